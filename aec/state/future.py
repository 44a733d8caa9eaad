"""StateFuture: the result of an async state access (FLIP-424's ``StateFuture``).

Invariants (all on the mailbox thread):
- A future completes once. Callbacks registered while it is pending run when it
  completes, in registration order; registered on a completed future they run
  inline, at once.
- Reference counting (docs/semantics.md, rule 3): a pending callback holds one
  reference on the future's ``context`` (a ``RecordContext``: +1 when it is
  registered, ``release()`` after it ran). A state request (or external call)
  holds its own reference, taken by the controller and released only after its
  callbacks ran, so callbacks registered on it ride on that one
  (``callbacks_hold_record = False``).
- An exception raised by a callback propagates to whoever completed the future:
  the engine's loop, which fails the job (rule 10). Futures never carry errors.

The engine side of a future is ``complete``, ``subscribe`` and the ``context``
attribute; the runtime reads nothing else of it.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from functools import partial
from typing import Any, ClassVar, Final, Generic, Protocol, TypeVar, overload

from aec.errors import CallbackFailed
from aec.native import mypyc_attr
from aec.state.typevars import T

R = TypeVar("R")  # what a chained function returns
S = TypeVar("S")  # the other future's result (then_combine)

# what ``_result`` holds until completion: typed as every T, compared by identity only
_PENDING: Final[Any] = object()


class Owner(Protocol):
    """The record a future belongs to (the runtime's ``RecordContext``): a pending
    callback keeps it unfinished (``ref_count`` + 1 when it is registered,
    ``release()`` after it ran)."""

    ref_count: int

    def release(self) -> None:
        """One thing less; at zero the record is finished."""


@mypyc_attr(allow_interpreted_subclasses=True)  # the external calls' CallFuture
class StateFuture(Generic[T]):
    """A value of type ``T`` that a state access delivers later, on the mailbox thread.

    Create futures through the state API or ``completed_future``; the engine
    completes them. Chaining methods follow Flink's ``StateFuture``; each returns
    a new ``StateFuture`` bound to the same record context.
    """

    __slots__ = ("_result", "_callbacks", "context")
    # whether a pending callback holds its own reference on the record: a future that
    # itself holds one until its callbacks ran (a state request, an external call)
    # lets them ride on it
    callbacks_hold_record: ClassVar[bool] = True
    # whether it may complete with an error that ``get()`` raises (an external call's):
    # a future composed of it takes its outcome through ``get()``, not its bare result
    may_fail: ClassVar[bool] = False

    def __init__(self, context: Owner | None = None, result: T = _PENDING) -> None:
        self._result: T = result  # _PENDING until completed
        # None, one callable, or a list of them
        self._callbacks: Callable[[T], object] | list[Callable[[T], object]] | None = None
        # engine side: the record whose reference count pending callbacks hold (None
        # for a future made outside a record until a coroutine awaits it: subscribe)
        self.context = context

    # -- state -------------------------------------------------------------------------
    def is_done(self) -> bool:
        """True once completed."""
        return self._result is not _PENDING

    def get(self) -> T:
        """The result of a completed future. Raises RuntimeError while pending
        (use a callback, ``await``, or the blocking state API instead)."""
        if self._result is _PENDING:
            raise RuntimeError("StateFuture.get() on a pending future")
        return self._result

    def __repr__(self) -> str:
        if self._result is _PENDING:
            return "<StateFuture pending>"
        return f"<StateFuture done: {self._result!r}>"

    # -- engine side ---------------------------------------------------------------------
    def complete(self, result: T) -> None:
        """Set the result and run the pending callbacks (engine use; mailbox thread).

        Raises RuntimeError if already complete; a callback's exception propagates.
        """
        if self._result is not _PENDING:
            raise RuntimeError(f"StateFuture completed twice (already {self._result!r})")
        self._result = result
        callbacks = self._callbacks
        if callbacks is None:
            return
        self._callbacks = None
        context = self.context if self.callbacks_hold_record else None
        if type(callbacks) is not list:  # one callback is stored bare: the common case
            callbacks(result)  # type: ignore[operator]  # a callable: type() is no list
            if context is not None:
                context.release()
            return
        for callback in callbacks:
            callback(result)
            if context is not None:
                context.release()

    def pending_callbacks(self) -> int:
        """Engine side: how many callbacks wait for this future (0 once complete)."""
        callbacks = self._callbacks
        if callbacks is None:
            return 0
        return len(callbacks) if type(callbacks) is list else 1

    def subscribe(self, callback: Callable[[T], object], context: Owner | None) -> bool:
        """Engine side (the coroutine driver), and every callback this class chains:
        run ``callback(result)`` on completion, holding a reference on the future's
        record; a future made outside a record becomes ``context``'s (the record now
        waits for it). False, registering nothing, when the future is already complete."""
        if self._result is not _PENDING:
            return False
        owner = self.context
        if owner is None:
            owner = self.context = context
        if owner is not None and self.callbacks_hold_record:
            owner.ref_count += 1  # released in complete, after the callback ran
        callbacks = self._callbacks
        if callbacks is None:
            self._callbacks = callback
        elif type(callbacks) is list:
            callbacks.append(callback)
        else:
            self._callbacks = [callbacks, callback]  # type: ignore[list-item]  # a callable
        return True

    def on_complete(self, callback: Callable[[T], object]) -> None:
        """Run ``callback(result)`` on completion, inline if already complete."""
        if not self.subscribe(callback, None):
            _now(callback, self._result)

    # -- chaining (Flink's StateFuture API) ------------------------------------------------
    def then_apply(self, fn: Callable[[T], R]) -> StateFuture[R]:
        """A future of ``fn(result)``."""
        if self._result is not _PENDING:
            return _done(_now(fn, self._result), self.context)
        out: StateFuture[R] = StateFuture(self.context)
        self.subscribe(partial(_apply, fn, out), None)
        return out

    def then_accept(self, fn: Callable[[T], object]) -> StateFuture[None]:
        """Run ``fn(result)``; a future of None once it ran."""
        if self._result is not _PENDING:
            _now(fn, self._result)
            return _DONE_NONE
        out: StateFuture[None] = StateFuture(self.context)
        self.subscribe(partial(_accept, fn, out), None)
        return out

    # fn returns a future (the usual case), a future or None, or a plain value
    @overload
    def then_compose(self, fn: Callable[[T], StateFuture[R]]) -> StateFuture[R]: ...
    @overload
    def then_compose(self, fn: Callable[[T], StateFuture[R] | None]) -> StateFuture[R | None]: ...
    @overload
    def then_compose(self, fn: Callable[[T], StateFuture[R] | R]) -> StateFuture[R]: ...

    def then_compose(self, fn: Callable[[T], object]) -> StateFuture[Any]:
        """A future of the result of the future ``fn(result)`` returns.

        A plain (non-future) return value is taken as an already-complete result.
        """
        if self._result is not _PENDING:
            composed = _now(fn, self._result)
            if isinstance(composed, StateFuture) and composed.may_fail:
                return _consumed(composed, self.context)
            return _as_future(composed, self.context)
        out: StateFuture[object] = StateFuture(self.context)
        self.subscribe(partial(_forward, fn, out), None)
        return out

    def then_combine(self, other: StateFuture[S], fn: Callable[[T, S], R]) -> StateFuture[R]:
        """A future of ``fn(self_result, other_result)`` once both are complete.
        TypeError when ``other`` is not a StateFuture."""
        if not isinstance(other, StateFuture):
            raise TypeError(f"then_combine takes a StateFuture, got {other!r:.200}")
        return self.then_compose(lambda a: other.then_apply(lambda b: fn(a, b)))

    def then_conditionally_apply(
        self,
        condition: Callable[[T], bool],
        if_true: Callable[[T], R],
        if_false: Callable[[T], R] | None = None,
    ) -> StateFuture[tuple[bool, R | None]]:
        """A future of ``(flag, value)``: flag is ``condition(result)``; value is
        ``if_true(result)`` or ``if_false(result)`` (None without ``if_false``).
        As Flink's ``thenConditionallyApply`` (a ``Tuple2<Boolean, Object>``)."""

        def branch(r: T) -> tuple[bool, R | None]:
            if condition(r):
                return True, if_true(r)
            return False, (if_false(r) if if_false is not None else None)

        return self.then_apply(branch)

    def then_conditionally_accept(
        self,
        condition: Callable[[T], bool],
        if_true: Callable[[T], object],
        if_false: Callable[[T], object] | None = None,
    ) -> StateFuture[None]:
        """Run ``if_true(result)`` or ``if_false(result)`` by ``condition``; a future of None."""

        def branch(r: T) -> None:
            if condition(r):
                if_true(r)
            elif if_false is not None:
                if_false(r)

        return self.then_accept(branch)

    def then_conditionally_compose(
        self,
        condition: Callable[[T], bool],
        if_true: Callable[[T], StateFuture[R] | R],
        if_false: Callable[[T], StateFuture[R] | R] | None = None,
    ) -> StateFuture[tuple[bool, R | None]]:
        """A future of ``(flag, value)`` where value is the result of the future
        the chosen branch returns (None without ``if_false``)."""

        def branch(r: T) -> StateFuture[tuple[bool, R | None]]:
            if condition(r):
                return _as_future(if_true(r), self.context).then_apply(lambda v: (True, v))
            if if_false is None:
                return _done((False, None), self.context)
            return _as_future(if_false(r), self.context).then_apply(lambda v: (False, v))

        return self.then_compose(branch)

    def __await__(self) -> Generator[StateFuture[T], T, T]:
        """``await future`` inside ``async def`` user code; the engine drives the coroutine."""
        if self._result is _PENDING:
            return (yield self)
        return self._result


