"""One owner per payload digest across shards: claims, confirms, releases over the real socket channel."""

import asyncio
import hashlib

from crawlerd.dedup.owners import DigestOwner, DigestOwners, DigestOwnerServer, owner_of
from crawlerd.store.digest_set import DigestSet


def digest_owned_by(shard: int, shards: int = 2) -> bytes:
    for i in range(1000):
        d = hashlib.sha1(str(i).encode()).digest()
        if owner_of(d, shards) == shard:
            return d
    raise AssertionError


def test_the_owner_decides_the_first_capture_for_every_shard(tmp_path):
    sock = lambda i: str(tmp_path / f"dedup{i}.sock")      # noqa: E731

    async def go():
        sets = [DigestSet(tmp_path / f"d{i}", map_size_bytes=1 << 24) for i in range(2)]
        owners = [DigestOwner(s) for s in sets]
        servers = [DigestOwnerServer(sock(i), owners[i]) for i in range(2)]
        for s in servers:
            await s.start()
        a, b = (DigestOwners(i, 2, owners[i], sock) for i in range(2))
        d = digest_owned_by(1)
        try:
            # shard 0 fetched it first: shard 1 (the owner) records the claim
            assert await a.claim(d, "http://a.test/x", 10.0) is None
            # shard 1 meets the same payload while shard 0 archives it: a revisit of shard 0's capture
            p = await b.claim(d, "http://b.test/y", 11.0)
            assert (p.url, p.fetched_at) == ("http://a.test/x", 10.0)
            a.confirm(d, "http://a.test/x", 10.0, "urn:uuid:1")
            await asyncio.sleep(0.05)                         # the confirm crossed the channel
            assert sets[1].owner(d) == ("http://a.test/x", "10.0", "urn:uuid:1")
            assert sets[0].owner(d) is not None               # and the claimant keeps what it archived
            p = await b.claim(d, "http://b.test/z", 12.0)
            assert p.record_id == "urn:uuid:1"
            # a failed archive releases the claim: the next copy is the first
            e = next(hashlib.sha1(bytes([i])).digest() for i in range(256)
                     if owner_of(hashlib.sha1(bytes([i])).digest(), 2) == 1)
            assert await a.claim(e, "http://a.test/q", 1.0) is None
            a.release(e, "http://a.test/q")
            await asyncio.sleep(0.05)
            assert await b.claim(e, "http://b.test/q", 2.0) is None
            # an owner that does not answer: the capture is archived in full, never a dangling revisit
            await servers[1].close()
            await a.close()
            f = next(hashlib.sha1(bytes([i, 1])).digest() for i in range(256)
                     if owner_of(hashlib.sha1(bytes([i, 1])).digest(), 2) == 1)
            assert await a.claim(f, "http://a.test/r", 3.0) is None
            assert a.unanswered == 1 and a.remote_claims >= 3
        finally:
            await a.close()
            await b.close()
            for s in servers:
                await s.close()
            for s in sets:
                s.close()

    asyncio.run(go())
