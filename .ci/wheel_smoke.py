"""CI smoke test of the engine-only wheel, run by .ci/run inside a fresh venv outside the checkout.

Usage: ``<fresh venv>/bin/python .ci/wheel_smoke.py <checkout> [--compiled]``. Fails
(exit 1) when aec is imported from the checkout instead of the installed wheel, when
``aec.compiled`` is not what the wheel should be (``--compiled``: the mypyc build), when a
module or ``py.typed`` of the checkout's packages is missing from the wheel, when
the engine does not import without extras, or when a missing extra's error does
not name it.
"""

from __future__ import annotations

import importlib
import pathlib
import sys

PACKAGES = ("aec", "backends", "spark_glue")


def _installed_root() -> pathlib.Path:
    import aec

    root = pathlib.Path(aec.__file__).resolve().parent.parent
    if pathlib.Path(sys.prefix).resolve() not in root.parents:
        raise SystemExit(f"aec was imported from {root}, not from the venv {sys.prefix}")
    return root


def _shipped(base: pathlib.Path) -> set[str]:
    return {
        str(p.relative_to(base))
        for package in PACKAGES
        for p in (base / package).rglob("*")
        if p.suffix in (".py", ".typed") and "__pycache__" not in p.parts
    }


def _expect_missing_extra(statement: str, extra: str) -> None:
    try:
        exec(statement, {})
    except ImportError as exc:
        if f"pip install 'aec[{extra}]'" not in str(exc):
            message = f"{statement!r}: the ImportError does not name aec[{extra}]: {exc}"
            raise SystemExit(message) from exc
    else:
        raise SystemExit(f"{statement!r} worked in an engine-only install")


def main(checkout: pathlib.Path, compiled: bool) -> None:
    installed = _installed_root()
    missing = sorted(_shipped(checkout) - _shipped(installed))
    if missing:
        raise SystemExit(f"left out of the wheel: {missing}")
    for name in ("aec", "aec.testing", "aec.async_io", "aec.retry", "aec.keygroups",
                 "aec.checkpoint", "aec.clock", "backends", "spark_glue", "spark_glue.cli"):  # fmt: skip
        importlib.import_module(name)
    from backends import CachedBackend, LatencyBackend, MemoryBackend  # noqa: F401

    _expect_missing_extra("from spark_glue import process_keyed", "spark")
    _expect_missing_extra("from backends import RocksDBBackend", "rocksdb")
    _expect_missing_extra("from backends import RedisBackend", "redis")
    _expect_missing_extra("from backends import SlateDBBackend", "slatedb")
    _expect_missing_extra("from aec.testing import keyed_streams", "hypothesis")
    import aec

    if aec.compiled != compiled:
        raise SystemExit(f"aec.compiled is {aec.compiled} in a {'compiled' if compiled else 'pure'} wheel")
    build = "compiled" if compiled else "pure Python"
    print(f"wheel smoke test: aec {aec.__version__} ({build}) from {installed}, engine only: ok")


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]).resolve(), compiled="--compiled" in sys.argv[2:])
