"""The tables and the plot of ``bench_windows.py``: a row's figure from its variants'
best seconds, the Markdown report, the plot, and two checkouts side by side."""

from __future__ import annotations

from pathlib import Path


def judge(row: dict) -> None:
    """Set a row's ``ratio``, ``met`` and each variant's ``records_per_s`` from its best
    seconds (the row's clock: CPU seconds judge work on a shared machine; the latency
    rows wait, so wall clock)."""
    best = {label: v["best_wall_s" if row["clock"] == "wall" else "best_cpu_s"]
            for label, v in row["variants"].items()}  # fmt: skip
    for label, v in row["variants"].items():
        v["records_per_s"] = v["records"] / best[label]
    a, b = list(row["variants"])
    va, vb = row["variants"][a], row["variants"][b]
    if row["kind"] == "cost":  # seconds per unit (a record, a result) of a over b
        row["ratio"] = (best[a] / va["per"]) / (best[b] / vb["per"])
        row["met"] = row["ratio"] <= row["threshold"]
    else:  # speed-up: records/s of a over b
        row["ratio"] = va["records_per_s"] / vb["records_per_s"]
        row["met"] = row["ratio"] >= row["threshold"]


def row_line(row: dict) -> str:
    verdict = "met" if row["met"] else "MISSED"
    rates = ", ".join(f"{k}: {v['records_per_s']:,.0f} rec/s" for k, v in row["variants"].items())
    return f"{row['measure']:<52} {row['ratio']:8.2f}x  goal {row['goal']:<9} {verdict}  {rates}"


def side_by_side(this_rows: dict[str, dict], base_rows: dict[str, dict]) -> tuple[list, str]:
    """Rows measured on two checkouts (measure -> row, variants' best seconds set):
    ``([{"this", "base", "this_vs_base"}, ...], a Markdown table)``. ``this_vs_base`` >
    1: this checkout better (a cost row's ratio is lower-is-better)."""
    lines = ["| measure | goal | this | base | this vs base | variants: this / base records/s |",
             "|---|---|---:|---:|---:|---|"]  # fmt: skip
    rows = []
    for name, this in this_rows.items():
        base = base_rows.get(name)
        judge(this)
        print("this " + row_line(this))
        if base is None:  # a row the base checkout does not have
            rows.append({"this": this, "base": None})
            lines.append(f"| {name} | {this['goal']} | {this['ratio']:.2f}x | - | - | - |")
            continue
        judge(base)
        print("base " + row_line(base))
        versus = (base["ratio"] / this["ratio"] if this["kind"] == "cost"
                  else this["ratio"] / base["ratio"])  # fmt: skip
        rates = ", ".join(
            f"{label} {v['records_per_s']:,.0f} / {base['variants'][label]['records_per_s']:,.0f} "
            f"({v['records_per_s'] / base['variants'][label]['records_per_s']:.2f}x)"
            for label, v in this["variants"].items()
        )
        rows.append({"this": this, "base": base, "this_vs_base": versus})
        lines.append(f"| {name} | {this['goal']} | {this['ratio']:.2f}x | "
                     f"{base['ratio']:.2f}x | {versus:.2f} | {rates} |")  # fmt: skip
    return rows, "\n".join(lines) + "\n"


def markdown(report: dict) -> str:
    p = report["params"]
    lines = [
        "# bench_windows: aec.windowing",
        "",
        f"{report['date']}; synthetic {p['records']:,} records over {p['keys']} keys; flights "
        f"{'all' if p['flights'] is None else p['flights']} rows; best of {p['repeats']} "
        f"interleaved rounds; load average at start {report.get('load', '?')} on "
        f"{report.get('cpus', '?')} CPUs. Clock `cpu`: process CPU seconds (the machine is "
        "shared; CPU time is what the variants cost); `wall`: wall clock (the latency rows "
        "wait on the modelled round trips: 1 ms per batch, `LatencyBackend(MemoryBackend(), "
        "0.001)`; async runs 50 % of the records over 5,000 keys, sync the first 2.5 % of "
        "them, each judged by its records/s).",
        "",
        "| measure | goal | measured | verdict | clock | variants (records/s) |",
        "|---|---|---:|---|---|---|",
    ]
    for r in report["rows"]:
        variants = ", ".join(f"{k} {v['records_per_s']:,.0f}" for k, v in r["variants"].items())
        verdict = "met" if r["met"] else "MISSED"
        clock = r.get("clock", "-")
        lines.append(
            f"| {r['measure']} | {r['goal']} | {r['ratio']:.2f}x | {verdict} | {clock} "
            f"| {variants} |"
        )
    flink = next((r for r in report["rows"] if r["measure"].startswith("vs PyFlink")), None)
    if flink is not None:
        peer = flink["variants"]["pyflink"]
        lines += [
            "",
            f"vs PyFlink: PyFlink {peer.get('pyflink', '')} (`apache-flink` in a venv of its "
            f"own, {peer.get('execution_mode', 'process')} mode, local mini-cluster, "
            f"parallelism 1) over the same {peer['records']:,} records "
            "(`window(TumblingEventTimeWindows.of(Time.hours(1))).aggregate(CountSum)`, "
            "watermarks: bounded out-of-orderness 60 s), from "
            f"{peer.get('run', 'this run')}: {peer['records_per_s']:,.0f} records/s from the "
            "first record in the Python worker to the last window result (JVM start, job "
            f"submission and worker start left out; the whole `execute` took "
            f"{peer.get('job_seconds', float('nan')):.1f} s, {peer.get('job_records_per_s', 0):,.0f} "
            "records/s). aec: the async tumbling run of the memory row, wall clock.",
        ]
    return "\n".join(lines) + "\n"


def plot(rows: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5))
    names = [r["measure"] for r in rows]
    ratios = [r["ratio"] for r in rows]
    colors = ["tab:green" if r["met"] else "tab:red" for r in rows]
    ax.barh(names, ratios, color=colors)
    for i, r in enumerate(rows):
        ax.annotate(f"{r['ratio']:.2f}x (goal {r['goal']})", (r["ratio"], i), fontsize=8,
                    xytext=(3, -3), textcoords="offset points")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("ratio (cost: lower is better; async/sync and vs PyFlink: higher is better)")
    ax.set_title("aec.windowing benchmark (green: goal met)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
