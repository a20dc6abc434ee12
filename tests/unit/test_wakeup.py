"""The claim loop's self-pipe: what a wake-up says (no database)."""

from __future__ import annotations

from forklift.workers.wakeup import SLOT, Wakeup


def test_a_freed_slot_is_no_news_to_a_loop_waiting_for_news() -> None:
    wakeup = Wakeup()
    try:
        wakeup.set(SLOT)
        wakeup.set(SLOT)
        assert not wakeup.wait_for_news(0.05)  # slots only: it waits its time out
        assert not wakeup.wait(0.0)  # and consumed them
        wakeup.set(SLOT)
        wakeup.set()  # news beside a freed slot
        assert wakeup.wait_for_news(5.0)
        wakeup.set(SLOT)
        assert wakeup.wait(5.0)  # to a plain wait every wake-up is one
    finally:
        wakeup.close()
