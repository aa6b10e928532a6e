"""A crawl whose body pool is so small that bodies fall back to the heap part of the time: every
answer the server gave is archived once, with exactly the body it served."""

import gzip
import os
from collections import Counter

import pytest
import xxhash
from warcio.archiveiterator import ArchiveIterator

from tests.e2e.netns import NETNS_MARKS, run_driver

HOSTS, SECONDS, SECONDS2 = 40, 15.0, 4.0
POOL_BYTES = 64 * 1024          # 7 blocks of 8 KiB: a few pages at once, the rest on the heap

pytestmark = NETNS_MARKS


@pytest.fixture(scope="module")
def crawl(tmp_path_factory):
    base = tmp_path_factory.mktemp("e2e-pool")
    data_dir, out = str(base / "data"), str(base / "report.json")
    driver = os.path.join(os.path.dirname(__file__), "driver.py")
    report = run_driver(driver, out, data_dir, str(HOSTS), str(SECONDS), str(SECONDS2),
                        "-s", f"fetch.body_pool_bytes={POOL_BYTES}")
    report["data_dir"] = data_dir
    return report


def captures(data_dir):
    """(record type, target URI, HTTP headers, raw body) of every response and revisit record."""
    warc_dir = os.path.join(data_dir, "warc")
    out = []
    for name in sorted(os.listdir(warc_dir)):
        if name.endswith(".warc.gz"):
            with open(os.path.join(warc_dir, name), "rb") as f:
                for rec in ArchiveIterator(f):
                    if rec.rec_type in ("response", "revisit"):
                        out.append((rec.rec_type, rec.rec_headers.get_header("WARC-Target-URI"),
                                    rec.http_headers, rec.raw_stream.read()))
    return out


def test_runs_exit_cleanly_and_the_pool_both_held_and_fell_back(crawl):
    for run in ("first", "second"):
        assert crawl[run]["rc"] == 0, crawl[run]["stderr"]
        assert "Traceback" not in crawl[run]["stderr"], crawl[run]["stderr"]
    shard = crawl["first"]["last_run"]["shards"][0]
    fb = shard["body_pool_fallbacks"]
    assert fb["pooled"] > 0 and fb["fetched"] > 0, fb
    mem = shard["memory"]["body_pool"]
    assert mem["cap_bytes"] == 7 * 8192 and mem["bytes"] == 0, mem      # every block back at the end
    assert mem["high_water_bytes"] == mem["cap_bytes"], mem           # bodies fell back: it was full


def test_every_answer_is_archived_once_with_the_body_served(crawl):
    records = captures(crawl["data_dir"])
    port = crawl["port"]
    answered = Counter(f"http://{e['host']}:{port}{e['target']}"
                       for led in ("ledger1", "ledger2") for e in crawl[led] if e["status"])
    assert Counter(uri for _, uri, _, _ in records) == answered, set(answered) ^ {r[1] for r in records}
    checked = 0
    for kind, uri, http, body in records:
        if kind != "response":
            continue
        length = http.get_header("Content-Length")
        assert length is not None and int(length) == len(body), uri
        etag = http.get_header("ETag")
        if http.get_statuscode() == "200" and etag:
            # simweb's ETag is the xxh64 of the body before its gzip coding
            if http.get_header("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            assert etag.strip('"').removesuffix("-gz") == xxhash.xxh64_hexdigest(body), uri
            checked += 1
    assert checked >= 100, checked
