"""WarcWriter: exact bytes, readability by warcio and fastwarc, digests, links, rotation."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import random
import re
import zlib

import pytest
from fastwarc.warc import ArchiveIterator as FastIterator
from fastwarc.warc import WarcRecordType
from hypothesis import given
from hypothesis import strategies as st
from warcio.archiveiterator import ArchiveIterator

from crawlerd.store.encoding import available_compressors, gzip_member, payload_digest, warc_date
from crawlerd.store.segment import dechunk, is_chunked, iter_members
from crawlerd.store.verify import verify
from crawlerd.store.warc import REVISIT_PROFILE, WarcWriter
from tests.store.helpers import CHUNKED_HEAD, REQUEST_HEAD, RESPONSE_HEAD, T0, det_writer, html, write_page

DATA = os.path.join(os.path.dirname(__file__), "data")
GOLDEN = os.path.join(DATA, "golden.warc")


def sample_segment(directory, **kw) -> tuple[str, dict[str, object]]:
    """One segment with a plain fetch + metadata, a chunked fetch and a revisit."""
    w = det_writer(directory, compressor="zlib", compress_level=6, **kw)
    body = b"<html><head><meta name=robots content=noindex></head><body>hi</body></html>"
    locs = {}
    locs["page"] = w.write_fetch(url="http://example.com/a", fetched_at=T0, ip="127.0.0.1",
                                 request_head=REQUEST_HEAD, response_head=RESPONSE_HEAD % len(body), body=body,
                                 metadata={"noindex": "true", "note": "two\r\nlines"})
    locs["chunked"] = w.write_fetch(url="http://example.com/c", fetched_at=T0 + 1.5, ip="127.0.0.2",
                                    request_head=REQUEST_HEAD, response_head=CHUNKED_HEAD,
                                    body=b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n")
    locs["revisit"] = w.write_revisit(url="http://example.com/b", fetched_at=T0 + 2, ip="127.0.0.1",
                                      request_head=REQUEST_HEAD, response_head=RESPONSE_HEAD % len(body),
                                      payload_digest=payload_digest(body), refers_to_uri="http://example.com/a",
                                      refers_to_date=T0, refers_to_id="urn:uuid:00000000-0000-0000-0000-000000000002")
    w.close()
    return w.segments_closed[0], locs


def records(path: str, check_digests=False):
    with open(path, "rb") as f:
        out = []
        for rec in ArchiveIterator(f, check_digests=check_digests):
            out.append((rec, rec.raw_stream.read(), list(rec.digest_checker.problems)))
        return out


# -- exact bytes --------------------------------------------------------------

def test_golden_bytes(tmp_path):
    path, _ = sample_segment(tmp_path / "a")
    with open(path, "rb") as f:
        content = gzip.decompress(f.read())
    if os.environ.get("CRAWLERD_REGEN_GOLDEN"):
        with open(GOLDEN, "wb") as f:
            f.write(content)
    with open(GOLDEN, "rb") as f:
        assert content == f.read()
    assert os.path.basename(path) == "crawlerd-20231114221320124457-00000-testhost-0.warc.gz"


def test_same_inputs_same_compressed_bytes(tmp_path):
    a, _ = sample_segment(tmp_path / "a")
    b, _ = sample_segment(tmp_path / "b")
    with open(a, "rb") as fa, open(b, "rb") as fb:
        assert fa.read() == fb.read()


def test_every_record_is_one_gzip_member(tmp_path):
    path, locs = sample_segment(tmp_path)
    with open(path, "rb") as f:
        members = list(iter_members(f))
    assert len(members) == 8       # warcinfo, 2 x (request, response), metadata, request, revisit
    assert members[-1].offset + members[-1].length == os.path.getsize(path)
    starts = {m.offset: m.length for m in members}
    for loc in locs.values():
        assert starts[loc.offset] == loc.length
        assert loc.filename == os.path.basename(path)


# -- readers -------------------------------------------------------------------

def test_warcio_reads_all_records_with_digests(tmp_path):
    path, _ = sample_segment(tmp_path)
    recs = records(path, check_digests=True)
    assert [r.rec_type for r, _, _ in recs] == [
        "warcinfo", "request", "response", "metadata", "request", "response", "request", "revisit"]
    for rec, _, problems in recs:
        chunked = rec.rec_headers.get_header("WARC-Target-URI") == "http://example.com/c"
        if chunked and rec.rec_type == "response":
            # warcio digests the body with its chunked coding kept; WARC/1.1 §6.3.2 and our brief
            # remove transfer coding first, so exactly the payload check differs here.
            assert problems == ["payload digest failed sha1:" + payload_digest(b"hello world")[5:]]
        else:
            assert problems == [], rec.rec_type
        assert rec.rec_headers.protocol == "WARC/1.1"


def test_fastwarc_reads_all_records_and_digests(tmp_path):
    path, _ = sample_segment(tmp_path)
    with open(path, "rb") as f:
        recs = list(FastIterator(f, parse_http=False))
        assert len(recs) == 8
    with open(path, "rb") as f:
        for rec in FastIterator(f, parse_http=False):
            assert rec.verify_block_digest(), rec.record_type
    with open(path, "rb") as f:
        checked = 0
        for rec in FastIterator(f, record_types=WarcRecordType.response, parse_http=True):
            if "chunked" not in (rec.http_headers.get("Transfer-Encoding") or ""):
                assert rec.verify_payload_digest()
                checked += 1
        assert checked == 1


def test_our_verify_accepts_sample(tmp_path):
    path, _ = sample_segment(tmp_path)
    report = verify(path)
    assert report.ok, report.errors
    assert report.warnings == []
    assert report.counts == {"warcinfo": 1, "request": 3, "response": 2, "metadata": 1, "revisit": 1}


# -- record fields -------------------------------------------------------------

def test_warcinfo_fields(tmp_path):
    path, _ = sample_segment(tmp_path)
    info, block, _ = records(path)[0]
    assert info.rec_headers.get_header("WARC-Filename") == os.path.basename(path)
    assert info.rec_headers.get_header("Content-Type") == "application/warc-fields"
    fields = dict(line.split(": ", 1) for line in block.decode().splitlines())
    assert fields["software"] == "crawlerd/0.1"
    assert fields["hostname"] == "testhost"
    assert fields["operator"] == "Test Operator <ops@example.org>"
    assert fields["http-header-user-agent"] == "crawlerd-test/0.1"
    assert fields["format"] == "WARC File Format 1.1"
    assert fields["conformsTo"].endswith("/warc-1.1/")


def test_request_response_linked_and_dated(tmp_path):
    path, _ = sample_segment(tmp_path)
    recs = [r for r, _, _ in records(path)]
    info_id = recs[0].rec_headers.get_header("WARC-Record-ID")
    req, resp, meta = recs[1], recs[2], recs[3]
    h = lambda r, k: r.rec_headers.get_header(k)  # noqa: E731
    assert h(req, "WARC-Concurrent-To") == h(resp, "WARC-Record-ID")
    assert h(resp, "WARC-Concurrent-To") == h(req, "WARC-Record-ID")
    assert h(meta, "WARC-Concurrent-To") == h(resp, "WARC-Record-ID")
    assert all(h(r, "WARC-Warcinfo-ID") == info_id for r in recs[1:])
    assert h(req, "Content-Type") == "application/http;msgtype=request"
    assert h(resp, "Content-Type") == "application/http;msgtype=response"
    assert h(resp, "WARC-Date") == "2023-11-14T22:13:20.123456Z"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", h(recs[5], "WARC-Date"))
    assert h(resp, "WARC-IP-Address") == "127.0.0.1"
    assert h(recs[5], "WARC-IP-Address") == "127.0.0.2"
    ids = [h(r, "WARC-Record-ID") for r in recs]
    assert len(set(ids)) == len(ids)


def test_metadata_record_fields_are_single_lines(tmp_path):
    path, _ = sample_segment(tmp_path)
    meta, block, _ = records(path)[3]
    assert meta.rec_type == "metadata"
    assert block == b"noindex: true\r\nnote: two%0D%0Alines\r\n"


@pytest.mark.parametrize("fields,block", [
    ([("outlink", "http://a.test/"), ("outlink", "http://b.test/ nofollow")],
     b"outlink: http://a.test/\r\noutlink: http://b.test/ nofollow\r\n"),
    ({"note": "cr\ronly", "x": "lf\nonly"}, b"note: cr%0Donly\r\nx: lf%0Aonly\r\n"),
    ([("a:b", "c: d"), ("e", "f")], b"a_b: c: d\r\ne: f\r\n"),       # a colon in a name, not in a value
    ([("crlf\r\n", "v")], b"crlf%0D%0A: v\r\n"),
    ([("k", "caf\u00e9")], "k: caf\u00e9\r\n".encode()),
    ([], b""),
])
def test_fields_block_escapes_what_would_break_a_line(fields, block):
    from crawlerd.store.encoding import fields_block
    assert fields_block(fields) == block


def test_chunked_payload_digest_is_over_dechunked_body(tmp_path):
    path, _ = sample_segment(tmp_path)
    resp = records(path)[5][0]
    assert resp.rec_headers.get_header("WARC-Payload-Digest") == payload_digest(b"hello world")


def test_revisit_record_fields(tmp_path):
    path, locs = sample_segment(tmp_path)
    rev, block, _ = records(path)[7]
    h = rev.rec_headers.get_header
    body = b"<html><head><meta name=robots content=noindex></head><body>hi</body></html>"
    assert rev.rec_type == "revisit"
    assert h("WARC-Profile") == REVISIT_PROFILE
    assert h("WARC-Refers-To-Target-URI") == "http://example.com/a"
    assert h("WARC-Refers-To-Date") == warc_date(T0) == "2023-11-14T22:13:20.123456Z"
    assert h("WARC-Refers-To") == "<urn:uuid:00000000-0000-0000-0000-000000000002>"
    assert h("WARC-Payload-Digest") == payload_digest(body)
    assert h("Content-Type") == "application/http;msgtype=response"
    assert rev.http_headers.get_statuscode() == "200"
    assert h("Content-Length") == str(len(RESPONSE_HEAD % len(body)))
    assert block == b""                 # warcio has consumed the HTTP head; no payload follows


def test_target_uri_never_breaks_a_header_line(tmp_path):
    w = det_writer(tmp_path)
    w.write_fetch(url="http://example.com/a b\r\nWARC-Type: evil", fetched_at=T0, ip="127.0.0.1",
                  request_head=REQUEST_HEAD, response_head=RESPONSE_HEAD % 0, body=b"")
    w.close()
    uris = [r.rec_headers.get_header("WARC-Target-URI") for r, _, _ in records(w.segments_closed[0])[1:]]
    assert uris == ["http://example.com/a%20b%0D%0AWARC-Type:%20evil"] * 2
    assert verify(w.segments_closed[0]).ok


def test_given_payload_digest_is_written_as_is(tmp_path):
    w = det_writer(tmp_path)
    write_page(w, 1, payload_digest="sha1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
    w.close()
    assert records(w.segments_closed[0])[2][0].rec_headers.get_header("WARC-Payload-Digest") == \
        "sha1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"


def test_truncated_marker(tmp_path):
    w = det_writer(tmp_path)
    write_page(w, 1, truncated="length")
    w.close()
    assert records(w.segments_closed[0])[2][0].rec_headers.get_header("WARC-Truncated") == "length"


# -- locations, flush, rotation -----------------------------------------------------------

def test_location_reads_back_the_response(tmp_path):
    w = det_writer(tmp_path)
    locs = [write_page(w, i) for i in range(5)]
    w.flush()
    path = w.current_path
    with open(path, "rb") as f:
        for i, loc in enumerate(locs):
            f.seek(loc.offset)
            member = f.read(loc.length)
            rec = next(iter(ArchiveIterator(io.BytesIO(member))))
            assert rec.rec_type == "response"
            assert rec.rec_headers.get_header("WARC-Target-URI") == f"http://example.com/p/{i}?b=2&a=1"
            assert rec.content_stream().read() == html(i)
            assert zlib.decompressobj(31).decompress(member)  # one whole member on its own
    w.close()


def test_current_path_lifecycle(tmp_path):
    w = det_writer(tmp_path)
    assert w.current_path is None
    write_page(w, 0)
    assert w.current_path.endswith(".warc.gz.open")
    assert os.path.exists(w.current_path)
    w.close()
    assert w.current_path is None
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".open")]
    w.close()                                   # idempotent


def test_flush_hands_bytes_to_the_os(tmp_path):
    w = det_writer(tmp_path, buffer_bytes=1 << 30)
    loc = write_page(w, 0)
    assert os.path.getsize(w.current_path) == 0             # still buffered
    w.flush()
    assert os.path.getsize(w.current_path) == loc.offset + loc.length
    w.close()


def test_size_is_the_segment_length_once_flushed(tmp_path):
    """The worker answers with ``size`` as the acknowledged length of its segment (no stat)."""
    w = det_writer(tmp_path, buffer_bytes=1 << 30)
    assert w.size == 0                                      # no segment yet
    locs = [write_page(w, i) for i in range(3)]
    assert w.size == locs[-1].offset + locs[-1].length     # the last record is the response
    w.flush()
    assert w.size == os.path.getsize(w.current_path)
    write_page(w, 3)
    assert w.size > os.path.getsize(w.current_path)         # buffered bytes count too
    w.flush()
    assert w.size == os.path.getsize(w.current_path)
    w.close()
    assert w.size == 0


def test_rotation_keeps_closed_segments_untouched(tmp_path):
    w = det_writer(tmp_path, segment_max_bytes=4096, compressor="zlib", compress_level=0)
    locs = [write_page(w, i, size=1500) for i in range(12)]
    first = w.segments_closed[0]
    with open(first, "rb") as f:
        before = hashlib.sha1(f.read()).digest()
    locs += [write_page(w, i, size=1500) for i in range(12, 20)]
    w.close()
    with open(first, "rb") as f:
        assert hashlib.sha1(f.read()).digest() == before
    segs = w.segments_closed
    assert len(segs) >= 5
    assert [int(os.path.basename(p).split("-")[2]) for p in segs] == list(range(len(segs)))
    assert len({loc.filename for loc in locs}) == len(segs)
    total = 0
    for p in segs:
        recs = records(p)
        assert recs[0][0].rec_type == "warcinfo"
        assert recs[0][0].rec_headers.get_header("WARC-Filename") == os.path.basename(p)
        total += sum(r.rec_type == "response" for r, _, _ in recs)
        with open(p, "rb") as f:
            assert sum(1 for rec in FastIterator(f, parse_http=False) if rec.verify_block_digest()) == len(recs)
        assert verify(p).ok
        size = os.path.getsize(p)
        # rotation happens once a segment passes the limit: only its last fetch may cross it
        assert size >= 4096 or p == segs[-1]
        assert size - 4096 < 2 * 1700
    assert total == 20


def test_serials_continue_after_restart(tmp_path):
    w = det_writer(tmp_path)
    write_page(w, 0)
    w.close()
    w2 = det_writer(tmp_path)
    write_page(w2, 1)
    w2.close()
    assert os.path.basename(w2.segments_closed[0]).split("-")[2] == "00001"


def test_bad_parameters_are_refused(tmp_path):
    with pytest.raises(ValueError, match="compress_level"):
        WarcWriter(str(tmp_path), compressor="zlib", compress_level=10)
    with pytest.raises(ValueError, match="compressor"):
        WarcWriter(str(tmp_path), compressor="lz4")


# -- digests and chunked coding --------------------------------------------------------

def test_payload_digest_known_value():
    assert payload_digest(b"") == "sha1:3I42H3S6NNFQ2MSVX7XZKYAYSCX5QBYJ"


def test_is_chunked():
    assert is_chunked(CHUNKED_HEAD)
    assert is_chunked(b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, Chunked\r\n\r\n")
    assert not is_chunked(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n")
    assert not is_chunked(b"HTTP/1.1 200 OK\r\nX-Note: chunked\r\n\r\n")


def test_dechunk_lenient_cases():
    assert dechunk(b"3\nabc\n0\n\n") == b"abc"
    assert dechunk(b"3;name=v\r\nabc\r\n2\r\nde\r\n0\r\n\r\n") == b"abcde"
    assert dechunk(b"3\r\nabc\r\n10\r\nshort") == b"abcshort"          # torn last chunk kept
    assert dechunk(b"3\r\nabc\r\nzz\r\nxx") == b"abc"                   # garbage ends the body
    assert dechunk(b"") == b""


@given(st.lists(st.binary(min_size=1, max_size=50), max_size=8), st.booleans())
def test_dechunk_inverts_chunking(chunks, upper):
    coded = b"".join((b"%X" if upper else b"%x") % len(c) + b"\r\n" + c + b"\r\n" for c in chunks) + b"0\r\n\r\n"
    assert dechunk(coded) == b"".join(chunks)


@pytest.mark.parametrize("compressor,level", [("zlib", 1), ("zlib", 6), ("isal", 0), ("isal", 3)])
def test_gzip_member_round_trip(compressor, level):
    if compressor not in available_compressors():
        pytest.skip(f"{compressor} not installed")
    for _ in range(2):
        member = gzip_member(b"x" * 1000, compressor, level)
        assert member[:2] == b"\x1f\x8b"
        assert gzip.decompress(member) == b"x" * 1000


class _FullDisk:
    """A segment file that takes a few bytes of the next write and then fails like a full disk."""

    def __init__(self, raw):
        self.raw = raw

    def write(self, data):
        self.raw.write(bytes(data[:7]))
        raise OSError(28, "No space left on device")

    def __getattr__(self, name):
        return getattr(self.raw, name)


@pytest.mark.parametrize("compressor", ["zlib", "isal"])
def test_each_compressor_writes_readable_segments(tmp_path, compressor):
    if compressor not in available_compressors():
        pytest.skip(f"{compressor} not installed")
    w = det_writer(tmp_path, compressor=compressor)
    for i in range(3):
        write_page(w, i)
    w.close()
    assert [r.rec_type for r, _, _ in records(w.segments_closed[0], check_digests=True)] == \
        ["warcinfo"] + ["request", "response"] * 3
    assert verify(w.segments_closed[0]).ok


def test_failed_write_leaves_a_valid_closed_segment(tmp_path):
    w = det_writer(tmp_path, buffer_bytes=1 << 30)
    kept = [write_page(w, i) for i in range(3)]
    w.flush()
    path = w.current_path
    write_page(w, 3)
    w._file = _FullDisk(w._file)          # the disk fills up under the writer
    with pytest.raises(OSError, match="No space"):
        w.flush()
    assert w.current_path is None
    final = path[:-len(".open")]
    assert w.segments_closed == [final]
    assert os.path.getsize(final) == kept[-1].offset + kept[-1].length
    assert verify(final).ok
    assert len(open(final[:-len(".warc.gz")] + ".cdxj").read().splitlines()) == 3
    write_page(w, 4)                        # the next record opens a new segment
    w.close()
    assert len(w.segments_closed) == 2 and verify(w.segments_closed[1]).ok


def _coded_segment(directory, compressor: str, level: int) -> tuple[str, dict[str, tuple[bytes, bytes, object]]]:
    """Content-coded responses (gzip small, gzip over several 64 KiB stored blocks, chunked br)."""
    w = det_writer(directory, compressor=compressor, compress_level=level)
    small = gzip.compress(html(1), mtime=0)
    rng = random.Random(7)
    big = gzip.compress(rng.randbytes(150_000), mtime=0)     # incompressible: 3 stored blocks
    br_body = rng.randbytes(3000)
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(br_body), br_body)
    heads = {
        "small": b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Encoding: gzip\r\n\r\n",
        "big": b"HTTP/1.1 200 OK\r\ncontent-ENCODING:  GZIP \r\nContent-Length: %d\r\n\r\n" % len(big),
        "br": b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nTransfer-Encoding: chunked\r\n\r\n",
    }
    out = {}
    for name, body in (("small", small), ("big", big), ("br", chunked)):
        loc = w.write_fetch(url=f"http://example.com/{name}", fetched_at=T0, ip="127.0.0.1",
                            request_head=REQUEST_HEAD, response_head=heads[name], body=body)
        out[name] = (heads[name], body, loc)
    w.close()
    return w.segments_closed[0], out


@pytest.mark.parametrize("compressor,level", [("zlib", 1), ("zlib", 6), ("isal", 2), ("isal", 3)])
def test_content_coded_bodies_stay_valid_and_digests_verify(tmp_path, compressor, level):
    if compressor not in available_compressors():
        pytest.skip(f"{compressor} not installed")
    path, written = _coded_segment(tmp_path / "a", compressor, level)
    recs = records(path, check_digests=True)
    assert [r.rec_type for r, _, _ in recs] == ["warcinfo"] + ["request", "response"] * 3
    for rec, body, problems in recs:
        if rec.rec_type == "response":
            assert body == written[rec.rec_headers.get_header("WARC-Target-URI").rsplit("/", 1)[1]][1]
            if not rec.http_headers.get_header("Transfer-Encoding"):    # warcio keeps chunking in its digest
                assert problems == []
    with open(path, "rb") as f:
        for rec in FastIterator(f, parse_http=False):
            assert rec.verify_block_digest(), rec.record_type
    assert verify(path).ok
    with open(path, "rb") as f:
        data = f.read()
    for head, body, loc in written.values():
        member = data[loc.offset:loc.offset + loc.length]
        record = gzip.decompress(member)                 # one whole member on its own: CRC and size hold
        assert record.endswith(head + body + b"\r\n\r\n")
    # same record bytes as the plain deflate path (level 0 never takes the stored-body path)
    plain, _ = _coded_segment(tmp_path / "b", "zlib", 0)
    with open(plain, "rb") as f:
        assert gzip.decompress(f.read()) == gzip.decompress(data)


def test_random_record_ids_are_version_4_and_unique():
    import uuid

    from crawlerd.store.encoding import RecordIds as _UuidIds
    gen = _UuidIds()
    ids = [gen() for _ in range(600)]                    # crosses two refills of the byte pool
    assert len(set(ids)) == 600
    for rid in ids:
        u = uuid.UUID(rid.removeprefix("urn:uuid:"))
        assert rid == f"urn:uuid:{u}" and u.version == 4 and u.variant == uuid.RFC_4122


@given(ts=st.floats(min_value=0, max_value=2**34, allow_nan=False))
def test_warc_date_is_utc_with_six_fraction_digits(ts):
    from datetime import UTC, datetime
    d = datetime.fromtimestamp(ts, UTC)
    assert warc_date(ts) == d.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert warc_date(1700000000.0) == "2023-11-14T22:13:20.000000Z"


def test_a_forked_child_never_repeats_its_parents_record_ids():
    from crawlerd.store.encoding import RecordIds
    gen = RecordIds()
    gen()                                                # the parent's pool is filled before the fork
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                         # child: its next ids, then exit at once
        os.write(w, " ".join(gen() for _ in range(4)).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        child = f.read().split()
    os.waitpid(pid, 0)
    parent = [gen() for _ in range(4)]
    assert len(child) == 4 and not set(child) & set(parent)


class TestSha1Base32:
    """The native kernel and its pure-Python reference both give base64.b32encode's text."""

    @pytest.mark.parametrize("impl", ["native", "ref"])
    @given(digest=st.binary(min_size=20, max_size=20))
    def test_matches_base64(self, impl, digest):
        import base64

        from crawlerd._native import b32, b32_ref
        fn = b32.sha1_base32 if impl == "native" else b32_ref.sha1_base32
        assert fn(digest) == base64.b32encode(digest).decode()

    @pytest.mark.parametrize("impl", ["native", "ref"])
    def test_a_digest_of_another_length_is_refused(self, impl):
        from crawlerd._native import b32, b32_ref
        fn = b32.sha1_base32 if impl == "native" else b32_ref.sha1_base32
        for bad in (b"", b"x" * 19, b"x" * 21):
            with pytest.raises(ValueError):
                fn(bad)

    def test_the_store_uses_the_native_kernel(self):
        from crawlerd._native import b32
        from crawlerd.store.encoding import sha1_base32
        assert sha1_base32 is b32.sha1_base32


