"""The Feast feature store as the project uses it: settings, definitions, offline store,
apply and materialize, and the request-path reader; shared by the feature service, the
gateway's in-process mode and the data pipelines.

Importing this package first turns off typeguard's ``@typechecked`` for what is imported after
it. Feast decorates its classes with it, and typeguard instruments each decorated function at
import by parsing its whole module's source again and compiling the result: about 2,000
compilations and 7 s of CPU for ``import feast`` on a 2-core machine, paid by every start of the
feature service, the updater and the pipelines. The checks it buys
are Feast's own arguments at run time; the project's calls into Feast are checked by mypy.
"""

from __future__ import annotations

import sys
from typing import Any


def _unchecked(target: Any = None, **_options: Any) -> Any:
    """``typechecked`` that returns what it decorates, bare or with options."""
    if target is None:
        return lambda decorated: decorated
    return target


def _skip_runtime_type_checks() -> None:
    """Makes ``typeguard.typechecked`` a no-op unless Feast was imported already."""
    if "feast" in sys.modules:
        return
    import typeguard

    typeguard.typechecked = _unchecked


_skip_runtime_type_checks()
