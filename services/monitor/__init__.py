"""The monitor: judges each model version on live traffic.

It consumes the event log (its own consumer group) and keeps, per version, arm and time
slice, fixed-size counts (``tally.py``) and, per version and decision hour, the outcomes
reported (``evaluation.py``); from them it exports drift against the version's reference
(``services.models.reference``), decision rates and live precision and recall, and advises
retraining (``advice.py``). Its windows are queryable in process (``engine.MonitorEngine``).
The math is ``services.domain.metrics``.
"""
