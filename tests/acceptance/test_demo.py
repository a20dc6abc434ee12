"""`forklift demo` through the real CLI: embedded or named database, a kill, Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import struct
import time
import zlib
from pathlib import Path
from typing import Any

import psycopg

from forklift.demo.image import colours
from forklift.testing import ForkliftProcess, process_state, process_title, wait_for


def demo_env() -> dict[str, str]:
    """The test run's environment without a database URL: the demo's own choice."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORKLIFT_")}
    env.pop("DATABASE_URL", None)
    return env


def start_demo(tmp_path: Path, *args: str) -> ForkliftProcess:
    return ForkliftProcess(
        ["demo", "--workers", "2", "--out", str(tmp_path / "demo.png"), *args],
        demo_env(),
        tmp_path / "demo.log",
    )


def finish(proc: ForkliftProcess, timeout: float = 90.0) -> str:
    try:
        code = proc.wait(timeout=timeout)
    finally:
        proc.kill()  # a no-op once it has exited; after a timeout, nothing is left running
    output = proc.output()
    assert code == 0, output
    return output


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert data[-8:-4] == b"IEND"
    return width, height


def png_rows(path: Path) -> list[bytes]:
    """The RGB rows of a PNG as the demo writes them (8-bit RGB, rows unfiltered)."""
    data = path.read_bytes()
    width, height = png_size(path)
    idat, at = b"", 8
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        if data[at + 4 : at + 8] == b"IDAT":
            idat += data[at + 8 : at + 8 + length]
        at += 12 + length
    raw, stride = zlib.decompress(idat), 1 + 3 * width
    assert len(raw) == stride * height and {raw[y * stride] for y in range(height)} == {0}
    return [raw[y * stride + 1 : (y + 1) * stride] for y in range(height)]


def caption_of(path: Path, tiles_height: int) -> set[tuple[int, int, int]]:
    """The colours in the strip below the tiles."""
    return {
        (row[x], row[x + 1], row[x + 2])
        for row in png_rows(path)[tiles_height:]
        for x in range(0, len(row), 3)
    }


def workers_with_tiles(output: str) -> dict[int, int]:
    """{pid: tiles} from the summary's worker rows."""
    rows = re.findall(r"worker (\d+)\s+│\s+██ (\d+) tiles?", output)
    return {int(pid): int(n) for pid, n in rows if int(n)}


def batch_and_callback_ran_once(output: str, tiles: int) -> None:
    """The tiles were one batch; it finished; its callback ran exactly once, and said so."""
    ended = re.search(
        r"batch (\d+) finished \(succeeded\): its callback, assemble, is job (\d+)", output
    )
    assert ended, output
    batch, job = ended[1], ended[2]
    assert re.search(rf"callback job {job} assembled the image on worker \d+", output), output
    assert re.search(rf"batch\s+│\s+{batch}: {tiles} jobs, succeeded; callback job {job}", output)
    assert re.search(r"callback\s+│\s+assemble: ran once \(1 image row\)", output), output
    assert "effects exactly once: yes; callback ran once" in output


def check_caption(path: Path, size: tuple[int, int], output: str) -> None:
    width, height = png_size(path)
    assert width == size[0] and height > size[1] + 10, (width, height)
    strip = caption_of(path, size[1])
    workers = workers_with_tiles(output)
    assert workers, output
    for pid, colour in colours(workers).items():
        assert colour in strip, f"worker {pid}'s swatch {colour} is not in the caption"
    assert f"{size[0]}x{size[1]} and a caption strip below, {width}x{height} in all" in output


def pids_started(output: str) -> list[int]:
    """The supervisor's pid and every worker's, as the demo printed them."""
    supervisor = re.findall(r"^supervisor: forklift run .* \(pid (\d+)\)$", output, re.M)
    workers = re.findall(r"supervisor started worker (\d+)", output)
    assert supervisor and workers, output
    return [int(p) for p in supervisor + workers]


def running(pid: int) -> bool:
    """`pid` is a live forklift process (not a zombie, not a reused pid)."""
    state = process_state(pid)
    return state is not None and state != "Z" and "forklift" in process_title(pid)


