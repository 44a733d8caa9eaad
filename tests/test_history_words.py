"""Code, tests, perf scripts and docs speak of the project, not of its history: no
words naming rounds of work (HISTORY below: a numbered session or issue, and the like)
and no rules cited from outside the repo ("DESIGN rule N"; `docs/semantics.md`
numbers the rules).
CHANGELOG.md is where the history goes. "Session windows" and Spark sessions stay.
"""

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HISTORY = re.compile(
    r"\b(?:wav" r"es?\b|sessions?\s+#?\d|issues?[\s-]+#?\d|DESIGN\s+rules?\s+\d)", re.IGNORECASE
)
TEXT = {".py", ".md", ".toml", ".yml", ".yaml", ".txt", ".cfg", ".sh", ".json"}
SKIPPED_DIRS = {
    ".git", ".venv", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis",
    "__pycache__", "out", "site", "build", "dist",
}  # fmt: skip


def _project_files() -> list[Path]:
    files = []
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.endswith(".egg-info")]
        for name in names:
            path = Path(folder, name)
            if path.suffix in TEXT and name not in ("CHANGELOG.md", Path(__file__).name):
                files.append(path)  # CHANGELOG.md holds the history; this file, the words
    return files


def test_the_pattern_finds_history_words_and_leaves_session_windows():
    found = [bool(HISTORY.search(text)) for text in (
        "the second wav" + "e", "Sessio" + "n 9 figures", "(issu" + "e 14)",
        "the issu" + "e-9 goal", "DESIGN rul" + "e 4", "session windows", "a Spark session",
        "the issue of keys",
    )]  # fmt: skip  # split so this file has none of the words it looks for
    assert found == [True, True, True, True, True, False, False, False]


def test_no_history_words_outside_the_changelog():
    hits = []
    for path in _project_files():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if HISTORY.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not hits, "history words outside CHANGELOG.md:\n" + "\n".join(hits)
