"""The worker's answer frame (crawlerd.process.wire): results round trip, host keys go once per
frame, and a frame the crawl process cannot read (a malformed pickle, shape, outcome or links
record) closes the worker's connection and applies nothing."""

import asyncio
import pickle

import pytest

from crawlerd.outcome import Outcome
from crawlerd.process.wire import (
    AnswerReader,
    frame,
    pack_result,
    results_frame,
    unpack_result,
    unpack_results,
)
from crawlerd.records import Link, ProcessResult


def result(n: int, *, outcome: Outcome = Outcome.OK) -> ProcessResult:
    # host keys as the link resolver gives them: a new string object per absolute link
    links = [Link(f"http://h{j % 3}.test/p/{n}/{j}", (n << 32) | j, "".join(["http://h", str(j % 3), ".test"]),
                  j % 4 == 0) for j in range(12)]
    return ProcessResult(url=f"http://p{n}.test/", outcome=outcome, status=200, links=links,
                         content_type="text/html", digest="sha1:GVVBSK3ZCOYEYVCXJUMMFDKG4Y4VIKFL",
                         simhash=(1 << 64) - 1 - n, warc_file="w.warc.gz.open", warc_offset=n, warc_length=9,
                         warc_record_id=f"<urn:uuid:{n}>", canonical="http://c.test/", error="")


def decoded(data: bytes) -> list[tuple[int, ProcessResult]]:
    return unpack_results(pickle.loads(data[4:]))[0]


def test_results_round_trip_through_a_frame():
    prs = [result(1), result(2, outcome=Outcome.BAD_ENCODING), ProcessResult(url="http://e.test/", outcome=Outcome.OK)]
    data = results_frame(list(enumerate(prs)), "seg", 7)
    _kind, _answers, segment, size, hosts = pickle.loads(data[4:])
    assert (segment, size, hosts) == ("seg", 7, ["http://h0.test", "http://h1.test", "http://h2.test"])
    assert decoded(data) == list(enumerate(prs))
    assert unpack_results(pickle.loads(data[4:]))[1:] == ("seg", 7)


def test_a_frame_sends_each_host_key_once_and_its_links_share_the_decoded_key():
    links = [ln for _, pr in decoded(results_frame([(1, result(1)), (2, result(2))], "seg", 7)) for ln in pr.links]
    assert len(links) == 24
    keys = {}
    for ln in links:        # across both results of the frame: one object per distinct key
        assert keys.setdefault(ln.host_key, ln.host_key) is ln.host_key
    assert len(keys) == 3


def test_an_unknown_outcome_is_refused():
    values = pack_result(result(1), {})
    bad = tuple("no_such_outcome" if v == Outcome.OK.value else v for v in values)
    with pytest.raises(ValueError):
        unpack_result(bad, ["http://h0.test", "http://h1.test", "http://h2.test"])


def bad_outcome_frame() -> bytes:
    hosts: dict = {}
    bad = tuple("no_such_outcome" if v == Outcome.OK.value else v for v in pack_result(result(1), hosts))
    return frame(("results", [(1, bad)], "seg", 7, list(hosts)))


def malformed_frames() -> list[bytes]:
    """Frames that unpickle but are not answers the pool can read whole."""
    hosts: dict = {}
    good = pack_result(result(1), hosts)
    keys = list(hosts)
    cut_links = tuple(v[:-3] if isinstance(v, bytes) and v.startswith(b"\x0c\x00") else v for v in good)
    assert cut_links != good
    return [bad_outcome_frame(),                                            # an outcome nobody knows
            frame(("results", [(1, good)], "seg", 7, keys[:1])),           # a host index past the list
            frame(("results", [(1, cut_links)], "seg", 7, keys)),          # a links record cut short
            frame(("results", [(1, good)], "seg", 7)),                     # no host list
            frame(("results", [(1, good)], "seg", 7, "not a list")),
            frame(("results", [(1, good[:-1])], "seg", 7, keys)),          # a field short
            frame(("results", [(1,)], "seg", 7, keys)),
            frame(("results", 5, "seg", 7, keys)),
            frame(("results", [(1, None)], "seg", 7, keys)),
            frame(42), frame(()), frame("results")]


