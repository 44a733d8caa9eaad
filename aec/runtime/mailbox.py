"""Mailbox: the completion hand-off from I/O threads to the mailbox thread.

The only cross-thread structure in the engine (FLIP-425's mailbox model): I/O
threads ``post`` completion mails; the mailbox thread ``take``s them. A deque
(append/popleft are atomic) plus an Event for the sleeping mailbox thread;
no other lock. Mails posted from the mailbox thread itself use ``post_local``,
which skips the Event.

``before_sleep`` is what the mailbox thread does when it is about to sleep because
nothing else can run: batched external calls send the partial batch they hold
(``aec.runtime.batch_queue``), since no further input can join it before a mail
wakes the thread.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any


class Mailbox:
    """FIFO of completion mails; any thread may post, one thread takes."""

    __slots__ = ("_mails", "_signal", "mails", "before_sleep")

    def __init__(self) -> None:
        # ``mails`` is the same deque, for the mailbox thread's hot loop to test and
        # pop without a method call; other threads use ``post`` only
        self._mails: deque[Any] = deque()
        self.mails = self._mails
        self._signal = threading.Event()
        # called on the mailbox thread by ``wait`` before it sleeps (None: nothing to do)
        self.before_sleep: Callable[[], None] | None = None

    def post(self, mail: Any) -> None:
        """Hand ``mail`` over from any thread and wake the mailbox thread."""
        self._mails.append(mail)
        self._signal.set()

    def post_local(self, mail: Any) -> None:
        """Queue ``mail`` from the mailbox thread itself (no wake-up needed)."""
        self._mails.append(mail)

    def take(self) -> Any | None:
        """The oldest mail, or None if there is none (never blocks)."""
        try:
            return self._mails.popleft()
        except IndexError:
            return None

    def __bool__(self) -> bool:
        return bool(self._mails)

    def wait(self, timeout: float | None) -> None:
        """Sleep until a mail is posted or ``timeout`` seconds pass; first, if no mail
        is there, run ``before_sleep``.

        Clearing the Event before the caller drains the deque means a mail posted
        after the drain sets it again, so no wake-up is lost.
        """
        if not self._mails:
            if self.before_sleep is not None:
                self.before_sleep()
            self._signal.wait(timeout)
        self._signal.clear()
