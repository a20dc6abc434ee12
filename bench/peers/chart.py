"""The chart of bench.compare's ratios: `python -m bench.peers.chart RESULTS.json OUT.png`.

Run by bench.compare with the peers venv's python (matplotlib lives there, not in the
project's venv). One horizontal bar per metric and peer, from 1 to forklift / peer on a
log scale: to the right, forklift is better; to the left, the peer. A peer that never
did it (never ran a killed job again) gets the word "never" instead of a bar.
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
from matplotlib.patches import Patch


def draw(results: dict[str, Any], out: Path) -> None:
    metrics = [
        m
        for m in results["metrics"]
        if m["ratio_forklift_over"] and not m["key"].startswith("sweep.")
    ]
    peers: list[str] = results["peers"]
    finite = [r for m in metrics for r in m["ratio_forklift_over"].values() if _finite(r)]
    low, high = min([0.5, *finite]) / 1.6, max([2.0, *finite]) * 1.6
    height = 0.8 / max(1, len(peers))
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.3 * len(metrics) * max(1, len(peers))))
    for i, peer in enumerate(peers):
        color = f"C{i}"
        for row, m in enumerate(metrics):
            ratio = m["ratio_forklift_over"].get(peer)
            y = row + (i - (len(peers) - 1) / 2) * height
            if ratio == "inf":  # the peer never did it (e.g. never ran a killed job again)
                ax.annotate("never", (high / 1.25, y), color=color, va="center", fontsize=7)
            elif _finite(ratio):
                ax.barh(y, ratio - 1, left=1, height=height * 0.9, color=color)
                ax.annotate(
                    f"{ratio:.2f}",
                    (ratio, y),
                    va="center",
                    fontsize=6,
                    ha="left" if ratio >= 1 else "right",
                )
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlim(low, high)
    ax.set_yticks(range(len(metrics)), [m["label"] for m in metrics], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("forklift / peer, log scale: right of 1 = forklift better, left = the peer")
    kind = "a quick (smoke) run" if results["meta"]["quick"] else "medians of the rounds"
    ax.set_title(f"forklift vs its peers, {kind}", fontsize=10)
    handles = [Patch(color=f"C{i}", label=peer) for i, peer in enumerate(peers)]
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def _finite(ratio: object) -> bool:
    return isinstance(ratio, float) and math.isfinite(ratio) and ratio > 0


def main(argv: list[str]) -> int:
    source, out = Path(argv[0]), Path(argv[1])
    draw(json.loads(source.read_text()), out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
