"""The whole daemon against simweb in a private network namespace, judged from the server's ledger."""

import gzip
import os
from collections import Counter

import pytest
from warcio.archiveiterator import ArchiveIterator

from crawlerd.simweb.ledger import (
    crawl_delays,
    entries_from_json,
    politeness_violations,
    retry_after_violations,
    robots_violations,
)
from tests.e2e.netns import NETNS_MARKS, run_driver

HOSTS, SECONDS, SECONDS2 = 60, 20.0, 8.0


pytestmark = NETNS_MARKS


@pytest.fixture(scope="module")
def crawl(tmp_path_factory):
    base = tmp_path_factory.mktemp("e2e")
    data_dir, out = str(base / "data"), str(base / "report.json")
    driver = os.path.join(os.path.dirname(__file__), "driver.py")
    report = run_driver(driver, out, data_dir, str(HOSTS), str(SECONDS), str(SECONDS2))
    report["data_dir"] = data_dir
    return report


def test_both_runs_exit_cleanly(crawl):
    for run in ("first", "second"):
        assert crawl[run]["rc"] == 0, crawl[run]["stderr"]
        assert "Traceback" not in crawl[run]["stderr"], crawl[run]["stderr"]


def test_pages_fetched_above_floor(crawl):
    assert crawl["first"]["last_run"]["pages"] >= 150


def test_invalid_seeds_skipped_and_counted(crawl):
    assert crawl["first"]["last_run"]["dropped"].get("invalid_seed") == 2


def test_status_answered_during_crawl(crawl):
    st = crawl["first"]["status_during"]
    assert st is not None, "crawlerd status --json never answered"
    assert st["state"] == "running"
    for key in ("uptime_s", "pages", "pages_per_s_10s", "pages_per_s_60s", "queued", "hosts_active",
                "outcomes", "statuses"):
        assert key in st


@pytest.mark.parametrize("ledger", ["ledger1", "ledger2"])
def test_zero_politeness_violations(crawl, ledger):
    entries = entries_from_json(crawl[ledger])
    assert len(entries) > 0
    v = politeness_violations(entries, min_gap_s=1.0, per_ip_concurrency=1,
                              host_min_gap_s=crawl_delays(crawl["site"]))
    assert v == [], "\n".join(map(str, v[:20]))
    assert retry_after_violations(entries) == []


def test_politeness_cases_were_exercised(crawl):
    # the clean ledger above means something only if shared IPs, 429s and Crawl-delay were in play
    entries = crawl["ledger1"]
    hosts_per_ip = {}
    for e in entries:
        if e["status"]:
            hosts_per_ip.setdefault(e["ip"], set()).add(e["host"])
    assert any(len(h) >= 2 for h in hosts_per_ip.values()), "no IP shared by two crawled hosts"
    assert any(e["status"] == 429 and e["retry_after_s"] for e in entries), "no 429 with Retry-After answered"
    delayed = crawl_delays(crawl["site"])
    assert any(e["host"] in delayed and e["target"] != "/robots.txt" for e in entries), "no Crawl-delay host"


@pytest.mark.parametrize("ledger", ["ledger1", "ledger2"])
def test_zero_robots_violations(crawl, ledger):
    # the second run reuses the robots.txt copies of the first (fresh for 24 h, RFC 9309 §2.4):
    # robots-first is judged over both runs' requests
    entries = crawl["ledger1"] + (crawl["ledger2"] if ledger == "ledger2" else [])
    v = robots_violations(entries_from_json(entries), crawl["site"], agent="crawlerd")
    assert v == [], "\n".join(map(str, v[:20]))


def test_second_run_reuses_fresh_robots_txt(crawl):
    first = {e["host"] for e in crawl["ledger1"] if e["target"] == "/robots.txt" and e["status"] == 200}
    again = [e["host"] for e in crawl["ledger2"] if e["target"] == "/robots.txt" and e["host"] in first]
    assert first and again == [], again[:20]


