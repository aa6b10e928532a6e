"""The shard's DUST gate (crawlerd.shard.dust) at intake: what it hands on, and in what record."""

import hashlib
import time

from crawlerd.config import load
from crawlerd.frontier.dust import DustLearner
from crawlerd.frontier.items import PRIORITY_DEFERRED
from crawlerd.metrics import Metrics
from crawlerd.shard.dust import DustGate
from crawlerd.shard.events import FetchEvents
from crawlerd.shard.intake import decode_aux, encode_aux
from crawlerd.url.canonical import fingerprint

H = "http://h.example"


def test_a_deferred_suspect_carries_the_deferred_level_in_its_record(tmp_path):
    """BEAST may hold a URL back and readmit it from its seen-set record: a suspect's record must
    say "deferred", or it comes back at its depth's level and is fetched as a duplicate."""
    learner = DustLearner(str(tmp_path / "dust"), sync=False, initial_probes=0)
    gate = DustGate(load(), learner, frontier=None, intake=None,
                    events=FetchEvents(None, wall=time.time), metrics=Metrics())
    page = f"{H}/p/1.html"
    learner.observe(page, fingerprint(page), H, hashlib.sha1(b"page").digest(), 0, "")

    def item(url: str, depth: int = 2) -> tuple:
        return (fingerprint(url), encode_aux(depth, 0, 1, url), depth, 0, 1, url, H)

    out = gate.admit([item(page, 1), item(f"{page}?sid=3f2a9c1b7d00aa"), item(f"{H}/p/2.html")])
    assert [it[5] for it in out] == [page, f"{page}?sid=3f2a9c1b7d00aa", f"{H}/p/2.html"]
    assert out[1][4] == PRIORITY_DEFERRED and decode_aux(out[1][1]) == (2, 0, PRIORITY_DEFERRED, out[1][5])
    assert out[2][4] == 1 and decode_aux(out[2][1])[2] == 1
    assert {it[6] for it in out} == {H}          # the host key travels with the item
    learner.close()


def test_the_periodic_commit_writes_changed_hosts_over_several_iterations_then_commits_once(tmp_path, monkeypatch):
    """``commit_sliced`` writes WRITE_SLICE changed hosts per loop iteration and commits after the
    last part; a host changed again after its part is written by that commit, not left behind."""
    import asyncio

    import crawlerd.shard.dust as dust_module

    monkeypatch.setattr(dust_module, "WRITE_SLICE", 8)
    learner = DustLearner(str(tmp_path / "dust"), sync=False, initial_probes=0)
    gate = DustGate(load(), learner, frontier=None, intake=None,
                    events=FetchEvents(None, wall=time.time), metrics=Metrics())
    hosts = [f"http://h{i}.example" for i in range(30)]
    for h in hosts:
        learner.observe(f"{h}/a", fingerprint(f"{h}/a"), h, hashlib.sha1(h.encode()).digest(), 0, "")
    events = []
    real_write, real_commit = learner.write_hosts, learner.store.commit

    async def go():
        loop = asyncio.get_running_loop()
        ticks = [0]

        def tick():
            ticks[0] += 1
            loop.call_soon(tick)
        tick()

        def write_hosts(part):
            events.append(("write", len(part), ticks[0]))
            if len(events) == 2:        # the first part's host changes again meanwhile
                h = hosts[0]
                learner.observe(f"{h}/b", fingerprint(f"{h}/b"), h, hashlib.sha1(b"b").digest(), 0, "")
            real_write(part)

        def commit(then=None):
            events.append(("commit", len(learner.dirty_hosts()), ticks[0]))
            real_commit(then)

        learner.write_hosts, learner.store.commit = write_hosts, commit
        assert len(learner.dirty_hosts()) == 30
        gate.commit_sliced()
        gate.commit_sliced()            # one at a time: a second call while one runs adds nothing
        for _ in range(20):
            await asyncio.sleep(0)
        return list(learner.dirty_hosts())

    left = asyncio.run(go())
    writes = [e for e in events if e[0] == "write"]
    assert [n for _, n, _ in writes] == [8, 8, 8, 6]
    assert len({t for *_, t in writes}) == 4                    # one part per loop iteration
    assert [e[0] for e in events].count("commit") == 1 and events[-1][0] == "commit"
    assert events[-1][2] > writes[-1][2]
    assert left == []                   # the host changed meanwhile was written by the commit
    gate.close()
