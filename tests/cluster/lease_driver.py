"""Shard lease scenarios against a real 3-node NATS cluster (run inside a private netns).

``python lease_driver.py OUT`` starts 3 nats-server processes, plays the scenarios, writes JSON.
``python lease_driver.py --holder SERVERS LOG`` is the lease holder the fencing scenario stops
with SIGSTOP: it takes the lease of shard 0 and logs ``wall held`` every 10 ms (line-buffered).

- ``exclusive``: a second node cannot take a held lease and learns who holds it; renewals
  advance the revision (compare-and-set).
- ``release``: a released lease is taken at once by another node.
- ``fencing``: the holder is stopped past the TTL; a standby takes over only after expiry;
  once continued, the old holder never says ``held`` after the standby's takeover, and learns
  it lost the lease (its compare-and-set is refused).
- ``leader_kill``: SIGKILL of the lease bucket's stream leader: the holder keeps the lease
  (never lost), nobody else takes it.
- ``shards``: N recorded by the first node; another N refused, naming both.
- ``heir``: a restarted process of the same node (holding the machine's lock) takes over the
  lease its dead predecessor left at once; another node may not; the predecessor's next renewal
  is refused (lost).
- ``dedup``: one owner per payload digest across two machines over NATS request/reply: the
  owner on the other machine decides the first capture, learns the confirm, forgets a released
  claim; with the owner gone a claim is unanswered (archived in full).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from crawlerd.cluster.engine import ClusterError, Link, Names
from crawlerd.cluster.lease import ClusterMeta, KvShardLease
from crawlerd.cluster.localnats import LocalNats

TTL = dict(ttl_s=3.0, fence_s=2.0, renew_interval_s=0.5)


async def lease(servers, crawl, shard, node, **kw):
    link = await Link(servers, Names(crawl)).open()
    return await KvShardLease(link, shard, node=node, **{**TTL, **kw}).open()


async def exclusive(nats: LocalNats) -> dict:
    a = await lease(nats.servers, "excl", 0, "A")
    b = await lease(nats.servers, "excl", 0, "B")
    got_a = await a.acquire()
    a.start()
    got_b = await b.acquire()
    rev0 = a.revision
    await asyncio.sleep(1.6)
    res = {"a": got_a, "b": got_b, "holder": (b.holder or {}).get("node"), "renewals": a.renewals,
           "revision_advanced": a.revision > rev0, "a_held": a.held(), "b_held": b.held()}
    await a.release()
    for x in (a, b):
        await x.link.close()
    return res


async def release(nats: LocalNats) -> dict:
    a = await lease(nats.servers, "rel", 1, "A")
    b = await lease(nats.servers, "rel", 1, "B")
    await a.acquire()
    a.start()
    await a.release()
    t0 = time.monotonic()
    got = await b.acquire()
    res = {"b_after_release": got, "took_s": round(time.monotonic() - t0, 3), "a_held": a.held()}
    await b.release()
    for x in (a, b):
        await x.link.close()
    return res


def holder_child(servers: str, logpath: str) -> None:
    async def go():
        le = await lease(servers.split(","), "fence", 0, "old")
        if not await le.acquire():
            sys.exit(3)
        le.start()
        with open(logpath, "w", buffering=1) as f:
            f.write(f"acquired {time.time():.6f}\n")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                f.write(f"{time.time():.6f} {int(le.held())} {int(bool(le.lost))}\n")
                if le.lost:
                    f.write(f"lost {time.time():.6f} {le.lost}\n")
                    break
                await asyncio.sleep(0.01)
    asyncio.run(go())


async def fencing(nats: LocalNats, tmp: str) -> dict:
    logpath = os.path.join(tmp, "holder.log")
    # the holder's output goes to a file: a holder left behind must not hold the driver's pipes open
    with open(os.path.join(tmp, "holder.out"), "wb") as out:
        p = subprocess.Popen([sys.executable, __file__, "--holder", ",".join(nats.servers), logpath],
                             stdout=out, stderr=subprocess.STDOUT)
    try:
        while not (os.path.exists(logpath) and open(logpath).read().count("\n") > 20):
            if p.poll() is not None:
                return {"error": f"the holder exited ({p.returncode}) before holding the lease"}
            await asyncio.sleep(0.05)
        standby = await lease(nats.servers, "fence", 0, "standby")
        early = await standby.acquire()                 # held by the old node: refused
        p.send_signal(signal.SIGSTOP)
        stopped_at = time.time()
        got = await standby.acquire_wait(30.0, poll_s=0.05)
        took_over = time.time()
        standby.start()
        await asyncio.sleep(0.5)
        p.send_signal(signal.SIGCONT)
        while p.poll() is None:                         # it notices the loss and exits (bounded by wait_for)
            await asyncio.sleep(0.05)
        rc = p.returncode
    finally:                                            # never leave a stopped holder behind
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.kill()
            p.wait()
    lines = open(logpath).read().splitlines()
    samples = [ln.split() for ln in lines if ln[0].isdigit()]
    held_after = [s for s in samples if float(s[0]) >= took_over and s[1] == "1"]
    last_held = max((float(s[0]) for s in samples if s[1] == "1"), default=0.0)
    lost = [ln for ln in lines if ln.startswith("lost")]
    res = {"early": early, "took_over": got, "rc": rc, "samples": len(samples),
           "held_after_takeover": len(held_after), "lost": bool(lost),
           "lost_reason": lost[0].split(" ", 2)[2] if lost else "",
           "takeover_after_stop_s": round(took_over - stopped_at, 3),
           "last_held_before_takeover_s": round(took_over - last_held, 3),
           "standby_held": standby.held()}
    await standby.release()
    await standby.link.close()
    return res


async def leader_kill(nats: LocalNats) -> dict:
    # a TTL longer than a stream leader election (raft election timeout 4-9 s in nats-server)
    slow = dict(ttl_s=20.0, fence_s=14.0, renew_interval_s=1.0)    # (margin for a loaded test box)
    a = await lease(nats.servers, "lkl", 2, "A", **slow)
    b = await lease(nats.servers, "lkl", 2, "B", **slow)
    await a.acquire()
    a.start()
    si = await a.link.js.stream_info(f"KV_{a.link.names.leases}")
    killed = si.cluster.leader
    nats.kill(killed)
    stolen = False
    gaps = 0
    t_end = time.monotonic() + 12.0
    while time.monotonic() < t_end:
        if not a.held():
            gaps += 1
        try:
            stolen = stolen or await asyncio.wait_for(b.acquire(), 1.0)
        except Exception:
            pass
        await asyncio.sleep(0.1)
    nats.start(killed)
    res = {"killed": killed, "lost": a.lost, "stolen": stolen, "held_end": a.held(), "unheld_samples": gaps,
           "renew_failures": a.renew_failures, "renewals": a.renewals}
    await a.release()
    for x in (a, b):
        await x.link.close()
    return res


async def shards(nats: LocalNats) -> dict:
    link = await Link(nats.servers, Names("meta")).open()
    meta = await ClusterMeta(link).open()
    first = await meta.check_shards(6)
    same = await meta.check_shards(6)
    try:
        await meta.check_shards(4)
        refused = ""
    except ClusterError as e:
        refused = str(e)
    res = {"first": first, "same": same, "refused": refused, "stored": await meta.shards()}
    await link.close()
    return res


async def status(nats: LocalNats) -> dict:
    """Two nodes own shards 0 and 1 of 3; shard 2 has a batch waiting: what `cluster status` says."""
    from crawlerd.handoff.jetstream import JetStreamInbox, JetStreamOutbox
    link = await Link(nats.servers, Names("stat")).open()
    await (await ClusterMeta(link).open()).check_shards(3)
    await link.ensure_stream(replicas=3, max_batches_per_shard=100, dedup_window_s=60.0)
    await JetStreamInbox(link, 2).open()            # its consumer exists; nobody reads it
    a = await lease(nats.servers, "stat", 0, "alpha")
    b = await lease(nats.servers, "stat", 1, "beta")
    for x in (a, b):
        x.numbers = {"pages": 42, "pages_per_s": 3.5, "outbox_batches": 0}
        await x.acquire()
        x.start()
    out = JetStreamOutbox(link, tempfile.mkdtemp(), 0, [2])
    out.start()
    await out.send(2, [(1, b"http://x.test/")])
    while out.published < 1:
        await asyncio.sleep(0.01)
    await out.close()
    cmd = [sys.executable, "-m", "crawlerd", "cluster", "status", "--json", "-s",
           "cluster.servers=" + json.dumps(nats.servers), "-s", "cluster.crawl=stat"]
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    so, se = await proc.communicate()
    text = await asyncio.create_subprocess_exec(*[c for c in cmd if c != "--json"], stdout=subprocess.PIPE)
    so_text, _ = await text.communicate()
    for x in (a, b):
        await x.release()
        await x.link.close()
    await link.close()
    if proc.returncode != 0:
        return {"error": se.decode()[-500:]}
    return {"view": json.loads(so), "text": so_text.decode()}


async def member(nats: LocalNats, tmp: str) -> dict:
    """Two shard processes' parts from the config: a batch from 0 reaches 1; a second process for
    shard 0 is refused naming the holder; a node with another N is refused."""
    from crawlerd import config as configmod
    from crawlerd.cluster.member import open_cluster_parts

    def cfg(n, node):
        return configmod.load(None, ["cluster.servers=" + json.dumps(nats.servers),
                                     "cluster.crawl=memb", f"cluster.node={node}", "cluster.lease_ttl_s=3",
                                     "cluster.lease_fence_s=2", "cluster.lease_renew_interval_s=0.5"])
    p0 = await open_cluster_parts(cfg(2, "alpha"), 0, shards=2, outbox_root=os.path.join(tmp, "m0"))
    p1 = await open_cluster_parts(cfg(2, "beta"), 1, shards=2, outbox_root=os.path.join(tmp, "m1"))
    for p in (p0, p1):
        p.start()
        p.outbox.start()
    await p0.outbox.send(1, [(5, b"0 0 0 http://a.test/")])
    got = []
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        for b in p1.inbox.receive():
            got.append([[fp, aux.decode()] for fp, aux in b.records])
            p1.inbox.ack(b)
        await asyncio.sleep(0.02)
    refusals = []
    for n, node in ((2, "gamma"), (3, "delta")):
        try:
            extra = await open_cluster_parts(cfg(n, node), 0, shards=n, outbox_root=os.path.join(tmp, "mx"))
            await extra.close()
            refusals.append("")
        except ClusterError as e:
            refusals.append(str(e))
    held = [p0.lease.held(), p1.lease.held()]
    for p in (p0, p1):
        await p.outbox.close()
        await p.close()
    return {"got": got, "held": held, "refusals": refusals}


async def heir(nats: LocalNats) -> dict:
    dead = await lease(nats.servers, "heir", 0, "A")
    got_dead = await dead.acquire()          # then never renewed: its process is gone
    other = await lease(nats.servers, "heir", 0, "B", heir=True)
    t0 = time.monotonic()
    again = await lease(nats.servers, "heir", 0, "A", heir=True)
    res = {"dead": got_dead, "other_node": await other.acquire(), "heir": await again.acquire(),
           "took_s": round(time.monotonic() - t0, 3), "inherited": again.inherited}
    await dead.renew_once()
    res["dead_lost"] = dead.lost
    res["holder_pid_is_heir"] = (await again.read_holder() or {}).get("since") == again.since
    await again.release()
    for x in (dead, other, again):
        await x.link.close()
    return res


async def dedup(nats: LocalNats, tmp: str) -> dict:
    import hashlib

    from crawlerd.cluster.dedup import OwnerPeer, OwnerService
    from crawlerd.dedup.owners import DigestOwner, DigestOwners, DigestOwnerServer, owner_of
    from crawlerd.store.digest_set import DigestSet

    def owned_by_1(tag: bytes) -> bytes:
        return next(d for d in (hashlib.sha1(tag + bytes([i])).digest() for i in range(256)) if owner_of(d, 2) == 1)
    links = [await Link(nats.servers[i:i + 1], Names("dd")).open() for i in (0, 1)]   # each machine its own server
    sets = [DigestSet(os.path.join(tmp, f"dd{i}"), map_size_bytes=1 << 24) for i in (0, 1)]
    owners = [DigestOwner(x) for x in sets]
    services = [OwnerService(links[i], i, DigestOwnerServer(os.path.join(tmp, f"none{i}.sock"), owners[i]).handle)
                for i in (0, 1)]
    for sv in services:
        await sv.start()
    probe, deadline = owned_by_1(b"probe"), time.monotonic() + 10
    while time.monotonic() < deadline:  # until the owner's subscription is known on the other server
        answered, _p = await OwnerPeer(links[0], 1).ask({"op": "claim", "d": probe.hex(), "u": "http://p.test/",
                                                         "t": 0.0}, 0.5)
        if answered:
            break
    a, b = (DigestOwners(i, 2, owners[i], lambda j: os.path.join(tmp, f"none{j}.sock")) for i in (0, 1))
    a.use_peer(1, OwnerPeer(links[0], 1))
    b.use_peer(0, OwnerPeer(links[1], 0))
    d, e, f = owned_by_1(b"d"), owned_by_1(b"e"), owned_by_1(b"f")
    res: dict = {"first": await a.claim(d, "http://a.test/x", 10.0)}
    p = await b.claim(d, "http://b.test/y", 11.0)          # the owner is b itself here: a's claim stands
    res["second"] = [p.url, p.fetched_at] if p else None
    a.confirm(d, "http://a.test/x", 10.0, "urn:uuid:1")
    deadline = time.monotonic() + 5
    while sets[1].owner(d) is None and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    res["owner_kept"] = list(sets[1].owner(d) or [])
    res["released_first"] = await a.claim(e, "http://a.test/q", 1.0)
    a.release(e, "http://a.test/q")
    deadline = time.monotonic() + 5
    while owners[1].claims and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    res["after_release"] = await b.claim(e, "http://b.test/q", 2.0)
    res["answered_for_a"] = services[1].answered
    await services[1].close()
    res["gone"] = await a.claim(f, "http://a.test/r", 3.0)
    res["unanswered"] = a.unanswered
    for x in (a, b):
        await x.close()
    for sv in services:
        await sv.close()
    for link in links:
        await link.close()
    for x in sets:
        x.close()
    return res


def main(out: str) -> None:
    tmp = tempfile.mkdtemp(prefix="crawlerd-lease-")
    results: dict = {}
    with LocalNats(os.path.join(tmp, "nats")) as nats:
        for name, coro in [("exclusive", lambda: exclusive(nats)), ("release", lambda: release(nats)),
                           ("shards", lambda: shards(nats)), ("status", lambda: status(nats)),
                           ("member", lambda: member(nats, tmp)), ("dedup", lambda: dedup(nats, tmp)),
                           ("heir", lambda: heir(nats)),
                           ("fencing", lambda: fencing(nats, tmp)),
                           ("leader_kill", lambda: leader_kill(nats))]:
            t = time.monotonic()
            try:
                results[name] = asyncio.run(asyncio.wait_for(coro(), 60.0))
            except Exception as e:
                results[name] = {"error": f"{type(e).__name__}: {e}"}
            results[name + "_s"] = round(time.monotonic() - t, 2)
    with open(out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    if sys.argv[1] == "--holder":
        holder_child(sys.argv[2], sys.argv[3])
    else:
        main(sys.argv[1])
