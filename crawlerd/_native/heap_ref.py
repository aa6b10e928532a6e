"""Pure-Python reference for ``crawlerd._native.heap.DueHeap`` (same API, same results).

A binary heap of ``[due, host]`` lists plus a dict ``host -> slot``. Slower
than the native 4-ary heap but simple enough to read against the spec; the
tests run the same operation sequences against both.
"""

from __future__ import annotations

import math
import operator

_MAX_HOST = 2**31 - 1


def _host_of(host_id: object) -> int:
    v = operator.index(host_id)
    if v < 0 or v > _MAX_HOST:
        raise ValueError(f"host id out of range [0, 2**31): {host_id!r}")
    return v


def _due_of(due: object) -> float:
    if isinstance(due, (str, bytes)):
        raise TypeError("due time must be a number")
    d = float(due)  # type: ignore[arg-type]
    if math.isnan(d):
        raise ValueError("due time is NaN")
    return d


class RefDueHeap:
    """Min-heap of (due, host_id) with update-key and remove.

    Key: host id (each host at most once). Order: (due, host_id) ascending.
    Invariant: ``self._pos[self._heap[i][1]] == i`` for every slot, and no
    entry sorts before its parent.
    """

    def __init__(self, capacity: int = 1024) -> None:
        self._heap: list[list] = []
        self._pos: dict[int, int] = {}

    def _place(self, i: int, entry: list) -> None:
        self._heap[i] = entry
        self._pos[entry[1]] = i

    def _sift_up(self, i: int) -> None:
        entry = self._heap[i]
        while i > 0:
            parent = (i - 1) // 2
            if not entry < self._heap[parent]:
                break
            self._place(i, self._heap[parent])
            i = parent
        self._place(i, entry)

    def _sift_down(self, i: int) -> None:
        entry = self._heap[i]
        n = len(self._heap)
        while True:
            child = 2 * i + 1
            if child >= n:
                break
            if child + 1 < n and self._heap[child + 1] < self._heap[child]:
                child += 1
            if not self._heap[child] < entry:
                break
            self._place(i, self._heap[child])
            i = child
        self._place(i, entry)

    def _delete_slot(self, i: int) -> None:
        del self._pos[self._heap[i][1]]
        last = self._heap.pop()
        if i == len(self._heap):
            return
        self._place(i, last)
        if i > 0 and last < self._heap[(i - 1) // 2]:
            self._sift_up(i)
        else:
            self._sift_down(i)

    def _set_due(self, i: int, due: float) -> None:
        old = self._heap[i][0]
        self._heap[i][0] = due
        if due < old:
            self._sift_up(i)
        elif due > old:
            self._sift_down(i)

    def push(self, host_id: int, due: float) -> None:
        host, d = _host_of(host_id), _due_of(due)
        if host in self._pos:
            raise ValueError(f"host {host} already in heap")
        self._heap.append([d, host])
        self._sift_up(len(self._heap) - 1)

    def update(self, host_id: int, due: float) -> None:
        host, d = _host_of(host_id), _due_of(due)
        if host not in self._pos:
            raise KeyError(host)
        self._set_due(self._pos[host], d)

    def push_or_update(self, host_id: int, due: float) -> None:
        host, d = _host_of(host_id), _due_of(due)
        if host in self._pos:
            self._set_due(self._pos[host], d)
        else:
            self._heap.append([d, host])
            self._sift_up(len(self._heap) - 1)

    def remove(self, host_id: int) -> bool:
        i = self._pos.get(operator.index(host_id))
        if i is None:
            return False
        self._delete_slot(i)
        return True

    def pop(self) -> tuple[int, float]:
        if not self._heap:
            raise IndexError("pop from empty DueHeap")
        due, host = self._heap[0]
        self._delete_slot(0)
        return host, due

    def peek(self) -> tuple[int, float] | None:
        if not self._heap:
            return None
        due, host = self._heap[0]
        return host, due

    def pop_due(self, now: float, limit: int) -> list[int]:
        now = float(now)
        limit = operator.index(limit)
        if limit < 0:
            raise ValueError("limit must be >= 0")
        out: list[int] = []
        while len(out) < limit and self._heap and self._heap[0][0] <= now:
            out.append(self._heap[0][1])
            self._delete_slot(0)
        return out

    def due_of(self, host_id: int) -> float | None:
        i = self._pos.get(operator.index(host_id))
        return None if i is None else self._heap[i][0]

    def __contains__(self, host_id: object) -> bool:
        return operator.index(host_id) in self._pos

    def __len__(self) -> int:
        return len(self._heap)

    def clear(self) -> None:
        self._heap.clear()
        self._pos.clear()

    def check_invariant(self) -> None:
        for i, (_, host) in enumerate(self._heap):
            if self._pos[host] != i:
                raise AssertionError(f"pos[{host}] != {i}")
            if i > 0 and self._heap[i] < self._heap[(i - 1) // 2]:
                raise AssertionError(f"slot {i} sorts before its parent")
        if len(self._pos) != len(self._heap):
            raise AssertionError(f"{len(self._pos)} hosts indexed, {len(self._heap)} in heap")
