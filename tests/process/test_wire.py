"""The worker's answer frame (crawlerd.process.wire): results round trip, host keys go once per
frame, and a frame the crawl process cannot read closes the worker's connection."""

import asyncio
import pickle

import pytest

from crawlerd.outcome import Outcome
from crawlerd.process.wire import AnswerReader, frame, pack_result, unpack_result
from crawlerd.records import Link, ProcessResult


def result(n: int, *, outcome: Outcome = Outcome.OK) -> ProcessResult:
    # host keys as the link resolver gives them: a new string object per absolute link
    links = [Link(f"http://h{j % 3}.test/p/{n}/{j}", (n << 32) | j, "".join(["http://h", str(j % 3), ".test"]),
                  j % 4 == 0) for j in range(12)]
    return ProcessResult(url=f"http://p{n}.test/", outcome=outcome, status=200, links=links,
                         content_type="text/html", digest="sha1:GVVBSK3ZCOYEYVCXJUMMFDKG4Y4VIKFL",
                         simhash=(1 << 64) - 1 - n, warc_file="w.warc.gz.open", warc_offset=n, warc_length=9,
                         warc_record_id=f"<urn:uuid:{n}>", canonical="http://c.test/", error="")


def test_results_round_trip_through_a_frame_with_and_without_shared_host_keys():
    prs = [result(1), result(2, outcome=Outcome.BAD_ENCODING), ProcessResult(url="http://e.test/", outcome=Outcome.OK)]
    for host_keys in (None, {}):
        data = frame(("results", [(i, pack_result(pr, host_keys)) for i, pr in enumerate(prs)], "seg", 7))
        _kind, answers, _seg, _size = pickle.loads(data[4:])
        assert [unpack_result(p) for _, p in answers] == prs


def test_a_frame_sends_each_host_key_once_and_its_links_share_the_decoded_key():
    prs = [result(1), result(2)]
    host_keys: dict[str, str] = {}
    shared = frame(("results", [(i, pack_result(pr, host_keys)) for i, pr in enumerate(prs)], "seg", 7))
    alone = frame(("results", [(i, pack_result(pr)) for i, pr in enumerate(prs)], "seg", 7))
    assert len(shared) < len(alone)
    links = [ln for _, p in pickle.loads(shared[4:])[1] for ln in unpack_result(p).links]
    assert len(links) == 24
    keys = {}
    for ln in links:        # across both results of the frame: one object per distinct key
        assert keys.setdefault(ln.host_key, ln.host_key) is ln.host_key
    assert len(keys) == 3


def test_an_unknown_outcome_is_refused():
    values = pack_result(result(1))
    bad = tuple("no_such_outcome" if v == Outcome.OK.value else v for v in values)
    with pytest.raises(ValueError):
        unpack_result(bad)


class _Transport:
    def __init__(self):
        self.closed = False

    def close(self):
        self.closed = True


def _feed(chunks: list[bytes]) -> tuple[list, AnswerReader, _Transport]:
    async def go():
        got: list = []

        def on_frame(msg):
            got.extend(unpack_result(p) for _, p in msg[1])
        proto = AnswerReader(on_frame)
        transport = _Transport()
        proto.connection_made(transport)
        for chunk in chunks:
            proto.data_received(chunk)
        return got, proto, transport
    return asyncio.run(go())


def test_a_frame_cut_anywhere_is_read_once_it_is_whole():
    prs = [result(1), result(2)]
    data = frame(("results", [(i, pack_result(pr, {})) for i, pr in enumerate(prs)], "seg", 7))
    for cut in (1, 3, 4, 5, len(data) // 2, len(data) - 1):
        got, proto, transport = _feed([data[:cut], data[cut:]])
        assert got == prs and proto.error is None and not transport.closed
        got, _, _ = _feed([data[:cut]])
        assert got == []                # a partial frame waits: nothing is decoded from it


def test_hostile_frames_close_the_connection_and_decode_nothing():
    good = pack_result(result(1))
    bad_outcome = tuple("no_such_outcome" if v == Outcome.OK.value else v for v in good)
    for data in (b"\x00\x00\x00\x05garbage",                                  # not a pickle
                 frame(("results", [(1, bad_outcome)], "seg", 7)),             # an outcome nobody knows
                 b"\x7f\xff\xff\xff" + b"x" * 16):                              # longer than MAX_FRAME
        got, proto, transport = _feed([data])
        assert got == [] and proto.error is not None and transport.closed


def test_an_answer_frame_that_does_not_decode_applies_nothing():
    """The pool decodes a frame whole before it applies it: an answer that does not decode leaves
    every job of the frame outstanding (the connection closes, the restarted worker gets them
    again) instead of losing the ones taken off before it."""
    from types import SimpleNamespace

    from crawlerd.process.pool import WorkerPool

    async def go():
        loop = asyncio.get_running_loop()
        pool = WorkerPool(1, {})
        jobs = {i: SimpleNamespace(job_id=i, future=loop.create_future(), copy=pool.bodies.put(b"x" * 100),
                                   result=SimpleNamespace(pooled=None)) for i in (1, 2)}

        def released():
            return [i for i, j in jobs.items() if j.copy.released]

        w = SimpleNamespace(segment="old", acked_bytes=5, answered=0, outstanding=dict(jobs))
        bad = tuple("no_such_outcome" if v == Outcome.OK.value else v for v in pack_result(result(2)))
        with pytest.raises(ValueError):
            pool._on_answer(w, ("results", [(1, pack_result(result(1))), (2, bad)], "new", 99))
        assert set(w.outstanding) == {1, 2} and not any(j.future.done() for j in jobs.values())
        assert (w.segment, w.acked_bytes, w.answered, released(), pool.answer_frames) == ("old", 5, 0, [], 0)
        pool._on_answer(w, ("results", [(1, pack_result(result(1))), (2, pack_result(result(2)))], "new", 99))
        assert w.outstanding == {} and [jobs[i].future.result() for i in (1, 2)] == [result(1), result(2)]
        assert (w.segment, w.acked_bytes, w.answered, released()) == ("new", 99, 2, [1, 2])
        assert pool.bodies.used == 0
        pool.bodies.close()
    asyncio.run(go())
