"""Testing helpers for users: the synchronous reference run, an adversarial
executor, the equivalence check (the async run gives the sync answer) and
hypothesis strategies.

    from aec.testing import assert_equivalent
    assert_equivalent(MyFunction, records_and_watermarks)

Modules: ``reference`` (``run_sync``), ``scripted`` (``ScriptedExecutor``),
``checker`` (``assert_equivalent``), ``strategies`` (``keyed_streams``,
``configs``; needs hypothesis, so imported lazily).
"""

from aec.testing.checker import DEFAULT_CONFIGS, assert_equivalent
from aec.testing.reference import run_sync
from aec.testing.scripted import ScriptedExecutor


def __getattr__(name: str) -> object:
    # the hypothesis strategies, re-exported lazily: hypothesis is optional for aec
    if name in ("keyed_streams", "configs"):
        from aec.testing import strategies

        return getattr(strategies, name)
    raise AttributeError(f"module 'aec.testing' has no attribute {name!r}")


__all__ = ["DEFAULT_CONFIGS", "ScriptedExecutor", "assert_equivalent", "run_sync"]
