"""A bound in bytes on what stores hold for the writer thread: their overlays' layers not landed.

A store written on the writer thread (``store/overlay.py``) holds each write in RAM, in its
overlay, from the loop's ``put`` until the writer's commit of it lands; how much that is follows
the writer's backlog (a slow group, an fsync), not the crawl's size. :class:`UnlandedGate` bounds
it: the loop's steps that write to the gated overlays ask ``crowded()`` first and, when it says so,
wait for a landing (``when_room``): backpressure on whatever feeds the step, nothing dropped.

Key: the gate's overlays (one store's, or several written by the same steps). Invariant: a step
runs only while the overlays' unlanded bytes plus ``extra`` (what the store holds outside the
overlay for its next commit) are at most half of ``cap_bytes``; a step adds less than the other
half (``largest_step_bytes`` in stats), so the bytes stay within ``cap_bytes``. Waiting steps run
in order at the first landing that leaves room; with no layer pending to land, the open one is
handed over (``commit``), so a wait always ends once the writer runs. ``close()`` (shutdown) drops
the waiting steps: each caller says what happens to a step that never ran (not acknowledged, so
delivered again; left for the final commit).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable

from crawlerd.store.overlay import Overlay


class UnlandedGate:
    """Backpressure on the loop's steps that write to ``overlays`` (see the module docstring).

    ``cap_bytes`` 0: no bound (``crowded`` is always False). ``commit`` hands the open layers over
    (a consistent point: called between steps). ``extra``: estimated bytes the stores hold for their
    next commit outside the overlays (0 when not given)."""

    def __init__(self, cap_bytes: int, commit: Callable[[], None], extra: Callable[[], int] | None = None):
        self.cap_bytes = cap_bytes
        # weakly held: the store that owns the gate (and its LMDB environment) is freed as soon as
        # it is dropped, never later by the cyclic collector in the middle of another store's work
        self._commit = _weak(commit)
        self._extra = _weak(extra) if extra is not None else None
        landed = weakref.WeakMethod(self._on_landed)
        self._hook = lambda: (f := landed()) is not None and f()      # an overlay's on_landed
        self._overlays: list[Overlay] = []
        self._waiters: list[Callable[[], None]] = []
        self._open = True               # False once closing: no step waits any more
        self.largest_step = 0           # the most bytes one step added (between two ``crowded`` calls)
        self._added_mark = 0
        self.waits = 0                  # steps that waited
        self.wait_s = 0.0               # time some step waited, in all
        self._waited_since = 0.0

    def attach(self, overlay: Overlay) -> None:
        """Gate ``overlay`` too (from now until ``detach``); its landings end waits."""
        self._overlays.append(overlay)
        if self.cap_bytes:
            overlay.on_landed = self._hook

    def detach(self, overlay: Overlay) -> None:
        if overlay in self._overlays:
            self._overlays.remove(overlay)
            if overlay.on_landed is self._hook:
                overlay.on_landed = None

    @property
    def active(self) -> bool:
        return bool(self.cap_bytes and self._overlays and self._open)

    def extra_bytes(self) -> int:
        return self._extra()() if self._extra is not None else 0

    def held_bytes(self, extra: int | None = None) -> int:
        """The overlays' unlanded bytes plus ``extra`` (read now when not given)."""
        if extra is None:
            extra = self.extra_bytes()
        return sum(ov.unlanded_bytes for ov in self._overlays) + extra

    def crowded(self) -> bool:
        """Whether a step that writes to the overlays must wait for a landing (``when_room``) first.
        Called once per step: what was added since the last call is one step's (``largest_step``)."""
        if not self.active:
            return False
        extra = self.extra_bytes()
        added = sum(ov.added_bytes for ov in self._overlays) + extra
        step, self._added_mark = added - self._added_mark, added
        if step > self.largest_step:
            self.largest_step = step
        return self._over(extra)

    def _over(self, extra: int) -> bool:
        held = self.held_bytes(extra)
        return held > 0 and 2 * held > self.cap_bytes

    def _pending(self) -> bool:
        return any(ov.pending for ov in self._overlays)

    def when_room(self, step: Callable[[], None]) -> None:
        """Run ``step`` on the loop at the first landing that leaves room (after ``crowded`` said
        True; the step asks again then). The open layers are handed over now if none is pending."""
        if not self._open:
            return
        if not self._waiters:
            self._waited_since = time.monotonic()
        self._waiters.append(step)
        self.waits += 1
        if not self._pending():
            self._commit()()          # the open layers hold it all: a landing needs them handed over

    def crowded_wake(self, wake: Callable[[], None]) -> bool:
        """``crowded``; if so, ``wake`` runs at the landing that leaves room (registered once however
        often this is asked meanwhile): for a step the loop retries by itself, such as leasing."""
        if not self.crowded():
            return False
        if wake not in self._waiters:
            self.when_room(wake)
        return True

    @property
    def waiting(self) -> int:
        """Steps waiting for room."""
        return len(self._waiters)

    def _on_landed(self) -> None:
        if not self._waiters or not self._open:
            return
        if self._over(self.extra_bytes()):
            if not self._pending():
                self._commit()()
            return
        self.wait_s += time.monotonic() - self._waited_since
        waiters, self._waiters = self._waiters, []
        for step in waiters:
            step()

    def close(self) -> None:
        """Closing: the waiting steps are dropped (each caller's docstring says what that means for
        it), none waits again."""
        self._open = False
        self._waiters = []

    def memory(self) -> dict[str, int]:
        """The unlanded writes against the bound (`crawlerd stats` memory): the overlays' bytes now
        (``extra_bytes`` apart), the most of the last 2-4 s and ever (the overlays' summed: an upper bound
        when several are gated), keys, layers, the largest step, the waits and their time."""
        ms = [ov.memory() for ov in self._overlays]
        extra = self.extra_bytes()
        return {"bytes": sum(m["bytes"] for m in ms), "cap_bytes": self.cap_bytes,
                "peak_bytes": sum(m["peak_bytes"] for m in ms),
                "high_water_bytes": sum(m["high_water_bytes"] for m in ms),
                "entries": sum(m["entries"] for m in ms), "layers": sum(m["layers"] for m in ms),
                "extra_bytes": extra, "largest_step_bytes": self.largest_step,
                "waits": self.waits, "wait_s": round(self.wait_s, 3)}


def _weak(f: Callable) -> Callable[[], Callable]:
    """A reference to ``f`` that does not keep its object alive: call it for ``f`` (a bound method
    held weakly; any other callable as it is)."""
    if hasattr(f, "__self__") and hasattr(f, "__func__"):
        return weakref.WeakMethod(f)
    return lambda: f
