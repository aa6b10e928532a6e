"""Recrawl with conditional GETs through the whole daemon: revisits send validators, 304s are archived."""

import os
from collections import Counter

import pytest

from crawlerd.simweb.ledger import crawl_delays, entries_from_json, politeness_violations
from tests.e2e.netns import NETNS_MARKS, run_driver
from tests.e2e.test_crawl import _warc_records

pytestmark = NETNS_MARKS


@pytest.fixture(scope="module")
def crawl(tmp_path_factory):
    base = tmp_path_factory.mktemp("recrawl")
    data_dir, out = str(base / "data"), str(base / "report.json")
    driver = os.path.join(os.path.dirname(__file__), "driver.py")
    extra = ["-s", "recrawl.initial_interval_s=4", "-s", "recrawl.min_interval_s=2",
             "-s", "recrawl.max_interval_s=30", "-s", "recrawl.jitter=0.0", "-s", "recrawl.priority=0"]
    report = run_driver(driver, out, data_dir, "8", "16", "4", *extra)
    report["data_dir"] = data_dir
    return report


def test_revisits_are_conditional_and_answered_304(crawl):
    entries = crawl["ledger1"]
    conditional = [e for e in entries if e["if_none_match"] or e["if_modified_since"]]
    assert conditional, "no conditional GET was sent"
    assert any(e["status"] == 304 for e in conditional)
    # a validator is only sent for a URL fetched before, with the validator that answer carried
    first_seen = {}
    for e in sorted(entries, key=lambda e: e["seq"]):
        key = (e["host"], e["target"])
        if e["if_none_match"] or e["if_modified_since"]:
            assert key in first_seen, key
        first_seen.setdefault(key, e)
    assert crawl["first"]["last_run"]["counters"].get("not_modified", 0) > 0


def test_recrawl_stays_polite(crawl):
    v = politeness_violations(entries_from_json(crawl["ledger1"]), min_gap_s=1.0,
                              host_min_gap_s=crawl_delays(crawl["site"]))
    assert v == [], "\n".join(map(str, v[:10]))


def test_every_answer_archived_once_including_304(crawl):
    records = _warc_records(crawl["data_dir"])
    port = crawl["port"]
    answered = Counter(f"http://{e['host']}:{port}{e['target']}"
                       for led in ("ledger1", "ledger2") for e in crawl[led] if e["status"])
    captures = Counter(uri for kind, uri in records if kind in ("response", "revisit"))
    assert captures == answered


def _segments(data_dir):
    warc_dir = os.path.join(data_dir, "warc")
    return [os.path.join(warc_dir, n) for n in sorted(os.listdir(warc_dir)) if n.endswith(".warc.gz")]


def test_304s_are_server_not_modified_revisits_of_an_archived_response(crawl):
    from warcio.archiveiterator import ArchiveIterator

    from crawlerd.store.warc import NOT_MODIFIED_PROFILE
    records = {}
    metadata_about = Counter()
    not_modified = []
    for seg in _segments(crawl["data_dir"]):
        with open(seg, "rb") as f:
            for rec in ArchiveIterator(f):
                h = rec.rec_headers
                records[h.get_header("WARC-Record-ID")] = (rec.rec_type, dict(h.headers))
                if rec.rec_type == "metadata":
                    metadata_about[h.get_header("WARC-Concurrent-To")] += 1
                if rec.rec_type == "revisit" and h.get_header("WARC-Profile") == NOT_MODIFIED_PROFILE:
                    not_modified.append(dict(h.headers))
                rec.content_stream().read()
    answered_304 = sum(1 for led in ("ledger1", "ledger2") for e in crawl[led] if e["status"] == 304)
    assert answered_304 and len(not_modified) == answered_304
    for h in not_modified:
        kind, original = records[h["WARC-Refers-To"]]        # the record that holds the payload
        assert kind == "response"
        assert h["WARC-Refers-To-Target-URI"] == original["WARC-Target-URI"]
        assert h["WARC-Refers-To-Date"] == original["WARC-Date"]
        assert h["WARC-Payload-Digest"] == original["WARC-Payload-Digest"]
    # one metadata record per capture, concurrent to it
    captures = [rid for rid, (kind, _) in records.items() if kind in ("response", "revisit")]
    assert all(metadata_about[rid] == 1 for rid in captures)


def test_segments_verify_and_index_as_cdxj_indexer_does(crawl):
    import subprocess
    import sys

    from crawlerd.store.cdxj import cdxj_path
    from crawlerd.store.verify import verify
    segments = _segments(crawl["data_dir"])
    index_dir = os.path.join(crawl["data_dir"], "index")
    for seg in segments:
        report = verify(seg)
        assert report.ok and report.index_path == cdxj_path(seg, index_dir), report.lines()
    theirs = subprocess.run([sys.executable, "-m", "cdxj_indexer.main", "--sort", *segments], capture_output=True,
                            text=True, check=True, timeout=300).stdout.splitlines()
    ours = []
    for seg in segments:
        with open(cdxj_path(seg, index_dir)) as f:
            ours += f.read().splitlines()
    assert sorted(ours) == theirs


def test_pywb_replays_the_304_captures(crawl, tmp_path):
    from crawlerd.store.cdxj import cdxj_path
    from tests.store.replay import collection, need_pywb, replay
    need_pywb()
    segments = _segments(crawl["data_dir"])
    index_dir = os.path.join(crawl["data_dir"], "index")
    root = collection(str(tmp_path / "pywb"), segments, [cdxj_path(s, index_dir) for s in segments])
    lines = []
    for seg in segments:
        with open(cdxj_path(seg, index_dir)) as f:
            lines += [ln.split(" ", 2) for ln in f.read().splitlines()]
    import json
    revisits = [(stamp, json.loads(js)) for _, stamp, js in lines if json.loads(js)["mime"] == "warc/revisit"]
    assert revisits
    sample = revisits[:20]
    answers = replay(root, [(stamp, fields["url"]) for stamp, fields in sample])
    for (_, fields), answer in zip(sample, answers, strict=True):
        assert answer["error"] == "" and answer["status"] == 200 and answer["body"], (fields, answer)
