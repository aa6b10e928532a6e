"""Crawler-trap filters applied to normalised URLs before they are queued (``UrlFilter``)."""

from __future__ import annotations

from collections import Counter, OrderedDict

from crawlerd.bytecache import ENTRY_OVERHEAD, TUPLE_BASE, slots_bytes, str_bytes
from crawlerd.url.hosts import host_key

__all__ = ["URL_TOO_LONG", "PATH_TOO_DEEP", "REPEATED_SEGMENTS", "TOO_MANY_PARAMS", "PARAM_VALUES", "UrlFilter"]

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


# Estimated bytes (CPython 3.11, 64-bit; see crawlerd.bytecache): a remembered value is a set
# slot (load <= 60 %) and an int; a pattern a set, its (path, name) tuple and a dict slot; a host
# an LRU entry, its _HostParams and the patterns dict.
_VALUE_BYTES = 64
_PATTERN_BYTES = 216 + TUPLE_BASE + 16 + 48
_HOST_BYTES = ENTRY_OVERHEAD + slots_bytes(3) + 232


class _HostParams:
    """One host's query-parameter patterns: (path, name) -> set of hash(value) seen, each set <= cap.

    Invariant: ``nbytes`` is the estimate of all this host holds (values, patterns, itself)."""

    __slots__ = ("patterns", "values", "nbytes")

    def __init__(self, key: str) -> None:
        self.patterns: dict[tuple[str, str], set[int]] = {}
        self.values = 0         # sum of the set sizes
        self.nbytes = _HOST_BYTES + str_bytes(key)


class UrlFilter:
    """Crawler-trap defences applied to normalised URLs before they are queued.

    ``check(url)`` returns a drop reason (one of the module's reason strings) or
    None, and counts drops by reason in ``drops``. Checks: URL length, path
    depth, a run of path segments repeated more than ``max_repeated_segments``
    times in a row (``/a/b/a/b/a/b/``: relative-link loops), too many query
    parameters, and per host a cap on distinct values of one parameter at one
    path (calendars, session ids: IRLbot §5 discusses such infinite spaces).

    State: ``host -> _HostParams`` in LRU order. Invariant: the estimated
    bytes of all hosts' state (``_HostParams.nbytes``) are at most
    ``state_bytes``; the least recently checked host is forgotten first, in
    O(1) (it then starts counting afresh, so memory stays bounded and a
    forgotten trap costs at most another ``max_param_values`` URLs).
    """

    def __init__(self, *, max_url_length: int = 2048, max_path_depth: int = 32,
                 max_repeated_segments: int = 2, max_query_params: int = 20,
                 max_param_values: int = 1000, state_bytes: int = 32 << 20):
        if min(max_url_length, max_path_depth, max_repeated_segments, max_query_params,
               max_param_values, state_bytes) < 1:
            raise ValueError("UrlFilter limits must be >= 1")
        self.max_url_length = max_url_length
        self.max_path_depth = max_path_depth
        self.max_repeated_segments = max_repeated_segments
        # a URL with its host key, no query, at most max_url_length characters and at most this many
        # slashes after its host passes check without a parse or a change of state (its quick test)
        self.quick_slashes = min(max_path_depth, max_repeated_segments)
        self.max_query_params = max_query_params
        self.max_param_values = max_param_values
        self.state_bytes = state_bytes
        self.drops: Counter[str] = Counter()
        self._hosts: OrderedDict[str, _HostParams] = OrderedDict()
        self._tracked = 0
        self._bytes = 0

    @property
    def tracked_values(self) -> int:
        return self._tracked

    @property
    def tracked_hosts(self) -> int:
        return len(self._hosts)

    def memory(self) -> dict[str, int]:
        """Estimated bytes of the per-host state against its cap."""
        return {"bytes": self._bytes, "cap_bytes": self.state_bytes, "entries": len(self._hosts)}

    def check(self, url: str, key: str = "") -> str | None:
        """The reason to drop ``url`` (counted, its values remembered), or None; ``key``: its host
        key when the caller has it (a worker's link), else taken from the URL."""
        if key and "?" not in url and len(url) <= self.max_url_length and \
                url.count("/", len(key)) <= self.quick_slashes:
            return None         # most links: no query, a short path (what _reason finds for them)
        reason = self._reason(url, key=key)
        if reason is not None:
            self.drops[reason] += 1
        return reason

    def peek(self, url: str) -> str | None:
        """The reason ``check`` would drop ``url`` now, without counting it or remembering its values."""
        return self._reason(url, record=False)

    def _reason(self, url: str, record: bool = True, key: str = "") -> str | None:
        if len(url) > self.max_url_length:
            return URL_TOO_LONG
        key = key or host_key(url)
        path, _, query = url[len(key):].partition("?")
        # a path has at most as many segments as slashes: few slashes pass both segment checks
        if path.count("/") > self.quick_slashes:
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
            state = self._hosts[key] = _HostParams(key)
            self._bytes += state.nbytes
        else:
            self._hosts.move_to_end(key)
        new: list[tuple[set[int], int]] = []
        for name, _, value in params:
            seen = state.patterns.get((path, name))
            if seen is None:
                seen = state.patterns[(path, name)] = set()
                grow = _PATTERN_BYTES + str_bytes(path) + str_bytes(name)
                state.nbytes += grow
                self._bytes += grow
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
                state.nbytes += _VALUE_BYTES
                self._tracked += 1
                self._bytes += _VALUE_BYTES
        self._evict(keep=key)
        return None

    def _evict(self, keep: str) -> None:
        while self._hosts and self._bytes > self.state_bytes:
            oldest = next(iter(self._hosts))
            if oldest == keep and len(self._hosts) == 1:
                # One host alone over the budget: forget its patterns, keep the entry.
                old = self._hosts[oldest]
                fresh = self._hosts[oldest] = _HostParams(oldest)
                self._tracked -= old.values
                self._bytes += fresh.nbytes - old.nbytes
                return
            gone = self._hosts.pop(oldest)
            self._tracked -= gone.values
            self._bytes -= gone.nbytes
