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


NOT_MODIFIED_HEAD = b"HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\nDate: Tue, 14 Nov 2023 22:13:30 GMT\r\n\r\n"
CONDITIONAL_HEAD = b"GET /a HTTP/1.1\r\nHost: example.com\r\nIf-None-Match: \"v1\"\r\n\r\n"


def all_kinds_segment(directory, **kw):
    """One closed segment with every record type and revisit profile the crawler writes, hosts
    of every kind (names, www, IPv4, IPv6, ports) and URLs SURT must canonicalise. Returns the
    segment path and {name: (WarcLocation, url, body)} of its captures."""
    import gzip as _gzip
    w = det_writer(directory, **kw)
    caps = {}

    def fetch(name, url, head, body, **extra):
        loc = w.write_fetch(url=url, fetched_at=T0 + len(caps), ip="127.0.0.1", request_head=REQUEST_HEAD,
                            response_head=head, body=body,
                            metadata=[("fetchTimeMs", "12"), ("outlink", "http://example.com/x nofollow")],
                            **extra)
        caps[name] = (loc, url, body)
        return loc

    page = html(1, 600)
    first = fetch("page", "http://www.Example.com/a?b=2&a=1",
                  b"HTTP/1.1 200 OK\r\nContent-Type: Text/HTML; charset=UTF-8\r\nETag: \"v1\"\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(page), page)
    fetch("ip", "http://127.0.0.1:8080/p/1.html", RESPONSE_HEAD % 5, b"hello")
    fetch("ipv6", "http://[::1]:8081/x", RESPONSE_HEAD % 3, b"six")
    fetch("no-type", "http://example.org/missing", b"HTTP/1.1 404 Not Found\r\nContent-Length: 4\r\n\r\n", b"gone")
    fetch("chunked", "https://example.net:443/c/./d/../e//f/", CHUNKED_HEAD,
          b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
    gz = _gzip.compress(html(2, 800), mtime=0)
    fetch("gzip", "http://example.com/Session;jsessionid=1?PHPSESSID=0123456789abcdef0123456789abcdef&z=%7e",
          b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n"
          % len(gz), gz)
    fetch("redirect", "http://example.com/old", b"HTTP/1.1 301 Moved\r\nLocation: /a\r\nContent-Length: 0\r\n\r\n",
          b"")
    fetch("truncated", "http://example.com/big", RESPONSE_HEAD % 10, b"0123", truncated="length")
    from crawlerd.store.encoding import payload_digest as _pd
    from crawlerd.store.warc import NOT_MODIFIED_PROFILE
    loc = w.write_revisit(url="http://example.com/copy", fetched_at=T0 + 20, ip="127.0.0.1",
                          request_head=REQUEST_HEAD,
                          response_head=b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n"
                          % len(page), payload_digest=_pd(page), refers_to_uri="http://www.Example.com/a?b=2&a=1",
                          refers_to_date=T0, refers_to_id=first.record_id, metadata={"fetchTimeMs": "3"})
    caps["revisit"] = (loc, "http://example.com/copy", page)
    loc = w.write_revisit(url="http://www.Example.com/a?b=2&a=1", fetched_at=T0 + 30, ip="127.0.0.1",
                          request_head=CONDITIONAL_HEAD, response_head=NOT_MODIFIED_HEAD, payload_digest=_pd(page),
                          refers_to_uri="http://www.Example.com/a?b=2&a=1", refers_to_date=T0,
                          refers_to_id=first.record_id, profile=NOT_MODIFIED_PROFILE,
                          metadata={"fetchTimeMs": "2", "http-status": "304"})
    caps["not-modified"] = (loc, "http://www.Example.com/a?b=2&a=1", page)
    w.close()
    return w.segments_closed[0], caps
