"""`kill -9` at several moments, restart on the same data dir: judged from the server's ledger and the files.

ARCHITECTURE.md invariant 3: every URL that passed the seen-set is fetched, queued, deferred or dropped with a
reason; `kill -9` at any moment loses at most the work in flight; restart resumes; WARC segments
are valid after any crash. The driver (tests/e2e/crash_driver.py) ends four runs by SIGKILL at
different moments (see its docstring) and a fifth cleanly.

Work in flight, measured on the server's clock: a run's *cut* is its SIGTERM or SIGKILL. An answer
that ended less than ``IN_FLIGHT_S`` before the cut may be lost (not archived, no event) or fetched
again after the restart: its processing, or the commit of its completion (the shard commits the
frontier at least every 2 s), may not have happened. Anything older is settled.
"""

import gzip
import json
import os
import subprocess
import sys
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

HOSTS, FINAL_S = 40, 8.0
IN_FLIGHT_S = 3.0
KILLED = ("orphans", "all", "drain", "startup")


pytestmark = NETNS_MARKS


@pytest.fixture(scope="module")
def crash(tmp_path_factory):
    base = tmp_path_factory.mktemp("crash")
    data_dir, out = str(base / "data"), str(base / "report.json")
    driver = os.path.join(os.path.dirname(__file__), "crash_driver.py")
    report = run_driver(driver, out, data_dir, str(HOSTS), str(FINAL_S))
    report["data_dir"] = data_dir
    report["by_name"] = {run["name"]: run for run in report["runs"]}
    return report


def _url(crash, e) -> str:
    return f"http://{e['host']}:{crash['port']}{e['target']}"


def _is_robots(target: str) -> bool:
    # robots.txt (and its redirect hops) and the sitemaps it announces are re-read after a restart
    name = target.rsplit("/", 1)[-1]
    return "robots" in name or name.startswith("sitemap")


def _cut(run) -> float | None:
    """When the run's ending began (SIGTERM or SIGKILL); None for the clean final run."""
    return run.get("t_term", run.get("t_kill"))


def _run_of(crash, e) -> dict:
    """The run a request belongs to: the last one launched before it started."""
    runs = [r for r in crash["runs"] if r["t_launch"] <= e["t_start"]]
    return runs[-1]


def _in_flight(crash, e) -> bool:
    cut = _cut(_run_of(crash, e))
    return cut is not None and e["t_end"] >= cut - IN_FLIGHT_S


def _warc_records(data_dir):
    """(type, target URI, segment name, offset) of every record; also checks each segment is plain gzip."""
    warc_dir = os.path.join(data_dir, "warc")
    out = []
    for name in sorted(os.listdir(warc_dir)):
        with open(os.path.join(warc_dir, name), "rb") as f:
            it = ArchiveIterator(f)
            for rec in it:
                out.append((rec.rec_type, rec.rec_headers.get_header("WARC-Target-URI"), name,
                            it.get_record_offset()))
                rec.content_stream().read()
        with gzip.open(os.path.join(warc_dir, name)) as g:
            assert g.read(8) == b"WARC/1.1", name
    return out


def _events(data_dir):
    events = []
    ev_dir = os.path.join(data_dir, "events")
    for name in sorted(os.listdir(ev_dir)):
        with open(os.path.join(ev_dir, name), "rb") as f:
            data = f.read()
        assert data.endswith(b"\n"), f"{name}: last line torn"
        for n, line in enumerate(data.splitlines(), 1):
            try:
                events.append(json.loads(line))
            except ValueError:
                pytest.fail(f"{name}:{n}: not JSON: {line[:200]!r}")
    return events


def test_every_run_ended_as_planned(crash):
    runs = crash["by_name"]
    assert [r["name"] for r in crash["runs"]] == [*KILLED, "final"]
    for name in KILLED:
        assert runs[name]["rc"] == -9, (name, runs[name]["rc"], runs[name]["stderr"])
        assert not runs[name].get("exited_before_kill"), name
    final = runs["final"]
    assert final["rc"] == 0 and not final.get("timed_out"), final["stderr"]
    for r in crash["runs"]:
        assert "Traceback" not in r["stderr"], r["stderr"]


