"""URL normalisation: resolve a reference, give one resource one spelling and one fingerprint.

Every URL that enters the crawl passes :func:`normalize` first, so one resource
has one spelling, one :func:`fingerprint` (the DRUM key) and one host key (the
politeness key, ``crawlerd.url.hosts``, whose helpers expect a URL that
``normalize`` returned).

Normalisation is the *safe* set of RFC 3986 §6.2.2 plus the parsing rules
browsers apply to http(s) links (WHATWG URL Standard, "basic URL parser"), so
that we request what a browser would request:

- leading/trailing C0 controls and spaces are stripped; tab, CR and LF are
  removed anywhere (WHATWG);
- the reference is resolved against ``base`` (RFC 3986 §5.2.2; as in its
  non-strict mode and in browsers, ``http:path`` with an ``http`` base is
  relative). A backslash counts as a slash before the query, and any run of
  slashes after ``http:`` introduces the authority (WHATWG special schemes);
- scheme and host are lowercased; a non-ASCII host is mapped with UTS #46
  (non-transitional, as browsers do) and punycoded; numeric IPv4 spellings
  (``0x7f.1``) become dotted quads; one trailing dot of a host is removed;
  IPv6 literals keep their brackets in RFC 5952 form, except IPv4-mapped
  ones (``[::ffff:127.0.0.1]``), which become their IPv4 host;
- userinfo is dropped: credentials found in a page must never be stored in
  the frontier, logs or WARC files, nor used to log in, and ``u@host`` and
  ``host`` name the same resource, so they must share one fingerprint;
- the default port (80 for http, 443 for https) and an empty port are removed;
  ports outside 1..65535 make the URL invalid;
- an empty path becomes ``/``; dot segments are removed (§5.2.4); empty
  segments (``//``) are kept: servers may treat them differently;
- percent-encoding: hex digits uppercased, ``%XX`` of an unreserved character
  decoded (§6.2.2.2), a ``%`` not followed by two hex digits becomes ``%25``,
  and every character outside the component's allowed set (space, ``"<>\\^`{|}[]``,
  controls, non-ASCII as UTF-8) is encoded, so the result is pure ASCII;
- the query keeps its order; an empty query (a bare trailing ``?``) is removed:
  servers do not tell ``/p?`` from ``/p``, and keeping both would fetch twice;
- the fragment is removed: it is never sent to the server.

Anything that is not an absolute http(s) URL after resolution (``mailto:``,
``javascript:``, ``data:``, no host, a bad host or port) gives ``None``;
``normalize`` never raises on garbage.
"""

from __future__ import annotations

import ipaddress
import re
from functools import lru_cache
from typing import NamedTuple
from urllib.parse import unquote

import idna
import xxhash

__all__ = [
    "MAX_INPUT_CHARS", "DEFAULT_PORTS", "PATH_CHARS", "QUERY_CHARS", "BaseUrl", "normalize",
    "normalize_authority", "parse_base", "fingerprint", "remove_dot_segments",
]

# Longer inputs are refused outright: bounds the work done per hostile href. The
# crawl-wide length limit (fetch.max_url_length) is applied to the result by the caller.
MAX_INPUT_CHARS = 16384
DEFAULT_PORTS = {"http": 80, "https": 443}

_STRIP = "".join(chr(i) for i in range(0x21))          # C0 controls and space
_TAB_NL = str.maketrans("", "", "\t\n\r")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):")
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
# RFC 3986 §3.3 pchar plus "/" (path) and §3.4 "/" "?" (query), without "%".
# (Regex character-class bodies; exported for fast paths that must agree with normalize.)
PATH_CHARS = r"A-Za-z0-9\-._~!$&'()*+,;=:@/"
QUERY_CHARS = PATH_CHARS + "?"
_PATH_CLEAN = re.compile(f"[{PATH_CHARS}]*")
_QUERY_CLEAN = re.compile(f"[{QUERY_CHARS}]*")
_PATH_FIX = re.compile(f"%([0-9A-Fa-f]{{2}})|[^{PATH_CHARS}]")
_QUERY_FIX = re.compile(f"%([0-9A-Fa-f]{{2}})|[^{QUERY_CHARS}]")
_HOST_OK = re.compile(r"[a-z0-9_\-]+(?:\.[a-z0-9_\-]+)*")
_HEX = frozenset("0123456789abcdefABCDEF")
_TWO_SLASHES = ("//", "\\\\", "/\\", "\\/")    # a backslash is a slash in http(s) (WHATWG)


def _pct_repl(m: re.Match) -> str:
    hx = m.group(1)
    if hx is not None:
        c = chr(int(hx, 16))
        return c if c in _UNRESERVED else "%" + hx.upper()
    return "".join(f"%{b:02X}" for b in m.group().encode("utf-8", "surrogatepass"))


