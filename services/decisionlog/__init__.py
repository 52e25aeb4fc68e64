"""The decision sink: every decision and outcome on the event log, as a Parquet decision log.

``sink`` is the loop (poll, gather, write durably, commit), ``writer`` the durable writes and
the flush journal, ``rows`` the events as table rows, ``layout`` the folders and schemas the
readers (``services.pipelines.decisions``) share; ``app`` runs the loop as a mesh process with
health and metrics.
"""
