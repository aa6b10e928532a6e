"""`crawlerd report`: one self-contained HTML page whose numbers come from the event logs."""

import json
import re
import subprocess
from collections import Counter

import pytest

from crawlerd.report import build_report
from tests.idle_daemon import crawlerd


def write_crawl(data, n_hosts=5, per_host=30, gap_s=1.2, fast_host_gap_s=None):
    """Events of ``n_hosts`` hosts fetched ``per_host`` times each ``gap_s`` apart; host 0 at
    ``fast_host_gap_s`` instead when given (an impolite host for the audit to find)."""
    (data / "events").mkdir(parents=True)
    (data / "warc").mkdir()
    (data / "warc" / "crawlerd-1-00000.warc.gz").write_bytes(b"x" * 12345)
    lines = []
    for h in range(n_hosts):
        t = 1_800_000_000.0 + h
        lines.append({"kind": "robots", "url": f"http://h{h}.example/robots.txt", "fetched_at": t, "fetch_ms": 20.0,
                      "status": 200 if h else 503, "outcome": "ok"})
        for i in range(per_host):
            t += 0.02 + (fast_host_gap_s if h == 0 and fast_host_gap_s else gap_s)
            lines.append({"kind": "page", "url": f"http://h{h}.example/p{i}", "fetched_at": t, "fetch_ms": 20.0,
                          "status": 200 if i % 10 else 404, "outcome": "ok", "bytes": 2000,
                          "content_type": "text/html", "duplicate_of": "x" if i == 3 else ""})
    lines.sort(key=lambda e: e["fetched_at"])
    (data / "events" / "events-20270115000000000000-00000.jsonl").write_text(
        "".join(json.dumps(e) + "\n" for e in lines))
    (data / "last-run.json").write_text(json.dumps({
        "pages": n_hosts * per_host, "cpu_s": 12.5, "queued": 7, "uptime_s": 40.0, "dropped": {"nofollow": 3},
        "budgets": {"top_spenders": [{"domain": "h1.example", "spent": 30, "budget": 10000, "indegree": 2,
                                      "deferred": 0}]}}))
    return len(lines)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    data = tmp_path_factory.mktemp("rep") / "data"
    write_crawl(data, fast_host_gap_s=0.5)
    return str(data), build_report(str(data), min_delay_s=1.0)


def test_self_contained_no_script_no_external_reference(report):
    _, page = report
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page and "<link" not in page and "@import" not in page
    assert not re.search(r'(?:src|href)="(?!#)', page)           # only in-document references
    assert "url(http" not in page


def test_every_chart_is_inline_svg_with_unique_ids(report):
    _, page = report
    charts = re.findall(r'<svg class="chart" role="img" aria-label="([^"]+)"', page)
    assert len(charts) == 10 and len(set(charts)) == 10
    ids = Counter(re.findall(r'\bid="([^"]+)"', page))
    assert ids and max(ids.values()) == 1
    for ref in set(re.findall(r'(?:url\(#|href="#)([^)"]+)', page)):
        assert ref in ids, ref


def test_numbers_come_from_the_events(report):
    _, page = report
    assert "<b>150</b><span>pages (responses kept)</span>" in page
    assert "<b>155</b><span>requests (pages, robots, sitemaps)</span>" in page
    assert re.search(r'class="bad">25\+ gaps below 1 s', page)      # host 0's 29 gaps; the table keeps 25
    smallest = page[page.index("<h3>Smallest gaps</h3>"):page.index("<h3>Busiest hosts</h3>")]
    assert smallest.count("http://h0.example") == 25 and "0.500" in smallest
    assert "5xx: unavailable (disallow all)" in page and "2xx: rules read" in page
    assert "crawlerd-1-00000.warc.gz" in page and "12,345" in page
    assert "h1.example" in page and "nofollow" in page
    assert re.search(r"exact duplicate [\d.]+%", page)


def test_empty_data_dir_still_makes_a_page(tmp_path):
    page = build_report(str(tmp_path), min_delay_s=1.0)
    assert page.count('<svg class="chart"') == 10 and "in the event logs" in page


def test_cli_writes_the_file_and_prints_its_path(tmp_path):
    data = tmp_path / "data"
    write_crawl(data, n_hosts=2, per_host=5)
    out = tmp_path / "r.html"
    r = subprocess.run(crawlerd("report", "--data-dir", str(data), "-o", str(out), "-s", "politeness.min_delay_s=2"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(out)
    assert "no gap below 2 s" not in out.read_text() and "gaps below 2 s" in out.read_text()
    missing = subprocess.run(crawlerd("report", "--data-dir", str(tmp_path / "nope"), "-o", str(out)),
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "no crawl data dir" in missing.stderr and "Traceback" not in missing.stderr
