"""The engine's types say what flows through it: the word ``Any`` in ``aec/`` stays
within a budget (counted as ``grep -rwo Any aec/ | wc -l`` counts it).

``Any`` is kept where the engine cannot know a type (a user's values, keys and
outputs) or where the compiled build must not check one (``aec.elements.Time``, one
alias for every time); elsewhere ``object``, ``Hashable`` or the real type says more.
"""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
BUDGET = 430  # at most this many
_WORD = re.compile(r"(?<![A-Za-z0-9_])Any(?![A-Za-z0-9_])")


def count_any(text: str) -> int:
    """Occurrences of ``Any`` as a whole word (grep -w: letters, digits, ``_``)."""
    return len(_WORD.findall(text))


def test_any_in_aec_within_budget():
    counts = {
        path.relative_to(ROOT): count_any(path.read_text(errors="replace"))
        for path in sorted((ROOT / "aec").rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".so"
    }
    total = sum(counts.values())
    worst = sorted(counts.items(), key=lambda item: -item[1])[:5]
    assert total <= BUDGET, f"{total} `Any` in aec/ (budget {BUDGET}); most in: {worst}"


def test_counter_counts_whole_words_only():
    text = "x: Any\ny: list[Any] = []  # AnyOf, _Any, Any_ and AnyIO are other words\nAny"
    assert count_any(text) == 3
