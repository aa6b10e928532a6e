"""Durability of the Frontier: reopen, kill -9, blocklist persistence, bounded RAM per host."""

import os
import signal
import subprocess
import sys
import textwrap
import tracemalloc

import pytest

from crawlerd.frontier import KIND_ROBOTS, QueuedURL
from crawlerd.outcome import Outcome

from .conftest import Harness
from .server_ledger import FakeClock

A, B = "http://a.test", "http://www.b.example.test"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_close_and_reopen_resumes_with_leases_back(h):
    h.ready(A, 5)
    h.ready(B, 5)
    l1, l2 = h.lease()
    h.done(l1)
    h.clock.t += 5.0                   # l2 has been out 5 s when the daemon stops
    h.f.close()
    f = h.reopen()
    st = f.stats()
    assert st["queued"] == 9 and st["completed"] == 1 and st["recovered_leases"] == 1
    assert sorted(h.resolve()) == sorted([A, B])  # addresses are looked up afresh
    f.check_invariants(deep=True)
    # The returned URL is at the front of its host's queue again.
    reopened_at = h.clock.t
    first = None
    for _ in range(100):
        for lease in h.lease():
            if lease.kind == KIND_ROBOTS:
                h.robots_known(lease.host_key)
            elif lease.host_key == l2.host_key and first is None:
                first = (lease.url, h.clock.t)
            h.done(lease)
        if first:
            break
        h.clock.t = f.next_due()
    # Back at the front of its queue, after a whole gap: the request was cut off at close, so
    # it lasted up to 5 s and its gap is clamp(10 x 5 s, 1, 60) = 50 s from then.
    assert first[0] == l2.url and first[1] >= reopened_at + 50.0


def test_dropped_object_loses_only_uncommitted_work(h):
    h.ready(A, 10)
    h.f.commit()
    (lease,) = h.lease()
    h.f.commit()
    h.done(lease)                      # not committed yet
    h.add(B, 3)                        # add() commits, and with it the completion above
    (l2,) = [x for x in h.lease() if x.host_key == A] or [None]
    h.f = None                         # "crash": no close, the open transaction is dropped
    f = h.reopen()
    st = f.stats()
    assert st["completed"] == 1 and st["queued"] == 12 and st["leased"] == 0
    f.check_invariants(deep=True)


def test_restart_after_crash_fetches_at_once_when_nothing_was_in_flight(tmp_path):
    h = Harness(str(tmp_path / "f"), max_delay_s=30.0, crawl_delay_cap_s=20.0)
    h.ready(A, 3)
    h.f.commit()
    h.f = None                         # kill -9
    f = h.reopen()
    h.resolve()
    assert f.next_due() <= h.clock.t


def test_without_the_journal_a_crash_waits_a_whole_grace(tmp_path):
    """An OS crash can lose the journal (page cache): nothing is known, every host waits."""
    h = Harness(str(tmp_path / "f"), max_delay_s=30.0, crawl_delay_cap_s=20.0)
    h.ready(A, 3)
    h.f.commit()
    h.f = None
    os.remove(tmp_path / "f" / "inflight.log")
    f = h.reopen()
    h.resolve()
    assert f.next_due() == pytest.approx(h.clock.t + 30.0)


def test_kill_minus_9_only_hosts_in_flight_wait(tmp_path):
    """The in-flight host waits a whole gap from the restart; the others resume at their own due."""
    h = Harness(str(tmp_path / "f"))
    h.ready(A, 3)
    h.ready(B, 3)
    h.f.commit()
    la, lb = sorted(h.lease(), key=lambda x: x.host_key)
    h.clock.t += 2.0
    h.done(lb, response_time_s=2.0)    # B: gap 20 s from now; never committed, only journaled
    b_due = h.clock.t + 20.0
    h.clock.t += 1.0
    h.f = None                         # kill -9 with A's request in flight (3 s so far)
    f = h.reopen()
    restart = h.clock.t
    h.resolve()
    dues = {}
    while len(dues) < 2:
        h.clock.t = max(h.clock.t, f.next_due())
        for lease in h.lease():
            dues.setdefault(lease.host_key, h.clock.t)
            h.done(lease)
    assert dues[B] == pytest.approx(b_due)
    assert dues[A] == pytest.approx(restart + 30.0)     # clamp(10 x 3 s): it may have lasted until the kill


