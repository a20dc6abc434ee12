"""bench.compare's results: one `Metric` per table row, its values per contender and round,
the medians, the forklift/peer ratios (always oriented so that > 1 means forklift is
better), the tables on stdout and the JSON for the chart."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._harness import print_grid

FORKLIFT = "forklift"


@dataclass
class Metric:
    """One row: what is measured, in which unit, and whether more is better."""

    key: str
    label: str
    unit: str  # "jobs/s", "ms", "s" or "x"
    higher_better: bool
    values: dict[str, list[float | None]] = field(default_factory=dict)
    reference: str | None = None  # the name of the reference among `values`, if any
    # What a round without a value means: "never" (recovery: the job never ran again
    # within the timeout) or "n/a" (e.g. a drain too fast for a 10-90% rate between polls).
    missing: str = "n/a"

    def add(self, who: str, value: float | None) -> None:
        self.values.setdefault(who, []).append(value)

    def median(self, who: str) -> float | None:
        """The median over the rounds; None when most rounds had no value ("never")."""
        rounds = self.values.get(who, [])
        known = [v for v in rounds if v is not None]
        if not known or len(known) * 2 < len(rounds):
            return None
        return statistics.median(known)

    def ratio(self, who: str) -> float | None:
        """forklift's median over `who`'s for a rate, the inverse for a time: > 1 is forklift
        better. inf when `who` never did it and forklift did; None when not comparable."""
        mine, theirs = self.median(FORKLIFT), self.median(who)
        if mine is None or who not in self.values:
            return None
        if theirs is None:
            return math.inf if self.missing == "never" else None
        if mine == 0 or theirs == 0:
            return None
        return mine / theirs if self.higher_better else theirs / mine

    def cell(self, who: str) -> str:
        """ "median (min-max)" of `who`'s rounds, "-" when not measured."""
        rounds = self.values.get(who)
        if not rounds:
            return "-"
        med = self.median(who)
        if med is None:
            return f"{self.missing} ({sum(v is None for v in rounds)}/{len(rounds)} rounds)"
        known = [v for v in rounds if v is not None]
        text = fmt(med, self.unit)
        if len(known) > 1:
            text += f" ({fmt(min(known), self.unit)}-{fmt(max(known), self.unit)})"
        if len(known) < len(rounds):
            text += f", {self.missing} in {len(rounds) - len(known)}"
        return text


def fmt(value: float, unit: str) -> str:
    """A rate in whole jobs/s; a time or a ratio with two decimals (whole from 100 up)."""
    if unit == "jobs/s" or value >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}"


def fmt_ratio(ratio: float | None) -> str:
    if ratio is None:
        return "-"
    if math.isinf(ratio):
        return "peer: never"
    return f"{ratio:.2f}x"


def print_values(metrics: Sequence[Metric], contenders: Sequence[str]) -> None:
    refs = any(m.reference for m in metrics)
    header = ["metric (unit)", *contenders, *(["reference"] if refs else [])]
    rows = [header]
    for m in metrics:
        row = [f"{m.label} ({m.unit})", *(m.cell(c) for c in contenders)]
        if refs:
            row.append(f"{m.reference}: {m.cell(m.reference)}" if m.reference else "-")
        rows.append(row)
    print_grid(
        "Medians over the rounds (min-max); 'never': not within the recovery timeout; 'n/a': "
        "no value (a drain too quick for a 10-90% rate between two polls)",
        rows,
    )


def print_ratios(metrics: Sequence[Metric], peers: Sequence[str]) -> None:
    rows = [["metric", *(f"forklift / {p}" for p in peers), "forklift's share of reference"]]
    for m in metrics:
        share = "-"
        if m.reference and m.median(m.reference) and m.median(FORKLIFT):
            share = f"{m.reference}: {fmt_ratio(m.ratio(m.reference))}"
        rows.append([m.label, *(fmt_ratio(m.ratio(p)) for p in peers), share])
    print_grid(
        "Ratios, forklift over each peer: > 1 means forklift is better (a higher rate, or a "
        "shorter time); 'share of reference': forklift's rate / the limit, or the floor's "
        "time / forklift's",
        rows,
    )


def to_json(metrics: Sequence[Metric], peers: Sequence[str], meta: dict[str, Any]) -> str:
    def clean(x: float | None) -> float | str | None:
        return "inf" if x is not None and math.isinf(x) else x

    out = [
        {
            "key": m.key,
            "label": m.label,
            "unit": m.unit,
            "higher_is_better": m.higher_better,
            "rounds": m.values,
            "median": {who: m.median(who) for who in m.values},
            "reference": m.reference,
            "ratio_forklift_over": {p: clean(m.ratio(p)) for p in peers if p in m.values},
        }
        for m in metrics
    ]
    return json.dumps({"meta": meta, "peers": list(peers), "metrics": out}, indent=2)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
