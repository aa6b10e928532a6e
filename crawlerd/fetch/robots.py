"""robots.txt per RFC 9309: parse once, match fast, and decide what a fetch of it means.

Three parts:

- :class:`RobotsRules` parses a body for one product token and answers ``allowed(url)``.
  Only the group that applies to the token is kept (RFC 9309 §2.2.1), its rules precompiled and
  sorted so that the first hit is the most specific match (§2.2.2).
- :func:`robots_decision` maps the result of fetching ``/robots.txt`` to a cache entry or to a
  redirect to follow (§2.3.1), with the clock injected.
- :class:`RobotsCache` keeps entries per host key, bounded, least recently used out first.

Where Google's parser (google/robotstxt) is more lenient than the RFC and the leniency is harmless,
it is followed: a missing colon, partial UTF-8 BOMs, lines cut at 16663 bytes, ``index.html`` rules.
Where it contradicts the RFC (percent-encoded unreserved characters), the RFC wins.
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from dataclasses import dataclass
from enum import StrEnum
from operator import itemgetter

__all__ = [
    "RobotsCache", "RobotsEntry", "RobotsFollow", "RobotsRules", "RobotsState",
    "check_lines", "normalize_path", "path_of", "robots_decision",
]

# Google cuts lines at 2083 * 8 - 1 bytes; we cut at as many characters (same for ASCII).
_MAX_LINE = 2083 * 8 - 1
_UTF8_BOM = b"\xef\xbb\xbf"

_UA, _ALLOW, _DISALLOW, _DELAY, _SITEMAP = range(5)
# Directive names, lower-cased, with the common misspellings Google also accepts.
_DIRECTIVES = {
    "user-agent": _UA, "useragent": _UA, "user agent": _UA,
    "allow": _ALLOW,
    "disallow": _DISALLOW, "dissallow": _DISALLOW, "dissalow": _DISALLOW, "disalow": _DISALLOW,
    "diasllow": _DISALLOW, "disallaw": _DISALLOW,
    "crawl-delay": _DELAY, "crawldelay": _DELAY,
    "sitemap": _SITEMAP, "site-map": _SITEMAP,
}
_SPACES = " \t\v\f"
# RFC 9309 §2.2.1: the product token is [a-zA-Z_-]+; what follows it ("Foo/1.0", "Foo Bar") is not.
_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_-")

# Percent-encoding normalisation, RFC 9309 §2.2.2 with RFC 3986 §2.3: %XX of an unreserved
# character is decoded, any other %XX is upper-cased, and every octet outside printable ASCII
# (non-ASCII as UTF-8, controls, space) is %-encoded. Applied to rules and URLs alike.
# A token is one character that is "%" or outside printable ASCII, and up to two hex digits
# after it (so "%XX" is one token); a single character class keeps the scan fast.
_NORM_TOKEN = re.compile(r"[^\x21-\x24\x26-\x7e][0-9A-Fa-f]{0,2}")
_NORM_TOKEN_LINES = re.compile(r"[^\x21-\x24\x26-\x7e\n][0-9A-Fa-f]{0,2}")     # keeps newlines
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")

# Optional "scheme://" or "//", the authority, then (group 1) path, params and query.
_AFTER_AUTHORITY = re.compile(r"(?:[A-Za-z][A-Za-z0-9+.\-]*://|//)?[^/?;#]*([^#]*)")

# Rule kinds, see _compile_rule.
_PREFIX, _CONTAINS, _SUFFIX, _EXACT, _GLOB = range(5)     # written as literals in allowed()


def _octets(text: str) -> bytes:
    try:
        # surrogateescape gives back the raw bytes of a body that was not valid UTF-8
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def _norm_repl(m: re.Match) -> str:
    token = m.group(0)
    if token[0] == "%":
        if len(token) < 3:
            return token        # a "%" not followed by two hex digits stays literal
        octet = int(token[1:], 16)
        return chr(octet) if octet in _UNRESERVED else token.upper()
    return "".join(f"%{b:02X}" for b in _octets(token[0])) + token[1:]


def _is_canonical(text: str) -> bool:
    """True if normalisation cannot change ``text`` (printable ASCII without "%" or space)."""
    return text.isascii() and "%" not in text and " " not in text and text.isprintable()


def normalize_path(path: str) -> str:
    """Path (and query) in the canonical percent-encoding used for matching (RFC 9309 §2.2.2)."""
    return path if _is_canonical(path) else _NORM_TOKEN.sub(_norm_repl, path)


def path_of(url: str) -> str:
    """Path, params and query of an absolute URL or of a path; "/" when there is none.

    The fragment is dropped. Without a scheme the first segment is taken as the authority
    ("example.com/a" -> "/a"), as google/robotstxt does.
    """
    if url[:1] == "/" and url[1:2] != "/":
        end = url.find("#")
        return url if end < 0 else url[:end]
    rest = _AFTER_AUTHORITY.match(url).group(1)
    if not rest:
        return "/"
    return rest if rest[0] == "/" else "/" + rest


def _compile_rule(pattern: str, allow: bool) -> tuple | None:
    """One normalised pattern as (rank, kind, head, a, b), or None if it can never match.

    rank is 2 * priority + allow: priority is the pattern length in octets (RFC 9309 §2.2.2:
    the match with the most octets wins) and the low bit makes Allow win a tie.

    head is the literal text before the first ``*``. Per kind: _PREFIX and _EXACT use head
    alone; _CONTAINS has one literal piece ``a`` somewhere after head; _SUFFIX has the literal
    ``b`` ending the path; _GLOB has pieces ``a`` found left to right, then ``b`` (maybe empty)
    ending the path. Leftmost-first search is exact for ``*``-only globs, so matching is linear
    and a hostile pattern cannot make it backtrack.
    """
    if not pattern or pattern[0] not in "/*":
        return None      # a path always starts with "/": this rule matches nothing
    rank = 2 * len(pattern) + allow
    anchored = pattern[-1] == "$"
    body = pattern[:-1] if anchored else pattern
    if "*" not in body:
        return (rank, _EXACT if anchored else _PREFIX, body, "", "")
    parts = body.split("*")
    head, rest = parts[0], parts[1:]
    tail = rest.pop() if anchored else ""
    middles = tuple(filter(None, rest))
    if not tail:          # "/a*b*" and "/a*b*$" need only "b" somewhere after "/a"
        if not middles:
            return (rank, _PREFIX, head, "", "")
        if len(middles) == 1:
            return (rank, _CONTAINS, head, middles[0], "")
    elif not middles:
        return (rank, _SUFFIX, head, "", tail)
    return (rank, _GLOB, head, middles, tail)


def _glob_matches(path: str, pos: int, middles: tuple, tail: str) -> bool:
    for piece in middles:
        i = path.find(piece, pos)
        if i < 0:
            return False
        pos = i + len(piece)
    if tail:
        return path.endswith(tail) and len(path) - len(tail) >= pos
    return True


_RANK = itemgetter(0)


class RobotsRules:
    """The rules of one robots.txt that apply to one product token, ready to match.

    Key: none (one instance per host and token; the cache keys it by host).
    Invariant: rules are tuples ``(rank, kind, head, len(head), a, b)`` (see ``_compile_rule``); every rule
    list is sorted by decreasing rank, so the first rule of a list that matches a path is that
    list's best (longest match wins, Allow wins a tie: RFC 9309 §2.2.2). ``_general`` holds the
    rules whose literal head is shorter than ``_KEY_LEN`` and ends at the first rule matching
    every path; ``_buckets[k]`` holds the rules whose head starts with ``k`` (``len(k) ==
    _KEY_LEN``) that outrank that rule. So the rules that can match ``path`` are
    ``_buckets.get(path[:_KEY_LEN])`` and ``_general``. ``_merged[k]`` memoises those two
    lists merged in rank order for a key met by ``allowed`` (at most one entry per key of
    ``_KEY_LEN`` printable characters). Rules never change after construction.
    """

    __slots__ = ("_general", "_buckets", "_merged", "_count", "_crawl_delay", "_sitemaps")

    _KEY_LEN = 3

    def __init__(self, rules: list[tuple] = (), crawl_delay: float | None = None,
                 sitemaps: list[str] = ()) -> None:
        k = self._KEY_LEN
        buckets: dict[str, list] = {}
        general: list[tuple] = []
        floor = -1
        for rank, kind, head, a, b in sorted(set(rules), key=_RANK, reverse=True):
            rule = (rank, kind, head, len(head), a, b)
            if len(head) >= k:
                if rank > floor:
                    bucket = buckets.get(head[:k])
                    if bucket is None:
                        buckets[head[:k]] = [rule]
                    else:
                        bucket.append(rule)
            elif floor < 0:
                general.append(rule)
                if kind == _PREFIX and head in ("", "/"):
                    floor = rank      # matches every path: nothing ranked lower can win
        self._general = tuple(general)
        self._buckets = {key: tuple(lst) for key, lst in buckets.items()}
        self._merged: dict[str, tuple] = {}
        self._count = len(general) + sum(map(len, buckets.values()))
        self._crawl_delay = crawl_delay
        self._sitemaps = tuple(sitemaps)

    @classmethod
    def allow_all(cls) -> RobotsRules:
        return cls()

    @classmethod
    def disallow_all(cls) -> RobotsRules:
        return cls([_compile_rule("/", False)])

    @classmethod
    def parse(cls, body: bytes, agent_token: str, max_bytes: int = 512 * 1024) -> RobotsRules:
        """Parse the first ``max_bytes`` of a robots.txt body for ``agent_token`` (a product token).

        The group whose user-agent matches the token case-insensitively is used, all such groups
        merged (RFC 9309 §2.2.1); else the ``*`` groups, merged; else nothing is disallowed.
        Lines that are not understood are skipped and do not end a group (§2.2.4).
        """
        if len(body) > max_bytes:
            # RFC 9309 §2.5: parse at least 500 KiB; a line cut by the limit is dropped, as its
            # rule would be broader than the one written
            body = body[:max_bytes]
            body = body[:max(body.rfind(b"\n"), body.rfind(b"\r")) + 1]
        if body[:1] == b"\xef":
            if body.startswith(_UTF8_BOM):
                body = body[3:]
            else:       # a partial BOM, skipped as Google does
                body = body[2:] if body[1:2] == b"\xbb" else body[1:]
        text = body.decode("utf-8", "surrogateescape")
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        if len(text) > _MAX_LINE:
            lines = text.split("\n")
            if max(map(len, lines)) > _MAX_LINE:
                text = "\n".join(line[:_MAX_LINE] for line in lines)
        # a token with other characters ("Foo Bar", "Foo/1.0") can match no user-agent line
        agent = agent_token.lower() if _TOKEN_CHARS.issuperset(agent_token) else ""
        agent_len = len(agent)

        specific: list[tuple[bool, str]] = []    # rules of the groups naming our token
        fallback: list[tuple[bool, str]] = []    # rules of the "*" groups
        delay_specific: float | None = None     # crawl-delay of the groups naming our token
        group_delay: float | None = None        # crawl-delay of the current group
        delay_fallback: float | None = None
        sitemaps: list[str] = []
        seen_specific = seen_fallback = False
        in_specific = in_fallback = False        # the current group applies to us / to "*"
        in_agent_lines = False                   # inside the user-agent lines that open a group

        for line in text.split("\n"):
            if not line:
                continue
            key, colon, value = line.partition(":")
            kind = _DIRECTIVES.get(key.lower())
            if kind is None:
                # not a plain "Key: value" line: spaces around the key, a comment, garbage, or
                # Google's leniency "Key value" (no colon, exactly two words)
                cut = line.find("#")
                if cut >= 0:
                    line = line[:cut]
                    key, colon, value = line.partition(":")
                if colon:
                    kind = _DIRECTIVES.get(key.strip(_SPACES).lower())
                else:
                    words = line.split()
                    if len(words) == 2:
                        kind = _DIRECTIVES.get(words[0].lower())
                        value = words[1]
                if kind is None:
                    continue
            elif "#" in value:
                value = value[:value.index("#")]
            value = value.strip(_SPACES)
            if kind == _ALLOW or kind == _DISALLOW:
                in_agent_lines = False
                if value:
                    rule = (kind == _ALLOW, value)
                    if in_specific:
                        specific.append(rule)
                    if in_fallback:
                        fallback.append(rule)
            elif kind == _UA:
                if not in_agent_lines:
                    if group_delay is not None:
                        if in_specific:
                            delay_specific = max(group_delay, delay_specific or 0.0)
                        if in_fallback:
                            delay_fallback = max(group_delay, delay_fallback or 0.0)
                    in_agent_lines = True
                    in_specific = in_fallback = False
                    group_delay = None
                if value[:1] == "*" and (len(value) == 1 or value[1] in _SPACES):
                    in_fallback = seen_fallback = True
                elif agent and value[:agent_len].lower() == agent and (
                        len(value) == agent_len or value[agent_len] not in _TOKEN_CHARS):
                    in_specific = seen_specific = True
            elif kind == _DELAY:
                # not in RFC 9309 (§2.2.4 other records): it belongs to the current group (also
                # to user-agent lines after it, as it does not end them); the largest value
                # wins when groups merge
                delay = _parse_delay(value)
                if delay is not None:
                    group_delay = delay if group_delay is None else max(delay, group_delay)
            elif value:      # sitemap: not tied to any group
                sitemaps.append(value)
        if group_delay is not None:
            if in_specific:
                delay_specific = max(group_delay, delay_specific or 0.0)
            if in_fallback:
                delay_fallback = max(group_delay, delay_fallback or 0.0)

        if seen_specific:
            raw, delay = specific, delay_specific
        elif seen_fallback:
            raw, delay = fallback, delay_fallback
        else:
            raw, delay = [], None
        return cls(_compile_rules(raw), crawl_delay=delay, sitemaps=sitemaps)

    @property
    def crawl_delay(self) -> float | None:
        """Crawl-delay of the applicable group in seconds (uncapped), or None."""
        return self._crawl_delay

    @property
    def sitemaps(self) -> list[str]:
        """Sitemap URLs named anywhere in the file, as written."""
        return list(self._sitemaps)

    @property
    def rule_count(self) -> int:
        return self._count

    def allowed(self, url: str) -> bool:
        """Whether ``url`` (absolute, or a path with optional query) may be fetched."""
        path = path_of(url)
        if path.startswith("/robots.txt") and (len(path) == 11 or path[11] == "?"):
            return True     # RFC 9309 §2.2.2: /robots.txt is implicitly allowed
        if not _is_canonical(path):
            path = _NORM_TOKEN.sub(_norm_repl, path)
        rules = self._merged.get(path[:3])          # 3 == _KEY_LEN
        if rules is None:
            rules = self._merge(path[:3])
        # Kinds are literals here (see _PREFIX ...): this loop is the hot path. rank & 1 is Allow.
        for rank, kind, head, n, a, b in rules:
            if path.startswith(head):
                if kind == 0:                                   # _PREFIX
                    return bool(rank & 1)
                if kind == 1:                                   # _CONTAINS
                    if path.find(a, n) >= 0:
                        return bool(rank & 1)
                elif kind == 2:                                 # _SUFFIX
                    if path.endswith(b) and len(path) - len(b) >= n:
                        return bool(rank & 1)
                elif kind == 3:                                 # _EXACT
                    if len(path) == n:
                        return bool(rank & 1)
                elif _glob_matches(path, n, a, b):              # _GLOB
                    return bool(rank & 1)
        return True

    def _merge(self, key: str) -> tuple:
        bucket = self._buckets.get(key)
        if bucket is None:
            merged = self._general
        elif not self._general:
            merged = bucket
        else:
            merged = tuple(sorted(bucket + self._general, key=_RANK, reverse=True))
        if len(key) == self._KEY_LEN:
            self._merged[key] = merged
        return merged

    def __repr__(self) -> str:
        return f"RobotsRules(rules={self._count}, crawl_delay={self._crawl_delay!r})"


def _parse_delay(value: str) -> float | None:
    try:
        delay = float(value)
    except ValueError:
        return None
    return delay if math.isfinite(delay) and delay >= 0 else None


def _compile_rules(raw: list[tuple[bool, str]]) -> list[tuple]:
    compiled = []
    patterns = [value for _, value in raw]
    joined = "\n".join(patterns)      # values hold no newline: normalise them all in one pass
    if not _is_canonical(joined.replace("\n", "")):
        patterns = _NORM_TOKEN_LINES.sub(_norm_repl, joined).split("\n")
    for (allow, _), pattern in zip(raw, patterns, strict=True):
        if pattern[0] == "/" and "*" not in pattern and pattern[-1] != "$":
            compiled.append((2 * len(pattern) + allow, _PREFIX, pattern, "", ""))     # the common case
        else:
            rule = _compile_rule(pattern, allow)
            if rule is not None:
                compiled.append(rule)
        if allow and "/index.htm" in pattern:
            # Google-specific: "Allow: /d/index.html" also allows "/d/" (a directory serves its
            # index page), added as the rule "/d/$".
            slash = pattern.rfind("/")
            if pattern.startswith("/index.htm", slash):
                extra = _compile_rule(pattern[:slash + 1] + "$", True)
                if extra is not None:
                    compiled.append(extra)
    return compiled


def check_lines(body: bytes, agent_token: str, urls: list[str]) -> list[str]:
    """``"allow URL"`` / ``"disallow URL"`` for each URL, in order (``crawlerd robots check``)."""
    rules = RobotsRules.parse(body, agent_token)
    return [f"{'allow' if rules.allowed(u) else 'disallow'} {u}" for u in urls]


# --------------------------------------------------------------------------- fetch-state policy


class RobotsState(StrEnum):
    """Why a host's robots entry says what it says (logged and counted by name)."""

    PARSED = "parsed"                          # 2xx: the file's rules
    UNAVAILABLE = "unavailable"                # 4xx: allow all (RFC 9309 §2.3.1.3)
    REDIRECT_LIMIT = "redirect_limit"          # more than max_hops redirects: as unavailable (§2.3.1.2)
    UNREACHABLE = "robots_unavailable"         # 5xx / network: disallow all (§2.3.1.4)
    STALE = "stale"                            # unreachable, but a good earlier copy is kept (§2.4)