@given(st.floats(min_value=0, max_value=4e9, allow_nan=False))
def test_warc_date_matches_strftime(ts):
    from datetime import UTC, datetime
    assert warc_date(ts) == datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# -- every record kind: readers, profiles, concurrency ---------------------------------

def test_every_record_kind_validates_with_warcio_and_fastwarc(tmp_path):
    from tests.store.helpers import all_kinds_segment
    path, caps = all_kinds_segment(tmp_path)
    with open(path, "rb") as f:
        recs = [(r, r.content_stream().read(), list(r.digest_checker.problems))
                for r in ArchiveIterator(f, check_digests=True)]
    kinds = [r.rec_type for r, _, _ in recs]
    assert set(kinds) == {"warcinfo", "request", "response", "metadata", "revisit"}
    assert kinds.count("metadata") == len(caps)              # one per capture
    for rec, _, problems in recs:
        chunked = "chunked" in ((rec.http_headers and rec.http_headers.get_header("Transfer-Encoding")) or "")
        assert problems == [] or (chunked and len(problems) == 1), (rec.rec_type, problems)
    with open(path, "rb") as f:
        fast = list(FastIterator(f, parse_http=False))
    assert [str(r.record_type).split(".")[-1] for r in fast] == kinds
    with open(path, "rb") as f:
        assert all(r.verify_block_digest() for r in FastIterator(f, parse_http=False))
    with open(path, "rb") as f:
        for rec in FastIterator(f, record_types=WarcRecordType.response, parse_http=True):
            if "chunked" not in (rec.http_headers.get("Transfer-Encoding") or ""):
                assert rec.verify_payload_digest(), rec.headers["WARC-Target-URI"]
    assert verify(path).ok, verify(path).errors


