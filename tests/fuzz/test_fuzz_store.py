"""WARC recovery of torn files: any cut, flipped byte or garbage tail leaves a valid segment or none."""

from __future__ import annotations

import os
import tempfile

from hypothesis import example, given
from hypothesis import strategies as st

from crawlerd.store.recover import recover
from crawlerd.store.verify import verify
from tests.fuzz.conftest import budget
from tests.store.helpers import det_writer, write_page


def _segment() -> tuple[bytes, str]:
    with tempfile.TemporaryDirectory() as d:
        w = det_writer(d)
        for i in range(4):
            write_page(w, i, size=400)
        w.flush()
        path = w.current_path
        with open(path, "rb") as f:
            data = f.read()
        return data, os.path.basename(path)


SEGMENT, NAME = _segment()


@budget(0.3)
@given(st.integers(0, len(SEGMENT)), st.one_of(st.none(), st.integers(0, len(SEGMENT) - 1)),
       st.one_of(st.just(b""), st.binary(max_size=64), st.just(b"\x1f\x8b\x08\x00" + b"\x00" * 40)))
@example(len(SEGMENT) - 1, None, b"")
@example(0, None, b"\x1f\x8b")
def test_recover_torn_segment(cut, flip, tail):
    data = SEGMENT[:cut]
    if flip is not None and flip < len(data):
        data = data[:flip] + bytes([data[flip] ^ 0xFF]) + data[flip + 1:]
    data += tail
    with tempfile.TemporaryDirectory() as d:
        open_path = os.path.join(d, NAME)
        assert open_path.endswith(".open")
        with open(open_path, "wb") as f:
            f.write(data)
        recover(d, index_dir=os.path.join(d, "index"))
        final = open_path.removesuffix(".open")
        assert not os.path.exists(open_path)
        if os.path.exists(final):
            report = verify(final)
            assert report.ok, report.summary()
            assert os.path.getsize(final) <= len(data)
            assert SEGMENT.startswith(open(final, "rb").read()) or flip is not None
        assert recover(d, index_dir=os.path.join(d, "index")) == []       # a second pass has nothing to do
