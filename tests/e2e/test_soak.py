"""Soak: RAM stays flat while a long crawl piles URLs and pages up on disk
(ARCHITECTURE.md invariant 4), politely, with a valid WARC.

`bench/soak_bench.py` runs simweb and `crawlerd run` in a private network namespace and samples
/proc/<pid>/status of the crawl process and every worker, and the daemon's stats, every few
seconds. After the warm-up (all hosts active, the RAM caps full), the private memory (RssAnon) of
every crawler process is fitted against the unique URLs the seen-set admitted and against the
pages fetched: keeping URLs in RAM would cost 100+ bytes each, and the near-duplicate index in
RAM cost 40 bytes per page, so at most 1 byte per URL and 2 bytes per page means everything that
grows with the crawl lives on disk (a billion pages: at most 2 GB). The file-backed part of RSS is
the page cache of the memory-mapped LMDB stores, which the kernel reclaims; it is bounded by the
size of the state on disk.

Long (`make test-long`, ~55 minutes): SOAK_SECONDS (default 2400) and SOAK_HOSTS (default 20000)
from the environment. Forty minutes, not fifteen: the last bounded caches (recrawl reads, DUST's
states) still fill ten minutes in, and a fit that starts among them reads their fill as a slope
(20-minute soaks of the same tree: +4.1 B/page; 40 minutes: +0.87, its late half -0.09).
SOAK_REPORT=<json>: check a report `bench/soak_bench.py OUT ... --check-ledger` already wrote
instead of running one (set SOAK_SECONDS and SOAK_HOSTS to its run's).
"""

import json
import os

import pytest

from tests.e2e.netns import NETNS_MARKS, run_driver

SECONDS = float(os.environ.get("SOAK_SECONDS", "2400"))
REPORT = os.environ.get("SOAK_REPORT", "")
HOSTS = int(os.environ.get("SOAK_HOSTS", "20000"))
INTERVAL_S = 3.0          # many samples: the per-page slope is a few bytes against MiB of noise
MAX_SLOPE_B_PER_URL = 1.0       # a URL kept in RAM costs 100+ bytes (its text ~60, a str object 100+)
MAX_SLOPE_B_PER_PAGE = 2.0      # a billion pages: at most 2 GB
MIN_FIT_URLS = 200_000          # the fit must span this many URLs, or the slope says nothing
MIB = 1 << 20

pytestmark = [*NETNS_MARKS, pytest.mark.long, pytest.mark.timeout(1.5 * SECONDS + 1200)]


@pytest.fixture(scope="module")
def soak(tmp_path_factory):
    if REPORT:                  # a soak already run: its report checked as it stands
        with open(REPORT) as f:
            run = json.load(f)["runs"][0]
        print("\n".join(run["summary"]))
        return run
    base = tmp_path_factory.mktemp("soak")
    out = str(base / "soak.json")
    driver = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                          "bench", "soak_bench.py")
    report = run_driver(driver, out, "--seconds", str(SECONDS), "--hosts", str(HOSTS),
                        "--interval", str(INTERVAL_S), "--check-ledger", timeout=1.5 * SECONDS + 1100)
    run = report["runs"][0]
    print("\n".join(run["summary"]))
    return run


def test_daemon_ran_and_exited_cleanly(soak):
    assert soak["rc"] == 0, soak["stderr"]
    assert "Traceback" not in soak["stderr"], soak["stderr"]
    assert soak["last_run"]["pages"] > 0


def test_sampled_all_through_the_crawl(soak):
    samples = soak["samples"]
    assert len(samples) >= 0.8 * SECONDS / INTERVAL_S, len(samples)
    assert all("crawl" in s["mem"] for s in samples)
    assert all(any(k.startswith("worker-") for k in s["mem"]) for s in samples)


def test_every_host_was_active(soak):
    # the warm-up ends when all hosts are taken up: RAM may grow with active hosts, not with URLs
    assert max(s["hosts_total"] for s in soak["samples"]) == HOSTS
    assert soak["analysis"]["warmup_samples"] < len(soak["samples"]), "the warm-up never ended"


def test_fit_spans_many_urls(soak):
    lo, hi = soak["analysis"]["seen_range"]
    assert hi - lo >= MIN_FIT_URLS, (lo, hi)
    q_lo, q_hi = soak["analysis"]["queued_range"]
    assert q_hi > q_lo, "the queue did not grow: nothing piled up on disk"