def test_clean_stop_records_each_host_due_in_wall_clock(tmp_path):
    """The monotonic clock starts again at boot; the dues are absolute (wall clock)."""
    mono, wall = FakeClock(50.0), FakeClock(1_700_000_000.0)
    h = Harness(str(tmp_path / "f"), clock=mono, wall=wall)
    h.clock = mono
    h.ready(A, 3)
    h.ready(B, 3)
    leases = sorted(h.lease(), key=lambda x: x.host_key)
    h.done(leases[0], response_time_s=4.0)              # A: 40 s gap
    h.done(leases[1], response_time_s=0.01)             # B: 1 s gap
    h.f.close()
    mono.t, wall.t = 7.0, wall.t + 10.0                   # a reboot, 10 s later
    f = h.reopen()
    h.resolve()
    dues = {}
    while len(dues) < 2:
        mono.t = max(mono.t, f.next_due())
        wall.t += 0                                        # (only the frontier's clock moves)
        for lease in h.lease():
            dues.setdefault(lease.host_key, mono.t)
            h.done(lease)
    assert dues[B] == pytest.approx(7.0)                  # its gap passed during the downtime
    assert dues[A] == pytest.approx(7.0 + 30.0)           # 40 s gap, 10 s of it passed


def test_clean_restart_needs_no_grace(tmp_path):
    h = Harness(str(tmp_path / "f"))
    h.ready(A, 3)
    h.f.close()
    f = h.reopen()
    h.resolve()
    assert f.next_due() <= h.clock.t


def test_backoff_survives_restart(tmp_path):
    h = Harness(str(tmp_path / "f"), backoff_base_s=500.0)
    h.ready(A, 3)
    h.done(h.lease()[0], outcome=Outcome.TIMEOUT, status=0)
    due = h.f.next_due()
    h.f = None                         # long waits are committed when set: a crash keeps them
    f = h.reopen()
    h.resolve()
    assert f.next_due() >= due - 1e-9


