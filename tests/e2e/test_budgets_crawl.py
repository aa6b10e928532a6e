"""Per-domain budgets through the whole daemon: deferral and readmission, `crawlerd stats`, `crawlerd url why`."""

import json
import os

import pytest

from crawlerd.simweb.ledger import crawl_delays, entries_from_json, politeness_violations
from tests.e2e.netns import NETNS_MARKS, run_driver

pytestmark = NETNS_MARKS


@pytest.fixture(scope="module")
def crawl(tmp_path_factory):
    base = tmp_path_factory.mktemp("budgets")
    data_dir, out = str(base / "data"), str(base / "report.json")
    driver = os.path.join(os.path.dirname(__file__), "budgets_driver.py")
    return run_driver(driver, out, data_dir, "40")


def test_over_budget_urls_are_deferred_then_readmitted(crawl):
    assert crawl["rc"] == 0, crawl["stderr"]
    counters = crawl["last_run"]["counters"]
    assert counters.get("budget_deferred", 0) > 0
    assert counters.get("budget_readmitted", 0) > 0, counters


def test_stats_show_the_reader_and_the_top_domains(crawl):
    assert crawl["stats_json"]["rc"] == 0
    bu = json.loads(crawl["stats_json"]["out"])["budgets"]
    assert bu["deferred"] > 0 and bu["reader_queue"] >= 0
    # the budget state is written on the writer thread only, a layer per commit
    assert bu["store_writer"]["written_by"] == ["crawlerd-writer"] and bu["store_writer"]["landed"] > 0
    # a domain is found before the edge DRUM has counted a link to it: its first URLs wait (probation)
    assert bu["probation"] > 0
    tops = bu["top_domains"]
    assert tops and {"domain", "indegree", "budget", "spent", "deferred", "queue"} <= set(tops[0])
    assert any(t["domain"].startswith("giant") and t["indegree"] > 0 for t in tops)
    text = crawl["stats_text"]["out"]
    assert "budgets:" in text and "reader on BEAST queue" in text and "domain graph:" in text
    assert "in-degree" in text and "deferred" in text


def test_url_why_tells_seen_deferred_and_unseen_apart(crawl):
    assert crawl["why"]["rc"] == 0, crawl["why"]["err"]
    answers = crawl["answers"]
    assert len(answers) == len(crawl["urls"])
    seed, unseen, farm = answers[0], answers[1], answers[2:]
    assert seed["seen"]["in_seen_set"] and not seed["verdict"].startswith("not seen"), seed["verdict"]
    assert unseen["verdict"].startswith("not seen") and not unseen["seen"]["in_seen_set"]
    deferred = [a for a in farm if a["verdict"].startswith("deferred by its domain's budget")]
    assert deferred, [a["verdict"] for a in farm][:5]
    for a in deferred:        # the verdict says why a domain nobody vouches for waits
        assert ("on probation" in a["verdict"]) == bool(a["budgets"]["on_probation"]), a["verdict"]
    d = deferred[0]["budgets"]
    assert d["waiting"] and d["deferred"] > 0 and d["expected_queue"] >= d["reader"]
    assert crawl["why_text"]["rc"] == 0 and crawl["why_text"]["out"].count("\n") >= 3
    assert crawl["why_bad"]["rc"] == 2 and "not a valid" in crawl["why_bad"]["err"]


def test_budgets_keep_politeness(crawl):
    v = politeness_violations(entries_from_json(crawl["ledger"]), min_gap_s=1.0,
                              host_min_gap_s=crawl_delays(crawl["site"]))
    assert v == []
