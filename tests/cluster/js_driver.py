"""JetStream hand-off scenarios against a real 3-node NATS cluster (run inside a private netns).

``python js_driver.py OUT`` starts 3 nats-server processes on loopback ports (temp store dirs),
runs every scenario below on its own crawl name, writes what it observed as JSON to OUT, and
stops the servers. ``python js_driver.py --sender SERVERS CRAWL ROOT SOURCE DEST COUNT`` is the
sender child the crash scenario kills with SIGKILL.

Scenarios (the test asserts on their numbers):
- ``basic``: one outbox to two shards, every batch received once, backlog drains to 0.
- ``dedup``: the same batch file published twice (a sender that died after the publish, before
  deleting its file): the stream stores it once.
- ``redelivery``: a receiver takes a batch and dies before its ack: the batch comes again; a
  receiver that acks (after its journal holds the batch) sees it no more.
- ``backpressure``: the destination's backlog limit refuses publishes; the outbox keeps the
  batches on disk and delivers them all once the receiver reads.
- ``leader_kill``: SIGKILL of the stream leader while batches flow: none lost, none applied
  twice, and the publish outage it caused.
- ``sender_crash``: a sender process killed with SIGKILL mid-stream and started again on the
  same outbox dir: every batch it wrote arrives, none applied twice.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from crawlerd.cluster.engine import Link, Names
from crawlerd.cluster.localnats import LocalNats
from crawlerd.handoff.jetstream import JetStreamInbox, JetStreamOutbox


def recs(tag: int, n: int) -> list[tuple[int, bytes]]:
    return [((tag << 20) | i, f"http://h{tag}.test/{i}".encode()) for i in range(n)]


async def open_link(servers, crawl, *, limit=1000, replicas=3):
    link = await Link(servers, Names(crawl)).open()
    await link.ensure_stream(replicas=replicas, max_batches_per_shard=limit, dedup_window_s=120.0)
    return link


class Journal:
    """A receiver's stand-in for the seen-set journal: what was applied, per (source, seq)."""

    def __init__(self):
        self.applied: dict[tuple[int, int], int] = {}
        self.records = 0
        self.fps: set[int] = set()

    def take(self, inbox: JetStreamInbox, ack: bool = True) -> int:
        n = 0
        for b in inbox.receive():
            key = (b.source, b.seq)
            self.applied[key] = self.applied.get(key, 0) + 1
            self.records += len(b.records)
            self.fps.update(fp for fp, _ in b.records)
            n += 1
            if ack:
                inbox.ack(b)
        return n

    def twice(self) -> int:
        return sum(1 for v in self.applied.values() if v > 1)


