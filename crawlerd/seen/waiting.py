"""The seen-set's keys pending, where they wait and what they cost, against its bound (``front.py``).

Keys submitted go into a batch on the loop; a job takes the whole batch over to the DRUM thread,
which journals them (DRUM's buckets and files) while the loop starts the next batch. Until that job
ends both are in RAM: the key arrays and each key's aux bytes (its URL record). A merge on the DRUM
thread holds the next job back, so the batch grows by the keys submitted meanwhile; the seen-set's
backpressure bounds it (``max_pending_keys``). Keys DRUM holds (waiting for a merge, or merged and
not handed out) are in its files, not here: ``PendingKeys`` counts them as the last job reported
them, with the batches, and keeps the bound.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

# What a key waiting in RAM costs beyond its aux bytes: 8 B in the batch's key array, a bytes
# object's header (33 B, rounded up by pymalloc) and the aux list's slot (8 B). An estimate, as the
# other components of `crawlerd stats` memory are; the aux bytes are counted exactly.
KEY_RAM_BYTES = 56
PEAK_WINDOW_S = 2.0            # peak_bytes: the most of this window and the one before


class WaitingKeys:
    """The batch being filled and the one a job is taking to DRUM, with their keys and estimated bytes.

    Invariant: ``keys``/``bytes`` describe ``batch`` exactly; ``inflight_*`` the batch handed to the
    job on the DRUM thread (0 once it ended); the window's peak only grows between hand-overs, so it
    is taken at each ``add`` and is exact, not sampled.
    """

    __slots__ = ("batch", "keys", "bytes", "inflight_keys", "inflight_bytes", "_peak", "_peak_prev", "_peak_at")

    def __init__(self) -> None:
        self.batch: list[tuple[np.ndarray, list[bytes] | None]] = []
        self.keys = self.bytes = 0
        self.inflight_keys = self.inflight_bytes = 0
        self._peak = self._peak_prev = 0
        self._peak_at = 0.0

    def add(self, keys: np.ndarray, aux: list[bytes] | None, aux_bytes: int | None = None) -> None:
        """``aux_bytes``: the aux records' total length, when the caller has it."""
        self.batch.append((keys, aux))
        self.keys += len(keys)
        if aux_bytes is None:
            aux_bytes = sum(map(len, aux)) if aux is not None else 0
        self.bytes += len(keys) * KEY_RAM_BYTES + aux_bytes
        self._note()

    def take(self) -> list[tuple[np.ndarray, list[bytes] | None]]:
        """The batch, handed to a job: it counts as in flight until ``landed``."""
        chunks, self.batch = self.batch, []
        self.inflight_keys, self.inflight_bytes = self.keys, self.bytes
        self.keys = self.bytes = 0
        return chunks

    def landed(self) -> None:
        """The job ended: DRUM holds the batch it took."""
        self.inflight_keys = self.inflight_bytes = 0

    @property
    def held_keys(self) -> int:
        return self.keys + self.inflight_keys

    @property
    def held_bytes(self) -> int:
        return self.bytes + self.inflight_bytes

    def peak_bytes(self) -> int:
        """The most ``held_bytes`` reached in the last 2-4 s."""
        self._note()
        return max(self._peak, self._peak_prev)

    def _note(self) -> None:
        now = time.monotonic()
        if now - self._peak_at >= PEAK_WINDOW_S:
            self._peak_prev, self._peak, self._peak_at = self._peak, 0, now
        self._peak = max(self._peak, self.held_bytes)


class PendingKeys:
    """The seen-set's keys submitted and not yet answered, by where they wait, against its bound.

    In RAM: ``waiting`` (the batch and the one in flight) and the merged answers DRUM holds for the
    epoch being handed out (``answers_ram`` bytes). In DRUM's buckets and files: ``drum_pending``
    keys, of which ``unmerged`` wait for a merge and ``ready`` are merged and not handed out, as the
    last job on the DRUM thread reported them (``reported``). ``reserve``: keys the work in flight
    can still submit (the shard: leases in flight times the links a page gave so far).
    Invariant: ``room`` = max(0, ``max_pending_keys`` - keys waiting in RAM - ``reserve()``).
    """

    __slots__ = ("waiting", "max_pending_keys", "reserve", "drum_pending", "ready", "unmerged", "answers_ram")

    def __init__(self, max_pending_keys: int, *, drum_pending: int, ready: int, unmerged: int, answers_ram: int):
        self.waiting = WaitingKeys()
        self.max_pending_keys = max_pending_keys
        self.reserve: Callable[[], int] | None = None
        self.reported(drum_pending, ready, unmerged, answers_ram)

    def reported(self, drum_pending: int, ready: int, unmerged: int, answers_ram: int) -> None:
        """What DRUM holds now (its counts at the end of a job)."""
        self.drum_pending, self.ready, self.unmerged, self.answers_ram = drum_pending, ready, unmerged, answers_ram

    @property
    def keys(self) -> int:
        """Keys submitted and not yet answered: in RAM and in DRUM."""
        return self.waiting.held_keys + self.drum_pending

    @property
    def room(self) -> int:
        """Keys that may still be submitted before the bound (0 at or past it)."""
        held = self.waiting.held_keys + (self.reserve() if self.reserve is not None else 0)
        return max(0, self.max_pending_keys - held)

    def memory(self) -> dict:
        """The keys waiting in RAM and DRUM's merged answers held in RAM, against the bound: bytes
        now and the most of the last 2-4 s (``peak_bytes``), keys; the keys in DRUM's files cost no
        private memory beyond its fixed buffers and are given as counts."""
        w = self.waiting
        ram, keys = w.held_bytes, w.held_keys
        per_key = ram / keys if keys else KEY_RAM_BYTES + 100
        return {"bytes": ram + self.answers_ram, "cap_bytes": int(self.max_pending_keys * per_key),
                "peak_bytes": w.peak_bytes() + self.answers_ram,
                "entries": keys, "cap_keys": self.max_pending_keys,
                "reserve_keys": self.reserve() if self.reserve is not None else 0,
                "answers_bytes": self.answers_ram, "unmerged_keys": self.unmerged,
                "ready_keys": self.ready}
