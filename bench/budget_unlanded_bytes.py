"""The budget store's unlanded writes: the bytes the overlay charges for its layers not landed
(``budgets.unlanded_bytes``, ``memory.budget_unlanded``) against the bytes they really hold (issue 14).

A crawl-shaped stream goes through a whole budget stage (``Budgets``: BEAST and STAR on one
store) with a ``WriteThread`` attached and held, so nothing lands: intake slices of new URLs
(``offer_many``; domains drawn by a Zipf law, a few hosts each, a slice's URLs grouped by host as
a page's links are), an edge delivery applied to the graph after every few slices (each page's
links to 8 domains, as the edge DRUM answers them), readmissions as the reader moves on, a commit
after each slice (a layer each). Then the writer is let go: the real bytes are what tracemalloc
sees freed once every layer landed (the overlay's sorted key lists pruned), against the drop of
the overlay's charge, ``unlanded_bytes``.

    nice -n 10 .venv/bin/python bench/budget_unlanded_bytes.py [slices...]
    nice -n 10 .venv/bin/python bench/budget_unlanded_bytes.py 10 40 120
"""

from __future__ import annotations

import asyncio
import collections
import gc
import random
import sys
import tempfile
import tracemalloc

from crawlerd.frontier.budgets import Budgets
from crawlerd.store.writer import WriteThread

SLICE = 512             # intake answers per slice (the shard's intake slice)
_Answer = collections.namedtuple("_Answer", "seq unique aux key")


def _zipf(rng: random.Random, n: int, s: float = 1.1) -> list[float]:
    w = [1 / (k ** s) for k in range(1, n + 1)]
    total = sum(w)
    return [x / total for x in w]


def stream(slices: int, domains: int = 5000, seed: int = 1):
    """Per slice: (records, fingerprints, host keys) of ``SLICE`` new URLs, host runs together, and
    the pages' (source domain, linked domains) for an edge delivery. Deterministic."""
    rng = random.Random(seed)
    weights = _zipf(rng, domains)
    names = [f"d{i}.example" for i in range(domains)]
    fp = 0
    for _ in range(slices):
        doms = rng.choices(range(domains), weights, k=SLICE // 8)      # a page's links: 8 per host
        hosts = sorted(f"http://h{rng.randrange(4)}.{names[d]}" for d in doms)
        keys, recs, fps = [], [], []
        for h in hosts:
            for _ in range(8):
                fp += 1
                url = f"{h}/p/{fp}"
                keys.append(h)
                recs.append(b"%d 1 0 %s" % (fp, url.encode()))
                fps.append(fp)
        pages = [(names[rng.choices(range(domains), weights)[0]], [names[d] for d in rng.choices(range(domains),
                                                                                                  weights, k=8)])
                 for _ in range(SLICE // 16)]
        yield recs, fps, keys, pages


async def _measure(slices: int) -> dict:
    from crawlerd.frontier.budgets.store import domain_key
    with tempfile.TemporaryDirectory(prefix="budget-unlanded") as d:
        b = Budgets(d, base_budget=2, per_inlink=2, max_budget=100_000, mode="vouched", sync=False,
                    write_buffer_bytes=16 << 20, read_cache_bytes=16 << 20, probation=True)
        writer = WriteThread(asyncio.get_running_loop(), name="bench-writer", group_delay_s=0.0)
        b.attach_writer(writer)
        ov = b.store.overlay
        seq = 0
        writer.hold()
        tracemalloc.start()
        try:
            for k, (recs, fps, keys, pages) in enumerate(stream(slices)):
                b.offer_many(recs, fps, keys)
                if k % 4 == 3:          # an edge delivery: the pages' links, as the DRUM answers them
                    answers = []
                    for src, targets in pages:
                        _, aux = b.graph.domain_edge_keys(domain_key(src), {domain_key(t) for t in targets})
                        for a in aux:
                            answers.append(_Answer(seq, True, a, 0))
                            seq += 1
                    b.graph.apply(answers)
                b.readmit(SLICE // 4, advance=k % 2 == 1)
                b.commit()
            charged = ov.unlanded_bytes
            layers = ov.pending
            gc.collect()
            before = tracemalloc.get_traced_memory()[0]
            writer.release()
            done = asyncio.get_running_loop().create_future()
            ov.barrier(lambda: done.set_result(None))
            await done
            for db in b.store.budget.dbs:
                ov.sorted_keys(db)      # the keys that landed leave the sorted lists now, not at the next cursor
            gc.collect()
            freed = before - tracemalloc.get_traced_memory()[0]
            charged -= ov.unlanded_bytes
        finally:
            tracemalloc.stop()
            writer.release()
            b.store.close_gate()
            await b.edges.close()
            b.store.attach_writer(None)
            writer.close()
            b.store.close()
    return {"slices": slices, "layers": layers, "charged_bytes": charged, "real_bytes": freed,
            "ratio": round(charged / freed, 2) if freed > 0 else None}


def measure(slices: int) -> dict:
    """One stage, ``slices`` intake slices (a layer each) held unlanded: charged against real bytes."""
    return asyncio.run(_measure(slices))


def main(argv: list[str]) -> None:
    for slices in [int(x) for x in argv] or [10, 40, 120]:
        m = measure(slices)
        print(f"{m['slices']} slices ({m['layers']} layers held): charged {m['charged_bytes'] / 2**20:.2f} MiB, "
              f"real {m['real_bytes'] / 2**20:.2f} MiB: charged/real {m['ratio']}")


if __name__ == "__main__":
    main(sys.argv[1:])