def _warc_records(data_dir):
    warc_dir = os.path.join(data_dir, "warc")
    names = sorted(os.listdir(warc_dir))
    assert names and not any(n.endswith(".open") for n in names), names
    records = []
    for name in names:
        if not name.endswith(".warc.gz"):
            continue
        with open(os.path.join(warc_dir, name), "rb") as f:
            for rec in ArchiveIterator(f):
                records.append((rec.rec_type, rec.rec_headers.get_header("WARC-Target-URI")))
                rec.content_stream().read()
        with gzip.open(os.path.join(warc_dir, name)) as g:     # plain gzip reads it too
            assert g.read(8) == b"WARC/1.1"
    return records


def test_warc_one_capture_per_page_fetched(crawl):
    records = _warc_records(crawl["data_dir"])
    captures = Counter(uri for kind, uri in records if kind in ("response", "revisit"))
    port = crawl["port"]
    answered = Counter(f"http://{e['host']}:{port}{e['target']}"
                       for led in ("ledger1", "ledger2") for e in crawl[led] if e["status"])
    assert captures, "no response records"
    # every answer the server gave is archived exactly once, and nothing else is
    assert captures == answered, (set(captures) ^ set(answered))


def _is_robots(target: str) -> bool:
    # robots.txt (and its redirect hops) and the sitemaps it announces are re-read after a restart
    # (RFC 9309 §2.4: the cached copy is not trusted across the restart)
    name = target.rsplit("/", 1)[-1]
    return "robots" in name or name.startswith("sitemap")


def test_killed_worker_was_replaced(crawl):
    first = crawl["first"]
    assert first["killed_worker"], "the driver could not kill a worker"
    assert first["last_run"]["worker_restarts"] >= 1
    assert f"worker-{first['killed_worker']}" not in first["last_run"]["cpu_by_process_s"] or \
        len(first["last_run"]["cpu_by_process_s"]) > 2


def test_hosts_with_4xx_robots_are_crawled(crawl):
    # RFC 9309 §2.3.1.3: 4xx means no rules: the host is crawled
    hosts = crawl["site"]["hosts"]
    # a host sharing its IP with a silent robots.txt waits out that fetch's timeout (per-IP politeness)
    hung_ips = {d["ip"] for d in hosts.values() if d["robots"]["status"] == 0}
    fourxx = [h for h, d in hosts.items() if d["robots"]["status"] in (401, 403, 404) and d["ip"] not in hung_ips]
    assert fourxx
    fetched = {e["host"] for e in crawl["ledger1"] if e["target"] != "/robots.txt" and e["status"]}
    assert set(fourxx) <= fetched, set(fourxx) - fetched


def test_sitemaps_from_robots_are_read(crawl):
    # allow_all hosts announce a sitemap index -> gzipped urlset of /sm/ pages nothing else links to
    targets = {(e["host"], e["target"]) for e in crawl["ledger1"] if e["status"] == 200}
    sm_hosts = [h for h, d in crawl["site"]["hosts"].items() if d["robots"]["variant"] == "allow_all"]
    assert sm_hosts
    read = [h for h in sm_hosts if (h, "/sitemap-1.xml.gz") in targets]
    assert read, "no sitemap urlset was read"
    assert any(t.startswith("/sm/") for h, t in targets if h in read), "no sitemap-only page was fetched"


def test_second_run_fetches_nothing_again(crawl):
    done_first = {(e["host"], e["target"]) for e in crawl["ledger1"]
                  if e["status"] and e["status"] not in (429, 503) and e["status"] < 500
                  and not _is_robots(e["target"])}
    again = [(e["host"], e["target"]) for e in crawl["ledger2"]
             if (e["host"], e["target"]) in done_first]
    assert again == []
    assert crawl["second"]["last_run"]["pages"] > 0, "the second run resumes the queue"
