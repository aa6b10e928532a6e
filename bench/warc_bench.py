"""WARC write speed: µs per fetch (request + 20 KB response record) for crawlerd's WarcWriter with
several gzip back ends and levels, against warcio's WARCWriter writing the same two records in the same run.

    nice .venv/bin/python bench/warc_bench.py [--records 2000] [--runs 5] [--body-bytes 20480]

Prints the median over runs of µs per fetch, compressed bytes per fetch, and the ratio to warcio.
The body is synthetic HTML (seeded): Zipf words in repetitive markup, compressing ~4x like real pages.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import statistics
import tempfile
import time

from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from crawlerd.store.encoding import available_compressors
from crawlerd.store.warc import WarcWriter

REQUEST_HEAD = (b"GET /page HTTP/1.1\r\nHost: example.org\r\nUser-Agent: crawlerd/0.1 (+https://example.org)\r\n"
                b"Accept: */*\r\nAccept-Encoding: gzip, br\r\n\r\n")
RESPONSE_HEAD = (b"HTTP/1.1 200 OK\r\nDate: Mon, 01 Jan 2024 00:00:00 GMT\r\nServer: nginx\r\n"
                 b"Content-Type: text/html; charset=utf-8\r\nContent-Length: %d\r\n\r\n")


def make_pages(n: int, body_bytes: int, seed: int = 7) -> list[bytes]:
    """Synthetic pages: Zipf-distributed vocabulary inside repetitive markup, like real HTML."""
    rnd = random.Random(seed)
    letters = "etaoinshrdlucmfwypvbgkqjxz"
    vocab = ["".join(rnd.choices(letters, weights=range(26, 0, -1), k=rnd.randint(2, 9))) for _ in range(2000)]
    weights = [1 / (r + 1) for r in range(len(vocab))]

    def text(k: int) -> str:
        return " ".join(rnd.choices(vocab, weights=weights, k=k))

    pages = []
    for i in range(n):
        parts = [f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{text(5)} {i}</title>'
                 '<link rel="stylesheet" href="/static/site.css"></head><body><div class="page">\n']
        size = len(parts[0])
        while size < body_bytes:
            r = rnd.random()
            if r < 0.35:
                chunk = (f'<li class="nav-item"><a class="nav-link" href="/{rnd.choice(vocab)}/'
                         f'{rnd.randint(0, 9999)}.html">{text(2)}</a></li>\n')
            elif r < 0.45:
                chunk = f'<div class="row"><div class="col-md-6"><h2>{text(4)}</h2></div></div>\n'
            else:
                chunk = f'<p class="text">{text(rnd.randint(10, 40))}.</p>\n'
            parts.append(chunk)
            size += len(chunk)
        pages.append("".join(parts).encode()[:body_bytes])
    return pages


def run_crawlerd(directory: str, pages: list[bytes], compressor: str, level: int) -> tuple[float, int]:
    writer = WarcWriter(directory, hostname="bench", compressor=compressor, compress_level=level,
                        segment_max_bytes=1 << 40)
    t0 = time.perf_counter()
    for i, body in enumerate(pages):
        writer.write_fetch(url=f"http://example.org/page/{i}", fetched_at=1.7e9 + i, ip="127.0.0.1",
                           request_head=REQUEST_HEAD, response_head=RESPONSE_HEAD % len(body), body=body)
    writer.flush()
    elapsed = time.perf_counter() - t0
    size = os.path.getsize(writer.current_path)
    writer.close()
    for name in os.listdir(directory):
        os.remove(os.path.join(directory, name))
    return elapsed, size


def run_warcio(directory: str, pages: list[bytes]) -> tuple[float, int]:
    path = os.path.join(directory, "warcio.warc.gz")
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        writer = WARCWriter(f, gzip=True, warc_version="WARC/1.1")
        for i, body in enumerate(pages):
            url = f"http://example.org/page/{i}"
            head = StatusAndHeaders("200 OK", [("Date", "Mon, 01 Jan 2024 00:00:00 GMT"), ("Server", "nginx"),
                                               ("Content-Type", "text/html; charset=utf-8"),
                                               ("Content-Length", str(len(body)))], protocol="HTTP/1.1")
            resp = writer.create_warc_record(url, "response", payload=io.BytesIO(body), http_headers=head)
            req_head = StatusAndHeaders("GET /page HTTP/1.1", [("Host", "example.org"), ("Accept", "*/*")],
                                        is_http_request=True)
            req = writer.create_warc_record(url, "request", payload=io.BytesIO(b""), http_headers=req_head)
            writer.write_request_response_pair(req, resp)
    elapsed = time.perf_counter() - t0
    size = os.path.getsize(path)
    os.remove(path)
    return elapsed, size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--body-bytes", type=int, default=20 * 1024)
    ap.add_argument("--variants", default="isal:1,isal:2,isal:3,zlib:1,zlib:3,zlib:4,zlib:6",
                    help="comma-separated compressor:level pairs for crawlerd's writer")
    args = ap.parse_args()
    pages = make_pages(args.records, args.body_bytes)
    variants = [(c, int(lv)) for c, lv in (v.split(":") for v in args.variants.split(","))
                if c in available_compressors()]
    results: dict[str, list[tuple[float, int]]] = {f"crawlerd {c} {lv}": [] for c, lv in variants}
    results["warcio (zlib 6)"] = []
    with tempfile.TemporaryDirectory() as d:
        for _ in range(args.runs):       # interleave so machine noise hits every variant alike
            for c, lv in variants:
                results[f"crawlerd {c} {lv}"].append(run_crawlerd(d, pages, c, lv))
            results["warcio (zlib 6)"].append(run_warcio(d, pages))
    base = statistics.median(t for t, _ in results["warcio (zlib 6)"])
    raw = args.body_bytes + len(RESPONSE_HEAD) + len(REQUEST_HEAD)
    print(f"{args.records} fetches x {args.runs} runs, body {args.body_bytes} B (request + response record)")
    print(f"{'writer':<20} {'µs/fetch':>9} {'B/fetch':>8} {'ratio':>6} {'vs warcio':>10}")
    for name, runs in results.items():
        t = statistics.median(x for x, _ in runs)
        size = statistics.median(s for _, s in runs) / args.records
        print(f"{name:<20} {t / args.records * 1e6:9.1f} {size:8.0f} {raw / size:6.2f} {t / base:10.2f}")


if __name__ == "__main__":
    main()
