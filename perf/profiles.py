"""cProfile for benchmarks: every thread of a run, waits left out, and profile differences.

Used through ``perf/harness.py`` (which re-exports these names).
"""

from __future__ import annotations

import cProfile
import gc
import io
import os
import pstats
import threading
import time
from collections.abc import Callable
from typing import Any

# --- profiles -------------------------------------------------------------------------------

# Functions where a thread waits rather than works (their tottime is idle time).
WAITS = (
    "acquire' of '_thread.lock",
    "acquire' of '_thread.RLock",
    "get' of '_queue.SimpleQueue",
    "wait' of '_thread.lock",
    "poll' of 'select.epoll",
    "select' of 'select",
    "built-in method time.sleep",
)


class ThreadProfiler:
    """cProfile in the calling thread (``main``) and in every thread started while installed.

    Timed by each thread's CPU clock (``time.thread_time``): on a shared machine a
    wall-clock profile charges whatever function was running when the process lost
    its core; a CPU profile does not (time spent waiting shows as about 0).
    """

    def __init__(self) -> None:
        self.main = cProfile.Profile(time.thread_time)
        self.threads: list[tuple[str, cProfile.Profile]] = []
        self._lock = threading.Lock()

    def _hook(self, frame: Any, event: str, arg: Any) -> None:
        profile = cProfile.Profile(time.thread_time)
        with self._lock:
            self.threads.append((threading.current_thread().name, profile))
        profile.enable()  # replaces this hook in this thread

    def install(self) -> None:
        threading.setprofile(self._hook)

    def uninstall(self) -> None:
        threading.setprofile(None)

    def profiles(self) -> list[tuple[str, cProfile.Profile]]:
        """``(thread group, profile)``: "mailbox" for the calling thread, else the thread
        name without its number (``aec-io``, ``aec-slatedb-loop``)."""
        rows = [("mailbox", self.main)]
        for name, profile in self.threads:
            head, _, tail = name.rpartition("_")
            rows.append((head if tail.isdigit() else name, profile))
        return rows

    def stats(self, group: str | None = None) -> pstats.Stats | None:
        """Merged stats of one thread group (None: every thread)."""
        merged = None
        for name, profile in self.profiles():
            if group is not None and name != group:
                continue
            one = pstats.Stats(profile)
            if not one.stats:  # type: ignore[attr-defined]
                continue
            if merged is None:
                merged = one
            else:
                merged.add(one)
        return merged

    def report(self, wall: float) -> str:
        """Top functions of all threads, then of each thread group."""
        groups = list(dict.fromkeys(name for name, _ in self.profiles()))
        text = []
        for group in [None, *groups]:
            stats = self.stats(group)
            if stats is not None:
                text.append(
                    top_text(stats, "all threads" if group is None else f"{group} thread(s)", wall)
                )
        return "\n".join(text)


def top_text(stats: pstats.Stats, title: str, wall: float, limit: int = 15) -> str:
    """Top ``limit`` functions by tottime, wait functions left out (and summed in the title)."""
    table = stats.stats  # type: ignore[attr-defined]
    waits = {func: row for func, row in table.items() if any(w in func[2] for w in WAITS)}
    total = sum(row[2] for row in table.values())
    waited = sum(row[2] for row in waits.values())
    for func in waits:
        del table[func]
    out = io.StringIO()
    out.write(
        f"-- {title}: {total:.2f} s of thread CPU time in {wall:.2f} s wall; {waited:.2f} s in waits "
        f"({', '.join(f'{func[2]} {row[2]:.2f} s' for func, row in waits.items()) or 'none'}), "
        f"left out below --\n"
    )
    stats.stream = out  # type: ignore[attr-defined]
    stats.strip_dirs().sort_stats("tottime").print_stats(limit)
    return out.getvalue()


def profile_call(
    run: Callable[[], Any], title: str, threads: bool = False
) -> tuple[str, pstats.Stats]:
    """cProfile one call of ``run`` (and, with ``threads``, every thread it starts).

    Returns the report text (top 15 by tottime per thread group) and the merged stats."""
    profiler = ThreadProfiler()
    gc.collect()
    if threads:
        profiler.install()
    start = time.perf_counter()
    profiler.main.enable()
    try:
        run()
    finally:
        profiler.main.disable()
        profiler.uninstall()
    wall = time.perf_counter() - start
    stats = profiler.stats()
    assert stats is not None
    text = f"== {title}: {wall:.2f} s wall under cProfile (times below: thread CPU) ==\n"
    text += profiler.report(wall)
    return text, profiler.stats() or stats


def profile_diff(slow: pstats.Stats, base: pstats.Stats, slow_label: str, base_label: str) -> str:
    """The 15 functions whose tottime grew most from ``base`` to ``slow``."""
    rows = []
    for func, (_, calls, tottime, _, _) in slow.stats.items():  # type: ignore[attr-defined]
        base_row = base.stats.get(func)  # type: ignore[attr-defined]
        base_calls, base_tottime = (base_row[1], base_row[2]) if base_row else (0, 0.0)
        rows.append((tottime - base_tottime, calls, base_calls, tottime, base_tottime, func))
    rows.sort(reverse=True)
    total = sum(r[3] for r in rows) - sum(row[2] for row in base.stats.values())  # type: ignore[attr-defined]
    lines = [
        f"== where {slow_label} spends more than {base_label} (tottime, s; "
        f"total difference {total:+.2f} s) ==",
        f"{'extra':>8} {'calls':>9} {'base calls':>10} {'tottime':>8} {'base':>8}  function",
    ]
    for extra, calls, base_calls, tottime, base_tottime, (file, line, fn) in rows[:15]:
        lines.append(
            f"{extra:>8.3f} {calls:>9,} {base_calls:>10,} {tottime:>8.3f} {base_tottime:>8.3f}  "
            f"{os.path.basename(file)}:{line}({fn})"
        )
    return "\n".join(lines) + "\n\n"
