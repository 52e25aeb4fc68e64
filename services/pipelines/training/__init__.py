"""The steps of a training run, which ``pipelines.train`` runs in order (``docs/training.md``)."""
