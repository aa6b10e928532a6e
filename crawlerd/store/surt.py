"""SURT keys for CDXJ: the canonical form the Wayback family (pywb, OutbackCDX) looks captures up by.

``http://www.Example.com:80/A/?b=2&a=1#x`` -> ``com,example)/a?a=1&b=2``. The key is
the one the ``surt`` package (Internet Archive's ``WaybackURLKeyMaker``, used by
cdxj-indexer and pywb) makes with its defaults, step for step, so our indexes
and theirs agree line for line (a test compares the two on generated URLs):

1. Parse: surrounding whitespace and every CR, LF, TAB removed; ``http://`` added
   when there is no scheme; ``http://https://x`` read as ``https://x``; user
   info dropped; an empty authority (``http:///host/p``) takes the host from the path.
2. Google-style canonicalisation: the fragment dropped; host, path and query
   percent-decoded until nothing changes, then percent-encoded once (everything
   outside printable ASCII, plus space, ``#`` and ``%``); a non-ASCII host to
   IDNA (2003); ``..`` in the host to ``.``, dots at its ends stripped; a numeric
   host (``2130706433``, ``0177.1``) to its dotted quad; dot segments removed
   from the path and repeated slashes collapsed (RFC 3986 §5.2.4).
3. Archive canonicalisation: ``www``, ``www2``, ... prefix dropped; the scheme's
   default port dropped; path and query lower-cased; the session ids Wayback
   knows (``jsessionid``, ``phpsessid``, ``sid``, ``aspsessionid``, ``cfid/cftoken``,
   ASP.NET path ids) removed; a trailing ``/`` dropped unless the path is ``/``;
   query arguments sorted by (name, value); an empty query dropped.
4. Key: host labels reversed and joined by ``,`` (an IPv4 address is reversed
   too: ``127.0.0.1`` -> ``1,0,0,127``), ``:port`` if kept, ``)``, path, ``?query``.

A URL the parser cannot take (a bad port) keys as itself, as cdxj-indexer does.

Most URLs a crawl archives are already plain (lower-case host, no escapes, no dot
segments, no session ids): :func:`surt` keys those without the general steps, to the
same key (a test compares both with the ``surt`` package on generated plain URLs).
"""

from __future__ import annotations

import re
import socket
from urllib.parse import SplitResultBytes, quote_from_bytes, unquote_to_bytes

__all__ = ["surt"]

_MULTIPLE_PROTOCOLS = re.compile(rb"^(https?://)+")
_HAS_SCHEME = re.compile(rb"^([a-zA-Z][a-zA-Z0-9+\-.]*):")
_CR_LF_TAB = re.compile(rb"[\n\r\t]")
# RFC 3986 appendix B, extended to a bare fragment; the scheme limited to scheme characters.
_URI = re.compile(rb"^(([a-zA-Z][a-zA-Z0-9+.-]*):)?((//([^/?#]*))?([^?#]*)(\?([^#]*))?)?(#(.*))?$", re.S)
_WWW = re.compile(rb"www\d*\.")
_OCTAL_IP = re.compile(rb"^(0[0-7]*)(\.[0-7]+)?(\.[0-7]+)?(\.[0-7]+)?$")
_DECIMAL_IP = re.compile(rb"^([1-9][0-9]*)(\.[0-9]+)?(\.[0-9]+)?(\.[0-9]+)?$")
# printable ASCII that stays as it is when escaping (with letters, digits and _.-~)
_SAFE = b"!\"$&'()*+,-./:;<=>?@[\\]^_`{|}~"
_PATH_SESSION_IDS = (
    re.compile(rb"^(.*/)(\((?:[a-z]\([0-9a-z]{24}\))+\)/)([^?]+\.aspx.*)$", re.I | re.S),
    re.compile(rb"^(.*/)(\([0-9a-z]{24}\)/)([^?]+\.aspx.*)$", re.I | re.S),
)
_QUERY_SESSION_IDS = tuple(re.compile(p, re.I | re.S) for p in (
    rb"^(.*)(?:jsessionid=[0-9a-zA-Z]{32})(?:&(.*))?$",
    rb"^(.*)(?:phpsessid=[0-9a-zA-Z]{32})(?:&(.*))?$",
    rb"^(.*)(?:sid=[0-9a-zA-Z]{32})(?:&(.*))?$",
    rb"^(.*)(?:ASPSESSIONID[a-zA-Z]{8}=[a-zA-Z]{24})(?:&(.*))?$",
    rb"^(.*)(?:cfid=[^&]+&cftoken=[^&]+)(?:&(.*))?$",
))
_DEFAULT_PORT = {b"http": 80, b"https": 443}
# A plain URL: http(s), a lower-case ASCII host, a port of digits, a path of non-empty segments
# and a query, both of characters that no step changes but case (no "%", "#", "(", space).
_PLAIN = re.compile(r"(https?)://([a-z0-9\-]+(?:\.[a-z0-9\-]+)*)(?::([0-9]{1,5}))?"
                    r"((?:/[A-Za-z0-9\-._~!$&'*+,;=:@]+)*/?)(?:\?([A-Za-z0-9\-._~!$&'*+,;=:@/?]+))?")
_PLAIN_PORT = {"http": 80, "https": 443}
_WWW_STR = re.compile(r"www\d*\.", re.A)


