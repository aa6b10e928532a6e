"""Recrawl state: adaptive intervals, due order, the hand-out invariant, crashes, validators, bounded RAM."""

import gc
import os
import random
import signal
import subprocess
import sys
import textwrap
import tracemalloc

import pytest

from crawlerd.frontier.recrawl import MAX_VALIDATOR_BYTES, Recrawl, RecrawlItem
from tests.frontier.recrawl_parts import T0, A, crash, open_rc, rec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def rc(tmp_path):
    r = open_rc(tmp_path / "recrawl")
    yield r
    r.close()


# == adaptive intervals ===================================================================
def test_first_visit_schedules_the_initial_interval(rc):
    assert rec(rc, 1, T0, etag='"v1"')
    st = rc.state(1)
    assert (st.url, st.host_key, st.interval_s, st.due_at, st.status) == (f"{A}/p1", A, 40.0, T0 + 40, 200)
    assert rc.next_due_at() == T0 + 40


def test_change_halves_no_change_doubles_clamped(rc):
    rec(rc, 1, T0, digest="a")
    # (digest, status) of each visit and the interval it must leave: same digest or 304 doubles up to
    # the max, a new digest halves down to the min
    plan = [("a", 200, 80), ("a", 200, 160), (None, 304, 320), (None, 304, 320), ("b", 200, 160),
            ("c", 200, 80), ("d", 200, 40), ("e", 200, 20), ("f", 200, 10), ("g", 200, 10)]
    for digest, status, interval in plan:
        t = rc.state(1).due_at
        assert [i.fp for i in rc.due(t)] == [1]
        rec(rc, 1, t, digest=digest, status=status)
        st = rc.state(1)
        assert (st.interval_s, st.due_at, st.handed_out) == (interval, t + interval, False)
    s = rc.stats()
    assert (s["unchanged"], s["not_modified"], s["changed"]) == (2, 2, 6)
    rc.check_invariants()


def test_explicit_changed_wins_and_unknown_keeps_interval(rc):
    rec(rc, 1, T0, digest=None)
    rec(rc, 1, T0 + 40, digest="x")                  # nothing stored to compare with: keep 40
    assert rc.state(1).interval_s == 40
    rec(rc, 1, T0 + 80, digest="x", changed=True)    # caller knows better (e.g. simhash distance)
    assert rc.state(1).interval_s == 20
    rec(rc, 1, T0 + 100, digest="y", changed=False)
    assert rc.state(1).interval_s == 40


def test_fast_page_is_visited_more_often_than_a_static_one(rc):
    """Simulation on a virtual clock: page 1 changes every 15 s, page 2 never (Cho & Garcia-Molina)."""
    rec(rc, 1, T0, digest="v0")
    rec(rc, 2, T0, digest="static")
    visits = {1: 0, 2: 0}
    now = T0
    while now < T0 + 3000:
        now = rc.next_due_at()
        for item in rc.due(now, 10):
            visits[item.fp] += 1
            digest = f"v{int((now - T0) // 15)}" if item.fp == 1 else "static"
            assert rc.record(item.url, item.fp, item.host_key, fetched_at=now, status=200, etag=None,
                             last_modified=None, digest=digest, changed=None)
    assert rc.state(1).interval_s == 10 and rc.state(2).interval_s == 320
    assert visits[1] > 5 * visits[2] > 0


def test_jitter_stays_within_its_band_and_is_reproducible(tmp_path):
    dues = []
    for run in range(2):
        r = open_rc(tmp_path / f"j{run}", jitter=0.25, rng=random.Random(7))
        for n in range(200):
            rec(r, n, T0)
        dues.append([r.state(n).due_at for n in range(200)])
        r.close()
    assert dues[0] == dues[1]
    assert all(T0 + 30 - 1e-3 <= d <= T0 + 50 + 1e-3 for d in dues[0])
    assert len(set(dues[0])) > 100                   # spread, not one burst


# == validators, 304, errors ==================================================================
def test_validators_round_trip(rc):
    etag, lm = 'W/"xyz-\u00e9"', "Tue, 15 Nov 1994 12:45:26 GMT"
    rec(rc, 1, T0, etag=etag, lm=lm, digest="sha1:AAAA")
    assert rc.validators(1) == (etag, lm)
    assert rc.last_digest(1) == "sha1:AAAA"
    assert rc.last_capture(1) == ("sha1:AAAA", T0)
    assert rc.validators(99) == (None, None) and rc.last_digest(99) is None and rc.last_capture(99) is None


