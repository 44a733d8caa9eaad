"""The event loop a SlateDBBackend runs every SlateDB coroutine on, in its own thread.

SlateDB's Python API is asyncio; the engine calls backends from plain threads (the
mailbox thread and I/O threads). ``LoopThread`` runs one loop on a daemon thread
(``aec-slatedb-loop``) and ``call`` hands it a coroutine and waits, with a timeout.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any

THREAD_NAME = "aec-slatedb-loop"


class LoopThread:
    """One asyncio loop on a daemon thread; ``owner`` names the backend in errors.

    ``timeout``: seconds ``call`` waits (None: forever)."""

    def __init__(self, owner: str, timeout: float | None) -> None:
        self._owner = owner
        self._timeout = timeout
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=_run_loop, args=(self._loop,), name=THREAD_NAME, daemon=True
        )
        self._thread.start()

    def call(self, coroutine: Any) -> Any:
        """Run ``coroutine`` on the loop and wait for its result.

        Raises what the coroutine raised, or TimeoutError (the coroutine is then
        cancelled) after ``timeout`` seconds."""
        future: Future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(self._timeout)
        except TimeoutError:
            if future.done():  # the operation itself raised TimeoutError
                raise
            future.cancel()
            raise TimeoutError(
                f"{self._owner}: a SlateDB operation took over {self._timeout} s"
            ) from None

    def stop(self) -> None:
        """Cancel what is still pending, stop the loop and join its thread."""
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
