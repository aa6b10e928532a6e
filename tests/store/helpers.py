"""Deterministic writers and sample fetches shared by the store tests."""

from __future__ import annotations

import itertools
import uuid

from crawlerd.store.warc import WarcWriter

T0 = 1_700_000_000.123456
REQUEST_HEAD = b"GET /a HTTP/1.1\r\nHost: example.com\r\nUser-Agent: crawlerd-test\r\n\r\n"
RESPONSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: %d\r\n\r\n"
CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"


class Clock:
    """A clock that advances one millisecond and a bit per read, so dates differ and are exact."""

    def __init__(self, start: float = T0):
        self.now = start

    def __call__(self) -> float:
        self.now += 0.001001
        return self.now


def id_counter(start: int = 0):
    counter = itertools.count(start)
    return lambda: f"urn:uuid:{uuid.UUID(int=next(counter))}"


def det_writer(directory, **kw) -> WarcWriter:
    kw.setdefault("hostname", "testhost")
    kw.setdefault("clock", Clock())
    kw.setdefault("id_gen", id_counter())
    kw.setdefault("operator", "Test Operator <ops@example.org>")
    kw.setdefault("user_agent", "crawlerd-test/0.1")
    return WarcWriter(str(directory), **kw)


def html(i: int, size: int = 2000) -> bytes:
    return (f"<html><body><h1>page {i}</h1>" + "<p>lorem ipsum dolor sit amet</p>" * (size // 33)
            + "</body></html>").encode()


def write_page(writer: WarcWriter, i: int, size: int = 2000, **kw):
    body = html(i, size)
    return writer.write_fetch(url=f"http://example.com/p/{i}?b=2&a=1", fetched_at=T0 + i, ip="127.0.0.1",
                              request_head=REQUEST_HEAD, response_head=RESPONSE_HEAD % len(body), body=body, **kw)