def test_revisit_profiles_and_concurrency(tmp_path):
    from tests.store.helpers import all_kinds_segment
    path, caps = all_kinds_segment(tmp_path)
    with open(path, "rb") as f:
        recs = [(r.rec_type, dict(r.rec_headers.headers), r.raw_stream.read()) for r in ArchiveIterator(f)]
    by_id = {h["WARC-Record-ID"]: (t, h) for t, h, _ in recs}
    original_id = "<" + caps["page"][0].record_id + ">"
    assert by_id[original_id][0] == "response"
    revisits = {h["WARC-Profile"].rsplit("/", 1)[-1]: (h, block) for t, h, block in recs if t == "revisit"}
    same, h304 = revisits["identical-payload-digest"], revisits["server-not-modified"]
    for h, _ in (same, h304):
        assert h["WARC-Refers-To"] == original_id
        assert h["WARC-Refers-To-Target-URI"] == "http://www.Example.com/a?b=2&a=1"
        assert h["WARC-Refers-To-Date"] == by_id[original_id][1]["WARC-Date"]
        assert h["WARC-Payload-Digest"] == by_id[original_id][1]["WARC-Payload-Digest"]
    assert same[0]["WARC-Truncated"] == "length" and same[1] == b""     # the head is all there is
    assert h304[1] == b"" and h304[0]["Content-Length"] == "0" and "Content-Type" not in h304[0]
    assert h304[0]["WARC-Protocol"] == "http/1.1"
    # a capture is request, response|revisit, metadata: each names the one before or after it
    for i, (t, h, _) in enumerate(recs):
        if t == "request":
            nxt_t, nxt_h, _ = recs[i + 1]
            assert nxt_t in ("response", "revisit") and h["WARC-Concurrent-To"] == nxt_h["WARC-Record-ID"]
            assert nxt_h["WARC-Concurrent-To"] == h["WARC-Record-ID"]
            meta_t, meta_h, meta_block = recs[i + 2]
            assert meta_t == "metadata" and meta_h["WARC-Concurrent-To"] == nxt_h["WARC-Record-ID"]
            assert meta_h["Content-Type"] == "application/warc-fields" and b"fetchTimeMs: " in meta_block
