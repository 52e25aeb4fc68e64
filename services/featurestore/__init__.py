"""The Feast feature store as the project uses it: settings, definitions, offline store,
apply and materialize, and the request-path reader; shared by the feature service, the
gateway's in-process mode and the data pipelines."""