KILL_SCRIPT = textwrap.dedent("""
    import os, random, signal, sys
    sys.path.insert(0, {root!r})
    from crawlerd.frontier import Frontier, QueuedURL
    from crawlerd.outcome import Outcome
    f = Frontier({path!r}, clock=lambda: 5000.0, rng=random.Random(1), map_size_bytes=1 << 28, sync=True,
                 min_delay_s=0.0, delay_factor=0.0)
    f.add([QueuedURL(f"http://h{{i % 20}}.test/p{{i}}", f"http://h{{i % 20}}.test") for i in range(1000)])
    for hk in f.hosts_needing_dns():
        f.set_host_ip(hk, "127.0.0." + str(int(hk[8:-5]) + 1))
        f.set_robots(hk, expires_at=1e9, crawl_delay_s=None)
    f2 = [x for x in f.lease(limit=10)]
    f.commit()
    for lease in f2[:5]:
        f.complete(lease.lease_id, outcome=Outcome.OK, status=200)
    f.commit()
    for lease in f2[5:7]:
        f.complete(lease.lease_id, outcome=Outcome.OK, status=200)   # never committed: journaled
    f.complete(f2[7].lease_id, outcome=Outcome.TIMEOUT, status=0)    # a retry: not journaled as done
    print(len(f2), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_kill_minus_9_loses_only_work_in_flight(tmp_path):
    path = str(tmp_path / "f")
    proc = subprocess.run([sys.executable, "-c", KILL_SCRIPT.format(root=ROOT, path=path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    leased = int(proc.stdout.strip())
    assert leased >= 8
    h = Harness(path)
    st = h.f.stats()
    # the two completions after the last commit are kept (the journal), the rest comes back
    assert st["added"] == 1000 and st["completed"] == 7 and st["queued"] == 993
    assert st["recovered_completions"] == 2 and st["recovered_leases"] == leased - 7
    h.f.check_invariants(deep=True)


def test_blocklist_drops_at_once_covers_subdomains_and_persists(h):
    h.ready(A, 4)
    h.ready(B, 3)
    h.add("http://b.example.test.evil", 2)
    h.add("http://notexample.test", 2)
    dropped = h.f.block("example.test")
    assert dropped == 3
    assert h.f.is_blocked("https://deep.www.b.example.test:8443")
    assert not h.f.is_blocked("http://notexample.test") and not h.f.is_blocked("b.example.test.evil")
    assert h.f.add([QueuedURL(B + "/new", B)]) == 0
    assert h.f.stats()["dropped"] == {"blocked": 4}
    reasons = {(item.url, r) for item, r in h.f.drain_dropped()}
    assert (B + "/new", "blocked") in reasons and len(reasons) == 4
    h.f.close()
    f = h.reopen()
    assert f.blocked() == ["example.test"]
    assert f.is_blocked(B)
    f.unblock("example.test")
    assert f.add([QueuedURL(B + "/again", B)]) == 1
    f.check_invariants(deep=True)


def test_blocklist_parameter_and_inactive_hosts(tmp_path):
    h = Harness(str(tmp_path / "f"), max_active_hosts=1)
    h.add(A, 2)
    h.add(B, 5)                         # no slot: waits on disk
    assert h.f.stats()["hosts_waiting"] == 1
    assert h.f.block("b.example.test") == 5
    h.f.close()
    f = h.reopen(blocklist=["a.test"])
    assert f.blocked() == ["a.test", "b.example.test"]
    st = f.stats()
    assert st["queued"] == 0 and st["dropped"]["blocked"] == 7
    f.check_invariants(deep=True)


def test_block_while_leased_keeps_the_answer_but_not_a_retry(h):
    h.ready(A, 3)
    (lease,) = h.lease()
    h.f.block("a.test")
    assert h.done(lease, outcome=Outcome.TIMEOUT, status=0)
    st = h.f.stats()
    assert st["dropped"] == {"blocked": 3} and st["hosts_active"] == 0
    h.f.check_invariants(deep=True)


def test_ram_per_active_host_is_bounded(tmp_path):
    """Python-side RAM per active host (slot arrays, key index, host key, its IP) <= 300 bytes."""
    h = Harness(str(tmp_path / "f"), max_active_hosts=100000)
    n = 20000
    hosts = [f"http://www.host{i}.example-{i % 97}.test" for i in range(n)]
    h.f.add([QueuedURL(hk + "/", hk) for hk in hosts[:1000]])
    h.resolve()
    h.f.commit()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for start in range(1000, n, 1000):
        h.f.add([QueuedURL(hk + "/", hk) for hk in hosts[start:start + 1000]])
        for hk in h.f.hosts_needing_dns():
            h.f.set_host_ip(hk, h.ip_of(hk))
        h.f.commit()
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    # The host key strings were allocated by this test before tracing; the frontier keeps them.
    per_host = used / (n - 1000) + sum(sys.getsizeof(hk) for hk in hosts) / n
    assert h.f.stats()["hosts_active"] == n
    assert per_host <= 300, per_host


def test_reopen_with_more_room_activates_waiting_hosts(tmp_path):
    h = Harness(str(tmp_path / "f"), max_active_hosts=2)
    for i in range(5):
        h.add(f"http://w{i}.test", 2)
    assert h.f.stats()["hosts_waiting"] == 3
    h.f.close()
    f = h.reopen(max_active_hosts=10)
    st = f.stats()
    assert st["hosts_active"] == 5 and st["hosts_waiting"] == 0
    f.close()
    f = h.reopen(max_active_hosts=1)
    st = f.stats()
    assert st["hosts_active"] == 1 and st["hosts_waiting"] == 4 and st["queued"] == 10
    f.check_invariants(deep=True)


def test_masks_are_rederived_on_open(tmp_path):
    """add() does not rewrite an active host's record; reopening finds its new levels anyway."""
    h = Harness(str(tmp_path / "f"), min_delay_s=0.0, delay_factor=0.0)
    h.ready(A, 1, priority=0)
    h.f.commit()                       # A's record: level 0 only
    h.add(A, 3, priority=3, start=10)  # committed queue entries, record not rewritten
    h.f = None
    f = h.reopen()
    f.check_invariants(deep=True)
    h.resolve()                        # robots.txt is still known: its expiry outlives the restart
    got = []
    while f.queued():
        h.clock.t = f.next_due()
        for lease in h.lease():
            got.append(lease.item.priority)
            h.done(lease)
    assert sorted(got) == [0, 3, 3, 3]


def test_without_the_journal_waiting_hosts_also_wait_the_grace(tmp_path):
    """Per-IP state dies with the process: a host activated after a crash may share an address
    with a request that was just cut off."""
    h = Harness(str(tmp_path / "f"), max_active_hosts=1, max_delay_s=30.0, crawl_delay_cap_s=20.0)
    h.add(A, 2)
    h.add(B, 2)                        # no slot: waits
    h.f.commit()
    h.f = None
    os.remove(tmp_path / "f" / "inflight.log")
    f = h.reopen(max_active_hosts=5)
    assert f.stats()["hosts_active"] == 2
    h.resolve()
    assert f.next_due() == pytest.approx(h.clock.t + 30.0)


def test_ip_gap_survives_a_crash(tmp_path):
    """ip_delay_s counts from the last request to the address, also across a kill -9."""
    h = Harness(str(tmp_path / "f"), ip_delay_s=8.0, min_delay_s=0.0, delay_factor=0.0)
    h.ready(A, 2, ip="127.0.0.9")
    h.ready(B, 2, ip="127.0.0.9")
    (first,) = h.lease()
    h.clock.t += 1.0
    h.done(first)
    end = h.clock.t
    h.f = None
    f = h.reopen()
    h.resolve("127.0.0.9")
    t = None
    while t is None:
        h.clock.t = max(h.clock.t, f.next_due())
        got = h.lease()
        if got:
            t = h.clock.t
    assert t >= end + 8.0 - 1e-6


def test_journal_is_bounded_and_rotated(tmp_path, monkeypatch):
    from crawlerd.frontier import journal
    monkeypatch.setattr(journal, "ROTATE_BYTES", 2048)
    h = Harness(str(tmp_path / "f"), min_delay_s=0.0, delay_factor=0.0)
    h.ready(A, 300)
    h.ready(B, 300)
    path = tmp_path / "f" / journal.FILE_NAME
    sizes = []
    for _ in range(300):
        held = h.lease()
        h.done(held[0])                # the other stays out across the rotation
        h.f.commit()
        sizes.append(os.path.getsize(path))
        for lease in held[1:]:
            h.done(lease)
    assert max(sizes) <= 2048 + 512 and min(sizes) < 200
    out = h.lease()
    h.f = None                         # kill -9: what is out is still named after the rotations
    assert {hk for hk in journal.read(str(tmp_path / "f")).inflight} == {x.host_key for x in out}


def test_completion_journaled_before_any_commit_is_not_fetched_again(tmp_path):
    """Leased and completed between two commits: the queue still holds the URL, the journal says done."""
    h = Harness(str(tmp_path / "f"), min_delay_s=0.0, delay_factor=0.0, commit_interval_s=1e9)
    h.ready(A, 3)
    h.f.commit()
    done = h.lease()[0]
    h.done(done)                       # neither the lease nor the completion is committed
    h.f = None                         # kill -9
    f = h.reopen()
    st = f.stats()
    assert st["completed"] == 1 and st["queued"] == 2 and st["recovered_completions"] == 1
    f.check_invariants(deep=True)
    h.resolve()
    urls = []
    while f.queued():
        h.clock.t = max(h.clock.t, f.next_due())
        for lease in h.lease():
            urls.append(lease.url)
            h.done(lease)
    assert done.url not in urls and len(urls) == 2


def test_a_due_stored_in_wall_clock_never_comes_back_early():
    """Clock + (wall - clock) rounds on the wall-clock grid: the stored due is rounded up, so a host
    deactivated and activated again (or restarted) never starts a few ns inside its gap."""
    import random

    from crawlerd.frontier.hosts import wall_of
    rng = random.Random(7)
    early = 0
    for _ in range(20_000):
        t, off = rng.uniform(0, 5000), 1_700_000_000.0 + rng.random()
        early += (t + off) - off < t
        assert wall_of(t, off) - off >= t
        assert wall_of(t, off) - off - t < 1e-6
    assert early > 1000          # the plain round trip does come back early


def test_the_leases_table_holds_exactly_the_url_leases_out_at_each_commit_and_a_crash_gives_them_back(h):
    """Lease changes are written at the commit (a lease that ends before it costs no write): after
    every commit the table holds exactly the URL leases out; a crash gives back those of the last
    commit (less those the journal says completed since) and nothing else, and no URL is lost."""
    import random
    hosts = [f"http://h{i}.test" for i in range(12)]
    for host in hosts:
        h.ready(host, 30)
    rng = random.Random(3)
    out, done = [], 0
    for _ in range(25):
        for lease in h.lease():
            if lease.kind == KIND_ROBOTS:
                h.robots_known(lease.host_key)
                h.done(lease)
            else:
                out.append(lease)
        rng.shuffle(out)
        for lease in out[:rng.randrange(len(out) + 1)]:
            h.done(lease)
            done += 1
            out.remove(lease)
        if rng.random() < 0.5:
            h.f.commit()
            store = h.f._store
            table = {int.from_bytes(k, "big") for k, _v in store.txn().cursor(db=store.leases)}
            del store
            assert table == {lease.lease_id for lease in out}
        h.clock.t = h.f.next_due() or h.clock.t + 1.0
    for _ in range(5):
        out += [lease for lease in h.lease() if lease.kind != KIND_ROBOTS]
        h.clock.t = h.f.next_due() or h.clock.t + 1.0
    h.f.commit()
    committed_out = len(out)
    assert committed_out > 3 and done > 20
    for lease in out[:3]:
        h.done(lease)                  # not committed: the in-flight journal tells they completed
    h.f = None                         # "crash": no close, the open transaction is dropped
    f = h.reopen()
    st = f.stats()
    assert st["recovered_leases"] == committed_out - 3 and st["leased"] == 0
    assert st["completed"] == done + 3 and st["queued"] == 12 * 30 - done - 3
    f.check_invariants(deep=True)


def test_saving_the_counters_leaves_no_blocks_behind(tmp_path):
    # a commit saves the counters; it must not leave Python blocks behind it. Packing them from a
    # generator did: CPython builds the argument tuple at 10 slots, grows it, shrinks it to 14, so each
    # call parked one 14-slot tuple on the interpreter's free list (up to 2,000: ~300 KiB, filled
    # one commit at a time over a crawl's first hour, read as private memory growing with pages)
    import gc
    import sys

    from crawlerd.frontier.queues import _COUNTERS, FrontierStore
    st = FrontierStore(str(tmp_path / "f"), map_size_bytes=1 << 24, sync=False)
    counters = {k: 10**12 + i for i, k in enumerate(_COUNTERS)}
    try:
        for _ in range(20):
            st.save_meta(counters, None)
            st.commit()
        gc.collect()                 # a full pass empties the free lists
        before = sys.getallocatedblocks()
        for i in range(3000):
            counters["seq"] = 10**12 + i
            st.save_meta(counters, None)
            st.commit()
        assert sys.getallocatedblocks() - before < 300
        assert st.load_meta()[0] == counters
    finally:
        st.close()