class _Transport:
    def __init__(self):
        self.closed = False

    def close(self):
        self.closed = True


def _feed(chunks: list[bytes], on_frame=None) -> tuple[list, AnswerReader, _Transport]:
    async def go():
        got: list = []

        def keep(msg):
            got.extend(pr for _, pr in unpack_results(msg)[0])
        proto = AnswerReader(on_frame or keep)
        transport = _Transport()
        proto.connection_made(transport)
        for chunk in chunks:
            proto.data_received(chunk)
        return got, proto, transport
    return asyncio.run(go())


def test_a_frame_cut_anywhere_is_read_once_it_is_whole():
    prs = [result(1), result(2)]
    data = results_frame(list(enumerate(prs)), "seg", 7)
    for cut in (1, 3, 4, 5, len(data) // 2, len(data) - 1):
        got, proto, transport = _feed([data[:cut], data[cut:]])
        assert got == prs and proto.error is None and not transport.closed
        got, _, _ = _feed([data[:cut]])
        assert got == []                # a partial frame waits: nothing is decoded from it


def test_hostile_frames_close_the_connection_and_decode_nothing():
    for data in (b"\x00\x00\x00\x05garbage",                                  # not a pickle
                 *malformed_frames(),
                 b"\x7f\xff\xff\xff" + b"x" * 16):                              # longer than MAX_FRAME
        got, proto, transport = _feed([data])
        assert got == [] and proto.error is not None and transport.closed


def _pool_and_jobs(loop):
    from types import SimpleNamespace

    from crawlerd.process.pool import WorkerPool
    pool = WorkerPool(1, {})
    jobs = {i: SimpleNamespace(job_id=i, future=loop.create_future(), copy=pool.bodies.put(b"x" * 100),
                               result=SimpleNamespace(pooled=None)) for i in (1, 2)}
    w = SimpleNamespace(segment="old", acked_bytes=5, answered=0, outstanding=dict(jobs))
    return pool, jobs, w


def test_a_malformed_frame_reaches_the_pool_as_a_closed_connection():
    """Through the pool's own frame handler: each malformed frame ends in the reader's error (the
    connection closes, the worker's death is handled: its jobs sent again, or the pool's named
    failure if it keeps dying before answering), never in an exception out of the protocol."""
    async def go():
        pool, jobs, w = _pool_and_jobs(asyncio.get_running_loop())
        for data in malformed_frames():
            proto = AnswerReader(lambda msg: pool._on_answer(w, msg))
            transport = _Transport()
            proto.connection_made(transport)
            proto.data_received(data)
            assert isinstance(proto.error, ValueError) and transport.closed, data
            assert set(w.outstanding) == {1, 2} and pool.answer_frames == 0
        pool.bodies.close()
    asyncio.run(go())


def test_an_answer_frame_that_does_not_decode_applies_nothing():
    """The pool decodes a frame whole before it applies it: an answer that does not decode leaves
    every job of the frame outstanding (the connection closes, the restarted worker gets them
    again) instead of losing the ones taken off before it."""
    async def go():
        pool, jobs, w = _pool_and_jobs(asyncio.get_running_loop())

        def released():
            return [i for i, j in jobs.items() if j.copy.released]

        hosts: dict = {}
        good = pack_result(result(1), hosts)
        bad = tuple("no_such_outcome" if v == Outcome.OK.value else v for v in pack_result(result(2), hosts))
        with pytest.raises(ValueError):
            pool._on_answer(w, ("results", [(1, good), (2, bad)], "new", 99, list(hosts)))
        assert set(w.outstanding) == {1, 2} and not any(j.future.done() for j in jobs.values())
        assert (w.segment, w.acked_bytes, w.answered, released(), pool.answer_frames) == ("old", 5, 0, [], 0)
        pool._on_answer(w, pickle.loads(results_frame([(1, result(1)), (2, result(2))], "new", 99)[4:]))
        assert w.outstanding == {} and [jobs[i].future.result() for i in (1, 2)] == [result(1), result(2)]
        assert (w.segment, w.acked_bytes, w.answered, released()) == ("new", 99, 2, [1, 2])
        assert pool.bodies.used == 0
        pool.bodies.close()
    asyncio.run(go())
