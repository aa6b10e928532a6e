"""The rules of one robots.txt for one product token, compiled to match fast (RFC 9309 §2.2.2).

Only the group that applies to the token is kept (§2.2.1, see ``parser``), its rules
precompiled and sorted so that the first hit is the most specific match. Google's
``index.html`` leniency is followed (``Allow: /d/index.html`` also allows ``/d/``); where
google/robotstxt contradicts the RFC (percent-encoded unreserved characters), the RFC wins.
"""

from __future__ import annotations

from operator import itemgetter

from crawlerd.bytecache import ENTRY_OVERHEAD, TUPLE_BASE, slots_bytes, str_bytes
from crawlerd.fetch.robots.parser import parse_groups
from crawlerd.fetch.robots.paths import literal, match_path, normalize_patterns

__all__ = ["RobotsRules", "check_lines"]

# Rule kinds, see _compile_rule.
_PREFIX, _CONTAINS, _SUFFIX, _EXACT, _GLOB = range(5)     # written as literals in allowed()


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
        return (rank, _EXACT if anchored else _PREFIX, literal(body), "", "")
    # cut at the wildcards first: an encoded "%2A" in a piece is a literal "*" (RFC 9309 §2.2.3)
    parts = [literal(part) for part in body.split("*")]
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
    lists merged in rank order for a key of ``_buckets`` met by ``allowed`` (at most one entry
    per bucket, so the memo never outgrows the rules). Rules never change after construction.
    """

    __slots__ = ("_general", "_buckets", "_merged", "_count", "_crawl_delay", "_sitemaps", "_nbytes")

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
        self._nbytes = 0

    def nbytes(self) -> int:
        """Estimated bytes held (``crawlerd.bytecache`` sizes), memo included at its largest."""
        if not self._nbytes:
            def rule_bytes(rule: tuple) -> int:
                return TUPLE_BASE + 8 * 8 + str_bytes(rule[2]) + str_bytes(rule[4]) + str_bytes(rule[5])
            rules = sum(map(rule_bytes, self._general)) + sum(
                sum(map(rule_bytes, b)) for b in self._buckets.values())
            per_bucket = ENTRY_OVERHEAD + str_bytes("abc") + TUPLE_BASE      # the dict slot, key, tuple
            merged = sum(TUPLE_BASE + 8 * (len(b) + len(self._general)) for b in self._buckets.values())
            self._nbytes = (slots_bytes(7) + rules + 8 * self._count + 2 * per_bucket * len(self._buckets)
                            + merged + sum(str_bytes(u) for u in self._sitemaps) + 3 * TUPLE_BASE)
        return self._nbytes

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
        groups = parse_groups(body, agent_token, max_bytes)
        return cls(_compile_rules(groups.rules), crawl_delay=groups.crawl_delay, sitemaps=groups.sitemaps)

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
        return not self.disallowed((url,))

    def disallowed(self, urls) -> list[int]:
        """The positions in ``urls`` (each absolute, or a path with optional query) of those that may
        not be fetched, in order: ``allowed`` of a host's run of URLs in one call."""
        out = []
        merged, merge = self._merged, self._merge
        for i, url in enumerate(urls):
            if (url[:1] == "/" and url[1:2] != "/" and "#" not in url and "%" not in url and " " not in url
                    and url.isascii() and url.isprintable()):
                path = url          # a canonical path already: match_path would return it as is
            else:
                path = match_path(url)
            if path.startswith("/robots.txt") and (len(path) == 11 or path[11] == "?"):
                continue    # RFC 9309 §2.2.2: /robots.txt is implicitly allowed
            rules = merged.get(path[:3])            # 3 == _KEY_LEN
            if rules is None:
                rules = merge(path[:3])
            # Kinds are literals here (see _PREFIX ...): this loop is the hot path. The first rule
            # that matches decides; rank & 1 is Allow.
            for rank, kind, head, n, a, b in rules:
                if path.startswith(head) and (
                        kind == 0                                                   # _PREFIX
                        or (path.find(a, n) >= 0 if kind == 1                       # _CONTAINS
                            else path.endswith(b) and len(path) - len(b) >= n if kind == 2  # _SUFFIX
                            else len(path) == n if kind == 3                        # _EXACT
                            else _glob_matches(path, n, a, b))):                    # _GLOB
                    if not rank & 1:
                        out.append(i)
                    break
        return out

    def _merge(self, key: str) -> tuple:
        bucket = self._buckets.get(key)
        if bucket is None:
            merged = self._general
        elif not self._general:
            merged = bucket
        else:
            merged = tuple(sorted(bucket + self._general, key=_RANK, reverse=True))
        if bucket is not None:
            self._merged[key] = merged      # a key without a bucket needs no memo: it is _general
        return merged

    def __repr__(self) -> str:
        return f"RobotsRules(rules={self._count}, crawl_delay={self._crawl_delay!r})"


def _compile_rules(raw: list[tuple[bool, str]]) -> list[tuple]:
    compiled = []
    patterns = normalize_patterns([value for _, value in raw])     # values hold no newline
    for (allow, _), pattern in zip(raw, patterns, strict=True):
        if pattern[0] == "/" and "*" not in pattern and pattern[-1] != "$" and "%2" not in pattern:
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
