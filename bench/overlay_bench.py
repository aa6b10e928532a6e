"""The overlay's loop-side CPU: puts, cursor seeks, cached gets, commits and landings (branch loop13).

An :class:`~crawlerd.store.overlay.Overlay` on a table of ``--table`` committed keys is driven the
way the budget store drives it on the loop: each *layer* writes ``--puts`` keys (a share of them
written again from the last layers, as BEAST's FIFO heads and turns are), makes ``--seeks`` cursor
seeks with a few steps each and ``--gets`` gets of keys read before (a read-cached table), and
commits. The writer is a stub: the layers handed over are applied in groups of ``--group`` on the
calling thread (outside the clock), ``--pending`` groups behind the newest, and then their landings
(``Overlay._landed``: the view, the read cache and the sorted keys brought up to date) run on the
clock. Prints µs of loop-side work per layer, and the landings' share, per shape.

    .venv/bin/python bench/overlay_bench.py [--tree DIR] [--layers 3000] [--runs 3]

``--tree DIR`` imports crawlerd from another tree (the base), so one script times both.
Single-threaded and CPU-bound: run both trees back to back, alternated, on a box as quiet as it gets.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from collections import deque

SHAPES = {
    # name: (puts per layer, share rewritten, seeks per layer, gets per layer, layers per group, groups pending)
    "small-layers": (40, 0.3, 4, 20, 6, 1),
    "large-layers": (400, 0.2, 4, 40, 4, 1),
    "deep-backlog": (100, 0.3, 4, 20, 6, 3),
    "seek-heavy": (40, 0.3, 40, 20, 6, 1),
}


class StubWriter:
    """Keeps what the overlay hands over; the bench applies and lands it when it chooses."""

    def __init__(self) -> None:
        self.items: deque = deque()

    def submit(self, sink, item=None, then=None) -> None:
        self.items.append((sink, item, then))

    def barrier(self, then) -> None:
        self.items.append((None, None, then))


def run_shape(Overlay, env, db, keys: list[bytes], shape, layers: int, seed: int) -> tuple[float, float]:
    puts, rewrite, seeks, gets, per_group, pending = shape
    rng = random.Random(seed)
    w = StubWriter()
    ov = Overlay(env, w, None, read_cache={db: 4 << 20})
    ov.loop_thread = -1                 # the stub applies the writes on this thread
    recent: deque[bytes] = deque(maxlen=puts * 4)
    loop_s = land_s = 0.0
    groups: deque[list] = deque()
    current: list = []
    clock = time.perf_counter
    for n in range(layers):
        t0 = clock()
        for _ in range(puts):
            if recent and rng.random() < rewrite:
                k = recent[rng.randrange(len(recent))]
            else:
                k = rng.randbytes(8)
                recent.append(k)
            ov.put(k, rng.randbytes(16), db=db)
        for _ in range(seeks):
            cur = ov.cursor(db=db)
            if cur.set_range(rng.randbytes(2)):
                for _ in range(3):
                    cur.key()
                    if not cur.next():
                        break
        for _ in range(gets):
            ov.get(keys[rng.randrange(len(keys))] if rng.random() < 0.7 else recent[rng.randrange(len(recent))], db=db)
        ov.commit()
        loop_s += clock() - t0
        current.append(w.items.popleft())
        if len(current) == per_group or n == layers - 1:
            groups.append(current)
            current = []
        while len(groups) > pending or (n == layers - 1 and groups):
            group = groups.popleft()
            sink = group[0][0]
            sink([item for _, item, _ in group])            # the writer's work: not timed
            t0 = clock()
            for _, _, then in group:
                then()
            d = clock() - t0
            land_s += d
            loop_s += d
    ov.close()
    return loop_s / layers * 1e6, land_s / layers * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", help="import crawlerd from this tree (default: this script's)")
    ap.add_argument("--layers", type=int, default=3000)
    ap.add_argument("--table", type=int, default=50_000, help="committed keys in the table at the start")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--shape", action="append", choices=sorted(SHAPES), help="default: all")
    args = ap.parse_args(argv)
    sys.path.insert(0, args.tree or os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import lmdb

    from crawlerd.store.overlay import Overlay

    print(f"crawlerd from {os.path.dirname(os.path.dirname(sys.modules['crawlerd.store.overlay'].__file__))}")
    print(f"{'shape':14} {'µs/layer (runs)':>28} {'of it landing':>22}")
    for name in args.shape or list(SHAPES):
        per, land = [], []
        for r in range(args.runs):
            with tempfile.TemporaryDirectory() as d:
                env = lmdb.open(d, map_size=1 << 30, max_dbs=2, sync=False, metasync=False)
                db = env.open_db(b"t")
                rng = random.Random(1000 + r)
                keys = sorted(rng.randbytes(8) for _ in range(args.table))
                with env.begin(write=True) as txn:
                    txn.cursor(db=db).putmulti([(k, b"v" * 16) for k in keys])
                a, b = run_shape(Overlay, env, db, keys, SHAPES[name], args.layers, seed=r)
                env.close()
            per.append(a)
            land.append(b)
        print(f"{name:14} {' '.join(f'{x:8.1f}' for x in per):>28} {' '.join(f'{x:6.1f}' for x in land):>22}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
