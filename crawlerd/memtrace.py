"""A debug switch that finds what grows: the crawl process's Python allocations, snapshotted.

With ``CRAWLERD_TRACEMALLOC_S=N`` in its environment the crawl process traces its allocations
(``tracemalloc``) and every ``N`` seconds writes a snapshot to
``<shard state>/tracemalloc/<seconds since start>.snap``, beside it a census of the objects the
collector tracks by type (``.types.json``: count and ``sys.getsizeof`` bytes per type); off (unset
or 0) it costs nothing. ``CRAWLERD_TRACEMALLOC_START_S=T`` starts tracing only ``T`` seconds in
(the warm-up runs at full speed and fills the caps; what is allocated after ``T`` and still live is
what the snapshots show), ``CRAWLERD_TRACEMALLOC_FRAMES=F`` keeps ``F`` frames per allocation
(default 1). Tracing slows the loop several-fold, so it is for diagnosis only, never for a measured
run. Compare two snapshots (what grew between them, by source line or by traceback), or follow
the top growers over every snapshot of a directory::

    python -m crawlerd.memtrace OLD.snap NEW.snap [TOP] [--traceback]
    python -m crawlerd.memtrace --series DIR [TOP]

Only Python's allocator is traced: C allocations (LMDB, libcurl, the native kernels' ``malloc``)
show in ``crawlerd stats`` ``malloc`` (glibc's heap numbers) instead.
"""

from __future__ import annotations

import gc
import glob
import json
import logging
import os
import sys
import time
import tracemalloc

from crawlerd.allocator import heap_stats, pymalloc_stats, rss_anon

ENV = "CRAWLERD_TRACEMALLOC_S"
MEMLOG_ENV = "CRAWLERD_WORKER_MEMLOG_S"
START_ENV = "CRAWLERD_TRACEMALLOC_START_S"
FRAMES_ENV = "CRAWLERD_TRACEMALLOC_FRAMES"
log = logging.getLogger("crawlerd.memtrace")


def _env_number(name: str, default: float) -> float | None:
    """The number in environment variable ``name`` (``default`` when unset or empty); None, with a
    warning naming the variable, when it is not a number (tracing then stays off)."""
    raw = os.environ.get(name, "")
    try:
        return float(raw or default)
    except ValueError:
        log.warning("%s=%r is not a number: allocation tracing stays off", name, raw)
        return None


class MemTrace:
    """Snapshots to ``directory`` every ``interval_s`` once ``start_s`` has passed; invariant:
    snapshot files are named by the whole seconds since the tracer was made, so their names sort
    in time order, and tracing runs from ``start_s`` on (from the start when it is 0)."""

    def __init__(self, directory: str, interval_s: float, clock=time.monotonic, start_s: float = 0.0,
                 frames: int = 1) -> None:
        self.directory = directory
        self.interval_s = interval_s
        self.clock = clock
        self.start_s = start_s
        self.frames = max(1, int(frames))
        os.makedirs(directory, exist_ok=True)
        self.t0 = clock()
        self.last = self.t0
        if start_s <= 0:
            self._start()

    def _start(self) -> None:
        if not tracemalloc.is_tracing():
            tracemalloc.start(self.frames)

    @classmethod
    def from_env(cls, directory: str, clock=time.monotonic) -> MemTrace | None:
        """A tracer if ``CRAWLERD_TRACEMALLOC_S`` is a positive number of seconds, else None."""
        interval_s = _env_number(ENV, 0)
        start_s = _env_number(START_ENV, 0)
        frames = _env_number(FRAMES_ENV, 1)
        if not interval_s or interval_s <= 0 or start_s is None or frames is None:
            return None
        return cls(directory, interval_s, clock, start_s=start_s, frames=int(frames))

    def maybe_dump(self, now: float | None = None) -> str | None:
        """Start tracing once ``start_s`` passed; write a snapshot (and its type census) if the
        interval passed since the last one or the start; its path, or None."""
        now = self.clock() if now is None else now
        if not tracemalloc.is_tracing():
            if now - self.t0 >= self.start_s:
                self._start()
                self.last = now
            return None
        if now - self.last < self.interval_s:
            return None
        self.last = now
        path = os.path.join(self.directory, f"{int(now - self.t0):07d}.snap")
        tracemalloc.take_snapshot().dump(path)
        with open(path[:-len(".snap")] + ".types.json", "w") as f:
            json.dump(type_census(), f)
        return path


