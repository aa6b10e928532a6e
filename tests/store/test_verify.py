"""verify(): a clean segment passes; every kind of damage is named, never a crash."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib

import pytest

from crawlerd.store.cdxj import cdxj_path
from crawlerd.store.encoding import gzip_member, payload_digest
from crawlerd.store.segment import iter_members
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


# -- files that are not segments: a failure each, never a traceback ------------------------

@pytest.mark.parametrize("kind,message", [
    ("missing", "no such file"),
    ("directory", "is a directory"),
    ("empty", "empty file"),
    ("unreadable", "cannot read"),
    ("not-gzip", "no whole WARC record at offset 0"),
])
def test_bad_files_fail_with_one_clear_line(tmp_path, kind, message):
    path = {"missing": str(tmp_path / "nope.warc.gz"), "directory": str(tmp_path),
            "unreadable": "/proc/self/mem", "empty": str(tmp_path / "empty.warc.gz"),
            "not-gzip": str(tmp_path / "text.warc.gz")}[kind]
    if kind == "empty":
        open(path, "wb").close()
    if kind == "not-gzip":
        with open(path, "wb") as f:
            f.write(b"WARC/1.1\r\nnot compressed\r\n")
    report = verify(path)
    assert not report.ok and report.records == 0
    assert len(report.errors) == 1 and message in report.errors[0], report.errors
    assert "FAILED" in report.summary()


def test_cli_verify_reports_each_bad_file_and_exits_1(tmp_path):
    good, _ = segment(tmp_path / "warc")
    empty = tmp_path / "empty.warc.gz"
    empty.write_bytes(b"")
    args = [str(tmp_path / "missing.warc.gz"), str(tmp_path), str(empty), good]
    r = subprocess.run([sys.executable, "-m", "crawlerd", "warc", "verify", *args], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    out = r.stdout.splitlines()
    for path, why in zip(args, ["no such file", "is a directory", "empty file"], strict=False):
        assert any(line.startswith(f"{path}: error: ") and why in line for line in out), out
    assert f"{good}: ok: 7 records" in r.stdout
    r = subprocess.run([sys.executable, "-m", "crawlerd", "warc", "verify", good], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout


def test_cli_index_rebuilds_the_cdxj(tmp_path):
    good, _ = segment(tmp_path / "warc")
    target = cdxj_path(good)
    with open(target) as f:
        want = f.read()
    os.remove(target)
    assert any("no CDXJ index found" in w for w in verify(good).warnings)
    r = subprocess.run([sys.executable, "-m", "crawlerd", "warc", "index", good, str(tmp_path / "missing.warc.gz")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "missing.warc.gz: no such file" in r.stderr and "Traceback" not in r.stderr
    with open(target) as f:
        assert f.read() == want
    assert verify(good).ok and verify(good).index_path == target


# -- record order and the index ------------------------------------------------------------

def _members(path):
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "rb") as f:
        return data, [(m.offset, m.length) for m in iter_members(f)]


def test_records_out_of_order_are_errors(tmp_path):
    path, _ = segment(tmp_path, n=2)
    data, members = _members(path)
    parts = [data[o:o + n] for o, n in members]
    # swap the two captures' responses: each request now names a record that is not after it
    parts[2], parts[4] = parts[4], parts[2]
    with open(path, "wb") as f:
        f.write(b"".join(parts))
    report = verify(path, check_index=False)
    assert any("request names" in e for e in report.errors), report.errors
    # warcinfo not first
    parts = [data[o:o + n] for o, n in members]
    with open(path, "wb") as f:
        f.write(b"".join(parts[1:3] + parts[:1] + parts[3:]))
    report = verify(path, check_index=False)
    assert any("the first record is 'request'" in e for e in report.errors), report.errors


def test_metadata_before_its_record_is_an_error(tmp_path):
    w = det_writer(tmp_path)
    write_page(w, 0, metadata={"fetchTimeMs": "1"})
    w.close()
    path = w.segments_closed[0]
    data, members = _members(path)
    parts = [data[o:o + n] for o, n in members]             # warcinfo, request, response, metadata
    with open(path, "wb") as f:
        f.write(b"".join([parts[0], parts[3], parts[1], parts[2]]))
    report = verify(path, check_index=False)
    assert any("metadata comes before the record it describes" in e for e in report.errors), report.errors


def test_index_that_does_not_match_is_an_error(tmp_path):
    path, _ = segment(tmp_path)
    target = cdxj_path(path)
    with open(target) as f:
        lines = f.read().splitlines()
    with open(target, "w") as f:
        f.write("\n".join(lines[1:] + [lines[0].replace('"offset": "', '"offset": "9')]) + "\n")
    report = verify(path)
    assert any("missing from CDXJ" in e for e in report.errors)
    assert any("not from this segment" in e for e in report.errors)
    with open(target, "w") as f:
        f.write("\n".join(reversed(lines)) + "\n")
    assert any("out of order" in e for e in verify(path).errors)