# what a callback chained on a completed future returns when it has no value: a done
# future holds no reference and takes no callback, so one serves every record
_DONE_NONE: StateFuture[None] = StateFuture(None, None)


# The chaining methods' callbacks: partials of these, not closures (compiled, a closure
# and its environment are a reference cycle per call, which only the cyclic GC frees).
def _apply(fn: Callable[[T], R], out: StateFuture[R], r: T) -> None:
    out.complete(fn(r))


def _accept(fn: Callable[[T], object], out: StateFuture[None], r: T) -> None:
    fn(r)
    out.complete(None)


def _forward(fn: Callable[[T], object], out: StateFuture[object], r: T) -> None:
    value = fn(r)
    if type(value) is StateFuture or isinstance(value, StateFuture):
        if value.subscribe(partial(_settle, value, out) if value.may_fail else out.complete, None):
            return
        value = value.get()
    out.complete(value)


def _now(fn: Callable[[S], R], value: S) -> R:
    """``fn(value)`` run at registration, its future complete already: an error is
    ``CallbackFailed``, which user code's ``except Exception`` does not catch, so it
    fails the job as a callback run at completion does (rule 10)."""
    try:
        return fn(value)
    except Exception as exc:
        raise CallbackFailed(exc) from exc


def _result_of(future: StateFuture[R]) -> R:
    return future.get()


