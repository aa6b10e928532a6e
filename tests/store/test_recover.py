"""recover(): torn and garbage tails are cut at the last whole record, segments closed and indexed."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap

from fastwarc.warc import ArchiveIterator as FastIterator
from warcio.archiveiterator import ArchiveIterator

from crawlerd.store.cdxj import cdxj_path, index
from crawlerd.store.encoding import gzip_member
from crawlerd.store.recover import recover, recover_segment
from crawlerd.store.segment import iter_members
from crawlerd.store.verify import verify
from tests.store.helpers import REQUEST_HEAD, RESPONSE_HEAD, det_writer, write_page

DATA = os.path.join(os.path.dirname(__file__), "data")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def types(path: str) -> list[str]:
    with open(path, "rb") as f:
        warcio_types = [r.rec_type for r in ArchiveIterator(f)]
    with open(path, "rb") as f:
        fast_types = [str(r.record_type).split(".")[-1] for r in FastIterator(f, parse_http=False)]
    assert fast_types == warcio_types
    return warcio_types


def open_segment(directory, n_pages: int = 3, **kw):
    """A flushed, never closed segment (what kill -9 leaves) and the locations of its responses."""
    w = det_writer(directory, **kw)
    locs = [write_page(w, i, size=300) for i in range(n_pages)]
    w.flush()
    return w.current_path, locs


def test_torn_fixture_is_cut_at_last_whole_record(tmp_path):
    shutil.copy(os.path.join(DATA, "torn.warc.gz.open"), tmp_path)
    size = os.path.getsize(tmp_path / "torn.warc.gz.open")
    done = recover(str(tmp_path))
    final = str(tmp_path / "torn.warc.gz")
    assert done[0].startswith(f"truncated torn.warc.gz.open from {size} to ")
    assert "closed torn.warc.gz" in done
    assert not os.path.exists(final + ".open")
    # the last capture was torn inside its response: its request goes too (no dangling request)
    assert types(final) == ["warcinfo", "request", "response", "request", "response"]
    assert verify(final).ok
    lines = open(cdxj_path(final)).read().splitlines()
    assert len(lines) == 2 and lines == index(final)


def test_garbage_tail_fixture_is_cut(tmp_path):
    shutil.copy(os.path.join(DATA, "garbage-tail.warc.gz.open"), tmp_path)
    recover(str(tmp_path))
    final = str(tmp_path / "garbage-tail.warc.gz")
    assert types(final) == ["warcinfo"] + ["request", "response"] * 3
    report = verify(final)
    assert report.ok and report.valid_bytes == os.path.getsize(final)
    assert len(open(cdxj_path(final)).read().splitlines()) == 3


def test_every_cut_inside_the_last_member_is_recovered(tmp_path):
    src, locs = open_segment(tmp_path / "src")
    with open(src, "rb") as f:
        whole = f.read()
    last = locs[-1]
    with open(src, "rb") as f:
        request_at = max(m.offset for m in iter_members(f) if m.offset < last.offset)
    cuts = sorted({last.offset + 1, last.offset + 9, last.offset + 10, last.offset + last.length // 2,
                   last.offset + last.length - 8, last.offset + last.length - 4, last.offset + last.length - 1})
    for cut in cuts:
        d = tmp_path / f"cut{cut}"
        d.mkdir()
        (d / "seg.warc.gz.open").write_bytes(whole[:cut])
        recover(str(d))
        final = str(d / "seg.warc.gz")
        assert os.path.getsize(final) == request_at, cut       # the capture's request is cut too
        assert types(final)[-1] == "response"
        assert verify(final).ok


def test_whole_member_that_is_not_a_record_is_cut(tmp_path):
    src, locs = open_segment(tmp_path)
    end = locs[-1].offset + locs[-1].length
    bad_length = gzip_member(b"WARC/1.1\r\nWARC-Type: resource\r\nContent-Length: 99\r\n\r\nshort\r\n\r\n")
    with open(src, "ab") as f:
        f.write(gzip_member(b"hello, not a WARC record") + bad_length)
    recover(str(tmp_path))
    final = src[:-len(".open")]
    assert os.path.getsize(final) == end
    assert verify(final).ok


def test_segment_with_only_warcinfo_is_removed(tmp_path):
    src, locs = open_segment(tmp_path, n_pages=1)
    os.truncate(src, locs[0].offset - 10)            # inside the request record
    done = recover(str(tmp_path))
    assert done[0].startswith("removed ")
    assert [n for n in os.listdir(tmp_path) if ".warc.gz" in n] == []


def test_recover_closes_and_indexes_into_index_dir(tmp_path):
    warc, idx = tmp_path / "warc", tmp_path / "index"
    src, _ = open_segment(warc, index_dir=str(idx))
    sidecar = cdxj_path(src, str(idx)) + ".open"
    assert os.path.exists(sidecar)                   # the writer's unsorted sidecar, left by the crash
    recover(str(warc), index_dir=str(idx))
    final = src[:-len(".open")]
    assert os.path.exists(cdxj_path(final, str(idx)))
    assert len(index(final)) == 3
    assert not os.path.exists(sidecar)


def test_stale_sidecar_removed_and_missing_cdxj_rewritten(tmp_path):
    w = det_writer(tmp_path)
    write_page(w, 0)
    w.close()
    seg = w.segments_closed[0]
    os.remove(cdxj_path(seg))
    (tmp_path / "other.cdxj.open").write_text("x\n")
    done = recover(str(tmp_path))
    assert f"indexed {os.path.basename(seg)}" in done
    assert "removed stale other.cdxj.open" in done
    assert open(cdxj_path(seg)).read().splitlines() == index(seg)
    assert recover(str(tmp_path)) == []              # nothing left to do


def test_new_writer_after_recovery_continues(tmp_path):
    src, _ = open_segment(tmp_path)
    recover(str(tmp_path))
    w = det_writer(tmp_path)
    write_page(w, 9)
    w.close()
    assert os.path.basename(w.segments_closed[0]).split("-")[2] == "00001"
    assert all(verify(os.path.join(tmp_path, n)).ok for n in os.listdir(tmp_path) if n.endswith(".warc.gz"))


def test_kill_9_mid_write_loses_only_unflushed_work(tmp_path):
    child = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {ROOT!r})
        from crawlerd.store.warc import WarcWriter
        body = b"<p>" + b"x" * 30000 + b"</p>"
        w = WarcWriter({str(tmp_path)!r}, hostname="kill", buffer_bytes=1 << 20, compressor="zlib",
                       compress_level=6)
        for i in range(5000):
            w.write_fetch(url=f"http://example.com/{{i}}", fetched_at=1.7e9 + i, ip="127.0.0.1",
                          request_head={REQUEST_HEAD!r}, response_head={RESPONSE_HEAD!r} % len(body), body=body)
            w.flush()
            print(i, flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    acked = -1
    try:
        for line in proc.stdout:
            acked = int(line)
            if acked >= 40:
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    assert acked >= 40
    done = recover(str(tmp_path))
    assert any(a.startswith("closed ") for a in done)
    segs = [os.path.join(tmp_path, n) for n in os.listdir(tmp_path) if n.endswith(".warc.gz")]
    assert len(segs) == 1
    report = verify(segs[0])
    assert report.ok, report.errors
    # every fetch acknowledged after flush() survived, in order
    assert report.counts["response"] >= acked + 1
    urls = [line.split('"url": "')[1].split('"')[0] for line in index(segs[0])]
    assert {f"http://example.com/{i}" for i in range(acked + 1)} <= set(urls)


def test_recover_on_missing_directory_is_a_no_op(tmp_path):
    assert recover(str(tmp_path / "nope")) == []


def test_torn_segment_still_indexable_before_recovery(tmp_path):
    shutil.copy(os.path.join(DATA, "torn.warc.gz.open"), tmp_path)
    lines = index(str(tmp_path / "torn.warc.gz.open"))
    assert len(lines) == 2 and all('"filename": "torn.warc.gz"' in line for line in lines)



def test_recover_segment_of_a_dead_writer(tmp_path):
    warc, idx = tmp_path / "warc", tmp_path / "index"
    src, locs = open_segment(warc, index_dir=str(idx))
    os.truncate(src, locs[-1].offset + 5)
    done = recover_segment(src, index_dir=str(idx))
    final = src[:-len(".open")]
    assert done[0].startswith("truncated ") and done[-1] == f"closed {os.path.basename(final)}"
    assert os.listdir(idx) == [os.path.basename(cdxj_path(final))]      # sidecar gone, CDXJ written
    assert len(open(cdxj_path(final, str(idx))).read().splitlines()) == 2
    assert recover_segment(src, index_dir=str(idx)) == []                # already closed: nothing to do
    os.remove(cdxj_path(final, str(idx)))
    assert recover_segment(final, index_dir=str(idx)) == [f"indexed {os.path.basename(final)}"]


def test_flushed_segment_is_indexed_from_its_records_not_the_sidecar(tmp_path):
    """A worker flushes its records per batch but not its CDXJ sidecar: a crash leaves the
    sidecar short or empty, and recovery still indexes every flushed record."""
    w = det_writer(tmp_path)
    for i in range(5):
        write_page(w, i)
    w.flush()
    path = w.current_path
    sidecar = cdxj_path(path) + ".open"
    with open(sidecar, "w"):
        pass                                        # as if no index line reached the OS
    recover_segment(path)
    final = path.removesuffix(".open")
    assert not os.path.exists(sidecar)
    with open(cdxj_path(final)) as f:
        lines = f.read().splitlines()
    assert len(lines) == 5
    assert lines == index(final)
