"""What BEAST knows, asked from outside: a domain's budget and place, where a URL waits, statistics.

A part of :class:`~crawlerd.frontier.budgets.beast.Beast` (its base class), kept apart so the queue
logic stays one module; these read its state and write nothing but pending FIFO entries.
"""

from __future__ import annotations

import struct

from crawlerd.frontier.budgets import fifo
from crawlerd.frontier.budgets.store import domain_key, domain_name

EXPLAIN_SCAN = 200_000                 # deferred URLs of one domain ``explain`` walks at most
_FP = struct.Struct("<Q")


class BeastReading:
    """The reading half of ``Beast`` (see there for its state)."""

    def domain(self, pld: str) -> dict:
        """What BEAST knows about one domain now."""
        return self._domain(domain_key(pld))

    def _domain(self, dk: bytes) -> dict:
        d = self._records.get(dk)
        spread = 1 << d.level
        return {"domain": domain_name(dk), "indegree": self.graph.indegree_key(dk), "budget": self._budget(dk),
                "spent": d.spent if d.at == self._r else 0, "deferred": d.deferred,
                "queue": self._r if dk in self._due else d.queue - 1 if d.queue else None, "spread": spread, "admitted": d.admitted,
                "deferred_all": d.deferred_all, "on_probation": self.probation and self.graph.unvouched_key(dk)}

    def explain(self, pld: str, fp: int) -> dict:
        """Where a URL (by fingerprint) waits, if it does: its place in its domain's FIFO and the queue
        it should pass in. Walks that domain's FIFO only, at most ``EXPLAIN_SCAN`` entries."""
        self._write_puts()
        txn = self.store.txn()
        info = self.domain(pld)
        info["reader"] = self._r
        info["waiting"] = False
        prefix = domain_key(pld) + b"\0"
        want = _FP.pack(fp)
        cur = txn.cursor(db=self.store.deferred)
        found = cur.set_range(prefix)
        urls: list[tuple[bytes, bytes]] = []        # (turn | seq, fp | record): runs interleave
        while found and fp and len(urls) < EXPLAIN_SCAN and cur.key().startswith(prefix):
            urls += fifo.entries(cur.key(), cur.value(), len(prefix))
            found = cur.next()
        urls.sort()
        for pos, (_, v) in enumerate(urls[:EXPLAIN_SCAN]):
            if v[:8] == want:
                budget = max(1, info["budget"])
                first = info["queue"] if info["queue"] is not None else self._r + 1
                info.update(waiting=True, position=pos, expected_queue=first + (pos // budget) * info["spread"])
                return info
        if len(urls) >= EXPLAIN_SCAN:
            info["scan"] = f"stopped after {EXPLAIN_SCAN} of its waiting URLs"
        return info

    def stats(self, top: int = 10) -> dict:
        st, c = self.store, self._c
        seen: dict[bytes, None] = {}
        for dk in self.graph.top(top) + [k for k, _ in self._top_admitted.top(top)] + \
                [k for k, _ in self._top_deferred.top(top)]:
            seen.setdefault(dk)
        tops = [self._domain(dk) for dk in seen]
        tops.sort(key=lambda t: (-t["indegree"], -t["admitted"], t["domain"]))
        return {**self.rule_stats(), "reader_queue": self._r, "window_end": self._end, "window": self._window,
                "wraps": self._wraps, **c, "deferred_now": self.waiting,
                "domains_waiting": st.count(st.queues), "top_domains": tops}

    def rule_stats(self) -> dict:
        r = self.rule
        return {"base_budget": r.base_budget, "per_inlink": r.per_inlink, "max_budget": r.max_budget,
                "queues": self.queues, "max_spread": self.max_spread}
