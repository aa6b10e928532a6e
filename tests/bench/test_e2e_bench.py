"""bench/e2e_bench.py: the ledger judge, /proc readers (e2e_watch.py), process control, summaries
(e2e_tables.py), and the namespace guard; plus one short crawlerd-only run in a private network namespace."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from crawlerd.simweb.ledger import HOST_GAP, HOST_OVERLAP, IP_CONCURRENCY, LedgerEntry
from crawlerd.simweb.netns import in_private_netns
from tests.bench.scripts import load_bench

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "bench", "e2e_bench.py")


e2e = load_bench("e2e_bench.py")
watch = load_bench("e2e_watch.py")
tables = load_bench("e2e_tables.py")


def _site(**robots_by_host) -> dict:
    """A site description shaped like GET /site, with only what the judge reads."""
    hosts = {}
    for name, (variant, groups) in robots_by_host.items():
        hosts[name] = {"robots": {"paths": ["/robots.txt"], "groups": groups, "variant": variant,
                                  "unavailable": variant.startswith("status_5")}}
    return {"hosts": hosts}


def _e(seq, host, target, t0, t1, status=200, ip=None, retry_after=None) -> LedgerEntry:
    return LedgerEntry(seq=seq, conn=seq, host=host, ip=ip or f"127.0.0.{seq + 10}", method="GET",
                       target=target, t_start=t0, t_end=t1, status=status, retry_after_s=retry_after)


ALLOW_ALL = ("allow_all", [{"agents": ["*"], "rules": []}])
NO_PRIVATE = ("disallow_private", [{"agents": ["*"], "rules": [["disallow", "/private/"]]}])
DELAY_3 = ("crawl_delay", [{"agents": ["*"], "rules": [], "crawl_delay_s": 3.0}])


class TestJudge:
    def test_pages_exclude_robots_and_unanswered_and_window_counts_starts(self):
        site = _site(**{"a.sim": ALLOW_ALL})
        entries = [_e(0, "a.sim", "/robots.txt", 100.0, 100.1),
                   _e(1, "a.sim", "/p/1.html", 101.2, 101.3),
                   _e(2, "a.sim", "/p/2.html", 102.4, 102.5, status=0),     # no answer: not a page
                   _e(3, "a.sim", "/p/3.html", 103.6, 103.7),
                   _e(4, "a.sim", "/p/4.html", 110.0, 110.1, status=404)]   # after the window
        j = e2e.judge(entries, site, t_launch=100.0, seconds=5.0, warmup_s=2.0)
        assert j["requests"] == 5
        assert j["steady_pages"] == 1 and j["steady_pages_per_s"] == pytest.approx(1 / 3)   # starts in [102, 105)
        assert j["refetches"] == 0
        assert j["robots_requests"] == 1
        assert j["pages"] == 3
        assert j["pages_2xx"] == 2
        assert j["pages_in_window"] == 2
        assert j["pages_per_s"] == pytest.approx(0.4)
        assert j["politeness"] == {HOST_OVERLAP: 0, HOST_GAP: 0, IP_CONCURRENCY: 0}
        assert j["robots"] == {} and j["retry_after"] == 0

    def test_gap_overlap_crawl_delay_robots_and_retry_after_are_counted(self):
        site = _site(**{"a.sim": NO_PRIVATE, "b.sim": DELAY_3, "c.sim": ALLOW_ALL})
        entries = [
            _e(0, "a.sim", "/robots.txt", 0.0, 0.1),
            _e(1, "a.sim", "/p/1.html", 0.5, 0.6),              # gap 0.4 s < 1 s
            _e(2, "a.sim", "/private/x", 2.0, 2.1),             # robots_disallowed
            _e(3, "b.sim", "/robots.txt", 0.0, 0.1),
            _e(4, "b.sim", "/p/1.html", 2.0, 2.1),              # gap 1.9 s < Crawl-delay 3 s
            _e(5, "c.sim", "/p/1.html", 0.0, 1.0),              # before robots.txt: robots_not_first
            _e(6, "c.sim", "/robots.txt", 0.5, 0.6),            # overlaps seq 5
            _e(7, "c.sim", "/p/2.html", 3.0, 3.1, status=429, retry_after=5.0),
            _e(8, "c.sim", "/p/3.html", 4.5, 4.6),              # inside Retry-After
        ]
        j = e2e.judge(entries + [_e(9, "c.sim", "/p/3.html", 9.0, 9.1)], site, t_launch=0.0, seconds=10.0,
                      warmup_s=0.0)
        assert j["refetches"] == 1                          # /p/3.html asked twice
        assert j["politeness"][HOST_GAP] == 2
        assert j["politeness"][HOST_OVERLAP] == 1
        assert j["robots"] == {"robots_disallowed": 1, "robots_not_first": 1}
        assert j["retry_after"] == 1
        assert j["examples"]

    def test_shared_ip_concurrency(self):
        site = _site(**{"a.sim": ALLOW_ALL, "b.sim": ALLOW_ALL})
        entries = [_e(0, "a.sim", "/robots.txt", 0.0, 0.1, ip="127.1.1.1"),
                   _e(1, "b.sim", "/robots.txt", 0.05, 0.2, ip="127.1.1.1")]
        j = e2e.judge(entries, site, t_launch=0.0, seconds=1.0, warmup_s=0.0)
        assert j["politeness"][IP_CONCURRENCY] == 1


class TestProc:
    def test_cpu_rss_and_family_of_a_child(self):
        child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
        try:
            family = watch.process_family(os.getpid())
            assert family[0] == os.getpid() and child.pid in family
            assert watch.process_family(child.pid) == [child.pid]
            assert watch.proc_ppid(child.pid) == os.getpid()
            assert watch.proc_cpu_s(os.getpid()) > 0.0
            assert watch.proc_status_kib(child.pid, "VmRSS") > 0
            s = watch.FamilySampler(os.getpid())
            s.sample()
            assert s.samples == 1
            assert s.peak_rss_kib >= watch.proc_status_kib(os.getpid(), "VmRSS") // 2
            assert set(s.hwm_kib) >= {os.getpid(), child.pid}
        finally:
            child.stdin.close()
            child.wait()
        assert watch.proc_cpu_s(child.pid) is None
        assert watch.proc_status_kib(child.pid, "VmRSS") is None

    def test_threads_of_a_process_and_their_cpu_and_writes_over_a_window(self, tmp_path):
        """The crawl process's threads (the writer's share): each one's CPU and bytes written
        between two samples, by thread id, and named from the --thread-names hook's log."""
        import threading
        import time
        go, done, leave, tids = threading.Event(), threading.Event(), threading.Event(), []

        def busy():
            tids.append(threading.get_native_id())
            go.wait()
            with open(tmp_path / "w", "wb") as f:
                f.write(b"x" * 300_000)
            end = time.process_time() + 0.05      # thread CPU of the process: at least 50 ms here
            while time.process_time() < end:
                pass
            done.set()
            leave.wait(30)                          # alive at the second sample

        t = threading.Thread(target=busy, name="busy-one")
        t.start()
        try:
            while not tids:
                time.sleep(0.01)
            s = watch.FamilySampler(os.getpid())
            s.sample()
            assert os.getpid() in s.threads[-1][1] and tids[0] in s.threads[-1][1]
            go.set()
            done.wait(30)
            s.sample()
        finally:
            go.set()
            leave.set()
            t.join()
        covered, used = s.threads_between(s.threads[0][0], s.threads[-1][0])
        assert covered > 0
        cpu, written = used[tids[0]]
        assert written >= 300_000 and cpu >= 0
        figures = e2e._thread_figures(s, s.threads[0][0], s.threads[-1][0], requests=1)
        assert [f["tid"] for f in figures] == sorted(used)
        log = tmp_path / "threads.log"
        log.write_text(f"{tids[0]} busy-one\n")
        e2e._name_threads(figures, str(log), os.getpid())
        names = {f["tid"]: f["name"] for f in figures}
        assert names[tids[0]] == "busy-one" and names[os.getpid()] == "loop"

    def test_wait_bounded_returns_status_and_cpu(self):
        child = subprocess.Popen([sys.executable, "-c", "sum(range(10**6))"])
        rc, cpu = e2e.wait_bounded(child, deadline=float("inf"), name="t")
        assert rc == 0 and cpu > 0.0 and child.returncode == 0

    def test_wait_bounded_terminates_after_the_deadline(self):
        child = subprocess.Popen(["sleep", "300"])
        rc, _cpu = e2e.wait_bounded(child, deadline=0.0, name="t")
        assert rc == -15


