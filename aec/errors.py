"""The one error a failed run raises, the one a missing optional dependency raises, and
the one a backend raises when its store cannot give back what it holds."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager


class JobFailure(Exception):
    """A run failed: user code or a backend raised (docs/semantics.md rule 10).

    The message names the key and the record being processed; the original
    exception is ``__cause__``. Raised by ``run_keyed`` and every
    ``KeyedProcessOperator`` entry point after all engine threads have stopped.

    Attributes:
        key: the key of the failing record or timer (None if none was current, or a
            backend failed on a batch of several records: the message names them all).
        record: the record value or a ``"timer@<t>"`` description (None if none).
    """

    def __init__(self, message: str, *, key: object = None, record: object = None) -> None:
        super().__init__(message)
        self.key = key
        self.record = record


class CallbackFailed(BaseException):
    """A ``StateFuture`` callback run at registration (its future complete already)
    raised ``__cause__``. A callback's error fails the job (docs/semantics.md rule 10)
    whether it runs then or at completion, so it reaches user code as this, which
    ``except Exception`` does not catch; the ``JobFailure`` names the original
    (``error``)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error
        self.__cause__ = error  # also where a compiled raiser's ``from`` is not kept


class StateReadError(RuntimeError):
    """A backend's store could not give back state it holds: a corrupt block or
    file, a store that lost its data or was replaced. Never an empty result
    instead: the batch fails (``JobFailure`` with this as ``__cause__``).

    The message names the store, the state and, where known, the key group; the
    store's own error is ``__cause__``.
    """


class StuckError(RuntimeError):
    """Records are unfinished but nothing can make progress (the controller's drain
    or the operator found no mail, no ready record and no batch to flush)."""


def describe(value: object, limit: int = 200) -> str:
    """Short ``repr`` for error messages; long values are cut at ``limit`` characters."""
    try:
        text = repr(value)
    except Exception as exc:  # a user __repr__ that fails must not hide the real error
        text = f"<unrepresentable {type(value).__name__}: {exc}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def qualified_name(fn: object) -> str:
    """``module.qualname`` of a function or method (for messages): of the function a
    ``functools.partial`` wraps, of ``Class.__call__`` for a callable object; else
    ``fn``'s short repr."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    qualname = getattr(fn, "__qualname__", None)
    if isinstance(qualname, str):
        return f"{getattr(fn, '__module__', '?')}.{qualname}"
    if callable(fn):
        return f"{type(fn).__module__}.{type(fn).__qualname__}.__call__"
    return describe(fn, 80)


class MissingExtraError(ImportError):
    """A feature needs an optional dependency group (an "extra") that is not installed.

    The message names the feature, the missing module and the ``pip install``
    line, e.g. ``checkpoints at s3:// URIs needs the 's3' extra (module
    'pyarrow' is missing): pip install 'aec[s3]'``.

    Attributes:
        extra: the extra to install (``"spark"``, ``"rocksdb"``, ...).
    """

    def __init__(self, feature: str, extra: str, missing: str) -> None:
        super().__init__(
            f"{feature} needs the {extra!r} extra (module {missing!r} is missing): "
            f"pip install 'aec[{extra}]'",
            name=missing,
        )
        self.extra = extra


@contextmanager
def needs_extra(extra: str, feature: str, *modules: str) -> Iterator[None]:
    """Turn a missing optional module, imported inside the block, into ``MissingExtraError``.

    Only a ``ModuleNotFoundError`` for one of ``modules`` (top-level names, e.g.
    ``"pyarrow"``) is translated; any other import error propagates unchanged.

        with needs_extra("s3", "checkpoints at s3:// URIs", "pyarrow"):
            import pyarrow.fs

    Raises:
        MissingExtraError: (an ``ImportError``) naming ``extra`` and ``feature``.
    """
    try:
        yield
    except ModuleNotFoundError as exc:
        top = (exc.name or "").partition(".")[0]
        if top not in modules:
            raise
        raise MissingExtraError(feature, extra, top) from exc
