"""Spool hand-off: durable before the barrier resolves, per-source order, bounded, at least once."""

import asyncio
import os

import pytest

from crawlerd.handoff import SpoolInbox, SpoolOutbox, decode_batch, encode_batch
from crawlerd.handoff.batch import BatchError


def recs(n, start=0):
    return [(i, f"0 0 1 http://h{i}.test/".encode()) for i in range(start, start + n)]


def test_batch_round_trip_and_damage_is_detected():
    data = encode_batch(3, 99, recs(5))
    b = decode_batch(data)
    assert (b.source, b.seq, b.records) == (3, 99, recs(5))
    for bad in (data[:10], data[:-1], data[:30] + b"x" + data[31:]):
        with pytest.raises(BatchError):
            decode_batch(bad)


def test_barrier_resolves_once_the_records_are_in_files(tmp_path):
    async def go():
        out = SpoolOutbox(str(tmp_path), 0, [1, 2], flush_interval_s=0.01)
        out.start()
        assert out.barrier() is None                     # nothing staged
        out.stage(1, recs(3))
        out.stage(2, recs(2, 10))
        fut = out.barrier()
        assert fut is not None and not fut.done()
        assert SpoolInbox(str(tmp_path), 1).receive() == []   # not written before the flusher runs
        await asyncio.wait_for(fut, 5)
        got1 = SpoolInbox(str(tmp_path), 1).receive()
        got2 = SpoolInbox(str(tmp_path), 2).receive()
        await out.close()
        return got1, got2

    got1, got2 = asyncio.run(go())
    assert [r for b in got1 for r in b.records] == recs(3)
    assert [r for b in got2 for r in b.records] == recs(2, 10)


def test_per_source_order_and_redelivery_until_acked(tmp_path):
    async def go():
        a = SpoolOutbox(str(tmp_path), 0, [2], batch_records=2)
        b = SpoolOutbox(str(tmp_path), 1, [2], batch_records=2)
        for i in range(3):
            await a.send(2, recs(3, 100 * i))
            await b.send(2, recs(1, 1000 + i))
        inbox = SpoolInbox(str(tmp_path), 2)
        first = inbox.receive()
        assert inbox.receive() == []                     # handed out, not acknowledged: not again
        for batch in first[:2]:
            inbox.ack(batch)
        again = SpoolInbox(str(tmp_path), 2).receive()  # a restarted receiver gets the rest again
        return first, again

    first, again = asyncio.run(go())
    by_source = {}
    for batch in first:
        by_source.setdefault(batch.source, []).append(batch.seq)
    assert all(seqs == sorted(seqs) for seqs in by_source.values())
    assert sum(len(b.records) for b in first if b.source == 0) == 9       # 3 sends, batches of <= 2
    assert [(b.source, b.seq) for b in again] == [(b.source, b.seq) for b in first[2:]]


def test_seq_grows_across_restarts_of_the_sender(tmp_path):
    async def go():
        out = SpoolOutbox(str(tmp_path), 0, [1])
        await out.send(1, recs(1))
        out2 = SpoolOutbox(str(tmp_path), 0, [1], wall=lambda: 1.0)     # a clock that went back
        await out2.send(1, recs(1, 5))
        return SpoolInbox(str(tmp_path), 1).receive()

    b1, b2 = asyncio.run(go())
    assert b2.seq > b1.seq and b2.records == recs(1, 5)


def test_a_full_channel_makes_the_sender_wait_nothing_is_dropped(tmp_path):
    async def go():
        out = SpoolOutbox(str(tmp_path), 0, [1], max_pending=2, batch_records=1, flush_interval_s=0.01)
        out.start()
        out.stage(1, recs(5))
        fut = out.barrier()
        inbox = SpoolInbox(str(tmp_path), 1)
        for _ in range(200):
            if out.blocked:
                break
            await asyncio.sleep(0.01)
        assert out.blocked == {1} and not fut.done()
        assert len(os.listdir(tmp_path / "1")) == 2
        taken = []
        while not fut.done():
            for b in inbox.receive():
                taken += b.records
                inbox.ack(b)
            await asyncio.sleep(0.02)
        for b in inbox.receive():
            taken += b.records
            inbox.ack(b)
        await out.close()
        return taken, out.backlog()

    taken, backlog = asyncio.run(go())
    assert taken == recs(5)
    assert backlog == {1: {"batches": 0, "staged": 0}}


def test_a_write_cut_short_is_cleaned_and_a_corrupt_file_set_aside(tmp_path):
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / ".tmp-00000-5").write_bytes(b"half")         # the sender died mid-write
    bad = tmp_path / "1" / "00003-00000000000000000007.hb"
    bad.write_bytes(encode_batch(3, 7, recs(2))[:-3])               # torn by a power loss

    async def go():
        SpoolOutbox(str(tmp_path), 0, [1])
        inbox = SpoolInbox(str(tmp_path), 1)
        return inbox.receive(), inbox.corrupt

    got, corrupt = asyncio.run(go())
    assert got == [] and corrupt == 1
    names = sorted(os.listdir(tmp_path / "1"))
    assert names == [".bad-00003-00000000000000000007.hb"]