def test_kills_hit_the_moments_they_aim_at(crash):
    runs = crash["by_name"]
    for name in ("orphans", "all", "drain"):
        st = runs[name]["stats_before_kill"]
        assert runs[name].get("t_ready"), f"{name}: status never answered before the kill"
        assert st["pages"] > 0, f"{name}: nothing fetched before the kill"
        # the drain closes the workers as soon as no lease needs them (the transfers still going
        # are short): by the drain's kill they may have exited in order, nothing left to kill
        if name != "drain":
            assert runs[name]["worker_pids"], f"{name}: no worker found to kill"
    # the drain kill lands inside the ordered shutdown, the start-up kill before READY
    assert "stop requested reason=SIGTERM" in runs["drain"]["stderr"]
    assert "stopped pages=" not in runs["drain"]["stderr"]
    assert runs["startup"].get("t_locked"), "the start-up run never took the data-dir lock"
    assert " started pid=" not in runs["startup"]["stderr"]


def test_restart_after_kill_finds_lock_and_socket_free(crash):
    runs = crash["runs"]
    for killed, nxt in zip(runs, runs[1:], strict=False):
        assert killed["lock_free"], f"{killed['name']}: data-dir lock still held after kill -9"
        # a stale control socket was left behind, and the next daemon listened anyway
        if killed.get("t_ready"):
            assert killed["socket_left"], killed["name"]
        assert nxt["name"] == "startup" or nxt.get("t_ready"), \
            f"{nxt['name']}: no status answer after restart: {nxt['stderr']}"
    final = crash["by_name"]["final"]
    assert not final["socket_left"], "control socket left after a clean stop"


def test_orphaned_workers_exit_by_themselves(crash):
    run = crash["by_name"]["orphans"]
    assert run["worker_pids"]
    assert run["orphans_left"] == [], "workers still running 10 s after the crawl process died"


def test_kills_left_open_segments_and_recovery_closed_them(crash):
    open_after_kill = {n for name in KILLED for n in crash["by_name"][name]["warc_after"] if n.endswith(".open")}
    assert open_after_kill, "no kill left a .open segment: recovery was not exercised"
    final = crash["by_name"]["final"]
    for sub in ("warc_after", "events_after"):
        assert not any(n.endswith(".open") for n in final[sub]), final[sub]
    logs = "".join(r["stderr"] for r in crash["runs"])
    for name in open_after_kill:
        # closed under its final name, or removed because it held no complete record
        assert name.removesuffix(".open") in final["warc_after"] or f"removed {name}" in logs, name


