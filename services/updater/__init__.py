"""The live feature updater: decision and outcome events in, card, merchant and terminal rows out.

It consumes the event log (group ``feature-updater``), applies the incremental aggregation
of ``domain.aggregation`` to per-entity states seeded from the batch history, writes the
online store at once (the next transaction of a card sees its previous ones) and checkpoints
the states durably before it commits its log position.
"""