def _results_of(futures: list[StateFuture[R]]) -> list[R]:
    return [f.get() for f in futures]


def _settle(done: StateFuture[T], out: StateFuture[T], _: object) -> None:
    out.complete(done.get())  # raises a failed call's error: the callback fails the job


def _consumed(call: StateFuture[R], context: Owner | None) -> StateFuture[R]:
    """A future of ``call``'s outcome (``may_fail``) composed into a chain: its error
    fails the job, now or when it completes, as ``_forward``'s does."""
    out: StateFuture[R] = StateFuture(context)
    if call.subscribe(partial(_settle, call, out), None):
        return out
    return _done(_now(_result_of, call), context)


def _done(value: R, context: Owner | None) -> StateFuture[R]:
    return StateFuture(context, value)


def _as_future(value: StateFuture[R] | R, context: Owner | None) -> StateFuture[R]:
    return value if isinstance(value, StateFuture) else StateFuture(context, value)


@overload
def completed_future() -> StateFuture[None]: ...
@overload
def completed_future(value: R) -> StateFuture[R]: ...


def completed_future(value: object = None) -> StateFuture[Any]:
    """A future already complete with ``value``."""
    return _done(value, None)


def combine_all(futures: Iterable[StateFuture[R]]) -> StateFuture[list[R]]:
    """A future of the list of results of ``futures``, in their order, once all are complete.

    Raises TypeError if an element is not a StateFuture.
    """
    # elements left untyped: compiled, a typed loop variable would check the type first
    given: list[Any] = list(futures)
    context = None
    pending = 0
    for future in given:
        if not isinstance(future, StateFuture):
            raise TypeError(f"combine_all takes StateFutures, got {type(future).__name__}")
        if not future.is_done():
            pending += 1
            context = context or future.context
    if not pending:  # a failed call's error: as when the last one completes later
        return _done(_now(_results_of, given), None)
    out: StateFuture[list[R]] = StateFuture(context)
    one_done = partial(_one_done, [pending], out, given)
    for future in given:
        if not future.is_done():
            future.on_complete(one_done)
    return out


def _one_done(
    remaining: list[int], out: StateFuture[list[Any]], given: list[StateFuture[object]], _: object
) -> None:
    """``combine_all``'s callback: ``remaining[0]`` futures were pending."""
    remaining[0] -= 1
    if remaining[0] == 0:
        out.complete([f.get() for f in given])
