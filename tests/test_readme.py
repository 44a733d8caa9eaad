"""The README's example runs and prints what the README says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def _examples_with_claims() -> list[str]:
    """Every python block of the README that prints ``result.outputs`` with a claim."""
    blocks = [b.split("```")[0] for b in README.read_text().split("```python\n")[1:]]
    return [b for b in blocks if re.search(r"print\(result\.outputs\)\s+# ", b)]


def test_the_readme_has_runnable_examples():
    assert len(_examples_with_claims()) >= 2  # the keyed counter and the windows


@pytest.mark.parametrize("index", [0, 1])
def test_readme_example_runs_and_matches_its_comment(capsys, index):
    example = _examples_with_claims()[index]
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
