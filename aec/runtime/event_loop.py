"""The one asyncio event loop of an operator, on one background thread.

asyncio-style ``AsyncFunction``s (``async def async_invoke(value)``), the calls
of ``Context.call_async`` and the batches of batched calls run here, off the
mailbox thread (DESIGN: no asyncio on the caller's thread, no per-record threads).
Completions go back through the ``future`` handed to ``submit`` (an object with
``complete`` and ``complete_exceptionally``), which posts a mail to the owner's
``Mailbox``; ``call_soon`` hands plain functions over (the batch queues' inputs).

Invariants:
- Started lazily by the first ``submit``; ``stop`` ends it within a bounded time.
- Task objects are touched only on the loop thread: the owner (mailbox thread)
  hands coroutines over through ``_inbox`` and functions through ``_calls`` (deques:
  atomic append/popleft) and wakes the loop with ``call_soon_threadsafe`` only when
  no wake-up is pending, so a burst of submissions costs one wake-up (one self-pipe
  write), not one each. ``_wake_pending`` is cleared on the loop thread *before* it
  drains them, so an item appended meanwhile is either drained now or gets its own
  wake-up. Functions run in the order they were handed over.
- Every submitted coroutine completes its future exactly once (result, exception,
  or ``CancelledError`` when cancelled), unless the loop is stopped first.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

__all__ = ["Completable", "EventLoopThread", "TaskHandle"]

R = TypeVar("R")
R_contra = TypeVar("R_contra", contravariant=True)
# a coroutine returning R (its yield and send types are asyncio's business)
Call = Coroutine[Any, Any, R]

_names = itertools.count(1)


class Completable(Protocol[R_contra]):
    """Where a submitted coroutine's outcome goes: an async I/O ``ResultFuture`` or an
    external call's ``CallCompletion`` (either completes from any thread)."""

    def complete(self, result: R_contra, /) -> None: ...
    def complete_exceptionally(self, error: BaseException, /) -> None: ...


class TaskHandle:
    """Lets the mailbox thread cancel one submitted coroutine.

    ``_task`` and ``_cancelled`` are read and written on the loop thread only.
    """

    __slots__ = ("_loop", "_task", "_cancelled")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._task: asyncio.Task[None] | None = None
        self._cancelled = False

    def cancel(self) -> None:
        """Ask the loop to cancel the coroutine (from any thread; returns at once)."""
        try:
            self._loop.call_soon_threadsafe(self._cancel_on_loop)
        except RuntimeError:  # loop already closed: nothing left to cancel
            pass

    def _cancel_on_loop(self) -> None:
        self._cancelled = True
        if self._task is not None:
            self._task.cancel()

    def start(self, coro: Call[R], future: Completable[R]) -> None:
        """On the loop thread: run ``coro`` as a task delivering to ``future``, unless
        it was cancelled before it started (then it never runs)."""
        if self._cancelled:
            coro.close()
            future.complete_exceptionally(asyncio.CancelledError())
            return
        task = asyncio.get_running_loop().create_task(_deliver(coro, future))
        # a task cancelled before its first step never awaits coro: close it quietly
        task.add_done_callback(lambda _: coro.close())
        self._task = task


class EventLoopThread:
    """One event loop on one daemon thread, owned by one operator.

    Args:
        name: the thread name's prefix (a number is appended).
        grace: seconds ``stop`` waits for cancelled tasks and for the thread to end;
            a coroutine that blocks the loop longer is abandoned (the daemon thread
            ends when it returns), so ``stop`` never hangs.
    """

    def __init__(self, grace: float = 2.0, name: str = "aec-async-io-loop") -> None:
        self._grace = grace
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # (handle, coroutine, its Completable): each pair agrees on the result type
        self._inbox: deque[tuple[TaskHandle, Call[Any], Completable[Any]]] = deque()
        self._calls: deque[tuple[Callable[..., object], tuple[object, ...]]] = deque()
        self._wake_pending = False
        # set by ``stop`` (owner thread), read on the loop: start no new call after it
        self.stopping = False

    @property
    def thread(self) -> threading.Thread | None:
        """The loop's thread, or None before the first ``submit``."""
        return self._thread

    def submit(self, coro: Call[R], future: Completable[R]) -> TaskHandle:
        """Run ``coro`` on the loop; complete ``future`` (a ``ResultFuture``) with its
        return value, or exceptionally with what it raised. Returns at once."""
        if self._loop is None:
            self._start()
        assert self._loop is not None
        handle = TaskHandle(self._loop)
        self._inbox.append((handle, coro, future))
        self._wake()
        return handle

    def call_soon(self, fn: Callable[..., object], *args: object) -> None:
        """Run ``fn(*args)`` on the loop thread soon, after every function handed over
        before it (from any thread; returns at once). An exception it raises goes to
        the loop's exception handler (logged) and does not stop the functions after it."""
        if self._loop is None:
            self._start()
        self._calls.append((fn, args))
        self._wake()

    def _wake(self) -> None:
        if not self._wake_pending:
            self._wake_pending = True
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._start_tasks)

    def stop(self) -> None:
        """Cancel every task, stop the loop and join the thread (at most ~2 x grace s)."""
        self.stopping = True
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        self._loop = None
        try:
            loop.call_soon_threadsafe(lambda: loop.create_task(self._shutdown(loop)))
        except RuntimeError:  # the loop already stopped and closed
            pass
        thread.join(self._grace * 2)
        while self._inbox:  # handed over after the loop stopped: never started
            self._inbox.popleft()[1].close()
        self._calls.clear()
        self._wake_pending = False

    # -- loop thread --------------------------------------------------------------------
    def _start(self) -> None:
        loop = asyncio.new_event_loop()
        thread = threading.Thread(
            target=self._run, args=(loop,), name=f"{self._name}-{next(_names)}", daemon=True
        )
        self._loop, self._thread = loop, thread
        self.stopping = False  # a loop started again after a stop sends again
        thread.start()

    @staticmethod
    def _run(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            loop.close()

    def _start_tasks(self) -> None:
        self._wake_pending = False
        calls = self._calls
        while calls:
            fn, args = calls.popleft()
            try:
                fn(*args)
            except Exception as exc:  # reported like any callback's; the rest still run
                asyncio.get_running_loop().call_exception_handler(
                    {"message": f"exception in {fn!r} handed to the loop", "exception": exc}
                )
        inbox = self._inbox
        while inbox:
            handle, coro, future = inbox.popleft()
            handle.start(coro, future)

    async def _shutdown(self, loop: asyncio.AbstractEventLoop) -> None:
        current = asyncio.current_task()
        deadline = loop.time() + self._grace
        # again until none is left: a task may start while others unwind (a callback
        # scheduled before the stop)
        while tasks := [t for t in asyncio.all_tasks(loop) if t is not current]:
            for task in tasks:
                task.cancel()
            left = deadline - loop.time()
            if left <= 0:
                break
            await asyncio.wait(tasks, timeout=left)
        try:
            await asyncio.wait_for(loop.shutdown_asyncgens(), self._grace)
        except Exception:  # best effort: a stuck async generator must not keep the loop alive
            pass
        finally:
            loop.stop()


async def _deliver(coro: Call[R], future: Completable[R]) -> None:
    """Await ``coro`` and hand its outcome to ``future`` (on the loop thread)."""
    try:
        results = await coro
    except BaseException as exc:  # CancelledError too: the driver drops stale attempts
        future.complete_exceptionally(exc)
        # the error's traceback holds this frame, and ``future`` holds the error: drop
        # it, else each failed call is a reference cycle
        del future
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
    else:
        future.complete(results)
