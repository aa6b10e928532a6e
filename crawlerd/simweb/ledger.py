"""The server-side ledger of every request simweb answered, and pure checks over it.

The ledger is the referee for politeness (ARCHITECTURE.md invariant 1) and robots (invariant 2): it is written by the
server, never by the crawler, so a crawler cannot mark its own homework. Times are measured on
the server: ``t_start`` when the request's first bytes were read, ``t_end`` just before the
answer was handed whole to the kernel (or, for an answer too big for the socket buffer, when the
buffer drained; or when the connection ended). Seen from the server, a request starts no earlier
and (answers that fit the socket buffer) ends no later than the crawler saw it, so server-side
gaps are never shorter than the crawler's own: a polite crawler passes with zero tolerance.

The checks take plain lists of :class:`LedgerEntry` and the site description (``Site.describe()``
or GET /site), and return lists of :class:`Violation`; an empty list means clean.
"""

from __future__ import annotations

import heapq
import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields

# violation kinds
HOST_OVERLAP = "host_overlap"             # two requests in flight to one host
HOST_GAP = "host_gap"                     # end -> next start gap shorter than required
IP_CONCURRENCY = "ip_concurrency"         # more than per_ip_concurrency in flight to one IP
IP_GAP = "ip_gap"                         # a request to an IP sooner than ip_delay_s after one ended
ROBOTS_DISALLOWED = "robots_disallowed"   # fetched a path robots.txt disallows for the agent
ROBOTS_UNAVAILABLE = "robots_unavailable"  # fetched a page from a host whose robots.txt is 5xx/unreachable
ROBOTS_NOT_FIRST = "robots_not_first"     # fetched a page before the host's robots.txt was answered
RETRY_AFTER = "retry_after"               # request inside an announced Retry-After window


@dataclass(slots=True)
class LedgerEntry:
    """One request as the server saw it. Key: ``seq`` (server-wide order of arrival)."""
    seq: int
    conn: int                  # connection id (requests on one connection share it)
    host: str                  # Host header name, lower-cased, port stripped ("" if absent)
    ip: str                    # local address the connection came in on
    method: str
    target: str                # path + query as sent
    user_agent: str = ""
    if_none_match: str = ""
    if_modified_since: str = ""
    t_start: float = 0.0       # time.monotonic() when the request's first bytes arrived
    t_start_wall: float = 0.0  # time.time() at the same moment
    t_end: float = 0.0         # time.monotonic() when the answer went to the kernel / conn ended
    t_end_wall: float = 0.0
    status: int = 0            # 0: no HTTP answer (held, reset, client left)
    bytes: int = 0             # bytes written (head + body)
    retry_after_s: float | None = None   # Retry-After announced by this answer
    note: str = ""             # "reset", "held", "client_closed", "bad_request", …

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> LedgerEntry:
        return cls(**{k: d[k] for k in _FIELD_NAMES if k in d})


_FIELD_NAMES = tuple(f.name for f in fields(LedgerEntry))


def entries_from_json(items: Iterable[Mapping]) -> list[LedgerEntry]:
    return [LedgerEntry.from_dict(d) for d in items]


def read_jsonl(path: str) -> list[LedgerEntry]:
    """Read a ledger written by ``--ledger-out`` (one JSON object per line)."""
    with open(path, encoding="utf-8") as f:
        return [LedgerEntry.from_dict(json.loads(line)) for line in f if line.strip()]


