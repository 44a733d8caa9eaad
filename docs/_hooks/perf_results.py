"""mkdocs hook: publish the benchmark plots (perf/results/*.png) in the site.

The benchmarks write their plots under perf/results/, outside docs/; this adds
them to the site as performance/<name>.png, so the Benchmarks page shows the
current ones without a copy in docs/ going stale. (Their Markdown tables come in
through pymdownx.snippets.)
"""

from __future__ import annotations

import pathlib
from typing import Any

from mkdocs.structure.files import File, Files

RESULTS = pathlib.Path(__file__).resolve().parents[2] / "perf" / "results"


def on_files(files: Files, config: Any) -> Files:
    for plot in sorted(RESULTS.glob("*.png")):
        files.append(File.generated(config, f"performance/{plot.name}", abs_src_path=str(plot)))
    return files