class TestPeerPlumbing:
    def test_hosts_file_maps_every_name_and_keeps_localhost(self):
        text = e2e.hosts_file_text({"h1.sim": "127.1.1.2", "h0.sim": "127.1.1.1"})
        lines = text.splitlines()
        assert "127.0.0.1 localhost" in lines
        assert lines.index("127.1.1.1 h0.sim") < lines.index("127.1.1.2 h1.sim")
        assert text.endswith("\n")

    def test_peer_command_only_adds_a_mount_namespace(self):
        cmd = e2e.peer_command("/tmp/h", "/tmp/seeds", 12.0, "/tmp/out.json")
        assert cmd[:2] == ["unshare", "-m"] and "-n" not in cmd[:cmd.index("sh")]
        assert 'mount --bind "$0" /etc/hosts && exec "$@"' in cmd and "/tmp/h" in cmd
        assert cmd[cmd.index("--seconds") + 1] == "12.0"
        assert cmd[cmd.index("--robots-agent") + 1] == e2e.ROBOTS_AGENT


def _result(crawler, pages, window, cpu, rss_kib, gaps=0, robots=None, warc_ok=True):
    j = {"pages": pages, "pages_in_window": window, "pages_per_s": window / 10.0,
         "politeness": {HOST_OVERLAP: 0, HOST_GAP: gaps, IP_CONCURRENCY: 0}, "robots": robots or {},
         "retry_after": 0, "refetches": 0, "refetch_share": 0.0}
    return e2e.CrawlResult(crawler=crawler, rc=0, judged=j, cpu_by_process_s={"crawl": cpu / 2, "workers": cpu / 2},
                           cpu_total_s=cpu, simweb_cpu_s=cpu / 10, peak_rss_kib=rss_kib, hwm_kib={},
                           warc={"valid": warc_ok})


