"""The writer threads: what the loop hands over is written off the loop, in order, and nothing that
depends on a write (an acknowledgement, a lease's completion) happens before it; readers on the loop
see what was handed over (RAM overlays) before it lands. A held-back writer makes the window wide."""

import asyncio
import os
import subprocess
import sys
import threading

import pytest

from crawlerd.fetch.robots import RobotsCache
from crawlerd.fetch.robots.store import FILE_NAME
from crawlerd.handoff import SpoolInbox, SpoolOutbox
from crawlerd.seen import AsyncSeenSet
from crawlerd.seen.intake_log import read_intake, segment_path, segments
from crawlerd.shard.intake import Intake
from crawlerd.store.digest_set import DigestSet
from crawlerd.store.writer import WriterError, WriteThread
from tests.fetch.test_robots_store import Clock, decide
from tests.shard.parts import Parts, run

SMALL = dict(buckets=4, bucket_buffer_bytes=4096, merge_bytes=1 << 15, cache_entries=256, max_results=50,
             poll_interval_s=0.01)


async def turns(n=20):
    """Let the loop run n iterations (callbacks a writer thread posted would run in them)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def written(writer: WriteThread) -> None:
    """Wait (on the loop) until everything handed to ``writer`` so far is written."""
    fut = asyncio.get_running_loop().create_future()
    writer.barrier(lambda: fut.set_result(None))
    await fut


def test_groups_keep_order_and_then_runs_after_its_write():
    async def go():
        w = WriteThread(asyncio.get_running_loop(), name="test-writer")
        seen_by_sink, order = [], []
        writes_at_then = []

        def sink(items):
            assert threading.current_thread().name == "test-writer"
            seen_by_sink.extend(items)

        w.hold()
        for i in range(100):
            w.submit(sink, i, lambda i=i: (order.append(i), writes_at_then.append(len(seen_by_sink))))
        await turns()
        assert seen_by_sink == [] and order == []       # held: nothing written, nothing acknowledged
        w.release()
        await written(w)
        assert seen_by_sink == list(range(100))
        assert order == list(range(100))
        assert all(n > i for i, n in zip(order, writes_at_then, strict=True))    # each then after its own write
        assert w.stats()["groups"] >= 1
        w.close()
    run(go())


def test_a_sink_named_first_writes_before_the_others_of_its_group():
    """The frontier's store is named ``first``: in a group its commit lands before a store's (budgets)
    handed over earlier, so a URL the frontier committed and that store then forgot is never gone
    from both after a crash between the two transactions."""
    async def go():
        w = WriteThread(asyncio.get_running_loop(), name="test-writer")
        calls = []

        def other(items):
            calls.append(("other", items))

        def frontier(items):
            calls.append(("frontier", items))

        w.first(frontier)
        w.hold()
        w.submit(other, 1)
        w.submit(frontier, 2)
        w.submit(other, 3)
        w.release()
        await written(w)
        assert calls == [("frontier", [2]), ("other", [1, 3])]
        calls.clear()
        w.submit(other, 4)              # a group without it: the others as before
        await written(w)
        assert calls == [("other", [4])]
        w.close()
    run(go())


def test_a_failed_write_stops_the_writer_and_acknowledges_nothing_after_it():
    async def go():
        errors, acked = [], []
        w = WriteThread(asyncio.get_running_loop(), on_error=errors.append)

        def sink(items):
            if "bad" in items:
                raise OSError(28, "No space left on device")

        w.hold()
        w.submit(sink, "bad", lambda: acked.append("bad"))
        w.release()
        while not errors:
            await turns(1)
        assert acked == [] and isinstance(errors[0], OSError)
        with pytest.raises(WriterError):
            w.submit(sink, "later", lambda: acked.append("later"))
        w.close()
    run(go())


def test_seen_set_logged_waits_for_the_intake_write(tmp_path):
    async def go():
        s = AsyncSeenSet(str(tmp_path), **SMALL, threaded_intake=True)
        acks = []
        s.start(asyncio.get_running_loop(), lambda results: (acks.append(len(results)), s.ack()))
        w = s.intake_writer
        w.hold()
        s.submit([1, 2, 3], [b"a", b"b", b"c"])
        kept = s.logged()
        order = []
        s.when_logged(lambda: order.append("when_logged"))
        await turns()
        # held: not on disk, and nobody told it is
        assert kept is not None and not kept.done() and order == []
        on_disk = [k for n in segments(str(tmp_path)) for _, ks, _ in read_intake(segment_path(str(tmp_path), n))
                   for k in ks.tolist()]
        assert on_disk == []
        w.release()
        await kept
        assert order == ["when_logged"]     # (that it is then on disk: the kill -9 child in test_seen.py)
        assert s.logged() is None
        await s.flush()
        await s.close()
        assert segments(str(tmp_path)) == []            # every segment deleted once DRUM held its keys
    run(go())


def test_the_intake_records_of_one_group_are_written_in_one_writev_each_whole_and_in_order(tmp_path, monkeypatch):
    """Submits handed over while the intake thread is held land in one group: one ``write_all`` for
    the run of records to the open segment, and the segment reads back as those records, in order."""
    import crawlerd.seen.intake_log as intake_log
    calls = []
    real = intake_log.write_all

    def counting(fd, parts):
        calls.append(len(parts))
        real(fd, parts)
    monkeypatch.setattr(intake_log, "write_all", counting)

    async def go():
        # a job gap longer than the test: the open segment is not taken (and deleted) under us
        s = AsyncSeenSet(str(tmp_path), **{**SMALL, "poll_interval_s": 3600.0}, threaded_intake=True,
                         job_gap_s=3600.0)
        s.start(asyncio.get_running_loop(), lambda results: s.ack())
        s.submit([10_000])              # the first job starts at once and takes its segment
        while s.stats()["jobs"] < 1:
            await asyncio.sleep(0.001)
        w = s.intake_writer
        await written(w)                # its record written, its segment deleted
        calls.clear()
        w.hold()
        batches = [list(range(10 * i, 10 * i + 3 + i)) for i in range(12)]
        for b in batches:
            s.submit(b, [b"u%d" % k for k in b])
        kept = s.logged()
        w.release()
        await kept
        seg = segments(str(tmp_path))
        records = [(first, ks.tolist(), aux) for n in seg for first, ks, aux in
                   read_intake(segment_path(str(tmp_path), n))]
        await s.close()
        return batches, records

    batches, records = run(go())
    assert calls == [4 * 12]            # header, keys, aux lengths, aux bytes of each record: one call
    seq = 1
    assert len(records) == len(batches)
    for (first, keys, aux), b in zip(records, batches, strict=True):
        assert first == seq and keys == b and aux == [b"u%d" % k for k in b]
        seq += len(b)


def test_hand_off_ack_and_lease_barrier_wait_for_the_intake_log(tmp_path):
    """A received batch is acknowledged (its spool file deleted) only once DRUM's intake log holds
    its records, and ``links_barrier`` (what a lease's completion awaits) only resolves then."""
    async def go():
        loop = asyncio.get_running_loop()
        p = Parts(str(tmp_path / "s0"))
        intake = Intake(p.cfg, frontier=p.frontier, seen=p.seen, url_filter=p.url_filter, recrawl=p.recrawl,
                        metrics=p.metrics, wake=lambda: None, wall=lambda: 0.0, shard=0, shards=2,
                        outbox=SpoolOutbox(str(tmp_path / "handoff"), 0, [1]))
        p.seen.start(loop, intake.on_seen_results)
        sender = SpoolOutbox(str(tmp_path / "handoff"), 1, [0])
        from tests.shard.test_intake_shards import two_domains
        mine, _ = two_domains()
        from crawlerd.shard.intake import encode_aux
        from crawlerd.url.canonical import fingerprint
        url = f"http://{mine}/handed"
        sender.stage(0, [(fingerprint(url), encode_aux(1, 0, 1, url))])
        await sender.flush()
        inbox = SpoolInbox(str(tmp_path / "handoff"), 0)
        try:
            w = p.seen.intake_writer
            w.hold()
            batches = inbox.receive()
            assert intake.take_handoff(batches, inbox.ack) == 1
            own = intake.submit_urls([f"http://{mine}/found"], depth=1)
            assert own == 1
            barrier = intake.links_barrier()
            await turns()
            assert inbox.backlog() == 1                 # not acknowledged while the log lacks it
            assert barrier is not None and not barrier.done()
            w.release()
            await barrier
            await turns()
            assert inbox.backlog() == 0
            await p.seen.flush()
            assert p.frontier.queued() == 2
        finally:
            await p.close()
    run(go())


def test_digest_overlay_answers_until_the_write_lands(tmp_path):
    async def go():
        d = DigestSet(tmp_path / "digests", map_size_bytes=1 << 24)
        w = WriteThread(asyncio.get_running_loop())
        d.attach_writer(w)
        sha = bytes(range(20))

        def view():             # a worker's read-only view, from another process as the workers do
            code = ("import sys; from crawlerd.store.digest_set import DigestView; "
                    "print(DigestView(sys.argv[1]).owner(bytes(range(20))))")
            return subprocess.run([sys.executable, "-c", code, str(tmp_path / "digests")], capture_output=True,
                                  text=True, timeout=60, check=True).stdout.strip()

        w.hold()
        assert d.add(sha, "http://a.test/", "2026-01-01T00:00:00Z", "<urn:uuid:1>") is True
        assert d.add(sha, "http://b.test/", "2026-01-02T00:00:00Z") is False     # first capture kept
        assert d.owner(sha) == ("http://a.test/", "2026-01-01T00:00:00Z", "<urn:uuid:1>")
        assert view() == "None"                         # a worker sees only what is committed
        w.release()
        await written(w)
        await turns()
        assert view() == str(("http://a.test/", "2026-01-01T00:00:00Z", "<urn:uuid:1>"))
        assert len(d) == 1
        w.close()
        d.attach_writer(None)
        d.close()
    run(go())


def test_robots_overlay_answers_an_evicted_entry_until_written(tmp_path):
    async def go():
        mono, wall = Clock(100.0), Clock(1_700_000_000.0)
        c = RobotsCache(directory=str(tmp_path), agent_token="crawlerd", clock=mono, wall=wall, cap_bytes=1)
        w = WriteThread(asyncio.get_running_loop())
        c.attach_writer(w)
        w.hold()
        ax, by = b"User-agent: *\nDisallow: /x\n", b"User-agent: *\nDisallow: /y\n"
        c.put("http://a.test", decide(200, mono.t, body=ax), ax)
        c.put("http://b.test", decide(200, mono.t, body=by), by)       # evicts a (cap)
        assert os.path.getsize(tmp_path / FILE_NAME) == 0         # nothing written while held
        a = c.get("http://a.test", mono.t)
        assert a is not None and not a.rules.allowed("http://a.test/x")    # from the overlay
        w.release()
        await written(w)
        await turns()
        w.close()
        c.attach_writer(None)
        c.close()
        c2 = RobotsCache(directory=str(tmp_path), agent_token="crawlerd", clock=mono, wall=wall)
        b = c2.get("http://b.test", mono.t)
        assert b is not None and not b.rules.allowed("http://b.test/y")
        c2.close()
    run(go())


def test_inflight_journal_end_lines_written_later_look_in_flight_until_then(tmp_path):
    """An end line handed to the writer and not written leaves its host in flight for a restart
    (it waits a whole gap, its URL is fetched again): conservative, never early."""
    from crawlerd.frontier import journal

    async def go():
        w = WriteThread(asyncio.get_running_loop())
        j = journal.InflightJournal(str(tmp_path), session=1)
        j.attach_writer(w)
        j.started([(1, 1000.0, "10.0.0.1", "http://a.test"), (2, 1000.0, "10.0.0.2", "http://b.test")])
        w.hold()
        j.ended(1, 1001.0, 1003.0, b"\x00\x01")
        if not journal.boot_id():
            pytest.skip("no boot id: the journal is never usable here")
        held = journal.read(str(tmp_path))
        assert held.inflight == {"http://a.test": 1000.0, "http://b.test": 1000.0} and held.completed == []
        j.rewrite([(2, 1000.0, "10.0.0.2", "http://b.test")], {})     # a rotation while a line waits
        w.release()
        await written(w)
        after = journal.read(str(tmp_path))
        assert after.inflight == {"http://b.test": 1000.0}
        j.ended(2, 1002.0, 1004.0)
        await written(w)
        assert journal.read(str(tmp_path)).ended == {"http://b.test": 1004.0}
        w.close()
        j.attach_writer(None)
        j.close()
    run(go())


def test_inflight_journal_end_lines_of_one_group_land_in_order_in_the_file_they_were_handed_to(tmp_path):
    """End lines handed over in one group (several per file, a rotation between them) are all
    written, in order, each to the file that was current when it was handed over."""
    import os

    from crawlerd.frontier import journal

    async def go():
        w = WriteThread(asyncio.get_running_loop())
        j = journal.InflightJournal(str(tmp_path), session=1)
        j.attach_writer(w)
        j.started([(i, 1000.0, f"10.0.0.{i}", f"http://h{i}.test") for i in range(1, 7)])
        w.hold()
        for i in (1, 2, 3):
            j.ended(i, 1000.0 + i, 2000.0 + i, bytes((i,)))
        old = str(tmp_path / "old.log")
        os.link(j.path, old)                     # keep the first file's inode past the rotation
        j.rewrite([(i, 1000.0, f"10.0.0.{i}", f"http://h{i}.test") for i in (4, 5, 6)], {})
        for i in (4, 5):
            j.ended(i, 1000.0 + i, 2000.0 + i)
        w.release()
        await written(w)
        with open(old, "rb") as f:
            ends = [line for line in f.read().decode().splitlines() if line.startswith("E ")]
        assert [line.split(" ")[1] for line in ends] == ["1", "2", "3"]
        assert [line.split(" ")[4] for line in ends] == ["01", "02", "03"]
        with open(j.path, "rb") as f:
            ends = [line for line in f.read().decode().splitlines() if line.startswith("E ")]
        assert [line.split(" ")[1:4] for line in ends] == [["4", "1004.0", "2004.0"], ["5", "1005.0", "2005.0"]]
        if journal.boot_id():
            after = journal.read(str(tmp_path))
            assert after.inflight == {"http://h6.test": 1000.0}
            assert after.ended == {"http://h4.test": 2004.0, "http://h5.test": 2005.0}
        w.close()
        j.attach_writer(None)
        j.close()
    run(go())


def test_digest_record_never_displaces_the_first_capture(tmp_path):
    async def go():
        d = DigestSet(tmp_path / "digests", map_size_bytes=1 << 24)
        first, other = bytes(range(20)), bytes(range(1, 21))
        assert d.add(first, "http://a.test/", "d1", "<urn:1>")       # committed before the writer
        w = WriteThread(asyncio.get_running_loop())
        d.attach_writer(w)
        w.hold()
        d.record(first, "http://copy.test/", "d2", "<urn:2>")        # a copy two workers both archived
        d.record(other, "http://b.test/", "d3", "<urn:3>")
        assert d.owner(first) == ("http://a.test/", "d1", "<urn:1>")
        assert d.owner(other) == ("http://b.test/", "d3", "<urn:3>")    # from the overlay
        w.release()
        await written(w)
        await turns()
        assert d.owner(first) == ("http://a.test/", "d1", "<urn:1>")
        assert d.owner(other) == ("http://b.test/", "d3", "<urn:3>")
        assert len(d) == 2
        w.close()
        d.attach_writer(None)
        d.close()
    run(go())