async def until(pred, timeout_s: float, step_s: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        await asyncio.sleep(step_s)
    return pred()


async def drain_into(journal: Journal, inbox: JetStreamInbox, want: int, timeout_s: float) -> bool:
    async def go():
        while len(journal.applied) < want:
            journal.take(inbox)
            await asyncio.sleep(0.01)
    try:
        await asyncio.wait_for(go(), timeout_s)
        return True
    except TimeoutError:
        return False


async def consumer_state(link: Link, shard: int) -> dict:
    info = await link.retry(lambda: link.js.consumer_info(link.names.stream, link.names.consumer(shard)),
                            what="consumer info")
    return {"pending": info.num_pending, "ack_pending": info.num_ack_pending}


async def stream_msgs(link: Link) -> int:
    si = await link.retry(lambda: link.js.stream_info(link.names.stream), what="stream info")
    return si.state.messages


async def wait_consumers_empty(link: Link, shards, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        states = {s: await consumer_state(link, s) for s in shards}
        if all(v["pending"] == 0 and v["ack_pending"] == 0 for v in states.values()) or time.monotonic() > deadline:
            return states
        await asyncio.sleep(0.1)


# -- scenarios ---------------------------------------------------------------------------
async def basic(nats: LocalNats, tmp: str) -> dict:
    link = await open_link(nats.servers, "basic")
    out = JetStreamOutbox(link, os.path.join(tmp, "basic"), 0, [1, 2], batch_records=50, flush_interval_s=0.02)
    inboxes = {d: await JetStreamInbox(link, d).open() for d in (1, 2)}
    out.start()
    for ib in inboxes.values():
        ib.start()
    for i in range(20):
        out.stage(1 + i % 2, recs(i, 120))          # 120 records: 3 batches of <= 50 each
    await out.flush()
    journals = {d: Journal() for d in (1, 2)}
    ok = all([await drain_into(journals[d], inboxes[d], 24, 20.0) for d in (1, 2)])
    for ib in inboxes.values():
        await ib.close()
    await out.close()
    empty = await wait_consumers_empty(link, [1, 2], 10.0)
    res = {"drained": ok, "batches": {d: len(j.applied) for d, j in journals.items()},
           "records": {d: j.records for d, j in journals.items()}, "twice": sum(j.twice() for j in journals.values()),
           "published": out.published, "unpublished": out.unpublished(), "consumers": empty,
           "stream_msgs": await stream_msgs(link)}
    await link.close()
    return res


async def dedup(nats: LocalNats, tmp: str) -> dict:
    link = await open_link(nats.servers, "dedup")
    root = os.path.join(tmp, "dedup")
    out = JetStreamOutbox(link, root, 0, [1], batch_records=100)
    out.local.stage(1, recs(1, 10))
    await out.local.flush()                    # the file exists; nothing published yet
    name = os.listdir(os.path.join(root, "1"))[0]
    with open(os.path.join(root, "1", name), "rb") as f:
        data = f.read()
    out.start()
    await until(lambda: out.published == 1, 10.0)
    await out.close()
    # the sender died after JetStream stored the batch, before its file was deleted: it is back
    with open(os.path.join(root, "1", name), "wb") as f:
        f.write(data)
    again = JetStreamOutbox(link, root, 0, [1])
    again.start()
    await until(lambda: again.published == 1, 10.0)
    await again.close()
    res = {"first": out.published, "second": again.published, "duplicates": again.duplicates,
           "stream_msgs": await stream_msgs(link), "left": again.unpublished()}
    await link.close()
    return res


async def redelivery(nats: LocalNats, tmp: str) -> dict:
    link = await open_link(nats.servers, "redeliv")
    out = JetStreamOutbox(link, os.path.join(tmp, "redeliv"), 0, [1], batch_records=100)
    out.start()
    await out.send(1, recs(7, 10))
    await until(lambda: out.published == 1, 10.0)
    await out.close()
    # receiver 1 takes the batch and dies before its journal holds it (no ack, no nak)
    dead = await Link(nats.servers, Names("redeliv")).open()
    ib1 = await JetStreamInbox(dead, 1, ack_wait_s=2.0).open()
    ib1.start()
    j1 = Journal()
    await until(lambda: bool(j1.take(ib1, ack=False)), 10.0)
    await dead.nc.close()                      # gone without a word; the tasks die with the connection
    for t in ib1._tasks:
        t.cancel()
    t0 = time.monotonic()
    ib2 = await JetStreamInbox(link, 1, ack_wait_s=2.0).open()
    ib2.start()
    j2 = Journal()
    got = await drain_into(j2, ib2, 1, 15.0)
    wait_s = time.monotonic() - t0
    await ib2.close()
    after = await wait_consumers_empty(link, [1], 5.0)
    # nothing comes a third time once acknowledged
    ib3 = await JetStreamInbox(link, 1, ack_wait_s=2.0).open()
    ib3.start()
    await asyncio.sleep(3.0)
    j3 = Journal()
    j3.take(ib3)
    await ib3.close()
    res = {"first_taken": len(j1.applied), "again": got, "same": list(j1.applied) == list(j2.applied),
           "redelivered_flag": ib2.redelivered, "wait_s": round(wait_s, 2), "after_ack": after,
           "third": len(j3.applied)}
    await link.close()
    return res


async def backpressure(nats: LocalNats, tmp: str) -> dict:
    link = await open_link(nats.servers, "backp", limit=4)
    out = JetStreamOutbox(link, os.path.join(tmp, "backp"), 0, [1], batch_records=10, max_pending=1000)
    out.start()
    for i in range(12):
        out.stage(1, recs(i, 10))
    await out.flush()
    await until(lambda: out.refused > 0 and out.published == 4, 10.0)
    held = {"published": out.published, "refused": out.refused, "on_disk": out.unpublished(),
            "stream_msgs": await stream_msgs(link)}
    ib = await JetStreamInbox(link, 1).open()
    ib.start()
    j = Journal()
    ok = await drain_into(j, ib, 12, 30.0)
    await ib.close()
    await out.close()
    res = {"held": held, "drained": ok, "batches": len(j.applied), "twice": j.twice(),
           "unpublished": out.unpublished()}
    await link.close()
    return res


async def leader_kill(nats: LocalNats, tmp: str) -> dict:
    link = await open_link(nats.servers, "lkill")
    out = JetStreamOutbox(link, os.path.join(tmp, "lkill"), 0, [1, 2], batch_records=20, flush_interval_s=0.01)
    # ack wait 5 s: a delivery lost with the consumer's leader comes again within the test
    inboxes = {d: await JetStreamInbox(link, d, ack_wait_s=5.0).open() for d in (1, 2)}
    journals = {d: Journal() for d in (1, 2)}
    out.start()
    for ib in inboxes.values():
        ib.start()
    total = 300
    killed = None
    for i in range(total):
        out.stage(1 + i % 2, recs(i, 20))
        if i == total // 3:
            si = await link.retry(lambda: link.js.stream_info(link.names.stream), what="stream info")
            killed = si.cluster.leader
            nats.kill(killed)
        for d in (1, 2):
            journals[d].take(inboxes[d])
        await asyncio.sleep(0.005)
    await out.flush()
    ok = all([await drain_into(journals[d], inboxes[d], total // 2, 60.0) for d in (1, 2)])
    lat = sorted(out.publish_latency_s)
    for ib in inboxes.values():
        await ib.close()
    await out.close()
    si = await link.retry(lambda: link.js.stream_info(link.names.stream), what="stream info")
    nats.start(killed)
    empty = await wait_consumers_empty(link, [1, 2], 15.0)
    res = {"killed": killed, "new_leader": si.cluster.leader, "drained": ok,
           "batches": sum(len(j.applied) for j in journals.values()), "sent": total,
           "twice": sum(j.twice() for j in journals.values()), "retries": out.retries,
           "duplicates": out.duplicates, "max_publish_s": round(out.max_publish_s, 3),
           "p50_publish_s": round(lat[len(lat) // 2], 4) if lat else None,
           "consumers": empty, "repeats": sum(ib.repeats for ib in inboxes.values()),
           "ack_retries": sum(ib.ack_retries for ib in inboxes.values())}
    await link.close()
    return res


def sender_child(servers: str, crawl: str, root: str, source: int, dest: int, count: int) -> None:
    async def go():
        link = await open_link(servers.split(","), crawl)
        out = JetStreamOutbox(link, root, source, [dest], batch_records=10, flush_interval_s=0.01)
        out.start()
        mark = os.path.join(root, "written")
        done = 0
        if os.path.exists(mark):
            with open(mark) as f:
                done = int(f.read() or 0)
        for i in range(done, count):
            await out.send(dest, recs(i, 10))           # durable in the outbox once this returns
            with open(mark + ".tmp", "w") as f:
                f.write(str(i + 1))
            os.replace(mark + ".tmp", mark)
            await asyncio.sleep(0.005)
        while out.unpublished():
            await asyncio.sleep(0.01)
        await out.close()
        await link.close()
    asyncio.run(go())


async def sender_crash(nats: LocalNats, tmp: str) -> dict:
    root = os.path.join(tmp, "scrash")
    os.makedirs(root)
    link = await open_link(nats.servers, "scrash")
    count = 200
    cmd = [sys.executable, __file__, "--sender", ",".join(nats.servers), "scrash", root, "3", "1", str(count)]
    p = subprocess.Popen(cmd)
    ib = await JetStreamInbox(link, 1).open()
    ib.start()
    j = Journal()
    await until(lambda: j.take(ib) >= 0 and len(j.applied) >= 60, 30.0)
    p.send_signal(signal.SIGKILL)
    p.wait()
    with open(os.path.join(root, "written")) as f:
        written_at_kill = int(f.read())
    left_at_kill = len([n for n in os.listdir(os.path.join(root, "1")) if n.endswith(".hb")])
    p = subprocess.Popen(cmd)
    # every record, not `count` batches: a batch in the outbox when the mark was not yet written is
    # sent again by the restarted sender under a new sequence, so the batch count runs one ahead
    everything = [i << 20 for i in range(count)]
    ok = await until(lambda: j.take(ib) >= 0 and all(fp in j.fps for fp in everything), 60.0)
    rc = p.wait(30)
    await ib.close()
    missing = sum(1 for fp in everything if fp not in j.fps)
    res = {"written_at_kill": written_at_kill, "missing": missing, "files_at_kill": left_at_kill, "batches": len(j.applied),
           "count": count, "drained": ok, "twice": j.twice(), "restart_rc": rc,
           "consumers": await wait_consumers_empty(link, [1], 10.0)}
    await link.close()
    return res


SCENARIO_TIMEOUT_S = 60.0


async def bounded(coro, name: str):
    """Run a scenario for at most SCENARIO_TIMEOUT_S; past that, print every task's stack and fail it."""
    task = asyncio.ensure_future(coro)
    done, _ = await asyncio.wait([task], timeout=SCENARIO_TIMEOUT_S)
    if not done:
        buf = io.StringIO()
        for t in asyncio.all_tasks():
            t.print_stack(file=buf)
        task.cancel()
        raise TimeoutError(f"{name} did not finish in {SCENARIO_TIMEOUT_S:.0f} s; tasks:\n{buf.getvalue()[-4000:]}")
    return task.result()
SCENARIOS = [basic, dedup, redelivery, backpressure, sender_crash, leader_kill]


def main(out: str, *names: str) -> None:
    tmp = tempfile.mkdtemp(prefix="crawlerd-js-")
    results: dict = {}
    t0 = time.monotonic()
    with LocalNats(os.path.join(tmp, "nats")) as nats:
        results["cluster_up_s"] = round(time.monotonic() - t0, 2)
        for sc in SCENARIOS:
            if names and sc.__name__ not in names:
                continue
            t = time.monotonic()
            try:
                results[sc.__name__] = asyncio.run(bounded(sc(nats, tmp), sc.__name__))
            except Exception as e:          # the test names the scenario that broke
                results[sc.__name__] = {"error": f"{type(e).__name__}: {e}"}
            results[sc.__name__ + "_s"] = round(time.monotonic() - t, 2)
    with open(out, "w") as f:
        json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    if sys.argv[1] == "--sender":
        sender_child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7]))
    else:
        main(sys.argv[1], *sys.argv[2:])
