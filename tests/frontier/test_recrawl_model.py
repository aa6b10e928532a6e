"""The recrawl schedule against a plain-Python model (random visits, hand-outs, crashes), and on a
writer thread against its own transactions (the same answers, no write on the loop)."""

import os
import random

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as hst
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tests.frontier.recrawl_parts import T0, A, crash, open_rc, rec


# == model-based: random operations against a plain-Python model ==============================
class Model:
    """The policy restated in the simplest terms (jitter off; integer seconds, so ms are exact)."""

    def __init__(self):
        self.urls = {}        # fp -> dict(due, fetched, interval, errors, out, digest)
        self.out = 0

    def record(self, fp, t, status, digest, changed):
        u = self.urls.get(fp)
        if u is None:
            if status >= 400 or status in (0, 304):
                return False
            self.urls[fp] = dict(due=t + 40, fetched=t, interval=40, errors=0, out=False, digest=digest)
            return True
        if t <= u["fetched"]:
            return False
        if u["out"]:
            u["out"] = False
            self.out -= 1
        u["fetched"] = t
        if status >= 400 or status == 0:
            u["errors"] += 1
            if status == 410 or u["errors"] >= 3:
                del self.urls[fp]
            else:
                u["due"] = t + 320
            return True
        u["errors"] = 0
        if status == 304:
            changed = False
        else:
            if changed is None and digest and u["digest"]:
                changed = digest != u["digest"]
            if digest:
                u["digest"] = digest
        if changed is True:
            u["interval"] = max(10, u["interval"] / 2)
        elif changed is False:
            u["interval"] = min(320, u["interval"] * 2)
        u["due"] = t + u["interval"]
        return True

    def due(self, now, limit):
        ready = sorted((u["due"], fp) for fp, u in self.urls.items() if u["due"] <= now)
        out = []
        for _d, fp in ready:
            if len(out) >= limit:
                break
            u = self.urls[fp]
            if u["out"]:
                u["errors"] += 1
                if u["errors"] >= 3:
                    del self.urls[fp]
                    self.out -= 1
                    continue
            else:
                u["out"] = True
                self.out += 1
            u["due"] = now + 25
            out.append(fp)
        return out

    def snapshot(self):
        return {fp: dict(u) for fp, u in self.urls.items()}, self.out


@settings(max_examples=30, stateful_step_count=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
class RecrawlMachine(RuleBasedStateMachine):
    KW: dict = {}

    @initialize()
    def start(self):
        import tempfile
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "r")
        self.rc = open_rc(self.path, group_ops=1 << 30, **self.KW)
        self.model = Model()
        self.saved = self.model.snapshot()
        self.t = int(T0)

    @rule(dt=hst.integers(0, 200))
    def advance(self, dt):
        self.t += dt

    @rule(fp=hst.integers(0, 7), back=hst.integers(0, 3),
          status=hst.sampled_from([200, 200, 200, 304, 304, 301, 404, 410, 500, 0]),
          digest=hst.sampled_from([None, "a", "b"]), changed=hst.sampled_from([None, None, True, False]))
    def record(self, fp, back, status, digest, changed):
        t = self.t - back
        got = rec(self.rc, fp, t, status=status, digest=digest, changed=changed)
        assert got == self.model.record(fp, t, status, digest, changed)

    @rule(limit=hst.integers(1, 5))
    def due(self, limit):
        got = [i.fp for i in self.rc.due(self.t, limit)]
        assert got == self.model.due(self.t, limit)

    @rule()
    def commit(self):
        self.rc.commit()
        self.saved = self.model.snapshot()

    @rule()
    def crash_and_reopen(self):
        self.rc = None
        crash()
        self.rc = open_rc(self.path, group_ops=1 << 30, **self.KW)
        urls, out = self.saved
        self.model.urls, self.model.out = {fp: dict(u) for fp, u in urls.items()}, out

    @invariant()
    def agrees_with_model(self):
        if not hasattr(self, "rc"):
            return
        self.rc.check_invariants()
        assert self.rc.stats()["handed_out_now"] == self.model.out
        for fp in range(8):
            st, u = self.rc.state(fp), self.model.urls.get(fp)
            assert (st is None) == (u is None), fp
            if st is not None:
                assert (st.due_at, st.interval_s, st.errors, st.handed_out) == \
                    (u["due"], u["interval"], u["errors"], u["out"]), fp
                assert 10 <= st.interval_s <= 320

    def teardown(self):
        if getattr(self, "rc", None) is not None:
            self.rc.close()
        if hasattr(self, "dir"):
            self.dir.cleanup()


