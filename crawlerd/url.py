"""URLs: resolve, normalise, fingerprint, host keys, registered domains, trap filters.

Every URL that enters the crawl passes :func:`normalize` first, so one resource
has one spelling, one :func:`fingerprint` (the DRUM key) and one
:func:`host_key` (the politeness key). The helpers below it (``host_key``,
``host_of``, ``port_of``) expect a URL that ``normalize`` returned.

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
from collections import Counter, OrderedDict
from functools import lru_cache
from typing import NamedTuple
from urllib.parse import unquote

import idna
import xxhash
from publicsuffixlist import PublicSuffixList

__all__ = [
    "MAX_INPUT_CHARS", "DEFAULT_PORTS", "PATH_CHARS", "QUERY_CHARS", "BaseUrl", "normalize",
    "normalize_authority", "parse_base", "fingerprint", "host_key", "host_of", "port_of",
    "registered_domain", "UrlFilter",
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


def _remove_dot_segments(path: str) -> str:
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
    path = _remove_dot_segments(path)
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


def _netloc(url: str) -> str:
    start = url.find("://")
    if start < 0 or url[:start] not in DEFAULT_PORTS:
        raise ValueError(f"not a normalised http(s) URL: {url!r}")
    start += 3
    end = url.find("/", start)
    return url[start:] if end < 0 else url[start:end]


def host_key(url: str) -> str:
    """``scheme://host[:port]`` of a normalised URL: the politeness key (one queue per key)."""
    start = url.find("://")
    end = url.find("/", start + 3) if start >= 0 else -1
    if start < 0 or url[:start] not in DEFAULT_PORTS:
        raise ValueError(f"not a normalised http(s) URL: {url!r}")
    return url if end < 0 else url[:end]


def host_of(url: str) -> str:
    """Host of a normalised URL, without port; an IPv6 literal without its brackets (for DNS)."""
    netloc = _netloc(url)
    if netloc.startswith("["):
        return netloc[1:netloc.index("]")]
    return netloc.partition(":")[0]


def port_of(url: str) -> int:
    """TCP port of a normalised URL: the explicit one, else 80/443 by scheme."""
    netloc = _netloc(url)
    tail = netloc[netloc.index("]") + 1:] if netloc.startswith("[") else netloc
    _, colon, port = tail.partition(":")
    return int(port) if colon else DEFAULT_PORTS[url[:url.index(":")]]


_PSL: PublicSuffixList | None = None


@lru_cache(maxsize=1 << 16)
def registered_domain(host: str) -> str:
    """Registrable domain (public suffix + one label) of a host; IPs and suffixes return themselves.

    Uses the list bundled with ``publicsuffixlist`` (offline), private section
    included, so ``alice.github.io`` is its own domain: its owner differs from
    ``bob.github.io``'s, and per-domain budgets follow owners.
    """
    global _PSL
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(bare)
        return host
    except ValueError:
        pass
    if _PSL is None:
        _PSL = PublicSuffixList()
    return _PSL.privatesuffix(host.lower()) or host.lower()



def shard_of(host: str, shards: int) -> int:
    """The crawl shard that owns ``host``: xxh3_64 of its registered domain, mod ``shards``.

    The one partition function of the crawl (seeds, sitemap entries, redirects, outlinks,
    ``seed add``, the hand-off): a registered domain's hosts, their politeness, robots and
    budget all live in one shard. ``shards`` is fixed for the life of a crawl (``crawl.json``).
    """
    if shards == 1:
        return 0
    return _domain_hash(host) % shards


@lru_cache(maxsize=1 << 16)
def _domain_hash(host: str) -> int:
    return xxhash.xxh3_64_intdigest(registered_domain(host).encode("utf-8", "surrogateescape"))


def shard_of_url(url: str, shards: int) -> int:
    """``shard_of`` the host of a normalised URL."""
    return 0 if shards == 1 else shard_of(host_of(url), shards)

# Drop reasons of UrlFilter.check, counted in UrlFilter.drops.
URL_TOO_LONG = "url_too_long"
PATH_TOO_DEEP = "path_too_deep"
REPEATED_SEGMENTS = "repeated_segments"
TOO_MANY_PARAMS = "too_many_params"
PARAM_VALUES = "param_values"