def remove_dot_segments(path: str) -> str:
    """RFC 3986 §5.2.4 for an absolute path (starts with "/")."""
    if "/." not in path:
        return path
    segs = path.split("/")
    out: list[str] = []
    for seg in segs[1:]:
        if seg == "..":
            if out:
                out.pop()
        elif seg != ".":
            out.append(seg)
    if segs[-1] in (".", ".."):
        out.append("")          # "/a/b/.." -> "/a/": the last step names a directory
    return "/" + "/".join(out)


def _assemble(scheme: str, netloc: str, path: str, query: str | None) -> str:
    if not _PATH_CLEAN.fullmatch(path):
        path = _PATH_FIX.sub(_pct_repl, path)
    if not path:
        path = "/"
    elif path[0] != "/":
        path = "/" + path
    path = remove_dot_segments(path)
    if query:
        if not _QUERY_CLEAN.fullmatch(query):
            query = _QUERY_FIX.sub(_pct_repl, query)
        return f"{scheme}://{netloc}{path}?{query}"
    return f"{scheme}://{netloc}{path}"


def _ipv4_number(part: str) -> int | None:
    if part[:2] in ("0x", "0X"):
        digits, radix = part[2:], 16
        if not digits:
            return 0
    elif len(part) > 1 and part[0] == "0":
        digits, radix = part[1:], 8
    else:
        digits, radix = part, 10
    if not digits.isascii() or not digits.isalnum() or len(digits) > 12:
        return None
    try:
        return int(digits, radix)
    except ValueError:
        return None


def _ipv4(labels: list[str]) -> str | None:
    """WHATWG IPv4 parser: 1-4 decimal/octal/hex parts, the last filling the remaining bytes."""
    if len(labels) > 4:
        return None
    nums = []
    for part in labels:
        if not part:
            return None
        n = _ipv4_number(part)
        if n is None:
            return None
        nums.append(n)
    if any(n > 255 for n in nums[:-1]) or nums[-1] >= 256 ** (5 - len(nums)):
        return None
    value = nums[-1]
    for i, n in enumerate(nums[:-1]):
        value += n << (8 * (3 - i))
    return str(ipaddress.IPv4Address(value))


def _ipv6_text(packed: bytes) -> str:
    """RFC 5952 §4 text form, all hex (embedded IPv4 is not dotted, as in the WHATWG serializer).

    Written out because ``ipaddress``'s own form of IPv4-mapped addresses changed
    between Python versions, and a fingerprint must not.
    """
    groups = [int.from_bytes(packed[i:i + 2], "big") for i in range(0, 16, 2)]
    best_at, best_len, i = -1, 1, 0
    while i < 8:                         # longest run of >= 2 zero groups, first on a tie
        if groups[i] == 0:
            j = i
            while j < 8 and groups[j] == 0:
                j += 1
            if j - i > best_len:
                best_at, best_len = i, j - i
            i = j
        else:
            i += 1
    hexes = [f"{g:x}" for g in groups]
    if best_at < 0:
        return ":".join(hexes)
    return ":".join(hexes[:best_at]) + "::" + ":".join(hexes[best_at + best_len:])


def _ends_in_number(label: str) -> bool:
    if label.isascii() and label.isdigit():
        return True
    return label[:2] in ("0x", "0X") and all(c in _HEX for c in label[2:])


def _idna_host(host: str) -> str | None:
    """UTS #46 non-transitional mapping, then punycode per label (browsers' ToASCII)."""
    try:
        mapped = idna.uts46_remap(host, std3_rules=False, transitional=False)
    except (idna.IDNAError, ValueError):
        return None
    labels = []
    for label in mapped.split("."):
        if label.isascii():
            labels.append(label)
        else:
            try:
                labels.append("xn--" + label.encode("punycode").decode("ascii"))
            except UnicodeError:
                return None
    return ".".join(labels)


def _valid_a_label(label: str) -> bool:
    try:
        label[4:].encode("ascii").decode("punycode")
    except (UnicodeError, IndexError, ValueError, OverflowError):
        return False
    return True


def _norm_host(host: str) -> str | None:
    if "%" in host:
        try:
            host = unquote(host, errors="strict")
        except UnicodeError:
            return None
    if len(host) > 1024:
        return None
    host = host.lower() if host.isascii() else _idna_host(host)
    if host is None:
        return None
    if host.endswith("."):
        host = host[:-1]
    if not host or len(host) > 253:
        return None
    labels = host.split(".")
    if _ends_in_number(labels[-1]):
        return _ipv4(labels)
    if not _HOST_OK.fullmatch(host):
        return None
    for label in labels:
        if len(label) > 63 or (label.startswith("xn--") and not _valid_a_label(label)):
            return None
    return host


