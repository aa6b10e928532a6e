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