TestRecrawlMachine = RecrawlMachine.TestCase


class FilteredRecrawlMachine(RecrawlMachine):
    """The same, with the key filter (rebuilt from the store at each reopen) answering untracked URLs."""

    KW = {"key_filter_bytes": 128}


TestFilteredRecrawlMachine = FilteredRecrawlMachine.TestCase


# == on the writer thread ===========================================================================
@pytest.mark.parametrize("read_cache_bytes, key_filter_bytes", [(0, 0), (2048, 0), (2048, 128)])
def test_on_a_writer_thread_recrawl_answers_as_with_its_own_transaction_and_the_loop_writes_nothing(
        tmp_path, read_cache_bytes, key_filter_bytes):
    """The same visits, hand-outs and forgets on a Recrawl with its own write transaction and on one
    whose commits land on a writer thread at random moments (read through the overlay meanwhile):
    the same answers throughout, the same tables at the end, every write transaction on the writer.
    With a read cache of a few entries (it evicts): the same, within its bytes, and reopened, both
    answer the same for every URL. With a key filter too (1,024 bits for 300 URLs: "absent" and
    "maybe" both answered): the same."""
    import asyncio
    import threading

    from crawlerd.store.writer import WriteThread
    from tests.frontier.budget_parts import RecordingEnv

    async def go():
        plain = open_rc(tmp_path / "a", group_ops=50)
        threaded = open_rc(tmp_path / "b", group_ops=50, read_cache_bytes=read_cache_bytes,
                           key_filter_bytes=key_filter_bytes)
        env = threaded._env = RecordingEnv(threaded._env)
        writer = WriteThread(asyncio.get_running_loop(), group_delay_s=0.001)
        threaded.attach_writer(writer)
        env.recording = True
        both = (plain, threaded)
        rng = random.Random(1)
        for step in range(3000):
            op, n, t = rng.random(), rng.randrange(300), T0 + step
            if op < 0.6:
                status, digest = rng.choice([200, 200, 304, 404, 410]), f"d{rng.random() < 0.5}"
                assert len({r.record(f"{A}/p{n}", n, A, fetched_at=t, status=status, etag=f'"{step}"',
                                     last_modified=None, digest=digest, changed=None) for r in both}) == 1
            elif op < 0.8:
                assert plain.due(t + 200, 20) == threaded.due(t + 200, 20), step
                for r in both:
                    r.commit(flush=False)
            elif op < 0.85:
                assert plain.forget(n) == threaded.forget(n)
            else:
                await asyncio.sleep(0.003 * rng.random())       # commits land meanwhile, or not
            if step % 20 == 0 and rng.random() < 0.5:
                n = rng.randrange(300)          # a lease reads its validators, then its answer
                assert plain.validators(n) == threaded.validators(n)
            if step % 100 == 0:     # ``tracked`` counts what landed: compared at the end
                got = threaded.stats()
                cache = got.pop("read_cache", None)
                got.pop("key_filter", None)
                assert {**plain.stats(), "tracked": 0} == {**got, "tracked": 0}, step
                if read_cache_bytes:
                    assert cache["bytes"] <= cache["cap_bytes"] == read_cache_bytes
        if read_cache_bytes:
            cache = threaded.stats()["read_cache"]
            assert cache["hits"] > 0 and cache["evictions"] > 0 and threaded.memory()["bytes"] <= 2048
        landed = asyncio.get_running_loop().create_future()
        threaded.commit(flush=False, then=lambda: landed.set_result(None))
        await landed
        env.recording = False
        threaded.attach_writer(None)
        writer.close()
        for r in both:
            r.check_invariants()
        if key_filter_bytes:
            assert threaded.reads_skipped > 0
        assert plain.stats() == {k: v for k, v in threaded.stats().items() if k != "key_filter"}
        assert plain.stats()["tracked"] > 0
        plain.close()
        threaded.close()
        plain = open_rc(tmp_path / "a")
        threaded = open_rc(tmp_path / "b", read_cache_bytes=read_cache_bytes, key_filter_bytes=key_filter_bytes)
        writer = WriteThread(asyncio.get_running_loop(), group_delay_s=0.001)
        threaded.attach_writer(writer)
        for _ in range(2):                      # misses, then hits
            assert [plain.state(n) for n in range(300)] == [threaded.state(n) for n in range(300)]
        threaded.attach_writer(None)
        writer.close()
        plain.close()
        threaded.close()
        return env.write_threads

    writers = asyncio.run(go())
    assert writers and threading.get_ident() not in writers       # the loop began no write transaction
