"""How a ``KeyedProcessOperator`` fails (DESIGN rule 10): stop every engine thread,
then raise ``JobFailure`` naming the key and the record, the original error as cause."""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

from aec.errors import JobFailure, describe
from aec.runtime.controller import BatchFailed, StuckError
from aec.runtime.record_context import RecordContext

if TYPE_CHECKING:
    from aec.runtime.controller import AsyncExecutionController
    from aec.runtime.executor import StateExecutor
    from aec.runtime.external_calls import ExternalCalls


class OperatorFailures:
    """Failure handling of ``KeyedProcessOperator`` (a mixin over its fields)."""

    _state: str
    controller: AsyncExecutionController
    executor: StateExecutor
    external_calls: ExternalCalls

    if TYPE_CHECKING:

        def open(self) -> None: ...  # the operator's method

    def _require_open(self) -> None:
        if self._state == "new":
            self.open()
        elif self._state != "open":
            raise RuntimeError(f"operator is {self._state}; it takes no more input")

    def _stuck(self) -> StuckError:
        keys = self.controller.stuck_keys()
        shown = ", ".join(describe(k, 60) for k in keys[:10])
        more = f" and {len(keys) - 10} more" if len(keys) > 10 else ""
        return StuckError(
            f"{self.controller.in_flight} record(s) can never finish: a future they wait for "
            f"is never completed (keys: {shown}{more})"
        )

    def _raise_failure(self, exc: BaseException, where: str | None = None) -> NoReturn:
        """Stop every engine thread, then raise ``JobFailure`` (KeyboardInterrupt,
        SystemExit and an existing JobFailure are re-raised as they are). ``where``
        names the action when no record is current (a checkpoint)."""
        context = self.controller.current
        self._state = "failed"
        self.executor.close()
        self.external_calls.close()
        if isinstance(exc, (KeyboardInterrupt, SystemExit, JobFailure)):
            raise exc
        raise self._failure(exc, context, where) from _cause(exc)

    def _failure(
        self, exc: BaseException, context: RecordContext | None, action: str | None = None
    ) -> JobFailure:
        if context is not None:
            where = context.describe()
            key, record = (
                context.key,
                (context.value if context.timer is None else f"timer@{context.timer[1]!r}"),
            )
        else:
            where, key, record = action or "no current record", None, None
        cause = _cause(exc)
        what = "state backend failed" if isinstance(exc, BatchFailed) else "job failed"
        return JobFailure(
            f"{what} at {where}: {type(cause).__name__}: {cause}", key=key, record=record
        )


def _cause(exc: BaseException) -> BaseException:
    """The original error behind an engine wrapper."""
    if isinstance(exc, BatchFailed) and exc.__cause__ is not None:
        return exc.__cause__
    return exc
