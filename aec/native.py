"""How the compiled build (mypyc; setup.py, ``AEC_COMPILE=1``) treats the engine's
classes: ``mypyc_attr`` is ``mypy_extensions.mypyc_attr`` to the compiler, which reads it
at build time, and a no-op at run time, so neither build needs ``mypy_extensions``
installed. E.g. ``@mypyc_attr(allow_interpreted_subclasses=True)`` keeps a compiled
class subclassable from Python (docs/performance.md, "The compiled build")."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

C = TypeVar("C", bound=type)

if TYPE_CHECKING:
    from mypy_extensions import mypyc_attr as mypyc_attr
else:

    def mypyc_attr(*_flags: str, **_attributes: Any) -> Callable[[C], C]:
        """No-op at run time (the compiler has read the attributes)."""
        return lambda cls: cls
