"""Plots output tok/s and TTFT against concurrency from loadgen JSON lines.

    pip install matplotlib
    python3 scripts/plot_loadgen.py runs.jsonl -o docs/img/concurrency_cpu.png \
        --title "SmolLM2-135M Q4_0, 2-core EPYC VM, 2026-11-27"

Each line of the input is one load generator result (`--json-out` appends
them), with at least `label`, `concurrency`, `output_tok_s`, `ttft_ms_p50`
and `ttft_ms_p99`. Lines are grouped by label (one line per server: wick,
llama-server, vllm, ...); where a label has several runs at one concurrency,
their median is plotted. A Markdown table of the same numbers, with the
first label's output tok/s as a ratio to each other label's, goes to
stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict


def load(paths: list[str]) -> dict[str, dict[int, list[dict]]]:
    runs: dict[str, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for path in paths:
        with open(path) as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    if r.get("failed"):
                        raise SystemExit(f"{path}: {r['label']} at c={r['concurrency']} "
                                         f"had {r['failed']} failed requests")
                    runs[r["label"]][int(r["concurrency"])].append(r)
    return runs


def median_of(rs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rs)


def table(runs: dict[str, dict[int, list[dict]]]) -> str:
    labels = list(runs)
    first = labels[0]
    head = ["concurrency"] + [f"{l} tok/s" for l in labels] \
        + [f"{first} / {l}" for l in labels[1:]] + [f"TTFT p50 / p99 {l}" for l in labels]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for c in sorted({c for by_c in runs.values() for c in by_c}):
        tok = {l: median_of(runs[l][c], "output_tok_s") if c in runs[l] else None for l in labels}
        cells = [str(c)] + [f"{tok[l]:.1f}" if tok[l] else "" for l in labels]
        cells += [f"{tok[first] / tok[l]:.2f}x" if tok[l] and tok[first] else ""
                  for l in labels[1:]]
        for l in labels:
            if c in runs[l]:
                p50 = median_of(runs[l][c], "ttft_ms_p50") / 1000
                p99 = median_of(runs[l][c], "ttft_ms_p99") / 1000
                cells.append(f"{p50:.2f} / {p99:.2f} s")
            else:
                cells.append("")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def plot(runs: dict[str, dict[int, list[dict]]], out: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (tput, ttft) = plt.subplots(1, 2, figsize=(10, 4))
    ticks = sorted({c for by_c in runs.values() for c in by_c})
    for label, by_c in runs.items():
        cs = sorted(by_c)
        tput.plot(cs, [median_of(by_c[c], "output_tok_s") for c in cs], marker="o", label=label)
        line, = ttft.plot(cs, [median_of(by_c[c], "ttft_ms_p50") / 1000 for c in cs],
                          marker="o", label=f"{label} p50")
        ttft.plot(cs, [median_of(by_c[c], "ttft_ms_p99") / 1000 for c in cs],
                  marker="x", linestyle="--", color=line.get_color(), label=f"{label} p99")
    for ax, ylabel in ((tput, "output tok/s"), (ttft, "time to first token (s)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(c) for c in ticks])
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    ttft.set_yscale("log")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("inputs", nargs="+", help="files of loadgen JSON lines")
    p.add_argument("-o", "--out", required=True, help="image to write (.png or .svg)")
    p.add_argument("--title", default="")
    args = p.parse_args()
    runs = load(args.inputs)
    plot(runs, args.out, args.title)
    print(table(runs))


if __name__ == "__main__":
    main()
