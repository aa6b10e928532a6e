"""A standby's create that meets the lease key expiring under it (nats-py's own read after a refused
create raises KeyNotFoundError when the key is gone by then): the standby takes the lease, or says it
did not, and never fails with the client's error.

The race sits inside the client between two of its requests, so no server timing reproduces it on
demand: the KV here is a stand-in that plays the client's answers; the real lease scenarios run
against a real NATS cluster in test_lease.py.
"""

import asyncio

import nats.js.errors

from crawlerd.cluster.lease import KvShardLease


class DirectLink:
    async def retry(self, op, *, what, timeout_s=60.0):
        return await op()


class ExpiringKv:
    """``create`` fails as nats-py's does when the key expires between its refused create and its read,
    ``misses`` times, then stores; ``get`` finds nothing (the key expired)."""

    def __init__(self, misses: int):
        self.misses = misses
        self.creates = 0
        self.stored: dict[str, bytes] = {}

    async def create(self, key, value):
        self.creates += 1
        if self.creates <= self.misses:
            raise nats.js.errors.KeyNotFoundError()
        self.stored[key] = value
        return 41

    async def get(self, key):
        raise nats.js.errors.KeyNotFoundError()


def standby(kv) -> KvShardLease:
    le = KvShardLease(DirectLink(), 3, node="standby", ttl_s=3.0, fence_s=2.0, renew_interval_s=0.5)
    le.kv = kv
    return le


def test_a_key_that_expired_under_the_create_is_created_again_and_held():
    kv = ExpiringKv(misses=1)
    le = standby(kv)
    assert asyncio.run(le.acquire()) is True
    assert le.held() and le.revision == 41 and kv.creates == 2 and "shard.3" in kv.stored


def test_a_key_that_keeps_vanishing_is_not_held_and_raises_nothing():
    kv = ExpiringKv(misses=100)
    le = standby(kv)
    assert asyncio.run(le.acquire()) is False
    assert not le.held() and le.holder is None and kv.creates == 3
