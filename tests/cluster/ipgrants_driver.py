"""Per-IP turns across two machines over a real 3-node NATS cluster (run inside a private netns).

``python ipgrants_driver.py OUT`` starts 3 nats-server processes and plays the scenarios with
shards of two "machines" in this process: machine A runs shards 0 and 1 (one slot table file
shared by both, as a machine's shards share it), machine B runs shard 2 (its own file); N = 3.
Each shard is a ``ClusterIpSlots`` over its own NATS connection, answering for the IPs it owns
with an ``IpTurnService``.

- ``exclusive``: all three shards lease on the same 6 IPs as fast as the slot tables let them
  (each lease held 5-15 ms) for a few seconds; every cell held is logged with its times (one
  clock: one process). No IP is ever held by both machines at once; both machines got turns
  on every IP; shards 0 and 1 shared their turns through their slot table.
- ``dead_holder``: machine B takes a grant on an IP owned by shard 0 and dies without a word
  (its connection dropped, its tasks cancelled); A gets the IP only after B's grant expired
  plus the drain, then at once.
- ``no_owner``: the IP's owner does not run: nothing is granted (the lease waits).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import tempfile
import time

from crawlerd._native.ipslots import IPSlots, create
from crawlerd.cluster.engine import Link, Names
from crawlerd.cluster.ipgrants import ClusterIpSlots, IpTurnService
from crawlerd.cluster.ipturns import IpTurns
from crawlerd.cluster.localnats import LocalNats

N = 3
MACHINE = {0: "A", 1: "A", 2: "B"}
GRANT_S, DRAIN_S = 0.6, 0.4


class Shard:
    def __init__(self, servers, shard: int, table: str, *, drain_s: float = DRAIN_S):
        self.shard = shard
        self.servers = servers
        self.table = table
        self.drain_s = drain_s

    async def open(self) -> Shard:
        self.link = await Link(self.servers, Names("ipt"), name=f"shard-{self.shard}").open()
        self.local = IPSlots(self.table)
        self.local.attach(self.shard, time.monotonic(), 0.0)
        self.turns = IpTurns(grant_s=GRANT_S, drain_s=self.drain_s, now=time.monotonic())
        self.ips = ClusterIpSlots(self.local, shard=self.shard, shards=N, node=MACHINE[self.shard],
                                  grant_s=GRANT_S, link=self.link, own=self.turns)
        self.service = IpTurnService(self.link, self.shard, self.turns)
        await self.service.start()
        self.ips.start()
        return self

    async def close(self, give_back: bool = True) -> None:
        if give_back:
            await self.ips.stop()
        else:
            await self.ips.stop(timeout_s=0.0)
        await self.service.close()
        await self.link.close()
        self.local.close()


def key_owned_by(owner: int, salt: int = 0) -> int:
    k = 1_000_003 * (salt + 1)
    while k % N != owner:
        k += 1
    return k


async def worker(sh: Shard, keys: list[int], until: float, log: list, rng: random.Random) -> None:
    while time.monotonic() < until:
        k = rng.choice(keys)
        now = time.monotonic()
        w = sh.ips.try_acquire(k, now, 0.01)
        if w == 0.0:
            t0 = time.monotonic()
            await asyncio.sleep(0.005 + rng.random() * 0.01)
            t1 = time.monotonic()
            sh.ips.release(k, t1, 0.01)
            log.append((k, MACHINE[sh.shard], sh.shard, t0, t1))
        else:
            await asyncio.sleep(min(max(w - now, 0.002), 0.05))


async def exclusive(servers, tmp) -> dict:
    ta, tb = os.path.join(tmp, "a.slots"), os.path.join(tmp, "b.slots")
    create(ta, N, 1, 1024)
    create(tb, N, 1, 1024)
    shards = [await Shard(servers, 0, ta).open(), await Shard(servers, 1, ta).open(),
              await Shard(servers, 2, tb).open()]
    keys = [key_owned_by(i % N, i) for i in range(6)]
    log: list = []
    until = time.monotonic() + 6.0
    rng = random.Random(5)
    await asyncio.gather(*(worker(sh, keys, until, log, random.Random(rng.random())) for sh in shards))
    stats = [sh.ips.snapshot() for sh in shards]
    for sh in shards:
        await sh.close()
    overlaps = handovers = 0
    for k in keys:
        held = sorted((t0, t1, m) for kk, m, _s, t0, t1 in log if kk == k)
        end, last = float("-inf"), None
        for t0, t1, m in held:
            if t0 < end:        # one cell per machine: an overlap is two machines at once
                overlaps += 1
            if last is not None and m != last:
                handovers += 1
            end, last = max(end, t1), m
    per = {str(k): sorted({m for kk, m, _s, _t0, _t1 in log if kk == k}) for k in keys}
    by_shard = {s: sum(1 for e in log if e[2] == s) for s in range(N)}
    return {"leases": len(log), "overlaps": overlaps, "machines_per_ip": per, "by_shard": by_shard,
            "handovers": handovers, "stats": stats}


async def dead_holder(servers, tmp) -> dict:
    ta, tb = os.path.join(tmp, "a2.slots"), os.path.join(tmp, "b2.slots")
    create(ta, N, 1, 1024)
    create(tb, N, 1, 1024)
    a = await Shard(servers, 0, ta).open()
    b = await Shard(servers, 2, tb).open()
    k = key_owned_by(0, 77)
    t = time.monotonic()
    while b.ips.try_acquire(k, time.monotonic(), 0.0) != 0.0 and time.monotonic() - t < 5:
        await asyncio.sleep(0.01)
    got_b = time.monotonic()
    await b.close(give_back=False)          # dies holding the cell and the grant: no done
    died = time.monotonic()
    while a.ips.try_acquire(k, time.monotonic(), 0.0) != 0.0 and time.monotonic() - died < 10:
        await asyncio.sleep(0.01)
    got_a = time.monotonic()
    a.ips.release(k, got_a, 0.0)
    expired = a.turns.expired
    await a.close()
    return {"a_after_b_grant_s": round(got_a - got_b, 3), "b_grant_s": GRANT_S, "drain_s": DRAIN_S,
            "expired": expired}


async def no_owner(servers, tmp) -> dict:
    ta = os.path.join(tmp, "a3.slots")
    create(ta, N, 1, 1024)
    a = await Shard(servers, 0, ta).open()
    k = key_owned_by(1, 5)                  # shard 1 does not run
    t0 = time.monotonic()
    granted = False
    while time.monotonic() - t0 < 2.0:
        if a.ips.try_acquire(k, time.monotonic(), 0.0) == 0.0:
            granted = True
            break
        await asyncio.sleep(0.02)
    st = a.ips.snapshot()
    await a.close()
    return {"granted": granted, "no_answer": st["no_answer"]}


def main(out: str) -> None:
    tmp = tempfile.mkdtemp(prefix="crawlerd-ipgrants-")
    results: dict = {}
    with LocalNats(os.path.join(tmp, "nats")) as nats:
        for name, fn in [("exclusive", exclusive), ("dead_holder", dead_holder), ("no_owner", no_owner)]:
            t = time.monotonic()
            try:
                results[name] = asyncio.run(asyncio.wait_for(fn(nats.servers, tmp), 60.0))
            except Exception as e:
                results[name] = {"error": f"{type(e).__name__}: {e}"}
            results[name + "_s"] = round(time.monotonic() - t, 2)
    with open(out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