class Ledger:
    """The live ledger. Key: entry.seq, increasing in order of arrival.

    Invariant: ``entries`` is sorted by seq and holds at most ``max_entries`` (0: no limit) of
    the most recent requests; ``seq`` numbers are never reused, even across ``reset()`` or
    trimming, so a reader polling with ``since`` never sees an entry twice. ``dropped`` counts
    entries trimmed for the limit.
    """

    __slots__ = ("entries", "next_seq", "max_entries", "dropped")

    def __init__(self, max_entries: int = 0) -> None:
        self.entries: list[LedgerEntry] = []
        self.next_seq = 0
        self.max_entries = max_entries
        self.dropped = 0

    def open(self, **kw) -> LedgerEntry:
        entry = LedgerEntry(seq=self.next_seq, **kw)
        self.next_seq += 1
        self.entries.append(entry)
        if self.max_entries and len(self.entries) > self.max_entries:
            # trim a quarter at once so the cost of the list shift is amortised
            cut = len(self.entries) - self.max_entries * 3 // 4
            del self.entries[:cut]
            self.dropped += cut
        return entry

    def since(self, seq: int) -> list[LedgerEntry]:
        """Entries with entry.seq >= seq (binary search: entries are sorted by seq)."""
        lo, hi = 0, len(self.entries)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.entries[mid].seq < seq:
                lo = mid + 1
            else:
                hi = mid
        return self.entries[lo:]

    def reset(self) -> int:
        n = len(self.entries)
        self.entries = []
        return n

    def write_jsonl(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            for e in self.entries:
                f.write(json.dumps(e.to_dict(), separators=(",", ":")) + "\n")


@dataclass(frozen=True, slots=True)
class Violation:
    kind: str          # one of the kinds above
    key: str           # the host or IP the rule is about
    seq: int           # the offending request
    other_seq: int     # the earlier request it conflicts with (-1: none)
    detail: str

    def __str__(self) -> str:
        return f"{self.kind} {self.key} seq={self.seq} other={self.other_seq}: {self.detail}"


def _by_host(entries: Iterable[LedgerEntry]) -> dict[str, list[LedgerEntry]]:
    groups: dict[str, list[LedgerEntry]] = defaultdict(list)
    for e in entries:
        if e.host:
            groups[e.host].append(e)
    for lst in groups.values():
        lst.sort(key=lambda e: (e.t_start, e.seq))
    return groups


# --- politeness ---

def politeness_violations(entries: Iterable[LedgerEntry], min_gap_s: float, per_ip_concurrency: int = 1,
                          tolerance_s: float = 0.01,
                          host_min_gap_s: Mapping[str, float] | None = None) -> list[Violation]:
    """(a) overlapping requests to one host, (b) end->start gap below the host's minimum,
    (c) more than ``per_ip_concurrency`` requests in flight to one IP.

    ``host_min_gap_s`` raises the minimum for particular hosts (e.g. robots.txt Crawl-delay, see
    :func:`crawl_delays`); ``tolerance_s`` forgives that much of each gap and overlap.
    """
    entries = list(entries)
    out: list[Violation] = []
    for host, lst in _by_host(entries).items():
        gap_needed = max(min_gap_s, (host_min_gap_s or {}).get(host, 0.0))
        prev = None                    # the request with the latest end so far
        for e in lst:
            if prev is not None:
                if e.t_start < prev.t_end - tolerance_s:
                    early = prev.t_end - e.t_start
                    out.append(Violation(HOST_OVERLAP, host, e.seq, prev.seq,
                                         f"started {early:.3f}s before seq {prev.seq} ended"))
                elif e.t_start - prev.t_end < gap_needed - tolerance_s:
                    out.append(Violation(HOST_GAP, host, e.seq, prev.seq,
                                         f"gap {e.t_start - prev.t_end:.3f}s < {gap_needed:.3f}s"))
            if prev is None or e.t_end >= prev.t_end:
                prev = e
    out.extend(_ip_concurrency(entries, per_ip_concurrency, tolerance_s))
    return out


def _by_ip(entries: Iterable[LedgerEntry]) -> dict[str, list[LedgerEntry]]:
    """The entries with an IP, per IP, each list in order of start (then sequence)."""
    by_ip: dict[str, list[LedgerEntry]] = defaultdict(list)
    for e in entries:
        if e.ip:
            by_ip[e.ip].append(e)
    for lst in by_ip.values():
        lst.sort(key=lambda e: (e.t_start, e.seq))
    return by_ip


def _ip_concurrency(entries: list[LedgerEntry], limit: int, tolerance_s: float) -> list[Violation]:
    """Per IP, in order of start: a request is in flight from t_start until t_end - tolerance;
    starting one while ``limit`` others are in flight is a violation."""
    out = []
    for ip, lst in _by_ip(entries).items():
        ends: list[tuple[float, int]] = []          # min-heap of (end - tolerance, seq) in flight
        for e in lst:
            while ends and ends[0][0] <= e.t_start:
                heapq.heappop(ends)
            if len(ends) >= limit:
                out.append(Violation(IP_CONCURRENCY, ip, e.seq, min(seq for _, seq in ends),
                                     f"{len(ends) + 1} requests in flight > {limit}"))
            heapq.heappush(ends, (e.t_end - tolerance_s, e.seq))
    return out


def ip_gap_violations(entries: Iterable[LedgerEntry], ip_delay_s: float,
                      tolerance_s: float = 0.01) -> list[Violation]:
    """Per IP: a request that starts less than ``ip_delay_s`` after the end of an earlier one
    (the latest end before its start; exact for ``per_ip_concurrency`` = 1)."""
    out = []
    for ip, lst in _by_ip(entries).items():
        ends: list[tuple[float, int]] = []          # min-heap of (end, seq) not yet passed
        last_end, last_seq = float("-inf"), -1      # the latest end before the current start
        for e in lst:
            while ends and ends[0][0] <= e.t_start:
                end, seq = heapq.heappop(ends)
                if end >= last_end:
                    last_end, last_seq = end, seq
            if e.t_start - last_end < ip_delay_s - tolerance_s:
                out.append(Violation(IP_GAP, ip, e.seq, last_seq,
                                     f"gap {e.t_start - last_end:.3f}s < {ip_delay_s:.3f}s"))
            heapq.heappush(ends, (e.t_end, e.seq))
    return out


def crawl_delays(site: Mapping, agent: str = "crawlerd") -> dict[str, float]:
    """Host -> Crawl-delay (seconds) its robots.txt sets for ``agent``, for ``host_min_gap_s``."""
    out = {}
    for name, h in site["hosts"].items():
        group = _select_groups(h["robots"]["groups"], agent)
        delays = [g["crawl_delay_s"] for g in group if g.get("crawl_delay_s")]
        if delays:
            out[name] = max(delays)
    return out


# --- robots (RFC 9309) ---

def _select_groups(groups: list[Mapping], agent: str) -> list[Mapping]:
    """§2.2.1: the groups naming the agent's product token (case-insensitive), else the "*" groups."""
    token = agent.lower()
    named = [g for g in groups if any(a.lower() == token for a in g["agents"])]
    return named or [g for g in groups if "*" in g["agents"]]


def _pattern_regex(pattern: str) -> re.Pattern:
    anchored = pattern.endswith("$")
    body = pattern[:-1] if anchored else pattern
    return re.compile(".*".join(re.escape(part) for part in body.split("*")) + (r"\Z" if anchored else ""))


def robots_allows(groups: list[Mapping], agent: str, target: str) -> bool:
    """§2.2.2: the longest matching rule wins; on a tie allow wins; no match allows."""
    best_len, allowed = -1, True
    for g in _select_groups(groups, agent):
        for verdict, pattern in g["rules"]:
            if not pattern:
                continue   # "Disallow:" with no path matches nothing
            if _pattern_regex(pattern).match(target) and (
                    len(pattern) > best_len or (len(pattern) == best_len and verdict == "allow")):
                best_len, allowed = len(pattern), verdict == "allow"
    return allowed


def robots_violations(entries: Iterable[LedgerEntry], site: Mapping,
                      agent: str = "crawlerd") -> list[Violation]:
    """Pages fetched that robots.txt forbids for ``agent``, pages from hosts whose robots.txt is
    5xx/unreachable (§2.3.1.4: disallow all), and pages fetched before the host's robots.txt was
    answered (ARCHITECTURE.md invariant 2). Requests to unknown hosts are ignored."""
    out: list[Violation] = []
    for host, lst in _by_host(entries).items():
        spec = site["hosts"].get(host)
        if spec is None:
            continue
        robots = spec["robots"]
        robots_paths = set(robots["paths"])
        # robots.txt is known when the last hop of its redirect chain (usually /robots.txt) is answered
        final = robots["paths"][-1]
        first_robots_end = min((e.t_end for e in lst if e.path == final), default=None)
        for e in lst:
            if e.path in robots_paths:
                continue
            if first_robots_end is None or e.t_start < first_robots_end:
                out.append(Violation(ROBOTS_NOT_FIRST, host, e.seq, -1,
                                     f"{e.target} fetched before robots.txt was answered"))
            if robots["unavailable"]:
                out.append(Violation(ROBOTS_UNAVAILABLE, host, e.seq, -1,
                                     f"{e.target} fetched while robots.txt is {robots['variant']}"))
            elif not robots_allows(robots["groups"], agent, e.target):
                out.append(Violation(ROBOTS_DISALLOWED, host, e.seq, -1,
                                     f"{e.target} disallowed for {agent}"))
    return out


# --- Retry-After (RFC 9110 §10.2.3) ---

def retry_after_violations(entries: Iterable[LedgerEntry], tolerance_s: float = 0.01) -> list[Violation]:
    """Requests to a host that start before a Retry-After it announced has run out
    (window measured from the end of the announcing answer)."""
    out: list[Violation] = []
    for host, lst in _by_host(entries).items():
        until, announcer = float("-inf"), -1
        for e in lst:
            if e.t_start < until - tolerance_s:
                out.append(Violation(RETRY_AFTER, host, e.seq, announcer,
                                     f"{until - e.t_start:.3f}s inside Retry-After window"))
            if e.retry_after_s is not None and e.t_end + e.retry_after_s > until:
                until, announcer = e.t_end + e.retry_after_s, e.seq
    return out


def summary(entries: Iterable[LedgerEntry]) -> dict:
    """Counts by status and by host, for reports."""
    by_status: dict[int, int] = defaultdict(int)
    by_host: dict[str, int] = defaultdict(int)
    n = 0
    for e in entries:
        n += 1
        by_status[e.status] += 1
        by_host[e.host] += 1
    return {"requests": n, "by_status": dict(by_status), "by_host": dict(by_host)}