_GOOD_STATES = frozenset({RobotsState.PARSED.value, RobotsState.UNAVAILABLE.value,
                          RobotsState.REDIRECT_LIMIT.value, RobotsState.STALE.value})


@dataclass(slots=True)
class RobotsFollow:
    """robots.txt answered with a redirect: fetch ``url`` next (the Location as sent; resolve it
    against the request URL and pass it through the address guard)."""

    url: str


@dataclass(slots=True)
class RobotsEntry:
    """What is known about one host's robots.txt.

    ``fetched_at`` is when the rules were obtained (for a kept stale copy: when that copy was
    fetched); ``expires_at`` is when robots.txt must be fetched again; ``outcome_name`` is a
    :class:`RobotsState` value; ``failures`` counts consecutive unreachable fetches (backoff).
    Invariant: ``ok`` is False exactly when the rules are the disallow-all of an unreachable file.
    """

    rules: RobotsRules
    fetched_at: float
    expires_at: float
    status: int
    outcome_name: str
    note: str
    failures: int = 0

    @property
    def ok(self) -> bool:
        return self.outcome_name in _GOOD_STATES


def robots_decision(*, status: int, outcome_ok: bool, body: bytes, location: str | None, hops: int,
                    previous: RobotsEntry | None, now: float, agent_token: str, cache_ttl_s: float,
                    error_retry_s: float, max_hops: int = 5, max_bytes: int,
                    stale_max_s: float = 30 * 86400.0) -> RobotsFollow | RobotsEntry:
    """Map one robots.txt fetch to the entry to cache, or to the redirect to follow (RFC 9309 §2.3.1).

    ``hops`` is how many redirects were followed to get this answer. 2xx: parse. 3xx with a
    Location and ``hops < max_hops``: follow. 4xx: allow all. 5xx, 429 and transport failure
    (``outcome_ok`` False): disallow all, retried after ``error_retry_s`` doubled per consecutive
    failure (at most ``cache_ttl_s``) -- unless ``previous`` holds a good copy fetched less than
    ``stale_max_s`` ago, which is kept (§2.4) and retried after ``error_retry_s``.
    """
    if outcome_ok and 200 <= status < 300:
        rules = RobotsRules.parse(body, agent_token, max_bytes)
        return RobotsEntry(rules, now, now + cache_ttl_s, status, RobotsState.PARSED.value,
                           f"{rules.rule_count} rules from {len(body)} bytes")
    if outcome_ok and 300 <= status < 400:
        if location and hops < max_hops:
            return RobotsFollow(location)
        if status == 304 and previous is not None and previous.ok:
            # a conditional re-fetch: the copy we hold is still the file
            return RobotsEntry(previous.rules, now, now + cache_ttl_s, status, previous.outcome_name,
                               "not modified")
        # RFC 9309 §2.3.1.2: after five consecutive redirects the crawler MAY assume the file is
        # unavailable (4xx, allow all). A redirect without a Location is treated the same way:
        # there is no file to obtain, and the server is answering (not erring).
        note = f"more than {max_hops} redirects" if location else f"{status} without Location"
        return RobotsEntry(RobotsRules.allow_all(), now, now + cache_ttl_s, status,
                           RobotsState.REDIRECT_LIMIT.value, note)
    if outcome_ok and 400 <= status < 500 and status != 429:
        return RobotsEntry(RobotsRules.allow_all(), now, now + cache_ttl_s, status,
                           RobotsState.UNAVAILABLE.value, f"{status}: allow all")
    # Unreachable (§2.3.1.4): 5xx, transport failure, or a status no server should send. 429 is
    # a 4xx the RFC would read as "allow all", but it asks us to slow down, so we wait instead.
    why = f"status {status}" if outcome_ok else "network failure"
    if previous is not None and previous.ok and now - previous.fetched_at < stale_max_s:
        return RobotsEntry(previous.rules, previous.fetched_at, now + error_retry_s, status,
                           RobotsState.STALE.value, f"{why}: kept copy fetched at {previous.fetched_at:.0f}",
                           previous.failures + 1)
    failures = (previous.failures if previous is not None else 0) + 1
    retry_s = min(error_retry_s * 2.0 ** min(failures - 1, 30), max(cache_ttl_s, error_retry_s))
    return RobotsEntry(RobotsRules.disallow_all(), now, now + retry_s, status,
                       RobotsState.UNREACHABLE.value, f"{why}: disallow all", failures)


