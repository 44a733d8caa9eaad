"""How an operator's failure reads (docs/semantics.md, rule 10): ``JobFailure`` naming
the key and the record (or the action, a checkpoint) with the original error as
cause, and the stuck-run error naming the keys that can never finish."""

from __future__ import annotations

from aec.errors import CallbackFailed, JobFailure, describe
from aec.runtime.controller import AsyncExecutionController, BatchFailed, StuckError
from aec.runtime.record_context import RecordContext
from aec.state.requests import StateRequest

_SHOWN_KEYS = 10


def stuck_error(controller: AsyncExecutionController) -> StuckError:
    """Records are in flight and nothing can make progress: name them (the record
    holding each stuck key) and their keys."""
    holders = controller.keys.items()
    shown = ", ".join(context.describe() for _, context in holders[:_SHOWN_KEYS])
    more = f" and {len(holders) - _SHOWN_KEYS} more" if len(holders) > _SHOWN_KEYS else ""
    keys = ", ".join(describe(key, 60) for key, _ in holders[:_SHOWN_KEYS])
    return StuckError(
        f"{controller.in_flight} record(s) can never finish: a future they wait for "
        f"is never completed ({shown}{more}; keys: {keys})"
    )


def job_failure(
    exc: BaseException, context: RecordContext | None, action: str | None = None
) -> JobFailure:
    """The ``JobFailure`` for ``exc`` raised while ``context`` ran (None: during
    ``action``, e.g. "checkpoint 3"); raise it ``from cause_of(exc)``."""
    batch = exc.batch if isinstance(exc, BatchFailed) else []
    records = _records_of(batch)
    if len(records) > 1:  # the store's error does not say which request it was
        shown = ", ".join(r.describe() for r in records[:_SHOWN_KEYS])
        more = f" and {len(records) - _SHOWN_KEYS} more" if len(records) > _SHOWN_KEYS else ""
        where = f"a batch of {len(batch)} requests of {len(records)} records ({shown}{more})"
        key = record = None
    elif context is not None:
        where, key, record = context.describe(), context.key, context.named()
    else:
        where, key, record = action or "no current record", None, None
    cause = cause_of(exc)
    what = "state backend failed" if isinstance(exc, BatchFailed) else "job failed"
    return JobFailure(
        f"{what} at {where}: {type(cause).__name__}: {_text(cause)}", key=key, record=record
    )


def _records_of(batch: list[StateRequest]) -> list[RecordContext]:
    """The distinct records (and timer firings) whose requests ``batch`` holds, in order."""
    found: dict[int, RecordContext] = {}
    for request in batch:
        context = request.context
        if isinstance(context, RecordContext):
            found.setdefault(id(context), context)
    return list(found.values())


def _text(error: BaseException) -> str:
    """``str(error)``, or a stand-in when the error's own ``__str__`` raises (the
    failure must still name the key and the record, with the error as its cause)."""
    try:
        return str(error)
    except Exception as exc:
        return f"<str() of the error raised {type(exc).__name__}>"


def close_function(function: object, failure: BaseException | None) -> None:
    """``function.close()`` at the end of a run, failed or not (Flink closes a
    function in either case). After a failure (``failure``, about to be raised) its
    error is a note on that failure, which stays the error the caller sees; else it
    fails the run: JobFailure naming it, the error as ``__cause__``."""
    try:
        function.close()  # type: ignore[attr-defined]  # every function kind has close()
    except Exception as exc:
        name = f"{type(function).__name__}.close()"
        if failure is not None:
            failure.add_note(f"{name} also failed: {type(exc).__name__}: {_text(exc)}")
            return
        raise JobFailure(f"{name} failed: {type(exc).__name__}: {_text(exc)}") from exc


def cause_of(exc: BaseException) -> BaseException:
    """The original error behind an engine wrapper."""
    if isinstance(exc, CallbackFailed):
        return exc.error
    if isinstance(exc, BatchFailed) and exc.__cause__ is not None:
        return exc.__cause__
    return exc
