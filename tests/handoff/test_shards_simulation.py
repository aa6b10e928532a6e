"""3 shards on a virtual clock, 10^4 hosts, 10% on IPs shared across partitions, random kills mid hand-off."""

import asyncio
import os
import shutil
import tempfile
from collections import Counter

import pytest

from crawlerd.url.hosts import shard_of_url

from .shard_sim import ShardWeb


@pytest.fixture
def fast_dir(tmp_path):
    """A tmpfs directory when there is one: the run's thousands of DRUM and LMDB fsyncs cost nothing."""
    if not os.path.isdir("/dev/shm"):
        yield str(tmp_path)
        return
    d = tempfile.mkdtemp(prefix="crawlerd-shards-", dir="/dev/shm")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_three_shards_polite_across_partitions_and_nothing_handed_off_is_lost(fast_dir):
    web = ShardWeb(fast_dir, shards=3, hosts=10_000, shared_share=0.1, seeds=600)
    # the shared addresses really straddle partitions
    straddling = [ip for ip, hs in web.shared_ips.items() if len({shard_of_url(h + "/", 3) for h in hs}) > 1]
    assert len(straddling) >= 0.9 * len(web.shared_ips) and len(web.shared_ips) >= 200
    asyncio.run(web.run(kills=6))
    L = web.ledger
    assert L.violations == [], L.violations[:10]
    assert L.shared_ip_requests > 1000
    assert sum(s.kills for s in web.shards) == 6 and web.lost_staged > 0   # kills took staged links along
    assert sum(s.frontier.shared_ip_waits for s in web.shards) > 0      # shards did wait for each other
    # every URL is owned by exactly one shard: only its owner ever queued or fetched it
    assert all(len(owners) == 1 for owners in web.queued_by.values())
    assert all(set(by) == {shard_of_url(u, 3)} for u, by in web.fetched.items())
    # everything discovered (handed off or not) was fetched: nothing lost across the kills
    assert len(web.discovered) == 2 * 10_000       # every host reached: page 0 and page 1 of each
    assert web.handed and web.handed <= web.discovered
    missing = web.discovered - set(web.fetched)
    assert not missing, sorted(missing)[:10]
    handed_by_owner = Counter(shard_of_url(u, 3) for u in web.handed)
    assert min(handed_by_owner.values()) > 1000
    for s in web.shards:
        s.frontier.check_invariants(deep=True)
        st = s.frontier.stats()
        assert st["queued"] == 0 and st["leased"] == 0 and st["dropped_total"] == 0, st
        assert s.inbox.backlog() == 0 and s.slots.held() == 0