def test_unsendable_validators_are_not_stored(rc):
    rec(rc, 1, T0, etag='"a"\r\nX-Evil: 1', lm="x" * (MAX_VALIDATOR_BYTES + 1))
    assert rc.validators(1) == (None, None)
    rec(rc, 2, T0, etag="  ", lm=" Tue, 15 Nov 1994 12:45:26 GMT ")
    assert rc.validators(2) == (None, "Tue, 15 Nov 1994 12:45:26 GMT")


def test_304_keeps_the_capture_and_refreshes_validators(rc):
    rec(rc, 1, T0, etag='"v1"', lm="Mon, 01 Jan 2024 00:00:00 GMT", digest="sha1:CAP")
    rec(rc, 1, T0 + 40, status=304, etag='"v1b"', lm=None, digest="sha1:EMPTY")
    assert rc.validators(1) == ('"v1b"', "Mon, 01 Jan 2024 00:00:00 GMT")   # RFC 9110 §15.4.5
    assert rc.last_capture(1) == ("sha1:CAP", T0)
    assert rc.state(1).fetched_at == T0 + 40
    rec(rc, 1, T0 + 80, status=304, etag=None, lm="Tue, 02 Jan 2024 00:00:00 GMT")
    assert rc.validators(1) == ('"v1b"', "Tue, 02 Jan 2024 00:00:00 GMT")


def test_200_replaces_validators_even_with_none(rc):
    rec(rc, 1, T0, etag='"v1"', lm="Mon, 01 Jan 2024 00:00:00 GMT", digest="a")
    rec(rc, 1, T0 + 40, etag=None, lm=None, digest="b")
    assert rc.validators(1) == (None, None)
    assert rc.last_capture(1) == ("b", T0 + 40)


def test_errors_back_off_to_max_then_drop(rc):
    rec(rc, 1, T0, etag='"v1"', digest="a")
    rec(rc, 1, T0 + 40, status=404, digest="nf")
    st = rc.state(1)
    assert st.due_at == T0 + 40 + 320 and st.errors == 1 and st.interval_s == 40
    assert rc.validators(1) == (None, None) and rc.last_digest(1) == "a"
    rec(rc, 1, T0 + 400, status=500)
    assert rc.state(1).errors == 2
    rec(rc, 1, T0 + 800, status=200, digest="a")     # an answer resets the count, interval resumes
    assert rc.state(1).errors == 0 and rc.state(1).interval_s == 80
    for i in range(3):
        assert rc.state(1) is not None
        rec(rc, 1, T0 + 1000 + i, status=403)
    assert rc.state(1) is None and rc.stats()["dropped"] == 1
    assert rc.next_due_at() is None


def test_gone_drops_at_once_and_untracked_errors_are_ignored(rc):
    rec(rc, 1, T0)
    rec(rc, 1, T0 + 1, status=410)
    assert rc.state(1) is None
    assert not rec(rc, 2, T0, status=404)
    assert not rec(rc, 3, T0, status=304)
    assert not rec(rc, 4, T0, status=0)
    assert rc.stats()["tracked"] == 0
    assert rec(rc, 1, T0 + 5)                         # fetched again: re-enters with the initial interval
    assert rc.state(1).interval_s == 40


def test_forget(rc):
    rec(rc, 1, T0)
    assert rc.forget(1) and not rc.forget(1)
    assert rc.due(T0 + 1000) == []
    rc.check_invariants()


# == due order and the hand-out invariant ===================================================
def test_due_returns_earliest_first_ties_by_fp_up_to_limit(rc):
    times = {5: 30, 3: 10, 9: 10, 1: 20, 7: 40}
    for fp, dt in times.items():
        rec(rc, fp, T0 + dt)                          # due at T0 + dt + 40
    assert rc.due(T0 + 49.999) == []
    assert [i.fp for i in rc.due(T0 + 60, 2)] == [3, 9]
    assert [i.fp for i in rc.due(T0 + 75)] == [1, 5]
    rest = rc.due(T0 + 84)                           # 3 and 9 come back only at T0 + 85
    assert rest == [RecrawlItem(f"{A}/p7", 7, A, 0)]