def test_every_segment_verifies(crash):
    warc_dir = os.path.join(crash["data_dir"], "warc")
    names = sorted(os.listdir(warc_dir))
    assert names and all(n.endswith(".warc.gz") for n in names), names
    r = subprocess.run([sys.executable, "-m", "crawlerd", "warc", "verify",
                        *(os.path.join(warc_dir, n) for n in names)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    records = _warc_records(crash["data_dir"])
    assert any(kind == "response" for kind, *_ in records)


def test_captures_are_answers_and_lost_answers_were_in_flight(crash):
    captures = Counter(uri for kind, uri, *_ in _warc_records(crash["data_dir"]) if kind in ("response", "revisit"))
    answers = [e for e in crash["ledger"] if e["status"]]
    answered = Counter(_url(crash, e) for e in answers)
    # archived at most once per answer the server gave, and nothing the server did not answer
    assert not captures - answered, captures - answered
    # an answer without its capture ended just before a kill (work in flight)
    lost = answered - captures
    settled_lost = []
    for url, n in lost.items():
        late = [e for e in answers if _url(crash, e) == url and _in_flight(crash, e)]
        if len(late) < n:
            settled_lost.append(url)
    assert settled_lost == [], settled_lost[:20]


def test_settled_pages_not_fetched_again(crash):
    entries = sorted(crash["ledger"], key=lambda e: e["t_start"])
    settled = {}
    for e in entries:
        if e["status"] and e["status"] not in (429, 503) and e["status"] < 500 and \
                not _is_robots(e["target"]) and not _in_flight(crash, e):
            settled.setdefault((e["host"], e["target"]), e["t_end"])
    again = [(e["host"], e["target"], _run_of(crash, e)["name"]) for e in entries
             if (e["host"], e["target"]) in settled and e["t_start"] > settled[(e["host"], e["target"])]]
    assert again == [], again[:20]
    # not vacuous: each crawling run that was killed settled pages before its kill window
    by_run = Counter(_run_of(crash, e)["name"] for e in entries if (e["host"], e["target"]) in settled
                     and e["t_end"] == settled[(e["host"], e["target"])])
    for name in ("orphans", "all", "drain"):
        assert by_run[name] >= 10, by_run


def test_every_run_after_a_crash_resumed(crash):
    runs = crash["by_name"]
    fetched = Counter(_run_of(crash, e)["name"] for e in crash["ledger"])
    for name in ("orphans", "all", "drain", "final"):
        assert fetched[name] > 0, f"{name}: no request reached the server"
    assert runs["final"]["last_run"]["pages"] > 0


def test_frontier_counts_add_up_after_crashes(crash):
    # every URL added is completed, dead-lettered, dropped, or still queued (nothing leased after a stop)
    fr = crash["by_name"]["final"]["last_run"]["frontier"]
    assert fr["leased"] == 0 and fr["leased_urls"] == 0, fr
    assert fr["added"] == fr["completed"] + fr["dead_letter"] + fr["dropped_total"] + fr["queued"], fr


@pytest.mark.parametrize("scope", ["whole", "per_run"])
def test_polite_and_robots_first_across_restarts(crash, scope):
    entries = entries_from_json(crash["ledger"])
    site = crash["site"]
    delays = crawl_delays(site)
    groups = [entries] if scope == "whole" else \
        [[x for x, e in zip(entries, crash["ledger"], strict=True) if _run_of(crash, e) is r] for r in crash["runs"]]
    for group in groups:
        if not group:
            continue
        # across a kill -9 too: the restarted daemon resumes each host after its gap
        v = politeness_violations(group, min_gap_s=1.0, per_ip_concurrency=1, host_min_gap_s=delays)
        assert v == [], "\n".join(map(str, v[:20]))
        assert retry_after_violations(group) == []
        if scope == "whole":
            # robots.txt before any page of the host, and its rules obeyed (RFC 9309)
            v = robots_violations(group, site, agent="crawlerd")
            assert v == [], "\n".join(map(str, v[:20]))


def test_fresh_robots_txt_is_not_fetched_again_after_a_restart(crash):
    """A robots.txt copy younger than its cache life survives the restart (RFC 9309 §2.4): a host's
    robots.txt is fetched again only if the earlier fetch was cut off by a kill."""
    site = crash["site"]
    fetches: dict[str, list] = {}
    for e in sorted(crash["ledger"], key=lambda e: e["t_start"]):
        spec = site["hosts"].get(e["host"])
        if spec is not None and e["target"].split("?")[0] == spec["robots"]["paths"][-1]:
            fetches.setdefault(e["host"], []).append(e)
    assert fetches
    again = [host for host, lst in fetches.items()
             if len(lst) > 1 and not any(_in_flight(crash, e) or not e["status"] for e in lst[:-1])]
    assert again == [], again[:20]


def test_every_restart_fetches_within_5_s(crash):
    """No restart stalls the crawl: each run reaches a server within 5 s of answering `status`."""
    starts = {}
    for e in crash["ledger"]:
        run = _run_of(crash, e)
        starts[run["name"]] = min(starts.get(run["name"], e["t_start"]), e["t_start"])
    for run in crash["runs"][1:]:
        if run["name"] == "startup":
            continue
        assert run["name"] in starts, f"{run['name']}: no request at all"
        assert starts[run["name"]] - run["t_ready"] < 5.0, (run["name"], starts[run["name"]] - run["t_ready"])


def test_events_parse_and_point_at_records(crash):
    events = _events(crash["data_dir"])
    assert events
    records = {(name, off): uri for kind, uri, name, off in _warc_records(crash["data_dir"])}
    for ev in events:
        w = ev.get("warc")
        if w and w.get("file"):
            key = (os.path.basename(w["file"]), w["offset"])
            assert key in records, f"event points at no record: {ev}"
            assert records[key] in (ev["url"], ev["final_url"]), (ev, records[key])


def test_settled_captures_have_events(crash):
    # the event of a page is flushed with the frontier's commit: only in-flight work may lack one
    events = Counter(ev["url"] for ev in _events(crash["data_dir"]) if ev.get("kind") == "page" and ev["status"])
    answers = {}
    for e in crash["ledger"]:
        if e["status"] and not _is_robots(e["target"]):
            answers.setdefault(_url(crash, e), []).append(e)
    captures = Counter(uri for kind, uri, *_ in _warc_records(crash["data_dir"])
                       if kind in ("response", "revisit") and not _is_robots(uri))
    missing = []
    for url in captures:
        settled = [e for e in answers.get(url, []) if not _in_flight(crash, e)]
        if settled and events[url] == 0:
            missing.append(url)
    assert missing == [], missing[:20]
