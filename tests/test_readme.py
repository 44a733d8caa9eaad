"""The README's example runs and prints what the README says."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_example_runs_and_matches_its_comment(capsys):
    text = README.read_text()
    example = text.split("```python\n")[1].split("```")[0]
    namespace: dict = {}
    exec(compile(example, "README example", "exec"), namespace)
    printed = capsys.readouterr().out.strip()
    claimed = re.search(r"print\(result\.outputs\)\s+# (.*)", example).group(1)
    assert printed == claimed


def test_readme_names_the_two_commands_and_ci_runs_the_test_one():
    text = README.read_text()
    ci = (README.parent / ".ci" / "run").read_text()
    assert "bin/with-venv aec flights --out out/flights" in text
    test_command = "bin/with-venv python -m pytest -q"
    assert test_command in text and test_command in ci
