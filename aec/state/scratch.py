"""Private scratch directories that do not outlive their process.

``make(prefix)`` creates ``<tmp>/<prefix><host>-<pid>-<random>``: removed by
``remove`` (a backend's ``close``), at interpreter exit for whatever is still
there (a run that never closed its backend), and, after a kill, by the next
``make`` of the same prefix in any process on this host: directories whose
process is gone (``os.kill(pid, 0)`` fails) and that belong to this user are
swept. The host name is part of the name so that a temporary directory shared
between containers (separate PID spaces) is never swept by the wrong one.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import tempfile

_OWNED: set[str] = set()
_SWEPT: set[tuple[str, str]] = set()  # (prefix, parent) swept by this process


def _host() -> str:
    return "".join(c if c.isalnum() else "_" for c in socket.gethostname())[:32] or "host"


def make(prefix: str, parent: str | None = None) -> str:
    """A new private directory ``<parent>/<prefix><host>-<pid>-<random>`` (``parent``:
    the system's temporary directory); sweeps the leftovers of dead processes
    first (once per process and prefix)."""
    where = parent if parent is not None else tempfile.gettempdir()
    if (prefix, where) not in _SWEPT:
        _SWEPT.add((prefix, where))
        sweep(prefix, where)
    path = tempfile.mkdtemp(prefix=f"{prefix}{_host()}-{os.getpid()}-", dir=where)
    _OWNED.add(path)
    return path


def remove(path: str | None) -> None:
    """Remove a directory ``make`` created (a no-op for None or a removed one)."""
    if path is not None:
        _OWNED.discard(path)
        shutil.rmtree(path, ignore_errors=True)


def sweep(prefix: str, parent: str) -> list[str]:
    """Remove ``prefix`` directories under ``parent`` left by dead processes of this
    host and user; the removed paths."""
    host = f"{prefix}{_host()}-"
    removed: list[str] = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(host):
            continue
        pid_text = name[len(host) :].partition("-")[0]
        path = os.path.join(parent, name)
        if not pid_text.isdigit() or _alive(int(pid_text)):
            continue
        try:
            if os.lstat(path).st_uid != os.getuid():
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


@atexit.register
def _remove_owned() -> None:
    for path in list(_OWNED):
        remove(path)
