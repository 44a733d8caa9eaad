"""Build script: everything else is in pyproject.toml.

By default the wheel is pure Python. With ``AEC_COMPILE=1`` in the environment the
modules in ``COMPILED`` are also compiled with mypyc (shipped with mypy; needs a C
compiler and Python's headers) and the wheel is platform-specific; the same ``.py``
files ship beside the compiled ones, and Python imports the compiled ones first.
``aec.compiled`` says which build is imported. docs/performance.md: "The compiled build".
"""

from __future__ import annotations

import os
import re

from setuptools import setup

# The engine's per-record core: the contexts user code gets (Context, TimerService),
# run_keyed, the keyed operators (one and two inputs) and their timers, the AEC, its
# buffers, lanes, key accounting and epochs, the record context, the mailbox, the
# executors, the user-code runner, the output, the metrics' histograms; the state
# futures, requests and handles, and MemoryBackend; the timer queue; windowing's kernel
# (the grid, the built-in trigger's rules, contents, panes, sessions and their interval
# rule, the callback drivers, the bundles) and the interval join (its buffers, its
# bundle, its function: a Python class with compiled methods). The rest stays
# interpreted (key groups and TimeWindow among them): docs/performance.md.
COMPILED = [
    "aec/contexts.py",
    "aec/joins/buffer.py",
    "aec/joins/bundle.py",
    "aec/joins/interval.py",
    "aec/runtime/buffers.py",
    "aec/runtime/bundle.py",
    "aec/runtime/co_operator.py",
    "aec/runtime/controller.py",
    "aec/runtime/epochs.py",
    "aec/runtime/executor.py",
    "aec/runtime/key_accounting.py",
    "aec/runtime/lanes.py",
    "aec/runtime/mailbox.py",
    "aec/runtime/metrics.py",
    "aec/runtime/operator.py",
    "aec/runtime/operator_timers.py",
    "aec/runtime/output.py",
    "aec/runtime/record_context.py",
    "aec/runtime/run.py",
    "aec/runtime/timers.py",
    "aec/runtime/user_code.py",
    "aec/state/future.py",
    "aec/state/handles.py",
    "aec/state/memory.py",
    "aec/state/requests.py",
    "aec/windowing/builtin.py",
    "aec/windowing/bundles.py",
    "aec/windowing/contents.py",
    "aec/windowing/grid.py",
    "aec/windowing/intervals.py",
    "aec/windowing/merging.py",
    "aec/windowing/panes.py",
    "aec/windowing/session_bundle.py",
    "aec/windowing/sessions.py",
    "aec/windowing/sliding.py",
    "aec/windowing/tumbling.py",
]

# Two fixes to the C mypyc (2.4.1) generates, applied before it is compiled:
#
# On Python < 3.12 a compiled class with a Python base (``Generic[T]``: the futures,
# requests, handles) keeps its weak-reference list in a slot after its ``__dict__``, but
# its traverse visits that list and its clear (run by dealloc) ``Py_CLEAR``s it like an
# owned reference: a freed instance left its weak references dangling, and the next
# collection crashed. Fixed as CPython's own dealloc does it: no visit, and
# ``PyObject_ClearWeakRefs`` once the object is dead.
_WEAKLIST = r"\*\(\(PyObject \*\*\)\(\(char \*\)self \+ sizeof\(PyObject \*\) \+ sizeof\(\w+\)\)\)"
_VISIT_WEAKLIST = re.compile(rf"^[ \t]*Py_VISIT\(({_WEAKLIST})\);\n", re.M)
_CLEAR_WEAKLIST = re.compile(rf"^([ \t]*)Py_CLEAR\(({_WEAKLIST})\);$", re.M)
_CLEAR_WEAKREFS = (
    r"\1if (Py_REFCNT(self) == 0 && \2 != NULL) PyObject_ClearWeakRefs((PyObject *)self);"
)
# The compiled methods of a Python class (``mypyc_attr(native_class=False)``) check that
# ``self`` is exactly that class, which refuses users' subclasses (of ``MemoryBackend``,
# ``IntervalJoinFunction``);
# mypyc ignores ``allow_interpreted_subclasses`` there, so the check becomes isinstance.
_PYTHON_CLASSES = (
    "memory___MemoryBackend", "memory___MemorySpec", "interval___IntervalJoinFunction"
)
_EXACT_TYPE = re.compile(rf"Py_TYPE\((\w+)\) == (CPyType_(?:{'|'.join(_PYTHON_CLASSES)}))\b")


def _fix_generated_c(source: str) -> tuple[int, int]:
    """Apply both fixes to one generated file; how many weak-list clears and exact type
    checks it changed."""
    with open(source) as file:
        text = file.read()
    fixed, clears = _CLEAR_WEAKLIST.subn(_CLEAR_WEAKREFS, _VISIT_WEAKLIST.sub("", text))
    fixed, checks = _EXACT_TYPE.subn(r"PyObject_TypeCheck(\1, \2)", fixed)
    if fixed != text:
        with open(source, "w") as file:
            file.write(fixed)
    return clears, checks


def _ext_modules() -> list[object]:
    if os.environ.get("AEC_COMPILE", "0") in ("", "0"):
        return []
    from mypyc.build import mypycify  # AEC_COMPILE=1 needs mypy in the build environment

    extensions = list(mypycify(COMPILED, opt_level="3", debug_level="0", group_name="aec_kernel"))
    clears = checks = 0
    for extension in extensions:
        for source in extension.sources:
            if source.endswith(".c"):
                found = _fix_generated_c(source)
                clears, checks = clears + found[0], checks + found[1]
    if not (clears and checks):  # another mypyc's C: building it unfixed would crash later
        raise RuntimeError(
            f"AEC_COMPILE: mypyc's generated C no longer matches setup.py's fixes "
            f"({clears} weak-list clears, {checks} exact type checks found); "
            "build with mypy==2.4.1"
        )
    return extensions


setup(ext_modules=_ext_modules())