class TestSummary:
    def test_medians_and_summed_violations(self):
        rs = [_result("crawlerd", 100, 90, 1.0, 1024 * 100, gaps=1),
              _result("crawlerd", 200, 180, 1.0, 1024 * 300, robots={"robots_disallowed": 2}),
              _result("crawlerd", 400, 360, 1.0, 1024 * 200, gaps=2)]
        s = tables.summarize(rs)
        assert s["runs"] == 3
        assert s["pages"] == 200 and s["pages_in_window"] == 180 and s["pages_per_s"] == 18.0
        assert s["cpu_ms_per_page"] == 5.0                   # median of 10, 5, 2.5
        assert s["cpu_ms_per_page_by_process"] == {"crawl": 2.5, "workers": 2.5}
        assert s["peak_rss_mib"] == 200
        assert s["politeness"][HOST_GAP] == 3
        assert s["robots"] == {"robots_disallowed": 2}
        assert s["warc_valid"] is True

    def test_one_bad_warc_fails_the_column_and_zero_pages_has_no_rate(self):
        s = tables.summarize([_result("crawlerd", 0, 0, 1.0, 1, warc_ok=True),
                           _result("crawlerd", 10, 5, 1.0, 1, warc_ok=False)])
        assert s["warc_valid"] is False
        assert s["cpu_ms_per_page"] == 100.0                 # the run with no pages has no ratio

    def test_table_prints_both_crawlers_and_the_ratio(self, capsys):
        summary = {"crawlerd/http": tables.summarize([_result("crawlerd", 100, 90, 1.0, 1024)]),
                   "scrapy/http": tables.summarize([_result("scrapy", 100, 45, 4.0, 2048, gaps=7)])}
        summary["scrapy/http"]["warc_valid"] = None
        tables.print_table(summary, runs=1, hosts=10, seconds=10.0)
        out = capsys.readouterr().out
        assert "http: crawlerd / scrapy: pages/s x2.00, CPU per page x0.25, peak RSS x0.50" in out
        assert "7 (o0 g7 ip0)" in out


class TestWarcVerify:
    def test_no_segments_is_not_valid(self, tmp_path):
        assert e2e.warc_verify(str(tmp_path))["valid"] is False
        assert e2e.warc_verify(str(tmp_path / "missing"))["segments"] == 0

    def test_torn_segment_is_not_valid(self, tmp_path):
        (tmp_path / "x.warc.gz").write_bytes(b"\x1f\x8b\x08\x00 not really gzip")
        rep = e2e.warc_verify(str(tmp_path))
        assert rep["segments"] == 1 and rep["valid"] is False


def test_refuses_outside_a_private_namespace_when_told_it_is_inside(capsys):
    if in_private_netns():
        pytest.skip("already in a private network namespace")
    assert e2e.main(["--inside-netns", "--no-peer"]) == 2
    assert "refusing" in capsys.readouterr().err


def test_bad_arguments_exit_2():
    assert e2e.main(["--hosts", "0"]) == 2
    assert e2e.main(["--runs", "0"]) == 2


def _can_unshare() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        return False
    return subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0


@pytest.mark.netns
@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare -n")
def test_short_crawlerd_run_in_a_private_namespace(tmp_path):
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, BENCH, "--hosts", "6", "--seconds", "4", "--no-peer", "--json", str(out)],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "crawlerd" in r.stdout and "scrapy" not in r.stdout.split("===")[-1].split("pages:")[0]
    rep = json.loads(out.read_text())
    (res,) = rep["results"]["crawlerd/http"]
    assert res["rc"] == 0
    assert res["judged"]["pages"] > 0
    assert res["warc"]["valid"] is True and res["warc"]["records"] > 0
    assert set(res["cpu_by_process_s"]) == {"crawl", "workers"}
    assert res["peak_rss_kib"] > 0 and res["simweb_cpu_s"] >= 0
    assert sum(res["judged"]["politeness"].values()) == 0
    assert res["judged"]["robots"] == {} and res["judged"]["retry_after"] == 0