def _has_repeated_run(segs: list[str], max_repeats: int) -> bool:
    """True when some run of 1+ consecutive segments occurs more than ``max_repeats`` times in a row."""
    n = len(segs)
    if len(set(segs)) == n:
        return False
    reps = max_repeats + 1
    for size in range(1, n // reps + 1):
        for start in range(0, n - size * reps + 1):
            run = segs[start:start + size]
            if all(segs[start + k * size:start + (k + 1) * size] == run for k in range(1, reps)):
                return True
    return False


class _HostParams:
    """One host's query-parameter patterns: (path, name) -> set of hash(value) seen, each set <= cap."""

    __slots__ = ("patterns", "values")

    def __init__(self) -> None:
        self.patterns: dict[tuple[str, str], set[int]] = {}
        self.values = 0         # sum of the set sizes: the memory this host holds


class UrlFilter:
    """Crawler-trap defences applied to normalised URLs before they are queued.

    ``check(url)`` returns a drop reason (one of the module's reason strings) or
    None, and counts drops by reason in ``drops``. Checks: URL length, path
    depth, a run of path segments repeated more than ``max_repeated_segments``
    times in a row (``/a/b/a/b/a/b/``: relative-link loops), too many query
    parameters, and per host a cap on distinct values of one parameter at one
    path (calendars, session ids: IRLbot §5 discusses such infinite spaces).

    State: ``host -> _HostParams`` in LRU order. Invariant: the total number of
    remembered values is at most ``max_tracked_values`` and at most
    ``max_hosts`` hosts are kept; the least recently checked host is forgotten
    first (it then starts counting afresh, so memory stays bounded and a
    forgotten trap costs at most another ``max_param_values`` URLs).
    """

    def __init__(self, *, max_url_length: int = 2048, max_path_depth: int = 32,
                 max_repeated_segments: int = 2, max_query_params: int = 20,
                 max_param_values: int = 1000, max_hosts: int = 4096,
                 max_tracked_values: int = 500_000):
        if min(max_url_length, max_path_depth, max_repeated_segments, max_query_params,
               max_param_values, max_hosts, max_tracked_values) < 1:
            raise ValueError("UrlFilter limits must be >= 1")
        self.max_url_length = max_url_length
        self.max_path_depth = max_path_depth
        self.max_repeated_segments = max_repeated_segments
        self.max_query_params = max_query_params
        self.max_param_values = max_param_values
        self.max_hosts = max_hosts
        self.max_tracked_values = max_tracked_values
        self.drops: Counter[str] = Counter()
        self._hosts: OrderedDict[str, _HostParams] = OrderedDict()
        self._tracked = 0

    @property
    def tracked_values(self) -> int:
        return self._tracked

    @property
    def tracked_hosts(self) -> int:
        return len(self._hosts)

    def check(self, url: str) -> str | None:
        reason = self._reason(url)
        if reason is not None:
            self.drops[reason] += 1
        return reason

    def peek(self, url: str) -> str | None:
        """The reason ``check`` would drop ``url`` now, without counting it or remembering its values."""
        return self._reason(url, record=False)

    def _reason(self, url: str, record: bool = True) -> str | None:
        if len(url) > self.max_url_length:
            return URL_TOO_LONG
        key = host_key(url)
        path, _, query = url[len(key):].partition("?")
        segs = [s for s in path.split("/") if s]
        if len(segs) > self.max_path_depth:
            return PATH_TOO_DEEP
        if len(segs) > self.max_repeated_segments and _has_repeated_run(segs, self.max_repeated_segments):
            return REPEATED_SEGMENTS
        if not query:
            return None
        params = [p.partition("=") for p in query.split("&") if p]
        if len(params) > self.max_query_params:
            return TOO_MANY_PARAMS
        return self._count_values(key, path, params, record)

    def _count_values(self, key: str, path: str, params: list[tuple[str, str, str]], record: bool) -> str | None:
        state = self._hosts.get(key)
        if not record:
            for name, _, value in params if state is not None else ():
                seen = state.patterns.get((path, name))
                if seen is not None and hash(value) not in seen and len(seen) >= self.max_param_values:
                    return PARAM_VALUES
            return None
        if state is None:
            state = self._hosts[key] = _HostParams()
        else:
            self._hosts.move_to_end(key)
        new: list[tuple[set[int], int]] = []
        for name, _, value in params:
            seen = state.patterns.get((path, name))
            if seen is None:
                seen = state.patterns[(path, name)] = set()
            h = hash(value)
            if h in seen:
                continue
            if len(seen) >= self.max_param_values:
                return PARAM_VALUES
            new.append((seen, h))
        for seen, h in new:       # only a URL that passes consumes value slots
            if h not in seen:
                seen.add(h)
                state.values += 1
                self._tracked += 1
        self._evict(keep=key)
        return None

    def _evict(self, keep: str) -> None:
        while self._hosts and (self._tracked > self.max_tracked_values or len(self._hosts) > self.max_hosts):
            oldest = next(iter(self._hosts))
            if oldest == keep and len(self._hosts) == 1:
                # One host alone over the budget: forget its patterns, keep the entry.
                self._tracked -= self._hosts[oldest].values
                self._hosts[oldest] = _HostParams()
                return
            self._tracked -= self._hosts.pop(oldest).values