class RobotsCache:
    """Robots entries by host key, bounded, least recently used evicted first.

    Key: host key ``"scheme://host[:port]"`` (the politeness key; robots.txt applies per
    scheme and authority, RFC 9309 §2.3). Invariant: at most ``max_entries`` entries; the
    iteration order of ``_entries`` is least to most recently used (``get``/``put`` move an entry
    to the end). Expired entries stay until evicted, so ``stale`` can still hand them out.
    """

    __slots__ = ("_entries", "_max_entries")

    def __init__(self, max_entries: int = 100_000) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self._entries: OrderedDict[str, RobotsEntry] = OrderedDict()
        self._max_entries = max_entries

    def get(self, host_key: str, now: float) -> RobotsEntry | None:
        """The entry for ``host_key`` if known and not expired at ``now``, else None."""
        entry = self._entries.get(host_key)
        if entry is None:
            return None
        self._entries.move_to_end(host_key)
        return entry if now < entry.expires_at else None

    def stale(self, host_key: str) -> RobotsEntry | None:
        """The last entry for ``host_key``, expired or not (None if never stored or evicted)."""
        return self._entries.get(host_key)

    def put(self, host_key: str, entry: RobotsEntry) -> None:
        self._entries[host_key] = entry
        self._entries.move_to_end(host_key)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

    def discard(self, host_key: str) -> None:
        self._entries.pop(host_key, None)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, host_key: object) -> bool:
        return host_key in self._entries