def postgres_serving(data_dir: str) -> list[int]:
    """Processes whose command line names `data_dir` (an embedded server's)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and data_dir in process_title(int(entry.name)):
            found.append(int(entry.name))
    return found


def nothing_left(output: str) -> None:
    assert [p for p in pids_started(output) if running(p)] == []


def schema_of(output: str) -> str:
    match = re.search(r"on schema (forklift_demo_[0-9a-f]+) of ", output)
    assert match, output
    return match[1]


def schema_exists(db: psycopg.Connection[Any], schema: str) -> bool:
    row = db.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
    return row is not None and row[0] == 1


def one_batch_of_every_tile(db: psycopg.Connection[Any], schema: str, tiles: int) -> None:
    """Every job is a tile of one sealed batch, none with an idempotency key, and the
    batch's callback (assemble) is not enqueued yet."""
    jobs = db.execute(
        f"SELECT count(*), count(DISTINCT batch_id), count(idempotency_key), "
        f"count(*) FILTER (WHERE task <> 'render_tile') FROM {schema}.jobs"
    ).fetchone()
    batches = db.execute(
        f"SELECT total, sealed_at IS NOT NULL, finished_at, callback->>'task', "
        f"callback_job_id FROM {schema}.batches"
    ).fetchall()
    assert jobs == (tiles, 1, 0, 0), jobs
    assert batches == [(tiles, True, None, "assemble", None)], batches


def test_demo_on_the_embedded_server_kills_a_worker_and_commits_every_tile_once(
    tmp_path: Path,
) -> None:
    output = finish(start_demo(tmp_path, "--size", "320x240"))
    assert "effects exactly once: yes" in output
    assert "80 for 80 tiles (80 distinct)" in output
    killed = re.search(r"killed worker (\d+) while it rendered tile (\d+)", output)
    assert killed, output
    tile = killed[2]
    assert re.search(rf"tile {tile} charged: WorkerDied: worker process killed by SIGKILL", output)
    assert re.search(rf"tile {tile} rendered again by worker \d+ \(attempt 2\)", output)
    assert re.search(r"retries\s+│\s+1\b", output), output
    batch_and_callback_ran_once(output, 80)
    check_caption(tmp_path / "demo.png", (320, 240), output)
    assert len(workers_with_tiles(output)) == 3  # the two first, and the killed one's heir
    assert f"image: {tmp_path / 'demo.png'}" in output
    data_dir = re.search(r"embedded PostgreSQL in (\S+), deleted afterwards", output)
    assert data_dir, output
    assert postgres_serving(data_dir[1]) == []
    assert not Path(data_dir[1]).exists()
    nothing_left(output)


def test_demo_in_a_named_database_drops_its_schema(
    dsn: str, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    output = finish(start_demo(tmp_path, "--dsn", dsn, "--size", "160x120", "--no-kill"))
    assert "effects exactly once: yes" in output
    assert "killed worker" not in output
    batch_and_callback_ran_once(output, 20)
    check_caption(tmp_path / "demo.png", (160, 120), output)
    assert not schema_exists(db, schema_of(output))
    nothing_left(output)


def test_ctrl_c_midway_stops_everything_and_drops_the_schema(
    dsn: str, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    proc = start_demo(tmp_path, "--dsn", dsn)
    try:
        # The first quarter of the tiles is done: the workers are busy rendering.
        wait_for(lambda: "/300 tiles" in proc.output(), timeout=60, what="a quarter rendered")
        schema = schema_of(proc.output())
        assert schema_exists(db, schema)
        one_batch_of_every_tile(db, schema, 300)
        interrupted = time.monotonic()
        proc.signal(signal.SIGINT)
        code = proc.wait(timeout=15)
        took = time.monotonic() - interrupted
    finally:
        proc.kill()
    output = proc.output()
    assert code == 130, output
    assert took < 5, f"{took:.1f}s to stop"
    assert "forklift demo: interrupted by SIGINT" in output
    assert "effects exactly once" not in output
    assert not schema_exists(db, schema)
    nothing_left(output)