# Measured (bench/RESULTS.md, branches mem8 and mem9: 15-min soaks, 20,000 hosts, one run each, under
# the bench lock): with every cap full before the fit (the read caches small in the soak profile, the
# warm-up waiting for the caps that fill) Python's arenas stay at their high-water mark through the
# fit, but the crawl process still rises ~1.2 MiB over 410 k pages: +4.5 B/page (block-bootstrap
# interval +3.2 ... +5.8), on the C side (glibc's mapped blocks, thread arenas), not attributed yet;
# +0.20 B/URL. Workers +0.35 B/page, +0.01 B/URL. mem10 found and removed the C side's parts (the
# digest set's LMDB buffers, DRUM's bucket high-water) and maps Python's arenas resident whole;
# its soaks: +4.96 B/page (+1.8 ... +8.3; 15 min) and -4.67 (-10.4 ... +1.2; 10 min), what is left
# in steps of the Python arena count (a running maximum of live objects) whose place against the
# warm-up decides the slope; +0.24 / -0.20 B/URL; workers +2.98 / +2.23 B/page (their own arena
# steps). mem11 keeps DRUM's deliveries as arrays (answer objects made a slice at a time): in one
# 15-min soak per side under the lock the arena count stepped once in the fit (base: five), the
# per-page slope +12.1 B/page (95 % interval +4.4 ... +20.2; base +31.2), per URL +0.49 (base
# +1.30); workers +0.34 / +0.01. The soak prints each slope's block-bootstrap interval and the arena
# steps' share: one 15-min soak's interval is 2.7-16 B/page wide (a 1 MiB arena step alone is
# 2.5-4 B/page over the fit), so one run shows neither the bound met nor missed.
# The workers' bound passed or failed by the run (mem13: +3.8, +4.4 B/page) because of one step: a
# worker sorted a rotated segment's CDXJ in process (8 MiB of lines as small objects: its arenas
# 12 -> 20, one left mapped); mem14 moved that sort to a child process (worker_mem_bench: no arena
# step in 300 k pages; one soak with a rotation inside the fit: workers -0.41 B/page).
# mem15 bounded the budget store's writes not landed (budgets.unlanded_bytes), which mem13 found at
# the allocated blocks' spikes: without the bound they reached 5.5 MiB and the crawl's per-page slope
# was +15.4 B/page (+11.1 ... +19.8, three arena steps); with it 1.2 MiB at most and +2.2 (-1.1 ... +5.1,
# two steps not at a budget spike): one soak per side, its interval still reaching past the bound.
# dust16 bounded DUST's, the frontier's and recrawl's too (dust.unlanded_bytes, frontier.unlanded_bytes):
# two soaks, no arena step in one fit and one at its end in the other, yet +7.3 (+5.5 ... +9.2) and
# +5.7 (+3.3 ... +8.6) B/page, on the C side, while the seen-set's pending URLs rose through both fits.
# mem17 split those pending URLs by where they wait: in a soak of main (9df36e9) they were merged answers
# waiting in DRUM for admission (35 k -> 138 k, first -> last third of the fit; the keys in RAM <= 6 k),
# one delivery admitted per commit-land-sync round trip; with a delivery released once its commits are
# handed over (the next judged while they land), only the head epoch's answers in RAM and the bound
# counting what leases in flight still submit, the pending URLs stayed flat (16 k -> 17 k waiting) and
# the crawl's slope was -0.62 B/page (-2.17 ... +1.09; no arena step in the fit) against main's +2.83
# (+0.58 ... +4.91, one step) in the same hour: one soak per side, the first whose interval is within
# the bound. So the crawl process's case is asserted again.
# The lead's confirmation soak of main b3aa10e (nineteenth pass, a loaded box) failed it: +8.20 B/page
# (+5.08 ... +11.47), the brk heap's resident pages +2.8 MiB while the C heap in use stayed flat.
# mem19 kept the C heap resident whole instead of trimming it (side branch mem19-resident): in its
# soak the brk heap's resident equalled glibc's extent to 0.01 MiB, yet the crawl measured +3.52 B/page
# (+0.16 ... +6.99): the extent itself stepped up 1.4 MiB with the peaks of bodies waiting for a worker;
# its second soak ended in a SIGSEGV of that branch (fixed there, not measured again). So the crawl's
# per-page case is a non-strict xfail again; the workers' is asserted (+0.43, +0.45 B/page).
# pool20 moved the bodies out of the heap (+5.76 B/page after). mem21 soaked main 004c484 with every
# malloc recorded by call chain (bench/malloc_sites.c, from 400 s and from 20 s): +7.47 B/page (+5.30 ..
# +9.69; the brk heap's resident +10.7, the C heap in use +6.7, other anonymous maps -3.3), yet no call
# chain kept rising through the fit; the only chains that never free are numpy's own cache of small
# array buffers (at most 7 per byte size below 1 KiB, ~3.4 MiB at most; a fill), the rest swing.
# The one group that rose: DUST's read cache values (dust.read_cache_bytes, at its cap while each
# host's record grows 0.9 -> 2.2 KB); in two 10-min soaks the cache at 1 MiB instead of 8 stopped the
# brk heap's extent rising (+0.88 against +7.34 B/page): not yet shown on this test's slope.
# The lead's 20-min soak with it at 1 MiB: C heap flat, +5.39 (+3.99 .. +6.77) B/page. mem22 made it
# the default, bounded the queue heads in bytes (small profile 2 MiB: every cap full by 54 s, far
# inside the warm-up) and prints each component's slope: +4.10 (+2.95 .. +5.43) B/page, every
# bounded component flat (|slope| <= 0.32), the rest in the other anonymous maps (+2.56: Python's
# arenas, thread arenas) and the brk heap (+1.62).
# mem22 bounded the last cache the traced soak saw filling (the frontier's queue heads, now in bytes)
# and printed each bounded component's slope: in its 20-min soak all 18 were flat and the crawl read
# +4.10 B/page (+2.95 .. +5.43). The lead's 40-min soak of the merged tree (main 4f4adfa; warm-up
# 720 s, fit over 1.12 M pages and 10 M URLs): +0.87 B/page (+0.50 .. +1.22), +0.11 B/URL, its late
# half -0.09; workers -0.06: the 20-minute fits began while the recrawl read cache and DUST's states
# were still filling. So the default soak is 40 minutes and the crawl's per-page case is asserted.