class MemLog:
    """A processing worker's memory, one JSON line every ``interval_s`` appended to ``path``
    (``CRAWLERD_WORKER_MEMLOG_S=N``; diagnosis only): the pages it served, its RssAnon, Python's
    arenas and allocated bytes (pymalloc), its allocated blocks, glibc's heap in use, the
    collector's generation counts and what its collections freed. Invariant: lines are in time
    order, ``pages`` never falls. Reading the arenas walks every pool (~ms): not for a measured run;
    while tracemalloc traces (it wraps pymalloc) the arenas read as null."""

    def __init__(self, path: str, interval_s: float, clock=time.monotonic) -> None:
        self.path = path
        self.interval_s = interval_s
        self.clock = clock
        self.t0 = clock()
        self.last: float | None = None
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)

    @classmethod
    def from_env(cls, path: str, clock=time.monotonic) -> MemLog | None:
        """A log if ``CRAWLERD_WORKER_MEMLOG_S`` is a positive number of seconds, else None."""
        interval_s = _env_number(MEMLOG_ENV, 0)
        return cls(path, interval_s, clock) if interval_s and interval_s > 0 else None

    def maybe_write(self, pages: int, now: float | None = None) -> bool:
        """Append a line if the interval passed since the last (or none was written); True if it did."""
        now = self.clock() if now is None else now
        if self.last is not None and now - self.last < self.interval_s:
            return False
        self.last = now
        py = pymalloc_stats()
        line = {"t": round(now - self.t0, 3), "pages": pages, "rss_anon": rss_anon(),
                "arenas": py.get("arenas"), "arenas_max": py.get("arenas_max"), "py_allocated": py.get("allocated"),
                "py_blocks": sys.getallocatedblocks(), "c_in_use": heap_stats().get("in_use"),
                "gc_count": list(gc.get_count()), "gc_collected": [g["collected"] for g in gc.get_stats()],
                "gc_collections": [g["collections"] for g in gc.get_stats()]}
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")
        return True


def type_census() -> dict[str, list[int]]:
    """Objects the collector tracks, by type name: [count, bytes by sys.getsizeof] (the containers'
    own size: a dict's table, a list's array; not what they hold)."""
    out: dict[str, list[int]] = {}
    for o in gc.get_objects():
        t = type(o)
        name = f"{t.__module__}.{t.__qualname__}" if t.__module__ != "builtins" else t.__qualname__
        row = out.get(name)
        if row is None:
            row = out[name] = [0, 0]
        row[0] += 1
        try:
            row[1] += sys.getsizeof(o)
        except TypeError:
            pass
    return out


def _census_diff(old: str, new: str, top: int) -> list[str]:
    paths = [p[:-len(".snap")] + ".types.json" for p in (old, new)]
    if not all(os.path.exists(p) for p in paths):
        return []
    with open(paths[0]) as f:
        a = json.load(f)
    with open(paths[1]) as f:
        b = json.load(f)
    rows = [(b.get(k, [0, 0])[1] - a.get(k, [0, 0])[1], b.get(k, [0, 0])[0] - a.get(k, [0, 0])[0], k)
            for k in set(a) | set(b)]
    rows.sort(key=lambda r: -abs(r[0]))
    return ["types (count, getsizeof bytes):"] + [f"  {k}: {dn:+d} objects, {db / 1024:+.1f} KiB"
                                                  for db, dn, k in rows[:top]]


def grown(old: str, new: str, top: int = 30, by: str = "lineno") -> list[str]:
    """What grew most from snapshot ``old`` to ``new``: by source line (``by="lineno"``) or by the
    whole traceback kept (``by="traceback"``), then the type census's largest changes."""
    a, b = tracemalloc.Snapshot.load(old), tracemalloc.Snapshot.load(new)
    total = sum(s.size for s in b.statistics("filename")) - sum(s.size for s in a.statistics("filename"))
    lines = [f"total {total / 1024:+.1f} KiB"]
    for d in b.compare_to(a, by)[:top]:
        if by == "traceback":
            lines.append(f"{d.size_diff / 1024:+.1f} KiB ({d.count_diff:+d} blocks), now {d.size / 1024:.1f} KiB")
            lines += [f"    {fr.filename}:{fr.lineno}" for fr in d.traceback]
        else:
            lines.append(str(d))
    return lines + _census_diff(old, new, top)


def series(directory: str, top: int = 30) -> list[str]:
    """The source lines that grew most from the first snapshot in ``directory`` to the last, with
    their live KiB at every snapshot (a steady rise, not a swing, is what grows with the crawl)."""
    paths = sorted(glob.glob(os.path.join(directory, "*.snap")))
    if len(paths) < 2:
        return []
    stats = [{s.traceback[0]: s.size for s in tracemalloc.Snapshot.load(p).statistics("lineno")} for p in paths]
    keys = sorted(set(stats[0]) | set(stats[-1]), key=lambda k: -(stats[-1].get(k, 0) - stats[0].get(k, 0)))
    out = ["snapshots (s): " + " ".join(os.path.basename(p)[:-len(".snap")].lstrip("0") or "0" for p in paths)]
    for k in keys[:top]:
        out.append(f"{k.filename}:{k.lineno}  " + " ".join(f"{s.get(k, 0) / 1024:.0f}" for s in stats) + " KiB")
    return out


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if "--series" in sys.argv:
        print("\n".join(series(args[0], int(args[1]) if len(args) > 1 else 30)))
    else:
        print("\n".join(grown(args[0], args[1], int(args[2]) if len(args) > 2 else 30,
                              "traceback" if "--traceback" in sys.argv else "lineno")))
