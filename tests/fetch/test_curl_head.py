"""The request head the Fetcher records is exactly the bytes the server received.

The Fetcher writes the head itself for ordinary URLs and takes curl's debug
stream for the rest; either way the record must equal what crossed the wire.
An echo server answers every request with the request head it read as the
body, so each case compares the two byte for byte.
"""

import asyncio

import pytest
import uvloop

from crawlerd.fetch.curl import Fetcher
from crawlerd.fetch.guard import AddressGuard
from crawlerd.fetch.http_head import request_head
from crawlerd.outcome import Outcome
from crawlerd.records import FetchRequest

UA = "crawlerd-test/0.1 (+https://example.org/bot)"


class _Echo(asyncio.Protocol):
    """Keep-alive HTTP/1.1 server: the body of each answer is the request head as received."""

    def connection_made(self, transport):
        self.transport = transport
        self.buf = b""

    def data_received(self, data):
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            head, self.buf = self.buf[:end + 4], self.buf[end + 4:]
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(head), head))


def fetch_all(cases, **kw):
    """Fetch each (url template, headers) from the echo server; return results and fetcher stats."""
    async def main():
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_Echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        params = dict(user_agent=UA, guard=AddressGuard(["127.0.0.0/8"]), connect_timeout_s=2.0, timeout_s=10.0,
                      low_speed_bytes_per_s=1, low_speed_time_s=10, max_body_bytes=1 << 20,
                      max_header_bytes=64 << 10, max_connections=10, verify_tls=False)
        params.update(kw)
        f = Fetcher(loop, **params)
        try:
            out = [await f.fetch(FetchRequest(url=url.format(port=port), ip="127.0.0.1", port=port,
                                              headers=list(headers)))
                   for url, headers in cases]
            return out, f.stats()["request_heads"], port
        finally:
            await f.close(0)
            server.close()
    return uvloop.run(main())


# URLs the Fetcher writes the head for (the server listens on {port}; CONNECT_TO sends every
# request there whatever port the URL names, so default ports can be tested too).
BUILT = [
    "http://site.test:{port}/",
    "http://site.test/",
    "http://site.test:80/a",                      # the default port is left out of Host
    "http://site.test:443/x",                     # 443 is not http's default: kept
    "http://site.test:8080/a",
    "http://Site.Example.TEST/Mixed/Case",        # curl keeps the host as written
    "http://site.test",                           # no path: curl asks for /
    "http://site.test?x=1",                       # no path, a query
    "http://site.test/a/../b/./c",                # PATH_AS_IS: dot segments go out as written
    "http://site.test/p%20q/%7Euser?a=%2F&b=c;d=e:f@g",
    "http://site.test/a?b?c/d",                   # "?" inside the query
    "http://site.test/x#frag",                    # the fragment never goes out
    "http://under_score.site-test.example/!$&'()*+,;=",
    "http://127.0.0.1/ip-literal",
]

# URLs or headers the Fetcher does not model: curl's debug stream gives the head.
DEBUG = [
    ("http://user:pw@site.test/", []),            # curl adds Authorization from the userinfo
    ("http://[::1]/v6", []),                      # curl normalises IPv6 literals
    ("http://site.test/a|b", []),                 # outside RFC 3986 pchars
    ("http://site.test/", [("Host", "other.test")]),
    ("http://site.test/", [("Accept", "text/html")]),
    ("http://site.test/", [("X-Empty", "")]),     # curl drops a header with an empty value
    ("http://site.test/", [("X-Space", "   ")]),
]


@pytest.mark.parametrize("url", BUILT)
def test_built_head_is_exactly_what_the_server_received(url):
    (r,), counts, _ = fetch_all([(url, [("If-None-Match", '"v1"'), ("If-Modified-Since", "Sat, 1 Jan 2000")])])
    assert r.outcome is Outcome.OK
    assert r.request_head == r.body
    assert counts == {"built": 1, "debug_stream": 0, "unconfirmed": 0}


@pytest.mark.parametrize("url, headers", DEBUG)
def test_unmodelled_head_comes_from_curl_and_is_exact(url, headers):
    (r,), counts, _ = fetch_all([(url, headers)])
    assert r.outcome is Outcome.OK
    assert r.request_head == r.body
    assert counts == {"built": 0, "debug_stream": 1, "unconfirmed": 0}


def test_handles_switch_between_built_and_debug_heads():
    cases = [("http://a.test/1", []), ("http://u:p@a.test/2", []), ("http://a.test/3", [("X-A", "1")]),
             ("http://a.test/4", [("Accept", "*/*")]), ("http://a.test/5", [])] * 3
    out, counts, _ = fetch_all(cases)
    assert all(r.outcome is Outcome.OK and r.request_head == r.body for r in out)
    assert counts == {"built": 9, "debug_stream": 6, "unconfirmed": 0}
    assert b"Authorization: Basic" in out[1].request_head
    assert b"Authorization" not in out[2].request_head   # the debug handle went back to building cleanly


def test_header_whitespace_goes_out_as_given():
    (r,), counts, _ = fetch_all([("http://site.test/", [("X-Lead", "  a"), ("X-Trail", "b \t"), ("x-lower", "c")])])
    assert r.request_head == r.body
    assert b"X-Lead:   a\r\nX-Trail: b \t\r\nx-lower: c\r\n" in r.body
    assert counts == {"built": 1, "debug_stream": 0, "unconfirmed": 0}


def test_latin1_header_values_go_out_as_their_bytes():
    (r,), counts, _ = fetch_all([("http://site.test/", [("If-None-Match", '"caf\u00e9"')])])
    assert r.request_head == r.body
    assert b'If-None-Match: "caf\xe9"\r\n' in r.body
    assert counts["built"] == 1


def test_empty_user_agent_falls_back_to_curl():
    (r,), counts, _ = fetch_all([("http://site.test/", [])], user_agent="")
    assert r.request_head == r.body
    assert counts["debug_stream"] == 1


def test_request_head_builder_layout():
    head = request_head("http://h.test:8080/a?b=1#f", b"User-Agent: x\r\n", [b"Accept-Encoding: gzip"])
    assert head == (b"GET /a?b=1 HTTP/1.1\r\nHost: h.test:8080\r\nUser-Agent: x\r\nAccept: */*\r\n"
                    b"Accept-Encoding: gzip\r\n\r\n")
    assert request_head("https://h.test:443", b"", []).startswith(b"GET / HTTP/1.1\r\nHost: h.test\r\n")
    for odd in ("http://u@h.test/", "http://h.test:0/", "http://h.test:08/", "http://h.test:99999/",
                "http://h.test/\u00e9", "http://h.test/a b", "ftp://h.test/", "HTTP://h.test/", "http://h.test/%zz"):
        assert request_head(odd, b"", []) is None, odd
