"""verify(): a clean segment passes; every kind of damage is named, never a crash."""

from __future__ import annotations

import zlib

from crawlerd.store.encoding import gzip_member, payload_digest
from crawlerd.store.verify import digest_matches, verify
from tests.store.helpers import CHUNKED_HEAD, REQUEST_HEAD, T0, det_writer, write_page


def segment(tmp_path, n=3, **kw):
    w = det_writer(tmp_path, **kw)
    locs = [write_page(w, i, size=500) for i in range(n)]
    w.close()
    return w.segments_closed[0], locs


def splice(path, loc, new_member: bytes) -> None:
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:loc.offset] + new_member + data[loc.offset + loc.length:])


def test_clean_segment(tmp_path):
    path, _ = segment(tmp_path)
    report = verify(path)
    assert report.ok, report.errors
    assert report.records == 7
    assert report.counts == {"warcinfo": 1, "request": 3, "response": 3}
    assert "ok: 7 records" in report.summary()


def test_changed_body_fails_block_and_payload_digest(tmp_path):
    path, locs = segment(tmp_path)
    with open(path, "rb") as f:
        f.seek(locs[1].offset)
        record = zlib.decompress(f.read(locs[1].length), 31)
    pos = record.index(b"lorem")
    tampered = record[:pos] + b"L" + record[pos + 1:]          # same length, so it still parses
    splice(path, locs[1], gzip_member(tampered))
    report = verify(path)
    assert not report.ok
    assert report.records == 7                                 # still whole records
    assert any("WARC-Block-Digest" in e for e in report.errors)
    assert any("WARC-Payload-Digest" in e for e in report.errors)
    records = [e for e in report.errors if "CDXJ" not in e]     # the index no longer fits the lengths either
    assert records and all(f"offset {locs[1].offset}" in e for e in records)
    assert any("CDXJ" in e for e in report.errors)


def test_flipped_compressed_byte_is_reported(tmp_path):
    path, locs = segment(tmp_path)
    with open(path, "r+b") as f:
        f.seek(locs[1].offset + locs[1].length // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))
    report = verify(path)
    assert not report.ok
    assert report.valid_bytes <= locs[1].offset
    assert "FAILED" in report.summary()


def test_wrong_payload_digest_is_reported(tmp_path):
    w = det_writer(tmp_path)
    write_page(w, 0, payload_digest=payload_digest(b"something else"))
    w.close()
    report = verify(w.segments_closed[0])
    assert [e for e in report.errors if "WARC-Payload-Digest" in e]
    assert not [e for e in report.errors if "WARC-Block-Digest" in e]


def test_duplicate_record_id_is_reported(tmp_path):
    path, _ = segment(tmp_path, id_gen=lambda: "urn:uuid:00000000-0000-0000-0000-000000000007")
    report = verify(path)
    assert any("duplicate WARC-Record-ID" in e for e in report.errors)


def test_trailing_garbage_is_reported(tmp_path):
    path, _ = segment(tmp_path)
    with open(path, "ab") as f:
        f.write(b"\x00garbage")
    report = verify(path)
    assert report.records == 7
    assert any("not a whole gzip member" in e for e in report.errors)


def test_chunked_digest_of_other_writers_is_a_warning(tmp_path):
    raw = b"5\r\nhello\r\n0\r\n\r\n"
    w = det_writer(tmp_path)
    w.write_fetch(url="http://example.com/", fetched_at=T0, ip="127.0.0.1", request_head=REQUEST_HEAD,
                  response_head=CHUNKED_HEAD, body=raw, payload_digest=payload_digest(raw))
    w.close()
    report = verify(w.segments_closed[0])
    assert report.ok
    assert len(report.warnings) == 1 and "chunked" in report.warnings[0]


def test_digest_matches_encodings():
    data = b"abc"
    assert digest_matches("sha1:VGMT4NSHA2AWVOR6EVYXQUGCNSONBWE5", data)
    assert digest_matches("sha1:a9993e364706816aba3e25717850c26c9cd0d89d", data)
    assert digest_matches("sha256:ungWv48Bz+pBQUDeXa4iI7ADYaOWF3qctBD/YfIAFa0=", data)
    assert not digest_matches("sha1:AAAA", data)
    assert digest_matches("nosuchalgo:AAAA", data) is None
    assert digest_matches("no-colon", data) is False
