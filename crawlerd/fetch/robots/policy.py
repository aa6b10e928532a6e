"""What a fetch of robots.txt means: the entry to cache or the redirect to follow (RFC 9309 §2.3.1, §2.4)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from crawlerd.fetch.robots.rules import RobotsRules

__all__ = ["RobotsEntry", "RobotsFollow", "RobotsState", "robots_decision"]


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
