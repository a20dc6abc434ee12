"""The chart of bench.compare's ratios: `python -m bench.peers.chart RESULTS.json OUT.png`.

Run by bench.compare with the peers venv's python (matplotlib lives there, not in the
project's venv). One horizontal bar per metric and peer: forklift's advantage, on a log
scale, > 1 (right of the line) meaning forklift is better; a peer that never recovered
gets a mark instead of a bar.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def draw(results: dict[str, Any], out: Path) -> None:
    metrics = [m for m in results["metrics"] if m["ratio_forklift_over"]]
    peers: list[str] = results["peers"]
    height = 0.8 / max(1, len(peers))
    fig, ax = plt.subplots(figsize=(10, 0.5 + 0.45 * len(metrics) * max(1, len(peers)) ** 0.5))
    finite = [r for m in metrics for r in m["ratio_forklift_over"].values() if isinstance(r, float)]
    top = max([2.0, *finite]) * 1.5
    for i, peer in enumerate(peers):
        ys, widths, never = [], [], []
        for row, m in enumerate(metrics):
            ratio = m["ratio_forklift_over"].get(peer)
            y = row + (i - (len(peers) - 1) / 2) * height
            if ratio == "inf":
                never.append(y)
            elif isinstance(ratio, float) and ratio > 0:
                ys.append(y)
                widths.append(ratio)
        bars = ax.barh(ys, widths, height=height * 0.9, label=peer, left=0)
        if never:
            ax.scatter(
                [top / 1.2] * len(never),
                never,
                marker=">",
                color=bars.patches[0].get_facecolor() if bars.patches else None,
                label=f"{peer}: never recovered",
            )
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlim(min([0.5, *finite]) / 1.5, top)
    ax.set_yticks(range(len(metrics)), [m["label"] for m in metrics], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("forklift / peer (log scale): > 1 means forklift is better")
    ax.set_title(
        "forklift vs its peers, "
        + ("quick run" if results["meta"]["quick"] else "medians of the rounds"),
        fontsize=10,
    )
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main(argv: list[str]) -> int:
    source, out = Path(argv[0]), Path(argv[1])
    draw(json.loads(source.read_text()), out)
    return 0 if math.isfinite(0.0) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