@lru_cache(maxsize=1 << 16)
def normalize_authority(scheme: str, authority: str) -> str | None:
    """Normalised ``host[:port]`` of a raw authority, or None when it is not a valid http(s) one.

    Cached per process (LRU, 65,536 entries): pages link to the same few hosts, so
    IDNA, IP parsing and validation run once per distinct spelling.
    """
    at = authority.rfind("@")
    if at >= 0:
        authority = authority[at + 1:]          # userinfo dropped (module docstring)
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            return None
        literal, rest = authority[1:end], authority[end + 1:]
        if (rest and rest[0] != ":") or "%" in literal or not literal.isascii():
            return None
        try:
            addr = ipaddress.IPv6Address(literal)
        except ValueError:
            return None
        # ::ffff:a.b.c.d is the IPv4 host a.b.c.d (RFC 4291 §2.5.5.2): one host, one IP, one politeness key
        mapped = addr.ipv4_mapped
        host = str(mapped) if mapped is not None else f"[{_ipv6_text(addr.packed)}]"
        port_s = rest[1:] if rest else ""
    else:
        raw_host, _, port_s = authority.partition(":")
        host = _norm_host(raw_host)
        if host is None:
            return None
    if not port_s:
        return host
    port_s = port_s.lstrip("0") or "0"
    if not (port_s.isascii() and port_s.isdigit()) or len(port_s) > 5:
        return None
    port = int(port_s)
    if not 0 < port <= 65535:
        return None
    return host if port == DEFAULT_PORTS[scheme] else f"{host}:{port}"


class BaseUrl(NamedTuple):
    """A parsed base URL, every part already normalised: what resolving a relative reference needs."""
    scheme: str
    netloc: str
    path: str
    query: str | None
    dir: str            # path up to and including its last "/" (RFC 3986 §5.2.3 merge)


@lru_cache(maxsize=1024)
def parse_base(base: str) -> BaseUrl | None:
    """Normalise and split a base URL (cached: one page resolves many links against one base)."""
    url = normalize(base)
    if url is None:
        return None
    scheme, _, rest = url.partition("://")
    slash = rest.find("/")
    netloc, pathq = rest[:slash], rest[slash:]
    path, qmark, query = pathq.partition("?")
    return BaseUrl(scheme, netloc, path, query if qmark else None, path[: path.rfind("/") + 1])


def _absolute(scheme: str, rest: str) -> str | None:
    """``rest`` is what follows ``scheme:`` and its slashes: authority, path, query."""
    end = len(rest)
    for sep in "/?\\":
        i = rest.find(sep)
        if 0 <= i < end:
            end = i
    netloc = normalize_authority(scheme, rest[:end])
    if netloc is None:
        return None
    path, qmark, query = rest[end:].partition("?")
    return _assemble(scheme, netloc, path.replace("\\", "/"), query if qmark else None)


def _relative(ref: str, b: BaseUrl) -> str | None:
    if ref[:2] in _TWO_SLASHES:          # network-path reference
        return _absolute(b.scheme, ref.lstrip("/\\"))
    path, qmark, query = ref.partition("?")
    path = path.replace("\\", "/")
    if not path:
        return _assemble(b.scheme, b.netloc, b.path, query if qmark else b.query)
    if path[0] != "/":
        path = b.dir + path
    return _assemble(b.scheme, b.netloc, path, query if qmark else None)


def normalize(url: str, base: str | None = None) -> str | None:
    """Absolute normalised http(s) URL for ``url`` resolved against ``base``, or None.

    See the module docstring for the rules. The result is ASCII and
    ``normalize(normalize(u)) == normalize(u)``.
    """
    if not isinstance(url, str) or len(url) > MAX_INPUT_CHARS:
        return None
    s = url.strip(_STRIP)
    if "\t" in s or "\n" in s or "\r" in s:
        s = s.translate(_TAB_NL)
    hash_at = s.find("#")
    if hash_at >= 0:
        s = s[:hash_at]
    m = _SCHEME.match(s)
    if m is not None:
        scheme = m.group(1).lower()
        if scheme not in DEFAULT_PORTS:
            return None
        rest = s[m.end():]
        if isinstance(base, str) and rest[:2] not in _TWO_SLASHES:
            b = parse_base(base)
            if b is not None and b.scheme == scheme:
                return _relative(rest, b)           # "http:x", "http:/x" against an http base
        return _absolute(scheme, rest.lstrip("/\\"))
    if not isinstance(base, str):
        return None
    b = parse_base(base)
    if b is None:
        return None
    return _relative(s, b)


def fingerprint(url: str) -> int:
    """64-bit unsigned fingerprint (xxh3_64) of a URL as given: pass ``normalize``'s result."""
    return xxhash.xxh3_64_intdigest(url.encode("utf-8", "surrogatepass"))
