"""Streaming aggregation of event logs: correct numbers, bounded memory, damaged input survived."""

import json
import os

import pytest

from crawlerd.report.aggregate import (
    GAP_EDGES_S,
    CrawlAggregate,
    PolitenessAudit,
    TimeBuckets,
    TopCounter,
    event_files,
    histogram_bin,
)


def page(url, at, ms=100.0, status=200, outcome="ok", **kw):
    return {"schema_version": 1, "kind": "page", "url": url, "fetched_at": at, "fetch_ms": ms,
            "status": status, "outcome": outcome, **kw}


def test_gap_is_next_start_minus_previous_end_and_overlaps_are_negative():
    a = PolitenessAudit()
    a.add("http://a", 100.0, 0.5)
    a.add("http://a", 102.0, 0.2)       # gap 1.5
    a.add("http://a", 102.1, 0.1)       # starts before the previous ended: -0.1
    a.add("http://b", 50.0, 1.0)
    assert a.gaps == 2 and a.overlaps == 1 and a.unmeasured == 2
    assert [(h, round(g, 3)) for h, g, _ in a.smallest()] == [("http://a", -0.1), ("http://a", 1.5)]
    h = a.hosts["http://a"]
    assert h.requests == 3 and h.min_gap == pytest.approx(-0.1) and h.max_gap == pytest.approx(1.5)
    assert sum(a.all_gaps) == 2 and a.all_gaps[0] == 1          # the overlap counts in the first bin


def test_per_host_state_is_bounded_and_evictions_are_counted():
    a = PolitenessAudit(max_hosts=100)
    for i in range(10_000):
        a.add(f"http://h{i % 1000}", float(i), 0.01)
    assert len(a.hosts) == 100
    assert a.evicted == 10_000 - 100 and a.gaps == 0             # LRU over 1000 hosts: never measured
    b = PolitenessAudit(max_hosts=100)
    for i in range(10_000):
        b.add(f"http://h{i % 50}", float(i), 0.01)
    assert b.evicted == 0 and b.gaps == 10_000 - 50


def test_quantiles_come_from_a_bounded_sample():
    a = PolitenessAudit()
    for i in range(5000):
        a.add("http://a", i * 2.0, 1.0)                           # every gap 1.0 s
    h = a.hosts["http://a"]
    assert len(h.sample) == h.SAMPLE and h.ngaps == 4999
    assert h.quantile(0.1) == h.quantile(0.9) == 1.0


def test_time_buckets_coarsen_and_keep_totals():
    tb = TimeBuckets(width_s=1.0, max_buckets=50)
    for t in range(10_000):
        tb.add(1_000_000.0 + t, [("pages", 1), ("bytes", 10)])
    assert len(tb.buckets) <= 50 and tb.width_s >= 10_000 / 50
    times, series = tb.series()
    assert sum(series["pages"]) * tb.width_s == pytest.approx(10_000)
    assert sum(series["bytes"]) * tb.width_s == pytest.approx(100_000)
    assert times == sorted(times) and len(times) == len(series["pages"])


def test_time_buckets_take_times_out_of_order():
    tb = TimeBuckets(width_s=1.0, max_buckets=8)
    for t in (100.0, 90.0, 130.0, 95.5, 101.0):
        tb.add(t, [("n", 1)])
    times, series = tb.series()
    assert sum(series["n"]) * tb.width_s == pytest.approx(5) and len(times) <= 8


def test_top_counter_keeps_the_heavy_hitters_in_bounded_space():
    tc = TopCounter(keep=10)
    for i in range(5000):
        tc.add("big" if i % 3 == 0 else f"tail{i}")
    assert len(tc.counts) < 20 and tc.trimmed
    assert tc.top(1)[0][0] == "big"


