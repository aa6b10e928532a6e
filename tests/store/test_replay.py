"""pywb replays every kind of capture we write, from our own CDXJ: responses, identical-payload
revisits of another URL, server-not-modified revisits, and a 304 whose URL's last capture was a
revisit of another URL. pywb runs in its own venv (``make pywb``); see tests/store/replay.py."""

from __future__ import annotations

import os

import pytest

from crawlerd.store.cdxj import cdxj_path, timestamp14
from crawlerd.store.encoding import payload_digest, warc_date
from crawlerd.store.warc import NOT_MODIFIED_PROFILE
from tests.store.helpers import (
    CONDITIONAL_HEAD,
    NOT_MODIFIED_HEAD,
    REQUEST_HEAD,
    T0,
    det_writer,
    html,
    id_counter,
)
from tests.store.replay import collection, http_date, need_pywb, replay

A = "http://127.0.0.1:8080/a.html"          # an IP-address host: its SURT reverses the octets
B = "http://www.site.example/b?y=2&x=1"


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    need_pywb()
    base = tmp_path_factory.mktemp("replay")
    body = html(7, 900)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nETag: \"e7\"\r\nContent-Length: %d\r\n\r\n"
    captures = {}
    w1 = det_writer(base / "warc", shard="w1")
    first = w1.write_fetch(url=A, fetched_at=T0, ip="127.0.0.1", request_head=REQUEST_HEAD,
                           response_head=head % len(body), body=body, metadata={"fetchTimeMs": "5"})
    captures["response"] = (A, T0)
    w1.close()
    # the revisits go to another segment (another worker): pywb resolves them across files
    w2 = det_writer(base / "warc", shard="w2", id_gen=id_counter(1000))
    digest = payload_digest(body)
    common = dict(ip="127.0.0.1", payload_digest=digest, refers_to_uri=A, refers_to_date=T0,
                  refers_to_id=first.record_id)
    w2.write_revisit(url=B, fetched_at=T0 + 100, request_head=REQUEST_HEAD, response_head=head % len(body),
                     **common)
    captures["identical, other URL"] = (B, T0 + 100)
    w2.write_revisit(url=A, fetched_at=T0 + 200, request_head=CONDITIONAL_HEAD, response_head=NOT_MODIFIED_HEAD,
                     profile=NOT_MODIFIED_PROFILE, **common)
    captures["not modified"] = (A, T0 + 200)
    # B's last capture was a revisit of A: its 304 names the record that holds the payload (A's)
    w2.write_revisit(url=B, fetched_at=T0 + 300, request_head=CONDITIONAL_HEAD, response_head=NOT_MODIFIED_HEAD,
                     profile=NOT_MODIFIED_PROFILE, **common)
    captures["not modified, revisit of other URL"] = (B, T0 + 300)
    w2.close()
    segments = w1.segments_closed + w2.segments_closed
    root = collection(str(base / "pywb"), segments, [cdxj_path(s) for s in segments])
    kinds = list(captures)
    answers = replay(root, [(timestamp14(warc_date(captures[k][1])), captures[k][0]) for k in kinds])
    return root, captures, body, dict(zip(kinds, answers, strict=True))


@pytest.mark.parametrize("kind", ["response", "identical, other URL", "not modified",
                                  "not modified, revisit of other URL"])
def test_pywb_replays_the_capture(archive, kind):
    root, captures, body, answers = archive
    answer = answers[kind]
    assert answer["error"] == "" and answer["status"] == 200, answer
    assert answer["body"] == body
    assert answer["memento"] == http_date(warc_date(captures[kind][1]))      # this capture, not the original's


def test_pywb_collection_uses_our_index(archive):
    root = archive[0]
    indexes = os.listdir(os.path.join(root, "collections", "c", "indexes"))
    assert len(indexes) == 2 and all(n.endswith(".cdxj") for n in indexes)
