"""The frontier's store written on a writer thread (``Frontier.attach_writer``): the loop keeps no
write transaction open and reads its own writes through an overlay, so the frontier answers exactly
as one with its own transactions; a commit survives ``kill -9`` only once it landed, and what
depends on it (an acknowledgement, the journal's rotation) waits for that."""

import asyncio
import os
import random
import shutil
import threading

from crawlerd.frontier import KIND_ROBOTS, QueuedURL, journal
from crawlerd.outcome import Outcome
from crawlerd.store.writer import WriteThread
from tests.frontier.budget_parts import RecordingEnv

from .conftest import Harness

HOSTS = [f"http://h{i}.test" for i in range(40)]
# completed, retried (Retry-After, backoff) and, after max_attempts, dead-lettered
ENDINGS = [(Outcome.OK, 200, None), (Outcome.OK, 200, None), (Outcome.OK, 404, None), (Outcome.OK, 503, 30.0),
           (Outcome.TIMEOUT, 0, None), (Outcome.CONNECT_REFUSED, 0, None)]


def tables(f) -> dict:
    """Every table of a frontier's LMDB file, as committed (call with no writer attached)."""
    st = f._store
    out = {}
    with st.env.begin() as txn:
        for name in ("queues", "hosts", "leases", "waiting", "dead", "events", "meta"):
            out[name] = list(txn.cursor(db=getattr(st, name)))
    return out


async def landed(f) -> None:
    """Commit and wait on the loop until the commit landed."""
    done = asyncio.get_running_loop().create_future()
    f.commit(flush=False, then=lambda: done.set_result(None))
    await done


def step(hs: list[Harness], rng: random.Random, out: list[list], i: int) -> None:
    """One random operation on every frontier of ``hs``, which must answer alike."""
    op = rng.random()
    if op < 0.1:
        host, n, prio = rng.choice(HOSTS), rng.randrange(1, 30), rng.randrange(3)
        assert len({h.add(host, n, prio, start=i * 100) for h in hs}) == 1
    elif op < 0.5:
        limit = rng.randrange(1, 20)
        got = [h.lease(limit) for h in hs]
        assert len({tuple((x.lease_id, x.kind, x.url) for x in g) for g in got}) == 1, i
        for h, leases, mine in zip(hs, got, out, strict=True):
            for x in leases:
                if x.kind == KIND_ROBOTS:
                    h.robots_known(x.host_key)
                    h.done(x)
                else:
                    mine.append(x)
    elif op < 0.8 and out[0]:
        j = rng.randrange(len(out[0]))
        outcome, status, retry = rng.choice(ENDINGS)
        rt = rng.random()
        assert len({h.f.complete(mine.pop(j).lease_id, outcome=outcome, status=status, response_time_s=rt,
                                 retry_after_s=retry) for h, mine in zip(hs, out, strict=True)}) == 1
    elif op < 0.85:
        asked = [h.f.hosts_needing_dns() for h in hs]
        assert len({tuple(a) for a in asked}) == 1
        for h, a in zip(hs, asked, strict=True):
            for hk in a:
                h.f.set_host_ip(hk, h.ip_of(hk))
    elif op < 0.9:
        for h in hs:
            h.f.commit(flush=False)
    else:
        dt = rng.random() * 3
        for h in hs:
            h.clock.t += dt
            h.f.expire_leases(h.clock.t)


def test_on_a_writer_thread_the_frontier_answers_as_with_its_own_transaction_and_the_loop_writes_nothing(tmp_path):
    """The same adds, leases, completions, DNS answers and commits on a Frontier with its own write
    transaction and on one whose commits land on a writer thread at random moments (the lease path
    popping queue heads through the overlay meanwhile): the same leases and counters throughout, the
    deep invariants hold mid-way on both, the same tables byte for byte at the end, and every write
    transaction of the threaded one began on the writer thread. Reopened, both lease alike."""
    async def go():
        kw = dict(min_delay_s=0.5, delay_factor=0.5, group_ops=64, commit_interval_s=5.0,
                  max_active_hosts=25, lease_timeout_s=20.0)
        plain = Harness(str(tmp_path / "a"), **kw)
        threaded = Harness(str(tmp_path / "b"), **kw)
        st = threaded.f._store
        env = st.env = RecordingEnv(st.env)
        writer = WriteThread(asyncio.get_running_loop(), group_delay_s=0.001)
        threaded.f.attach_writer(writer)
        env.recording = True
        hs, out = [plain, threaded], [[], []]
        rng = random.Random(3)
        for i in range(4000):
            step(hs, rng, out, i)
            if rng.random() < 0.05:
                await asyncio.sleep(0.003 * rng.random())       # commits land meanwhile, or not
            if i % 500 == 499:
                for h in hs:
                    h.f.check_invariants(deep=True)
                a, b = plain.f.stats(), threaded.f.stats()
                a.pop("hosts_total")            # counted as of the last commit that landed
                b.pop("hosts_total")
                assert a == b, i
        assert st.overlay.landed > 10 and st.overlay.pending < st.overlay.layers
        plain.f.commit(flush=False)
        await landed(threaded.f)
        env.recording = False
        threaded.f.attach_writer(None)
        writer.close()
        assert tables(plain.f) == tables(threaded.f)
        assert plain.f.stats()["completed"] > 200
        plain.f.close()
        threaded.f.close()
        for h in hs:
            h.reopen()
            h.resolve()
        for i in range(4000, 4300):
            step(hs, rng, [[], []], i)
        for h in hs:
            h.f.close()
        return env.write_threads

    writers = asyncio.run(go())
    assert writers and threading.get_ident() not in writers       # the loop began no write transaction


