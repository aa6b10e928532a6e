"""One worker answer frame on the crawl process, by part (issue 10; branch wire24).

A frame of ``--results`` results (e2e: ~18 a frame) of 20-60 links each, URLs and host keys as the
e2e web's (``http://hN.sim:PORT/p/K.html``; about half on the page's own host, the rest on a few
others), built as the tree's worker builds it. CPU µs per frame (min over ``--repeats`` of
``--frames`` frames), each part alone:

- ``encode (worker)``: the frame's bytes as the worker makes them (pack + pickle);
- ``pickle.loads``: the frame's pickle read (``AnswerReader.data_received``);
- ``unpack``: the results and their ``Link`` records from the decoded frame (``WorkerPool._on_answer``);
- ``decode total``: both, as the pool does them;
- ``follow``: each page's followable links and hosts (``followed_links``) and the intake's native
  pass over them (``_native.intake.links``: seen-set records), as ``Answers._follow`` does (the
  same code in every tree: what the link records cost past the decode).

And the collector's view of one decoded frame (``collector_view``): tracked objects alive while
the frame is handled, and after. (The frame's temporaries are freed before the loop's paced
gen-0 pass, which runs between callbacks, ``crawlerd/gcpace.py``: only a pass inside the
callback would walk them.)

Run it with each tree's Python (the script adapts to the tree's wire API; run from outside a
source tree so each Python imports its own crawlerd)::

    cd /tmp && /work/wt/integ22/.venv/bin/python /work/wt/wire24/bench/answer_wire_bench.py
    cd /tmp && /work/wt/wire24/.venv/bin/python /work/wt/wire24/bench/answer_wire_bench.py
"""

from __future__ import annotations

import argparse
import gc
import json
import pickle
import random
import time

from crawlerd._native.intake import links as intake_links
from crawlerd.outcome import Outcome
from crawlerd.process import wire
from crawlerd.records import Link, ProcessResult, followed_links

NEW_API = hasattr(wire, "results_frame")        # the links as columns (wire24)


def page(rng: random.Random, i: int) -> ProcessResult:
    """A page of 20-60 links, as the resolver gives them: its own host key one object, an
    absolute link's key a new object each."""
    own = f"http://h{rng.randrange(20000)}.sim:8080"
    links = []
    others = [f"h{rng.randrange(20000)}.sim:8080" for _ in range(rng.randrange(2, 8))]
    for _ in range(rng.randrange(20, 61)):
        if rng.random() < 0.5:
            links.append(Link(f"{own}/p/{rng.randrange(500)}.html", rng.getrandbits(64), own, False))
        else:
            o = rng.choice(others)
            links.append(Link(f"http://{o}/p/{rng.randrange(500)}.html", rng.getrandbits(64), "http://" + o,
                              rng.random() < 0.05))
    return ProcessResult(url=f"{own}/p/{i}.html", outcome=Outcome.OK, status=200, links=links,
                         content_type="text/html", digest="sha1:GVVBSK3ZCOYEYVCXJUMMFDKG4Y4VIKFL",
                         simhash=rng.getrandbits(64), warc_file="/data/warc/crawl-2026-00001-0_w0.warc.gz.open",
                         warc_offset=1000 * i, warc_length=9876, warc_record_id=f"<urn:uuid:{i:036d}>")


def encode(answers: list[tuple[int, ProcessResult]]) -> bytes:
    """The frame as the tree's worker writes it."""
    if NEW_API:
        return wire.results_frame(answers, "seg", 123)
    host_keys: dict = {}
    return wire.frame(("results", [(j, wire.pack_result(pr, host_keys)) for j, pr in answers], "seg", 123))


def unpack(msg) -> list[tuple[int, ProcessResult]]:
    """The results of a decoded frame, as the tree's pool reads them."""
    if NEW_API:
        return wire.unpack_results(msg)[0]
    return [(j, wire.unpack_result(packed)) for j, packed in msg[1]]


def follow(results: list[tuple[int, ProcessResult]]) -> int:
    n = 0
    for _j, pr in results:
        links, _hosts = followed_links(pr.links)
        keys, _aux, _lens = intake_links(links, b"2 0 5 ", 2048, 10, lambda url, key: "", [])
        n += len(keys)
    return n


def _best(fn, items, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        t0 = time.process_time()
        for it in items:
            fn(it)
        best = min(best, (time.process_time() - t0) / len(items))
    return best * 1e6


def collector_view(data: bytes) -> dict:
    """Tracked objects alive (``gc.get_objects()``, collector off) while the pool holds the decoded
    frame and its results (``on_frame`` runs then: a pass inside it would walk them), and once the
    frame is dropped (the results are held until the pages' leases complete)."""
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        msg = pickle.loads(memoryview(data)[4:])
        held = unpack(msg)
        during = len(gc.get_objects()) - before - 2         # less msg and held themselves
        del msg
        left = len(gc.get_objects()) - before - 1
        links = sum(len(pr.links) for _, pr in held)
    finally:
        gc.enable()
    return {"tracked during decode": during, "tracked left": left, "links": links}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=int, default=18, help="results a frame (e2e: ~18)")
    ap.add_argument("--frames", type=int, default=200, help="frames a repeat")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    frames = [[(k, page(rng, f * args.results + k)) for k in range(args.results)] for f in range(args.frames)]
    datas = [encode(answers) for answers in frames]
    msgs = [pickle.loads(memoryview(d)[4:]) for d in datas]
    decoded = [unpack(m) for m in msgs]
    assert [[(j, pr) for j, pr in d] for d in decoded] == frames        # the same answers
    out = {
        "wire": "columns" if NEW_API else "tuples",
        "frame bytes": sum(map(len, datas)) / len(datas),
        "encode (worker) us": _best(encode, frames, args.repeats),
        "pickle.loads us": _best(lambda d: pickle.loads(memoryview(d)[4:]), datas, args.repeats),
        "unpack us": _best(unpack, msgs, args.repeats),
        "decode total us": _best(lambda d: unpack(pickle.loads(memoryview(d)[4:])), datas, args.repeats),
        "follow us": _best(follow, decoded, args.repeats),
    }
    out.update(collector_view(datas[0]))
    out["links a frame"] = sum(len(pr.links) for answers in frames for _, pr in answers) / len(frames)
    for k, v in out.items():
        print(f"{k:22s} {v:10.1f}" if isinstance(v, float) else f"{k:22s} {v:>10}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