def test_handed_out_url_is_not_returned_again_until_recorded_or_reissued(rc):
    rec(rc, 1, T0)
    rec(rc, 2, T0)
    now = T0 + 40
    assert [i.fp for i in rc.due(now)] == [1, 2]
    assert rc.due(now) == [] and rc.due(now + 24.999) == []
    assert rc.stats()["handed_out_now"] == 2
    rec(rc, 1, now + 1)                               # fp 1 answered: scheduled from its visit
    assert rc.state(1).due_at == now + 1 + 80 and not rc.state(1).handed_out
    reissued = rc.due(now + 25)                       # fp 2 never answered: back after the timeout
    assert [i.fp for i in reissued] == [2]
    assert rc.state(2).errors == 1
    assert rc.due(now + 49) == []
    assert [i.fp for i in rc.due(now + 50)] == [2]
    assert rc.due(now + 75) == []                     # third miss: dropped (drop_after_errors = 3)
    assert rc.state(2) is None
    s = rc.stats()
    assert (s["reissued"], s["dropped"], s["handed_out_now"], s["tracked"]) == (2, 1, 0, 1)
    rc.check_invariants()


def test_record_is_idempotent(rc):
    rec(rc, 1, T0, digest="a")
    rec(rc, 1, T0 + 40, digest="b")
    before = rc.state(1)
    assert not rec(rc, 1, T0 + 40, digest="b")        # the same visit again
    assert not rec(rc, 1, T0 + 10, digest="c")        # an older one
    assert rc.state(1) == before and rc.stats()["ignored"] == 2
    rc.check_invariants()


def test_disabled_does_nothing(tmp_path):
    r = Recrawl(str(tmp_path / "off"), enabled=False)
    assert not r.record("http://a.test/", 1, A, fetched_at=T0, status=200, etag='"x"', last_modified=None,
                        digest="d", changed=None)
    assert r.due(T0 + 1e9) == [] and r.validators(1) == (None, None) and r.stats() == {"enabled": False}
    r.commit()
    r.close()
    assert not os.path.exists(tmp_path / "off")


@pytest.mark.parametrize("kw", [dict(min_interval_s=0.0), dict(initial_interval_s=5.0),
                                dict(max_interval_s=20.0), dict(reissue_timeout_s=0.0),
                                dict(drop_after_errors=0), dict(jitter=1.0), dict(group_ops=0)])
def test_bad_parameters_are_refused(tmp_path, kw):
    with pytest.raises(ValueError):
        open_rc(tmp_path / "bad", **kw)


# == durability ==============================================================================
def test_reopen_after_crash_keeps_committed_state_only(tmp_path):
    path = tmp_path / "r"
    r = open_rc(path)
    for n in range(10):
        rec(r, n, T0, etag=f'"e{n}"')
    handed = r.due(T0 + 40, 4)
    r.commit()
    rec(r, 0, T0 + 41)                                # uncommitted: lost
    rec(r, 100, T0)                                   # uncommitted: lost
    lost_handout = r.due(T0 + 40, 3)                  # uncommitted hand-out: comes back at once
    del r
    crash()
    r = open_rc(path)
    r.check_invariants()
    assert r.stats()["tracked"] == 10 and r.state(100) is None
    assert r.state(0).fetched_at == T0 and r.state(0).handed_out
    assert r.validators(7) == ('"e7"', None)
    again = r.due(T0 + 50)                            # these come back at T0 + 75
    assert [i.fp for i in again] == [i.fp for i in lost_handout] + [7, 8, 9]
    assert {i.fp for i in again}.isdisjoint(i.fp for i in handed)
    assert [i.fp for i in r.due(T0 + 65)] == [i.fp for i in handed]   # committed hand-outs: after the timeout
    r.close()


def test_group_commit_bounds_what_a_crash_loses(tmp_path):
    path = tmp_path / "r"
    r = open_rc(path, group_ops=10)
    for n in range(25):
        rec(r, n, T0)
    del r
    crash()
    r = open_rc(path)
    assert r.stats()["tracked"] == 20 and r.stats()["recorded"] == 20
    r.check_invariants()
    r.close()


