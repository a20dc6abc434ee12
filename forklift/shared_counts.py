"""Job outcome counters a worker keeps in memory its supervisor shares, so what a killed
worker finished is still counted.

A supervisor's child used to send its counts over its report pipe every half second; a
SIGKILL lost the last half second of them (the database showed 700 succeeded jobs,
`forklift_jobs_total` 698, for good). Now the supervisor maps an anonymous shared
region before the fork, and the child adds each outcome to a counter there in the
same thread, right after the statement that recorded the outcome returns: only a kill
in those microseconds loses one. The supervisor reads the counters as the child reports
and once more after it exited, and adds what grew.

A group commit's completions are the other gap: the statement commits on the server
while the worker waits for its answer, and a kill then loses them all (hundreds at full
speed). So before it sends one, the worker writes its jobs (id, attempt) as an intent,
marks the intent answered when the statement returns, counts the completions and
clears it. A supervisor that finds an intent unanswered in a dead child's memory asks
the database which of those attempts succeeded (`pending()`), and counts those.

Layout: a header of one u64 (slots in use), then SLOTS slots of [u64 count][u16 key
length][key: UTF-8 JSON of [queue, task, outcome]], then the intent: [u64 state: 0 none,
1 sent, 2 answered][u64 entries] and INTENT_MAX entries of [u64 job id][u32 attempt][u32
slot]. Only the child writes: a slot's key first, then the header (a new slot is
published after its key is whole); counts are aligned 8-byte stores; an intent's entries
before its state. The supervisor trusts nothing in it: a key that does not parse, a
count that shrank or a slot number out of range is dropped, and said to be malformed.
"""

from __future__ import annotations

import json
import mmap
import struct
from collections.abc import Iterator

SLOTS = 512  # distinct (queue, task, outcome) a child counts here; more go by the pipe
KEY_BYTES = 1014  # two names of at most 200 characters (4 bytes each) and an outcome
_SLOT = 8 + 2 + KEY_BYTES
INTENT_MAX = 1000  # jobs per group commit at most (CompleterConfig.batch)
_INTENT = 8 + SLOTS * _SLOT
_ENTRY = struct.Struct("<QII")
SIZE = _INTENT + 16 + INTENT_MAX * _ENTRY.size  # ~0.5 MiB, touched only as it is used
_U64 = struct.Struct("<Q")
_U16 = struct.Struct("<H")
SENT, ANSWERED = 1, 2

Key = tuple[str, str, str]


class SharedCounts:
    """One child's counters. The child calls `add()` (under its own lock); the parent
    calls `changes()`."""

    def __init__(self) -> None:
        self.region = mmap.mmap(-1, SIZE)  # anonymous: shared with the children forked after
        self._slot: dict[Key, int] = {}  # the child's own index of its slots
        self._seen: dict[Key, int] = {}  # the parent's: the counts it has added

    # -- the child -----------------------------------------------------------------------

    def add(self, key: Key, n: int = 1) -> bool:
        """Count `n` more of `key`; False when every slot is taken (count it elsewhere)."""
        slot = self._slot.get(key)
        if slot is None:
            slot = self._new_slot(key)
            if slot is None:
                return False
        offset = 8 + slot * _SLOT
        count = _U64.unpack_from(self.region, offset)[0]
        _U64.pack_into(self.region, offset, count + n)
        return True

    def _new_slot(self, key: Key) -> int | None:
        used = len(self._slot)
        encoded = json.dumps(list(key), ensure_ascii=False).encode()
        if used >= SLOTS or len(encoded) > KEY_BYTES:
            return None
        offset = 8 + used * _SLOT
        _U64.pack_into(self.region, offset, 0)
        _U16.pack_into(self.region, offset + 8, len(encoded))
        self.region[offset + 10 : offset + 10 + len(encoded)] = encoded
        _U64.pack_into(self.region, 0, used + 1)  # published: its key is whole
        self._slot[key] = used
        return used

    def intend(self, jobs: list[tuple[int, int, Key]]) -> bool:
        """Before a group commit of these (id, attempt, key): False if it cannot be
        written (too many, or no slot left), and then it is not."""
        if len(jobs) > INTENT_MAX:
            return False
        slots = []
        for _, _, key in jobs:
            slot = self._slot.get(key)
            if slot is None and (slot := self._new_slot(key)) is None:
                return False
            slots.append(slot)
        for i, (job_id, attempt, _) in enumerate(jobs):
            at = _INTENT + 16 + i * _ENTRY.size
            _ENTRY.pack_into(self.region, at, job_id, attempt, slots[i])
        _U64.pack_into(self.region, _INTENT + 8, len(jobs))
        _U64.pack_into(self.region, _INTENT, SENT)
        return True

    def answered(self) -> None:
        """The group commit's statement returned: what it did is counted by the child."""
        _U64.pack_into(self.region, _INTENT, ANSWERED)

    def settled(self) -> None:
        _U64.pack_into(self.region, _INTENT, 0)

    # -- the parent ----------------------------------------------------------------------

    def pending(self) -> list[tuple[int, int, Key]]:
        """A dead child's group commit that was sent and not answered: its jobs (id,
        attempt, key), for the database to say which succeeded; [] if there is none."""
        if _U64.unpack_from(self.region, _INTENT)[0] != SENT:
            return []
        keys = {slot: key for slot, (key, _) in enumerate(self._read()) if key is not None}
        n = min(_U64.unpack_from(self.region, _INTENT + 8)[0], INTENT_MAX)
        found = []
        for i in range(n):
            job_id, attempt, slot = _ENTRY.unpack_from(self.region, _INTENT + 16 + i * _ENTRY.size)
            if slot in keys:
                found.append((job_id, attempt, keys[slot]))
        return found

    def changes(self) -> tuple[list[list[object]], int]:
        """What grew since the last call, as Tally.take()'s "jobs" rows ([queue, task,
        outcome, n]), and how many slots were unreadable (dropped)."""
        grown: list[list[object]] = []
        bad = 0
        for key, count in self._read():
            if key is None:
                bad += 1
                continue
            before = self._seen.get(key, 0)
            if count > before:
                grown.append([*key, count - before])
                self._seen[key] = count
            elif count < before:
                bad += 1  # counts never shrink: not the child's doing
        return grown, bad

    def _read(self) -> Iterator[tuple[Key | None, int]]:
        used = _U64.unpack_from(self.region, 0)[0]
        for slot in range(min(used, SLOTS)):
            offset = 8 + slot * _SLOT
            count = _U64.unpack_from(self.region, offset)[0]
            length = _U16.unpack_from(self.region, offset + 8)[0]
            yield _key(self.region[offset + 10 : offset + 10 + min(length, KEY_BYTES)]), count
        if used > SLOTS:
            yield None, 0

    def close(self) -> None:
        self.region.close()


def _key(raw: bytes) -> Key | None:
    try:
        value = json.loads(raw.decode())
    except (UnicodeDecodeError, ValueError):
        return None
    if isinstance(value, list) and len(value) == 3 and all(isinstance(v, str) for v in value):
        return (value[0], value[1], value[2])
    return None
