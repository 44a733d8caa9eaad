"""Declared processing (FLIP-455): keyed functions written as named steps, so a
checkpoint stores the records in flight instead of draining them (FLIP-425's
"Faster Checkpoint Drain").

``DeclaringKeyedProcessFunction`` declares its processing in ``declare_process``
with a ``DeclarationContext`` (``declare``, ``chain``, ``branch``,
``declare_variable``); ``DeclaredVariable`` is a value per record in flight.
"""

from aec.declare.context import (
    DeclarationContext,
    DeclaredBranch,
    DeclaredChain,
    DeclaredStep,
    DeclaredVariable,
)
from aec.declare.function import DeclaringKeyedProcessFunction
from aec.declare.program import DeclaredProgram, DeclaredRun

__all__ = [
    "DeclarationContext", "DeclaredBranch", "DeclaredChain", "DeclaredProgram",
    "DeclaredRun", "DeclaredStep", "DeclaredVariable", "DeclaringKeyedProcessFunction",
]  # fmt: skip
