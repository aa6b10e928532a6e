"""HTTP/1.1 heads as bytes: the request head curl sends, and the response head it received.

The request head. The fetcher sets every header curl sends, so for an ordinary URL
(:func:`request_head`) it writes the head itself and ``CURLINFO_REQUEST_SIZE`` confirms that curl
sent exactly that many bytes; a URL or header not modelled here exactly (userinfo, unusual
characters, headers curl manages: :data:`CURL_MANAGED`, names that are not tokens) switches that
one transfer to curl's debug stream, which reports the head as sent
(:class:`crawlerd.fetch.curl.Fetcher`).

The response head. curl hands every header line of the exchange, 1xx interim heads included;
:func:`final_head` keeps the last head, :func:`status_of` reads its status code and
:func:`parse_headers` its fields.
"""

from __future__ import annotations

import re

# An ordinary absolute URL whose request line and Host header curl sends exactly as written
# (checked byte for byte against curl's debug stream in tests/fetch/test_curl_head.py): lowercase
# http(s) scheme, no userinfo, a plain host name or IPv4 literal, a port without leading zeros, RFC
# 3986 pchars in the path and query with well-formed %-escapes. Anything else goes the debug way.
_PCHARS = r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/]|%[0-9A-Fa-f]{2})"
_SIMPLE_URL = re.compile(
    r"(https?)://([A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*)(?::([1-9][0-9]{0,4}))?"
    rf"(/{_PCHARS}*)?((?:\?(?:{_PCHARS}|\?)+)?)(?:#.*)?\Z", re.S)
_DEFAULT_PORT = {"http": 80, "https": 443}
# Request headers curl writes or rewrites itself: a request naming one is not built by us.
CURL_MANAGED = frozenset({"host", "user-agent", "accept", "authorization", "cookie", "range", "referer", "te",
                          "connection", "content-length", "content-type", "transfer-encoding", "expect",
                          "proxy-authorization", "proxy-connection", "upgrade", "http2-settings"})
# An RFC 9110 §5.6.2 token: a head we build names only such fields.
HEADER_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")


def status_of(line: bytes) -> int:
    parts = line.split(None, 2)
    if len(parts) >= 2 and parts[1].isdigit():
        return int(parts[1])
    return 0


def final_head(raw: bytes) -> bytes:
    """The last response head in ``raw`` (every header line curl saw): 1xx interim heads dropped
    (RFC 9110 §15.2), cut after its blank line."""
    k = raw.rfind(b"\nHTTP/")                        # a header line can never contain "\n"
    if k >= 0:
        raw = raw[k + 1:]
    end = raw.find(b"\n\r\n")
    end2 = raw.find(b"\n\n")
    if end2 >= 0 and (end < 0 or end2 < end):
        return raw[:end2 + 2]
    return raw[:end + 3] if end >= 0 else raw


def parse_headers(head: bytes) -> list[tuple[str, str]]:
    """Header fields of one head (status line first), in order; obs-fold lines join the previous value."""
    out: list[tuple[str, str]] = []
    lines = head.decode("latin-1").split("\n")
    for line in lines[1:]:
        if line[:1] in (" ", "\t"):
            if out:
                k, v = out[-1]
                out[-1] = (k, f"{v} {line.strip()}")
            continue
        name, sep, value = line.partition(":")
        if sep:
            out.append((name.strip(), value.strip()))
        elif not line.strip():
            break
    return out


def request_head(url: str, ua_line: bytes, extra: list[bytes]) -> bytes | None:
    """The request head curl sends for ``url`` with our headers, or None when we do not model it exactly.

    curl's order (lib/http.c): request line, Host, User-Agent, Accept (curl's default */*), then the
    custom headers in the order given, then the blank line.
    """
    m = _SIMPLE_URL.match(url)
    if m is None:
        return None
    scheme, host, port, path, query = m.groups()
    if port is not None and int(port) != _DEFAULT_PORT[scheme]:
        if int(port) > 65535:
            return None
        host = f"{host}:{port}"
    target = f"{path or '/'}{query}"
    parts = [f"GET {target} HTTP/1.1\r\nHost: {host}\r\n".encode("ascii"), ua_line, b"Accept: */*\r\n"]
    for line in extra:
        parts.append(line)
        parts.append(b"\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)
