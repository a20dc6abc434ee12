"""examples/resumable.py end to end: `python -m examples.resumable` starts a real
supervisor, SIGKILLs its worker three times mid-job, and what it prints (and what the
database holds) shows each kill cost at most a checkpoint interval and an item."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg

from examples.resumable import BLOCK, CHECKPOINT_EVERY, ITEMS_BEFORE_KILL
from forklift.testing import process_state
from tests.acceptance.conftest import scalar

ROOT = Path(__file__).resolve().parents[2]
ITEMS = 200
KILLS = 3


def run_example(env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "examples.resumable", "--items", str(ITEMS)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def number(pattern: str, output: str) -> float:
    match = re.search(pattern, output, re.M)
    assert match, f"no {pattern!r} in:\n{output}"
    return float(match[1].replace(",", ""))


def test_three_kills_redo_at_most_a_checkpoint_interval_and_an_item_each(
    env: dict[str, str], db: psycopg.Connection[Any], schema: str
) -> None:
    output = run_example(env)

    job_id = int(number(r"^job (\d+): succeeded after 4 attempts$", output))
    assert number(r"^kills: (\d+)$", output) == KILLS
    assert number(r"^items: (\d+),", output) == ITEMS
    assert len(re.findall(r"^kill \d: SIGKILL of worker \d+", output, re.M)) == KILLS
    # The answer is right although blocks were computed twice: stored once each.
    assert "answer: 837,799 (524 steps) below 1,000,000" in output
    assert scalar(db, f"SELECT count(*) FROM {schema}.collatz_blocks") == ITEMS
    assert ITEMS * BLOCK == 1_000_000

    redone = number(r"^items redone: (\d+)$", output)
    assert redone == scalar(db, f"SELECT sum(runs - 1) FROM {schema}.collatz_blocks")
    # Without checkpoints each attempt would start at block 0: the kills come once an
    # attempt has computed ITEMS_BEFORE_KILL blocks, all of which would be redone.
    assert redone < KILLS * ITEMS_BEFORE_KILL
    seconds = number(r"^work redone: ([\d.]+) s;", output)
    bound = number(r"= ([\d.]+) s; within the bound$", output)
    per_item = scalar(db, f"SELECT sum(seconds) / sum(runs) FROM {schema}.collatz_blocks")
    assert abs(bound - KILLS * (CHECKPOINT_EVERY + per_item)) < 0.01
    assert seconds <= bound

    state = scalar(db, f"SELECT state::text FROM {schema}.jobs WHERE id = %s", job_id)
    assert state == "succeeded"
    supervisor = int(number(r"supervisor pid (\d+)$", output))
    assert process_state(supervisor) is None  # stopped, and reaped by the example
