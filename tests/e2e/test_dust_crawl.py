"""DUST in the whole daemon: a crawl of a web with URL variants, judged from the server's side."""

import os
from collections import defaultdict

import pytest

from crawlerd.simweb.ledger import crawl_delays, entries_from_json, politeness_violations
from crawlerd.simweb.variants import content_key
from tests.e2e.netns import NETNS_MARKS, run_driver

HOSTS, SECONDS, SECONDS2 = 30, 24.0, 6.0
MIN_GAP_S = 0.5
SETS = ["-s", f"politeness.min_delay_s={MIN_GAP_S}", "-s", "dust.confirmations=2", "-s", "dust.probe_share=0.2",
        "-s", "dust.sample_share=0.1"]

pytestmark = NETNS_MARKS


@pytest.fixture(scope="module")
def crawl(tmp_path_factory):
    base = tmp_path_factory.mktemp("dust")
    data_dir, out = str(base / "data"), str(base / "report.json")
    driver = os.path.join(os.path.dirname(__file__), "dust_driver.py")
    return run_driver(driver, out, data_dir, str(HOSTS), str(SECONDS), str(SECONDS2), *SETS)


def page_of(site, host, target):
    h = site["hosts"].get(host)
    if h is None:
        return target
    if h["variants"]:
        return content_key(h, target) or target
    return target.partition("?")[0] if target.startswith("/p/") else target


def test_runs_exit_cleanly_and_politely(crawl):
    assert crawl["first"]["rc"] == 0, crawl["first"]["stderr"]
    assert crawl["second"]["rc"] == 0, crawl["second"]["stderr"]
    entries = entries_from_json(crawl["ledger"])
    assert politeness_violations(entries, MIN_GAP_S, host_min_gap_s=crawl_delays(crawl["site"])) == []


def test_rules_learned_and_urls_skipped(crawl):
    dust = crawl["first"]["last_run"]["dust"]
    assert dust["enabled"] and dust["rules_learned_total"] >= 1, dust
    assert dust["skipped_total"] >= 1, dust
    assert dust["top"] and dust["top"][0]["rules"][0]["state"] == "trusted"
    skipped = [e for e in crawl["events"] if e["kind"] == "dust_skipped"]
    assert skipped and all(e["rule"] for e in skipped)         # the event log names the rule
    assert {e["outcome"] for e in crawl["events"] if e["kind"] == "dust_rule"} >= {"dust_trusted"}


def test_no_unique_page_skipped(crawl):
    """Every URL skipped shows a page that was fetched under some URL."""
    site = crawl["site"]
    fetched = defaultdict(set)
    for e in crawl["ledger"]:
        if e["status"] == 200:
            fetched[e["host"]].add(page_of(site, e["host"], e["target"]))
    lost = []
    for e in crawl["events"]:
        if e["kind"] != "dust_skipped":
            continue
        netloc, _, tail = e["url"].split("://", 1)[1].partition("/")
        host = netloc.rsplit(":", 1)[0]
        if page_of(site, host, "/" + tail) not in fetched[host]:
            lost.append(e["url"])
    assert lost == []


def test_rules_survive_the_restart(crawl):
    first, second = crawl["first"]["last_run"]["dust"], crawl["second"]["last_run"]["dust"]
    assert second["rules_learned_total"] >= first["rules_learned_total"]
    assert second["rules_trusted"] >= 1
