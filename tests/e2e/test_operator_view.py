"""The operator's view of a real crawl: the metrics endpoint scraped, `top` on a pty, the report in Chromium."""

import os
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.netns import NETNS_MARKS, run_driver

pytestmark = [*NETNS_MARKS, pytest.mark.skipif(not os.path.exists("/usr/bin/chromium"),
                                                reason="needs Chromium (make test installs it)")]
MAX_SECONDS, HOSTS = "120", "40"      # the driver stops the crawl once its checks ran


@pytest.fixture(scope="module")
def view(tmp_path_factory):
    base = tmp_path_factory.mktemp("operator")
    driver = os.path.join(os.path.dirname(__file__), "operator_driver.py")
    return run_driver(driver, str(base / "out.json"), str(base / "data"), MAX_SECONDS, HOSTS, timeout=400)


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(fams: dict, name: str, **labels) -> float:
    return sum(s.value for s in fams[name].samples
               if s.name in (name, name + "_total") and all(s.labels.get(k) == v for k, v in labels.items()))


def test_demo_crawls_and_prints_its_report(view):
    assert view["stop"] == "stopping" and view["demo_rc"] == 0, view["demo_stderr"]
    assert "Traceback" not in view["demo_stderr"], view["demo_stderr"]
    assert view["report"] and view["report"].endswith("report.html"), view["demo_stdout"]
    assert "0 politeness violations" in view["demo_stdout"]


def test_scrapes_during_the_crawl_parse_and_move(view):
    assert view["during"] is not None and len(view["scrapes"]) == 2, view["demo_stderr"]
    first, second = (families(t) for t in view["scrapes"])
    assert 0 < value(first, "crawlerd_pages") <= value(second, "crawlerd_pages") <= view["last_run"]["pages"]
    assert value(second, "crawlerd_requests") >= value(second, "crawlerd_pages")
    assert value(second, "crawlerd_fetch_outcomes", outcome="ok") > 0
    assert value(second, "crawlerd_http_status", status="200") > 0
    assert value(second, "crawlerd_bytes") > value(first, "crawlerd_bytes") > 0
    assert value(second, "crawlerd_hosts_active") > 0
    assert value(first, "crawlerd_state", state="running") == value(second, "crawlerd_state", state="running") == 1
    lag1 = next(s.value for s in first["crawlerd_loop_lag_seconds"].samples if s.name.endswith("_count"))
    lag2 = next(s.value for s in second["crawlerd_loop_lag_seconds"].samples if s.name.endswith("_count"))
    assert lag2 > lag1 > 0
    roles = {s.labels["role"] for s in second["crawlerd_process_cpu_seconds"].samples}
    assert roles == {"shard", "worker"}
    assert value(second, "crawlerd_process_cpu_seconds", role="shard") > 0


def test_top_drew_the_live_crawl_and_quit_on_q(view):
    assert view["top_rc"] == 0
    screen = view["top_screen"]
    assert "running" in screen and "shards and processes" in screen
    assert re.search(r"http://h\d+\.sim", screen), screen[-3000:]          # busiest hosts named
    assert re.search(r"\bworker\s+\d+", screen)


def test_report_renders_in_chromium_with_every_chart_drawn(view):
    b = view["browser"]
    assert b["console"] == [] and b["exceptions"] == [] and b["log_errors"] == [], b
    assert b["requests"] == [b["url"]], "the report fetched something besides itself"
    assert len(b["charts"]) >= 10
    for c in b["charts"]:
        assert c["width"] > 300 and c["height"] > 80, c
        assert c["shapes"] >= 8 and c["texts"] >= 3 and not c["empty"], c


def test_report_agrees_with_the_crawl(view):
    html, last = view["report_html"], view["last_run"]
    assert f"<b>{last['pages']:,}</b><span>pages (responses kept)</span>" in html
    assert "no gap below 1 s" in html                    # the server's ledger saw no violation either
    assert "<script" not in html and not re.search(r'(?:src|href)="(?!#)', html)
    for f in os.listdir(os.path.join(os.path.dirname(view["report"]), "warc")):
        assert f in html