def crashed_copy(h: Harness, to) -> Harness:
    """What a ``kill -9`` now would leave: the LMDB file and the journal as they are, reopened."""
    shutil.copytree(h.path, to)
    return Harness(str(to), **{k: v for k, v in h.kw.items() if k not in ("clock", "wall", "rng")})


def test_a_commit_survives_a_kill_9_and_runs_what_waits_for_it_only_once_it_landed(tmp_path):
    """With the writer held, an add is committed on the loop but not on disk: a ``kill -9`` then keeps
    none of it, and nothing waiting for it (``when_written``: DRUM's acknowledgement) has run. Once
    the writer lands it, the waiter runs and a ``kill -9`` keeps every URL."""
    async def go():
        h = Harness(str(tmp_path / "f"))
        writer = WriteThread(asyncio.get_running_loop(), group_delay_s=0.001)
        h.f.attach_writer(writer)
        h.add("http://a.test", 5)
        await landed(h.f)
        writer.hold()
        h.f.add([QueuedURL(f"http://b.test/p{i}", "http://b.test", fp=100 + i) for i in range(7)], seen_mark=42)
        acked = []
        h.f.when_written(lambda: acked.append(1))
        for _ in range(20):
            await asyncio.sleep(0.002)
        assert acked == [] and h.f.queued() == 12 and h.f.seen_mark == 42
        before = crashed_copy(h, tmp_path / "k1")
        assert before.f.queued() == 5 and before.f.seen_mark == 0
        before.f.check_invariants(deep=True)
        writer.release()
        while not acked:
            await asyncio.sleep(0.002)
        after = crashed_copy(h, tmp_path / "k2")
        assert after.f.queued() == 12 and after.f.seen_mark == 42
        after.f.check_invariants(deep=True)
        h.f.attach_writer(None)
        writer.close()
        h.f.close()
    asyncio.run(go())


def test_a_rotation_waits_for_its_commit_and_keeps_the_lines_written_meanwhile(tmp_path, monkeypatch):
    """The journal is rewritten only once the commit that makes its old lines redundant landed, and
    the rewrite keeps the lines written since that commit: a lease started (and one ended) while the
    commit was in flight is still named after the rotation, so a ``kill -9`` keeps its host waiting."""
    monkeypatch.setattr(journal, "ROTATE_BYTES", 600)

    async def go():
        h = Harness(str(tmp_path / "f"), min_delay_s=0.0, delay_factor=0.0, commit_interval_s=1e9)
        writer = WriteThread(asyncio.get_running_loop(), group_delay_s=0.001)
        h.f.attach_writer(writer)
        hosts = [f"http://h{i}.test" for i in range(12)]
        for hk in hosts:
            h.ready(hk, 3)
        await landed(h.f)
        for x in h.lease():
            h.done(x)                   # enough lines for a rotation at the next commit
        path = tmp_path / "f" / journal.FILE_NAME
        writer.hold()
        size = os.path.getsize(path)
        h.f.commit(flush=False)         # wants a rotation: held until the commit lands
        late = h.lease(limit=3)         # started after the commit, before it landed
        assert late
        h.done(late[0])                 # and one of them ended meanwhile
        for _ in range(10):
            await asyncio.sleep(0.002)
        assert os.path.getsize(path) >= size        # not rewritten yet
        writer.release()
        await landed(h.f)
        replay = journal.read(str(tmp_path / "f"))
        assert os.path.getsize(path) < size         # rewritten
        assert set(replay.inflight) == {x.host_key for x in late[1:]}
        assert late[0].host_key in replay.ended
        h.f.attach_writer(None)
        writer.close()
        h.f.close()
    asyncio.run(go())
