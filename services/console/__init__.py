"""The web console: the review queue, decision lookup, models and the mesh's health, for the
people who run fraudmesh (``python -m services.console``; ``fraudmesh up`` starts it).

``pages`` is the HTTP edge (requests in, pages out) and ``outcomes`` the gRPC edge (verdicts
to ``fraud.v1.OutcomeService``); the modules beside them never import grpc: ``reviews`` reads
the decision log, ``verdicts`` checks a verdict, ``csrf`` and ``identity`` guard the one
state-changing action, ``models`` reads the lifecycle, ``overview`` and ``sources`` hold the
Prometheus and monitor seams.
"""
