"""What one ``QueueHeads.memory()`` costs (asked at each ``crawlerd status``: the bench's watcher,
``make run``'s progress and operators ask every second), µs per call with ``--queues`` cached
queues of ``--depth`` entries.

    .venv/bin/python bench/heads_memory_bench.py [--queues 30000] [--depth 4] [--calls 200]

Run it with each tree's Python to compare (from outside a source tree, so each imports its own
crawlerd).
"""

from __future__ import annotations

import argparse
import timeit

from crawlerd.frontier.heads import QueueHeads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queues", type=int, default=30_000)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    heads = QueueHeads(depth=args.depth, cap_bytes=1 << 40)
    for i in range(args.queues):
        p = i.to_bytes(4, "big") + b"\0"
        heads.fill(p, [(p + j.to_bytes(8, "big"), b"x" * 40) for j in range(args.depth)], False)
    per_call = timeit.timeit(heads.memory, number=args.calls) / args.calls
    m = heads.memory()
    print(f"memory(): {per_call * 1e6:.1f} us per call with {m['queues']} queues, {m['entries']} entries")


if __name__ == "__main__":
    main()
