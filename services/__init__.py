"""fraudmesh services: gateway, features and scorer, with the runtime they share."""
