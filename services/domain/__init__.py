"""Pure domain logic shared by services and pipelines: money, validation, the feature
spec and its aggregation, the rules fallback, the field's metrics. No transport, no storage."""
