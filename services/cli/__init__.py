"""The ``fraudmesh`` command line: the composition root that wires every part together."""
