"""CDXJ: SURT keys, sorted lines, offsets that point at the right record."""

from __future__ import annotations

import io
import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from warcio.archiveiterator import ArchiveIterator

from crawlerd.store.cdxj import Capture, cdxj_path, index, surt, timestamp14
from crawlerd.store.encoding import payload_digest
from tests.store.helpers import REQUEST_HEAD, RESPONSE_HEAD, T0, det_writer


@pytest.mark.parametrize("url,key", [
    ("http://www.Example.com/a/B?z=1&a=2#frag", "com,example)/a/b?a=2&z=1"),
    ("https://example.com", "com,example)/"),
    ("http://example.com:80/x", "com,example)/x"),
    ("https://example.com:443/x", "com,example)/x"),
    ("http://example.com:8080/x", "com,example:8080)/x"),
    ("http://www2.sub.example.co.uk/", "uk,co,example,sub)/"),
    ("http://127.0.0.1:8000/p", "127.0.0.1:8000)/p"),
    ("http://example.com./", "com,example)/"),
])
def test_surt(url, key):
    assert surt(url) == key


def test_timestamp14():
    assert timestamp14("2023-11-14T22:13:20.123456Z") == "20231114221320"
    assert timestamp14("2023-11-14T22:13:20Z") == "20231114221320"


def parse(line: str) -> tuple[str, str, dict]:
    key, stamp, js = line.split(" ", 2)
    return key, stamp, json.loads(js)


@pytest.fixture
def segment(tmp_path):
    w = det_writer(tmp_path)
    urls = ["http://zeta.example.org/", "http://alpha.example.com/b", "http://alpha.example.com/a",
            "http://www.example.net/x?b=1&a=2"]
    bodies = {}
    for i, url in enumerate(urls):
        body = f"<html>{url}</html>".encode() * (i + 1)
        bodies[url] = body
        head = (RESPONSE_HEAD % len(body)) if i != 1 else b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\n\r\n" \
            % len(body)
        w.write_fetch(url=url, fetched_at=T0 + i, ip="127.0.0.1", request_head=REQUEST_HEAD, response_head=head,
                      body=body)
    w.write_revisit(url="http://alpha.example.com/c", fetched_at=T0 + 10, ip="127.0.0.1",
                    request_head=REQUEST_HEAD, response_head=RESPONSE_HEAD % 5,
                    payload_digest=payload_digest(b"hello"), refers_to_uri="http://zeta.example.org/",
                    refers_to_date=T0)
    w.close()
    return w.segments_closed[0], bodies


def test_lines_sorted_and_complete(segment):
    path, bodies = segment
    lines = index(path)
    assert len(lines) == 5                      # 4 responses + 1 revisit; requests/warcinfo not indexed
    assert lines == sorted(lines, key=str.encode)
    keys = [parse(line)[0] for line in lines]
    assert keys == ["com,example,alpha)/a", "com,example,alpha)/b", "com,example,alpha)/c",
                    "net,example)/x?a=2&b=1", "org,example,zeta)/"]


def test_file_written_at_close_equals_index(segment):
    path, _ = segment
    with open(cdxj_path(path)) as f:
        assert f.read().splitlines() == index(path)


def test_offsets_point_at_the_record(segment):
    path, bodies = segment
    with open(path, "rb") as f:
        for line in index(path):
            _, stamp, fields = parse(line)
            assert fields["filename"] == os.path.basename(path)
            f.seek(int(fields["offset"]))
            member = f.read(int(fields["length"]))
            rec = next(iter(ArchiveIterator(io.BytesIO(member))))
            assert rec.rec_headers.get_header("WARC-Target-URI") == fields["url"]
            assert rec.rec_headers.get_header("WARC-Date").replace("-", "").replace(":", "").replace("T", "")[:14] \
                == stamp
            assert "sha1:" + fields["digest"] == rec.rec_headers.get_header("WARC-Payload-Digest")
            assert fields["status"] == rec.http_headers.get_statuscode()
            if rec.rec_type == "revisit":
                assert fields["mime"] == "warc/revisit"
            else:
                assert rec.content_stream().read() == bodies[fields["url"]]
                ct = rec.http_headers.get_header("Content-Type")
                assert fields["mime"] == (ct.split(";")[0] if ct else "unk")


def test_status_of_404_recorded(segment):
    path, _ = segment
    by_url = {parse(line)[2]["url"]: parse(line)[2] for line in index(path)}
    assert by_url["http://alpha.example.com/b"]["status"] == "404"
    assert by_url["http://alpha.example.com/b"]["mime"] == "unk"
    assert by_url["http://zeta.example.org/"]["mime"] == "text/html"


def _dumps_line(cap) -> str:
    """The line as json.dumps writes it: what Capture.line() must equal byte for byte."""
    fields = {"url": cap.url, "mime": cap.mime or "unk"}
    if cap.status:
        fields["status"] = str(cap.status)
    if cap.digest:
        fields["digest"] = cap.digest.split(":", 1)[-1]
    fields.update(length=str(cap.length), offset=str(cap.offset), filename=cap.filename)
    return f"{surt(cap.url)} {timestamp14(cap.warc_date)} {json.dumps(fields, ensure_ascii=True)}"


@settings(max_examples=300, deadline=None)
@given(url=st.text(max_size=60), mime=st.text(max_size=20), status=st.integers(0, 999),
       digest=st.text(max_size=40), length=st.integers(0, 2**40), offset=st.integers(0, 2**40),
       filename=st.text(max_size=30))
def test_capture_line_equals_json_dumps(url, mime, status, digest, length, offset, filename):
    cap = Capture(url="http://example.com/" + url, warc_date="2023-11-14T22:13:20.123456Z", mime=mime,
                  status=status, digest=digest, length=length, offset=offset, filename=filename)
    assert cap.line() == _dumps_line(cap)
