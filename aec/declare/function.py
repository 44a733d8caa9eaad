"""``DeclaringKeyedProcessFunction``: a keyed function whose processing is declared
(FLIP-455's ``DeclaringAsyncKeyedProcessFunction``).

Instead of ``process_element`` a declaring function implements
``declare_process(d)``, returning the chain of named steps a record runs through
(and, optionally, ``declare_on_timer(d)`` for timers). The operator builds the
declarations once, at ``open``, runs every record through them, and, because a
waiting record's next step has a name, a checkpoint stores the records in flight
instead of draining them (docs/checkpoints.md, "Checkpoints that do not drain").
"""

from __future__ import annotations

from aec.declare.context import DeclarationContext, DeclaredChain
from aec.declare.program import DeclaredProgram
from aec.functions import Context, KeyedProcessFunction


class DeclaringKeyedProcessFunction(KeyedProcessFunction):
    """Subclass, create state in ``open`` and declare the processing::

        class Counter(DeclaringKeyedProcessFunction):
            def open(self, ctx):
                self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

            def declare_process(self, d):
                def read(value, ctx):
                    return self.count.async_value()

                def write(n, ctx):
                    return self.count.async_update(n + 1)

                return d.chain(d.declare("read", read), d.declare("write", write))

    Steps run on the mailbox thread under the rules of any callback. A step
    returns a value, None or a ``StateFuture`` (its result is the next step's
    input); a checkpoint stores a record without waiting for it when what it waits
    for is one state access of its own (``async_value``, ``async_update``, map
    point operations, list writes) with no callback of its own; otherwise that
    checkpoint drains (docs/checkpoints.md).
    """

    def declare_process(self, d: DeclarationContext) -> DeclaredChain:
        """The chain of a record: its first step is called with ``(value, ctx)``."""
        raise NotImplementedError(f"{type(self).__name__} must override declare_process")

    def declare_on_timer(self, d: DeclarationContext) -> DeclaredChain | None:
        """The chain of a timer firing (first step called with ``(timestamp, ctx)``),
        or None: ``on_timer`` runs as in any keyed function."""
        return None

    def declarations(self) -> DeclaredProgram:
        """Declare the steps (``declare_process``, then ``declare_on_timer``); the
        operator calls it once after ``open``.

        Raises ValueError for a name declared twice or a step placed in two
        chains, TypeError for a chain that is not one."""
        program = DeclaredProgram()
        d = DeclarationContext(program)
        process = self.declare_process(d)
        program.finish(process, self.declare_on_timer(d))
        return program

    def process_element(self, value: object, ctx: Context) -> object:
        """Not called: the operator runs records through ``declare_process``'s chain."""
        raise TypeError(
            f"{type(self).__name__} is a DeclaringKeyedProcessFunction: records run "
            "through declare_process, not process_element"
        )
