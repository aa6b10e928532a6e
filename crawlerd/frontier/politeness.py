"""How long a host waits after a request: the gap rule of ARCHITECTURE.md invariant 1, backoff and parking."""

from __future__ import annotations

import random
from dataclasses import dataclass

from crawlerd.outcome import BACKOFF_OUTCOMES, Outcome

# RFC 9110 §15.5.30 (429 via RFC 6585 §4) and §15.6.4 (503): "come back later", with Retry-After.
RETRY_LATER_STATUS = frozenset({429, 503})


def is_failure(outcome: Outcome, status: int) -> bool:
    """The host is in trouble: back it off (transport failures, 429, 5xx)."""
    if outcome is Outcome.OK:            # the common case, without hashing the enum
        return status == 429 or status >= 500
    return outcome in BACKOFF_OUTCOMES or status == 429 or status >= 500


def is_retryable(outcome: Outcome, status: int) -> bool:
    """The URL got no usable answer and goes back to its queue (counting an attempt).

    Other 5xx answers are kept as answers: the page said something, and it is archived.
    """
    if outcome is Outcome.OK:
        return status == 429 or status == 503
    return outcome in BACKOFF_OUTCOMES or status in RETRY_LATER_STATUS


@dataclass(frozen=True, slots=True)
class Politeness:
    """The gap rule's parameters (seconds unless named otherwise)."""

    delay_factor: float = 10.0
    min_delay_s: float = 1.0
    max_delay_s: float = 60.0
    crawl_delay_cap_s: float = 60.0
    backoff_base_s: float = 30.0
    backoff_max_s: float = 3600.0
    retry_after_cap_s: float = 86400.0
    park_after_failures: int = 10
    park_s: float = 21600.0

    def gap_s(self, response_time_s: float, crawl_delay_s: float, demote: int) -> float:
        """Gap after a request: clamp(factor x response time), raised to Crawl-delay (IRLbot §6).

        A demoted host (near-duplicate trap) is visited (1 + demote) times less often.
        """
        d = self.delay_factor * max(response_time_s, 0.0)
        if d < self.min_delay_s:
            d = self.min_delay_s
        elif d > self.max_delay_s:
            d = self.max_delay_s
        if crawl_delay_s > d:
            d = crawl_delay_s
        return d * (1 + demote)

    def crawl_delay(self, crawl_delay_s: float | None) -> float:
        if crawl_delay_s is None or crawl_delay_s != crawl_delay_s or crawl_delay_s <= 0:
            return 0.0
        return min(crawl_delay_s, self.crawl_delay_cap_s)

    def failure_wait_s(self, fails: int, retry_after_s: float | None, rng: random.Random) -> float:
        """Wait after the ``fails``-th consecutive failure.

        Retry-After is honoured up to its cap (RFC 9110 §10.2.3); otherwise the
        wait doubles from ``backoff_base_s`` with up to +50 % jitter, so hosts
        failing together do not come back together, never above
        ``backoff_max_s``. From ``park_after_failures`` on the host is parked.
        """
        if retry_after_s is not None and retry_after_s == retry_after_s and retry_after_s >= 0:
            wait = min(retry_after_s, self.retry_after_cap_s)
        else:
            wait = self.backoff_base_s * 2.0 ** min(max(fails - 1, 0), 60)
            wait = min(self.backoff_max_s, wait * (1.0 + 0.5 * rng.random()))
        if fails >= self.park_after_failures and self.park_s > wait:
            wait = self.park_s
        return wait

    def restart_grace_s(self, ip_delay_s: float) -> float:
        """After a crash every host waits this long: covers any gap a lost completion set.

        Longer waits (backoff, Retry-After, parking) are committed when they are set.
        """
        return max(self.max_delay_s * 1.0, self.crawl_delay_cap_s, ip_delay_s, self.min_delay_s)
