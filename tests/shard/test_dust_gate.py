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
