"""Per-domain budgets through the whole daemon: URLs over budget are deferred, then readmitted (BEAST)."""

import os

import pytest

from crawlerd.simweb.ledger import crawl_delays, entries_from_json, politeness_violations
from tests.e2e.netns import NETNS_MARKS, run_driver

pytestmark = NETNS_MARKS


@pytest.fixture(scope="module")
def crawl(tmp_path_factory):
    base = tmp_path_factory.mktemp("budgets")
    data_dir, out = str(base / "data"), str(base / "report.json")
    driver = os.path.join(os.path.dirname(__file__), "driver.py")
    extra = ["-s", "budgets.base_budget=15", "-s", "budgets.per_inlink=15", "-s", "budgets.edge_max_age_s=1"]
    return run_driver(driver, out, data_dir, "30", "14", "4", *extra)


def test_over_budget_urls_are_deferred_then_readmitted(crawl):
    counters = crawl["first"]["last_run"]["counters"]
    assert counters.get("budget_deferred", 0) > 0
    assert counters.get("budget_readmitted", 0) > 0, counters
    assert crawl["first"]["last_run"]["budgets"], "budget stats reported by crawlerd stats"


def test_budgets_keep_politeness(crawl):
    v = politeness_violations(entries_from_json(crawl["ledger1"]), min_gap_s=1.0,
                              host_min_gap_s=crawl_delays(crawl["site"]))
    assert v == []