@pytest.mark.parametrize("proc", ["crawl", "workers"])
def test_private_memory_slope_per_url_is_small(soak, proc):
    p = soak["analysis"]["procs"][proc]
    assert p["anon_slope_b_per_url"] is not None
    assert p["anon_slope_b_per_url"] <= MAX_SLOPE_B_PER_URL, p


@pytest.mark.parametrize("proc", ["crawl", "workers"])
def test_private_memory_slope_per_page_is_small(soak, proc):
    # RAM grows with active hosts only (capped by config); pages fetched and their
    # fingerprints go to disk (WARC, LMDB, the near-duplicate index's run files)
    p = soak["analysis"]["procs"][proc]
    assert p["anon_slope_b_per_page"] is not None
    assert p["anon_slope_b_per_page"] <= MAX_SLOPE_B_PER_PAGE, p


def test_every_page_was_processed(soak):
    # a page the worker failed on is archived raw and yields no links: the crawl stops finding URLs
    assert soak["samples"][-1]["process_errors"] == 0, soak["samples"][-1]


def test_components_stay_within_their_caps(soak):
    for s in soak["samples"]:
        for name, held in s.get("components_full", {}).items():
            assert held["bytes"] <= held["cap_bytes"], (name, held)


def test_file_backed_memory_is_bounded_by_the_state_on_disk(soak):
    # RssFile: pages of the mapped LMDB stores and shared libraries; it cannot outgrow what is on disk
    disk = sum(v for k, v in soak["disk_bytes"].items() if k not in ("warc", "index", "events"))
    for s in soak["samples"]:
        crawl = s["mem"]["crawl"]
        assert crawl["RssFile"] <= disk + 128 * MIB, (s, disk)


def test_zero_politeness_violations(soak):
    c = soak["checks"]
    assert c["answered"] > 0
    assert c["politeness_count"] == 0, "\n".join(c["politeness"])
    assert c["retry_after_count"] == 0, "\n".join(c["retry_after"])


def test_zero_robots_violations(soak):
    c = soak["checks"]
    assert c["robots_count"] == 0, "\n".join(c["robots"])


def test_warc_valid(soak):
    c = soak["checks"]
    assert c["warc_files"] and not any(n.endswith(".open") for n in c["warc_files"]), c["warc_files"]
    assert c["warc_errors"] == [], c["warc_errors"]
    # every answer simweb gave is archived (responses, revisits for exact duplicates)
    assert c["warc_responses"] == c["answered"], (c["warc_responses"], c["answered"])
