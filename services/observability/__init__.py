"""The observability layer: the trace collector's and Prometheus's configuration for a local
mesh (``collector``, ``prometheus``), and the recording rules, alert rules and dashboards
generated from the metric catalogue (``rules``, ``dashboards``; ``python -m
services.observability`` writes them under ``deploy/observability/``)."""
