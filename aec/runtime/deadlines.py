"""Timeouts of many calls on one asyncio loop: a deadline FIFO behind one timer.

Each ``Context.call_batched`` argument with a timeout waits for its deadline on the
loop thread (``aec.runtime.batched_calls``). One asyncio timer per argument
(``loop.call_at``, cancelled when the argument finishes first, which almost every one
does) costs a ``TimerHandle``, a push on asyncio's heap and a cancel per argument. The
arguments of one batch queue usually share their timeout and start it in the order
they were called, on the monotonic clock: their deadlines come in order. So a
``DeadlineFifo`` keeps them in a deque, in deadline order, behind one asyncio timer
armed at (or before) the earliest live deadline:

- ``add``: appended, O(1); the timer is armed only if none is.
- ``discard`` (the call finished first): the entry is marked dead, O(1), with no
  asyncio call; dead entries leave when they reach the head, or when the deque is
  compacted.
- the timer fires: every live entry whose deadline passed expires (its owner's
  ``time_out`` runs), dead heads are dropped, the timer is re-armed at the head.

A deadline earlier than the tail's (a shorter timeout given after longer ones) gets
its own asyncio timer instead of a place inside the deque: that keeps ``add`` O(1)
whatever timeouts a function mixes (an insertion walks back over every later
deadline: quadratic for a function that alternates two timeouts), and costs such an
entry what every entry cost before. Everything here runs on the loop thread.

Clock: a deadline is in ``time.monotonic()`` seconds (``external_calls`` takes it
from there on the owner thread when the call is made), and asyncio's default
``loop.time()``, the clock of ``loop.call_at``, is ``time.monotonic()`` too: the
owner thread's deadline is the loop's. An entry is due when its deadline is below
``loop.time()`` plus the clock's resolution, the rule asyncio applies to its own
timers, so expiry here happens exactly when a ``call_at`` timer would have run.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Protocol

__all__ = ["Deadline", "DeadlineFifo", "Expiring"]

# asyncio runs a timer whose time is below loop.time() + this (BaseEventLoop's
# _clock_resolution): the same rule here
_RESOLUTION = time.get_clock_info("monotonic").resolution
# dead entries tolerated beyond the live ones before the deque is compacted
_SLACK = 64


class Expiring(Protocol):
    """What a deadline belongs to: told when the deadline passes first."""

    def time_out(self) -> None: ...


class Deadline:
    """One owner's deadline, as ``DeadlineFifo.add`` returned it; written by the FIFO
    only.

    ``when``: monotonic seconds. ``owner``: None once the deadline is over (discarded,
    or expired), which is what makes a deque entry dead. ``handle``: the entry's own
    asyncio timer if it is not in the deque (entered out of deadline order), else None.
    """

    __slots__ = ("when", "owner", "handle")

    def __init__(self, when: float, owner: Expiring) -> None:
        self.when = when
        self.owner: Expiring | None = owner
        self.handle: asyncio.TimerHandle | None = None

    def __repr__(self) -> str:
        state = "over" if self.owner is None else "own timer" if self.handle else "in FIFO"
        return f"<Deadline {self.when:.3f} {state}>"


class DeadlineFifo:
    """Deadlines in the order they fall due, behind one asyncio timer (loop thread).

    Invariants:
    - ``_entries`` is sorted by ``when`` (non-decreasing): ``add`` appends only a
      deadline no earlier than the tail's (dead tail entries later than it are dropped
      first); an earlier one gets its own timer (``Deadline.handle``) and is never in
      ``_entries``.
    - ``_live`` counts the entries of ``_entries`` whose ``owner`` is set (each added
      once); the others are dead. A dead head is dropped at once, and between calls
      ``len(_entries) <= 2 * _live + _SLACK`` (the deque is compacted past that): it
      holds about twice the live deadlines at most, however many finished.
    - ``_timer`` (armed for ``_timer_at``) is set whenever a live entry is in
      ``_entries`` (except while ``_fire`` runs), and ``_timer_at`` is at or before the
      earliest live ``when``: the timer may fire for a deadline since discarded, then
      finds nothing due and re-arms at the head. Once ``_entries`` is empty it may
      stay armed for a discarded deadline: ``add`` arms it earlier if it must.
    """

    __slots__ = ("_entries", "_live", "_timer", "_timer_at")

    def __init__(self) -> None:
        self._entries: deque[Deadline] = deque()
        self._live = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

    def __len__(self) -> int:
        """Entries held in the deque, live or dead (not those with their own timer)."""
        return len(self._entries)

    @property
    def live(self) -> int:
        """Live deadlines in the deque."""
        return self._live

    def add(self, when: float, owner: Expiring) -> Deadline:
        """Call ``owner.time_out()`` at ``when`` (monotonic seconds) unless the returned
        deadline is ``discard``ed first."""
        deadline = Deadline(when, owner)
        entries = self._entries
        if entries and when < entries[-1].when:
            while entries and entries[-1].owner is None and when < entries[-1].when:
                entries.pop()  # dead: each leaves once, O(1) per entry
            if entries and when < entries[-1].when:  # out of order: a timer of its own
                loop = asyncio.get_running_loop()
                deadline.handle = loop.call_at(when, self._expire_alone, deadline)
                return deadline
        entries.append(deadline)
        self._live += 1
        if self._timer is None or when < self._timer_at:
            self._arm(when)
        return deadline

    def discard(self, deadline: Deadline) -> None:
        """``deadline``'s owner no longer waits for it: O(1), no asyncio call (unless
        it has a timer of its own). Nothing happens if it is over already."""
        if deadline.owner is None:
            return
        deadline.owner = None
        handle = deadline.handle
        if handle is not None:
            deadline.handle = None
            handle.cancel()
            return
        self._live -= 1
        entries = self._entries
        if entries[0] is deadline:
            entries.popleft()
            while entries and entries[0].owner is None:
                entries.popleft()
        if len(entries) > 2 * self._live + _SLACK:
            self._compact()

    def _compact(self) -> None:
        """Drop every dead entry (order kept): O(entries), once per ``_live + _SLACK``
        or more entries died since the last time, so O(1) per entry."""
        self._entries = deque(entry for entry in self._entries if entry.owner is not None)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = asyncio.get_running_loop().call_at(when, self._fire)

    def _fire(self) -> None:
        """The timer: expire every live entry due, drop dead heads, re-arm."""
        self._timer = None
        try:
            due = asyncio.get_running_loop().time() + _RESOLUTION
            while self._entries:
                head = self._entries[0]
                owner = head.owner
                if owner is None:
                    self._entries.popleft()
                    continue
                if head.when >= due:
                    break
                self._entries.popleft()
                head.owner = None
                self._live -= 1
                owner.time_out()
        finally:  # re-armed even if an owner's time_out raised
            self._rearm()

    def _rearm(self) -> None:
        """After ``_fire``: the bound on dead entries, and the timer at the head (unless
        an ``add`` from an owner's ``time_out`` armed it early enough)."""
        if len(self._entries) > 2 * self._live + _SLACK:
            self._compact()
        entries = self._entries
        if entries and (self._timer is None or entries[0].when < self._timer_at):
            self._arm(entries[0].when)

    def _expire_alone(self, deadline: Deadline) -> None:
        """The own timer of a deadline entered out of order."""
        owner = deadline.owner
        deadline.handle = None
        if owner is not None:
            deadline.owner = None
            owner.time_out()