def test_histogram_bins():
    assert histogram_bin(GAP_EDGES_S, 0.0) == 0 and histogram_bin(GAP_EDGES_S, 0.0009) == 0
    assert GAP_EDGES_S[histogram_bin(GAP_EDGES_S, 1.0)] == 1.0
    assert histogram_bin(GAP_EDGES_S, 1e9) == len(GAP_EDGES_S) - 1


def test_events_counted_by_kind_outcome_duplicates_and_robots():
    agg = CrawlAggregate()
    agg.add({"kind": "robots", "url": "http://a.example/robots.txt", "fetched_at": 10.0, "fetch_ms": 5.0,
             "status": 404, "outcome": "ok"})
    agg.add({"kind": "robots", "url": "http://b.example/robots.txt", "fetched_at": 10.0, "fetch_ms": 5.0,
             "status": 0, "outcome": "connect_refused"})
    agg.add(page("http://a.example/", 12.0, bytes=1000, content_type="text/html; charset=utf-8"))
    agg.add(page("http://a.example/x", 14.0, bytes=500, duplicate_of="http://a.example/"))
    agg.add(page("http://www.a.example/y", 16.0, bytes=10, near_duplicate_of="http://a.example/"))
    agg.add(page("http://a.example/z", 18.0, status=0, outcome="timeout", ms=60000.0))
    agg.add(page("http://a.example/r", 0.0, status=0, outcome="robots_denied", ms=0.0))
    agg.add({"kind": "dropped", "url": "http://c.example/", "outcome": "blocked", "fetched_at": 19.0, "status": 0})
    assert agg.pages == 3 and agg.bytes == 1510
    assert (agg.unique_200, agg.dup_exact, agg.dup_near) == (1, 1, 1)
    assert agg.outcomes == {"ok": 3, "timeout": 1, "robots_denied": 1}
    assert agg.robots == {"4xx: none (allow all)": 1, "unreachable: connect_refused (disallow all)": 1}
    assert agg.dropped == {"blocked": 1}
    assert agg.domains.top(1) == [("a.example", 3)]                   # www.a.example is the same domain
    assert agg.content_types.top(1) == [("text/html", 1)]
    # requests to a.example: robots at 10, pages at 12, 14, 16 (www is another host), the timeout at 18
    assert agg.audit.hosts["http://a.example"].requests == 4
    assert agg.first_at == 10.0 and agg.last_at == 18.0             # drops are not crawl activity


def test_files_in_time_order_with_torn_tail_and_damaged_line(tmp_path):
    d = tmp_path / "events"
    d.mkdir()
    (d / "events-20260101000000000000-00000.jsonl").write_text(
        json.dumps(page("http://a.example/1", 1.0)) + "\n{not json\n" + json.dumps(page("http://a.example/2", 3.0))
        + "\n")
    (d / "events-20260101000100000000-00001.jsonl.open").write_text(
        json.dumps(page("http://a.example/3", 5.0)) + "\n" + '{"kind": "page", "url": "http://a.exa')
    (d / "unrelated.txt").write_text("x")
    files = event_files(str(d))
    assert [os.path.basename(f) for f in files] == ["events-20260101000000000000-00000.jsonl",
                                                    "events-20260101000100000000-00001.jsonl.open"]
    agg = CrawlAggregate()
    agg.add_files(files + [str(d / "gone.jsonl")])
    assert agg.pages == 3 and agg.bad_lines == 1
    assert event_files(str(tmp_path / "missing")) == []


def test_a_large_log_stays_within_its_bounds():
    agg = CrawlAggregate(max_hosts=500, top_keep=100)
    for i in range(60_000):
        agg.add(page(f"http://h{i % 7919}.d{i % 3001}.example/p{i}", 1_000_000.0 + i * 0.5, bytes=100))
    assert len(agg.audit.hosts) <= 500
    assert len(agg.domains.counts) < 200
    assert len(agg.time.buckets) <= agg.time.max_buckets
    assert agg.pages == 60_000 and agg.bytes == 6_000_000
