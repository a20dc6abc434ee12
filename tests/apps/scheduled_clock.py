"""A test app for schedules on a skewed host clock (one and two seconds apart), and for
overlap=False: a five-second job every two seconds that records when each run began and
ended (seconds since the epoch, appended to the file $FORKLIFT_TEST_RUNS)."""

from __future__ import annotations

import os
import time

import forklift

app = forklift.App()


@app.periodic(every=1, name="every1")
def every1(ctx: forklift.JobContext) -> None:
    pass


@app.periodic(every=2, name="every2")
def every2(ctx: forklift.JobContext) -> None:
    pass


slow_app = forklift.App()


@slow_app.periodic(every=2, name="slow", overlap=False)
def slow(ctx: forklift.JobContext) -> None:
    began = time.time()
    time.sleep(5)
    with open(os.environ["FORKLIFT_TEST_RUNS"], "a") as out:
        out.write(f"{ctx.job_id} {began} {time.time()}\n")