def surt(url: str) -> str:
    """The SURT key of ``url`` (see the module docstring); ``-`` for an empty URL."""
    if not url:
        return "-"
    m = _PLAIN.fullmatch(url)
    if m is not None and "/." not in m.group(4):      # no dot segments either
        key = _plain_key(*m.groups())
        if key is not None:
            return key
    try:
        raw = url.encode("utf-8")
        if raw.startswith(b"filedesc"):
            return url
        return _key(raw).decode("utf-8")
    except (ValueError, AttributeError, UnicodeError, OSError):
        return url


def _plain_key(scheme: str, host: str, port: str | None, path: str, query: str | None) -> str | None:
    """The key of a URL that matched ``_PLAIN``: the steps of ``_key`` that can change it; None
    when it needs the general path after all (a numeric host, a bad port, a session id)."""
    if not host.strip("0123456789."):
        return None                         # all digits and dots: a numeric IPv4 spelling
    if port is not None:
        port_no = int(port)
        if port_no > 65535:
            return None
        port = f":{port_no}" if port_no and port_no != _PLAIN_PORT[scheme] else ""
    w = _WWW_STR.match(host)
    if w:
        host = host[w.end():]
    labels = host.split(".")
    labels.reverse()
    path = path.lower() if path else "/"
    if len(path) > 1 and path[-1] == "/":
        path = path[:-1]
    if query is not None:
        query = query.lower()
        if "sid" in query or "session" in query or "cfid" in query:
            return None                     # perhaps a session id: the general path removes it
        query = "?" + _sorted_query(query.encode("ascii")).decode("ascii")
    return f"{','.join(labels)}{port or ''}){path}{query or ''}"


def _unescape(value: bytes) -> bytes:
    while True:
        out = unquote_to_bytes(value)
        if out == value:
            return value
        value = out


def _escape(value: bytes) -> bytes:
    return quote_from_bytes(value, safe=_SAFE).encode("ascii") if value else value


def _dotted_quad(host: bytes) -> bytes | None:
    """A numeric host as an IPv4 address (inet_aton's forms, RFC 3493 §6.1), else None."""
    if host.isdigit():
        return socket.inet_ntoa((int(host) & 0xFFFFFFFF).to_bytes(4, "big")).encode("ascii")
    if _DECIMAL_IP.match(host) or _OCTAL_IP.match(host):
        try:
            return socket.inet_ntoa(socket.inet_aton(host.decode("ascii"))).encode("ascii")
        except OSError:
            return None
    return None


def _normalize_path(path: bytes | None) -> bytes:
    """Dot segments removed and empty segments dropped (a trailing ``/`` kept)."""
    if not path:
        return b"/"
    kept: list[bytes] = []
    for seg in path.split(b"/")[1:]:
        if seg == b".":
            continue
        if seg == b"..":
            if kept:
                kept.pop()
            else:
                kept.append(seg)
        else:
            kept.append(seg)
    if not kept:
        return b"/"
    return b"/" + b"".join(p + b"/" for p in kept[:-1] if p) + kept[-1]


def _sorted_query(query: bytes) -> bytes:
    if len(query) <= 1:
        return query
    args = sorted(tuple(arg.split(b"=", 1)) for arg in query.split(b"&"))
    return b"&".join(b"=".join(a) for a in args)


def _key(url: bytes) -> bytes:
    # 1. parse
    url = _CR_LF_TAB.sub(b"", url.strip())
    if url and not _HAS_SCHEME.match(url):
        url = b"http://" + url
    url = _MULTIPLE_PROTOCOLS.sub(lambda m: m.group(1), url)
    m = _URI.match(url)
    scheme = m.group(2) or None
    netloc = (m.group(5) or b"").rstrip(b":")
    parts = SplitResultBytes(m.group(2) or b"", netloc, m.group(6) or b"", m.group(8) or b"", b"")
    query = m.group(8) or None
    port = parts.port or None              # ValueError for a bad port: the URL keys as itself
    host = parts.hostname or None
    path = m.group(6) or None
    if scheme.startswith(b"http") and host is None and path is not None:
        host, _, rest = path.lstrip(b"/").partition(b"/")
        path = b"/" + rest
    # 2. Google-style canonicalisation
    if query:
        query = _escape(_unescape(query))
    if host:
        host = _unescape(host)
        try:
            host.decode("ascii")
        except UnicodeDecodeError:
            try:
                host = host.decode("utf-8", "ignore").encode("idna")
            except ValueError:
                pass
        host = host.replace(b"..", b".").strip(b".")
        host = _dotted_quad(host) or _escape(host.lower())
    path = _unescape(path) if path is not None else None
    if host:
        path = _normalize_path(path)
    path = _escape(path)
    # 3. archive canonicalisation
    if host:
        host = host.lower()
        if scheme != b"dns" and (w := _WWW.match(host)):
            host = host[w.end():]
    if port is not None and port == _DEFAULT_PORT.get(scheme.lower(), 0):
        port = None
    if path:
        path = path.lower()
        for pat in _PATH_SESSION_IDS:
            if sm := pat.match(path):
                path = sm.group(1) + sm.group(3)
        if path.endswith(b"/") and len(path) > 1:
            path = path[:-1]
    if query:
        for pat in _QUERY_SESSION_IDS:
            if qm := pat.match(query):
                query = qm.group(1) + qm.group(2) if qm.group(2) else qm.group(1)
        query = _sorted_query(query.lower()) or None   # a trailing "?" alone is dropped too
    # 4. the key
    if host:
        out = b",".join(reversed(host.split(b".")))
        if port is not None:
            out += b":%d" % port
        out += b")"
    else:
        out = scheme + b":"
    if path:
        out += path
    elif query is not None:
        out += b"/"
    if query is not None:
        out += b"?" + query
    return out
