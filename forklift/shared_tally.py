"""A worker's tally of job outcomes, kept in memory its supervisor shares, so what a
killed worker finished is still counted.

The supervisor maps an anonymous shared region before the fork, and the child adds each
outcome to a counter there in the same thread, right after the statement that recorded
the outcome returns: only a kill in those microseconds loses one (counts sent over the
report pipe every half second would lose the last half second of them to a SIGKILL).
The supervisor reads the counters as the child reports and once more after it exited,
and adds what grew.

A group commit's completions are the other gap: the statement commits on the server
while the worker waits for its answer, and a kill then loses them all (hundreds at full
speed). So before it sends one, the worker writes its jobs (id, attempt) as an intent
under a fresh generation number, and marks each slot the intent counts into as not yet
folded. When the statement returns, the worker folds the successes into those slots,
each with one aligned 8-byte store that carries the new count and the intent's
generation together, then clears the intent. (The words are written through a
memoryview of 8-byte items, one memcpy each: struct's pack_into zeroes its bytes before
it writes them, so a reader could see a count of 0.) A supervisor that finds an intent
in a dead child's memory asks the database which attempts succeeded (`unanswered()`)
for the slots not yet folded, and counts those: a kill at any instruction counts each
job once.

Layout: a header of one u64 (slots in use), then SLOTS slots of [u64 word: generation
(high 20 bits) and count (low 44)][u16 key length][key: UTF-8 JSON of [queue, task,
outcome]], then the intent: [u64 state: 0 none, 1 sent][u64 entries][u64 generation]
and INTENT_MAX entries of [u64 job id][u32 attempt][u32 slot]. Only the child writes: a
slot's key first, then the header (a new slot is published after its key is whole);
words are aligned 8-byte stores; an intent's entries and its slots' marks before its
state. The supervisor trusts nothing in it: a key that does not parse, a count that
shrank or a slot number out of range is dropped, and said to be malformed.
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
# The intent's three words, as indexes among the region's u64 words.
_INTENT_STATE, _INTENT_JOBS, _INTENT_GENERATION = _INTENT // 8, _INTENT // 8 + 1, _INTENT // 8 + 2
_ENTRIES = _INTENT + 24
_ENTRY = struct.Struct("<QII")
SIZE = _ENTRIES + INTENT_MAX * _ENTRY.size  # ~0.5 MiB, touched only as it is used
_U16 = struct.Struct("<H")
SENT = 1
_COUNT_BITS = 44  # 1.7e13 outcomes of one key in one child's life
_COUNT = (1 << _COUNT_BITS) - 1
_GENERATIONS = 1 << 20  # 0 is "not folded"; wraps harmlessly (only the current is compared)

Key = tuple[str, str, str]


def _word_of(slot: int) -> int:
    """The index of a slot's count word among the region's u64 words."""
    return (8 + slot * _SLOT) // 8


class SharedTally:
    """One child's counters. The child calls `add()` (under its own lock); the parent
    calls `changes()`."""

    def __init__(self, fd: int = -1) -> None:
        # Anonymous (shared with the children forked after), or the file `fd` (a memfd
        # the supervisor maps and hands to its fork server for the child).
        self.region = mmap.mmap(fd, SIZE)
        self._words = memoryview(self.region).cast("Q")  # the region as aligned u64 words
        self._slot: dict[Key, int] = {}  # the child's own index of its slots
        # The child's group commit in flight: its generation and the slots of its keys.
        self._intent: tuple[int, dict[Key, int]] | None = None
        self._generation = 0
        self._seen: dict[Key, int] = {}  # the parent's: the counts it has added

    # -- the child -----------------------------------------------------------------------

    def add(self, key: Key, n: int = 1) -> bool:
        """Count `n` more of `key`; False when every slot is taken (count it elsewhere)."""
        slot = self._slot.get(key)
        if slot is None:
            slot = self._new_slot(key)
            if slot is None:
                return False
        self._bump(slot, n)
        return True

    def _bump(self, slot: int, n: int, generation: int | None = None) -> None:
        """Add `n` to a slot's count in one store, keeping its generation unless given."""
        at = _word_of(slot)
        word = self._words[at]
        if generation is None:
            generation = word >> _COUNT_BITS
        count = ((word & _COUNT) + n) & _COUNT
        self._words[at] = generation << _COUNT_BITS | count

    def _new_slot(self, key: Key) -> int | None:
        used = len(self._slot)
        encoded = json.dumps(list(key), ensure_ascii=False).encode()
        if used >= SLOTS or len(encoded) > KEY_BYTES:
            return None
        offset = 8 + used * _SLOT
        self._words[_word_of(used)] = 0
        _U16.pack_into(self.region, offset + 8, len(encoded))
        self.region[offset + 10 : offset + 10 + len(encoded)] = encoded
        self._words[0] = used + 1  # published: its key is whole
        self._slot[key] = used
        return used

    def intend(self, jobs: list[tuple[int, int, Key]]) -> bool:
        """Before a group commit of these (id, attempt, key): False if it cannot be
        written (too many, or no slot left), and then it is not."""
        if len(jobs) > INTENT_MAX:
            return False
        slots: dict[Key, int] = {}
        for _, _, key in jobs:
            slot = self._slot.get(key)
            if slot is None and (slot := self._new_slot(key)) is None:
                return False
            slots[key] = slot
        self._generation = self._generation % (_GENERATIONS - 1) + 1
        for slot in slots.values():
            self._bump(slot, 0, generation=0)  # not folded into by this intent yet
        for i, (job_id, attempt, key) in enumerate(jobs):
            _ENTRY.pack_into(self.region, _ENTRIES + i * _ENTRY.size, job_id, attempt, slots[key])
        self._words[_INTENT_JOBS] = len(jobs)
        self._words[_INTENT_GENERATION] = self._generation
        self._words[_INTENT_STATE] = SENT
        self._intent = (self._generation, slots)
        return True

    def fold(self, succeeded: dict[Key, int]) -> None:
        """The intent's statement returned: count its successes (every key was in the
        intent), each slot in one store that also marks it folded, then clear it."""
        assert self._intent is not None, "fold() without an intent"
        generation, slots = self._intent
        for key, slot in slots.items():
            self._bump(slot, succeeded.get(key, 0), generation=generation)
        self.settled()

    def settled(self) -> None:
        """No group commit is in flight (answered and counted, or given up)."""
        self._words[_INTENT_STATE] = 0
        self._intent = None

    @property
    def intended(self) -> bool:
        return self._intent is not None

    # -- the parent ----------------------------------------------------------------------

    def unanswered(self) -> list[tuple[int, int, Key]]:
        """A dead child's group commit that was sent and not counted: its jobs (id,
        attempt, key) in slots not yet folded, for the database to say which succeeded;
        [] if there is none."""
        if self._words[_INTENT_STATE] != SENT:
            return []
        generation = self._words[_INTENT_GENERATION]
        keys = {slot: key for slot, (key, _) in enumerate(self._read()) if key is not None}
        n = min(self._words[_INTENT_JOBS], INTENT_MAX)
        found = []
        for i in range(n):
            job_id, attempt, slot = _ENTRY.unpack_from(self.region, _ENTRIES + i * _ENTRY.size)
            if slot in keys and self._word(slot) >> _COUNT_BITS != generation:
                found.append((job_id, attempt, keys[slot]))
        return found

    def _word(self, slot: int) -> int:
        return int(self._words[_word_of(slot)])

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
        used = self._words[0]
        for slot in range(min(used, SLOTS)):
            offset = 8 + slot * _SLOT
            count = self._word(slot) & _COUNT
            length = _U16.unpack_from(self.region, offset + 8)[0]
            yield _key(self.region[offset + 10 : offset + 10 + min(length, KEY_BYTES)]), count
        if used > SLOTS:
            yield None, 0

    def close(self) -> None:
        self._words.release()
        self.region.close()


def _key(raw: bytes) -> Key | None:
    try:
        value = json.loads(raw.decode())
    except (UnicodeDecodeError, ValueError):
        return None
    if isinstance(value, list) and len(value) == 3 and all(isinstance(v, str) for v in value):
        return (value[0], value[1], value[2])
    return None