def test_transactions_stay_within_the_reserved_page_buffers(tmp_path):
    # 64 pages reserved (limit 56), a new tree of depth 1-2: each record (2 writes) is charged 2 x
    # (depth + 1), so the store commits every ~7-14 records although group_ops is far away (without
    # the budget nothing would be committed); a crash loses only the records since the last one
    path = tmp_path / "r"
    r = open_rc(path, group_ops=1 << 30, write_buffer_bytes=64 * 4096)
    for n in range(300):
        rec(r, n, T0 + n)
    del r
    crash()
    r = open_rc(path)
    assert 300 - 14 <= r.stats()["tracked"] < 300
    r.check_invariants()
    r.close()


def test_kill_9_in_a_child_loses_only_the_open_transaction(tmp_path):
    path = str(tmp_path / "r")
    child = textwrap.dedent(f"""
        import os, signal
        from crawlerd.frontier.recrawl import Recrawl
        r = Recrawl({path!r}, initial_interval_s=40.0, min_interval_s=10.0, max_interval_s=320.0,
                    jitter=0.0, map_size_bytes=1 << 28, sync=True)
        for n in range(100):
            r.record("http://a.test/p%d" % n, n, "http://a.test", fetched_at={T0}, status=200,
                     etag='"e%d"' % n, last_modified=None, digest="d", changed=None)
        r.commit()
        for n in range(100, 150):
            r.record("http://a.test/p%d" % n, n, "http://a.test", fetched_at={T0}, status=200,
                     etag=None, last_modified=None, digest="d", changed=None)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    p = subprocess.run([sys.executable, "-c", child], cwd=ROOT, capture_output=True, timeout=60)
    assert p.returncode == -signal.SIGKILL, p.stderr.decode()
    r = open_rc(path)
    r.check_invariants()
    assert r.stats()["tracked"] == 100 and r.validators(99) == ('"e99"', None) and r.state(100) is None
    assert len(r.due(T0 + 40, 1000)) == 100
    r.close()


def _fill(r, lo, hi, t, hk="http://big.test"):
    for fp in range(lo, hi):
        r.record(f"{hk}/page/{fp}", fp, hk, fetched_at=t, status=200, etag=f'"{fp:x}"', last_modified=None,
                 digest=f"sha1:{fp}", changed=None)


def _revisit_all(r, now):
    handed = 0
    while items := r.due(now, 1000):
        handed += len(items)
        for it in items:
            r.record(it.url, it.fp, it.host_key, fetched_at=now + 1, status=304, etag=None, last_modified=None,
                     digest=None, changed=None)
    return handed


def _rss_anon() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_ram_does_not_grow_with_urls(tmp_path):
    """10^5 URLs recorded, all handed out and re-recorded: anonymous RSS stays flat (ARCHITECTURE.md invariant 4).

    The map is file-backed (page cache, not the process's own memory); state kept in Python per URL
    (>= 100 bytes each) would add 10 MB or more here.
    """
    r = open_rc(tmp_path / "big", group_ops=2048)
    n = 100_000
    _fill(r, 0, 10_000, T0)
    r.commit()
    gc.collect()
    base = _rss_anon()
    _fill(r, 10_000, n, T0)
    r.commit()
    after_record = _rss_anon() - base
    assert _revisit_all(r, T0 + 40) == n
    r.commit()
    gc.collect()
    after_due = _rss_anon() - base
    assert r.stats()["tracked"] == n and r.stats()["not_modified"] == n
    assert after_record < 4 << 20 and after_due < 4 << 20, (after_record, after_due)
    r.close()


def test_traced_python_memory_is_flat(tmp_path):
    """The same on Python's own allocations, byte-exact (tracemalloc; fewer URLs, as tracing is slow)."""
    r = open_rc(tmp_path / "traced", group_ops=1024)
    n = 20_000
    _fill(r, 0, 2_000, T0)
    _revisit_all(r, T0 + 40)
    r.commit()
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    _fill(r, 2_000, n, T0)
    _revisit_all(r, T0 + 40)
    r.commit()
    gc.collect()
    used, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert r.stats()["tracked"] == n
    # 4 bytes kept per URL would already be 72 KB
    assert used - base < 16 * 1024, used - base
    assert peak - base < 1 << 20, peak - base
    r.close()
