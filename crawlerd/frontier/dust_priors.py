"""Cross-host DUST priors: rule shapes that many hosts proved, offered to hosts that have not.

Per-host learning (``dust_evidence``) costs every host ``k`` duplicate fetches per rewrite kind
before a rule binds; on a broad crawl most hosts are fetched a few pages deep, so that cost is
most of the duplicates. Yet the rewrites repeat across the web: ``?utm_source``, ``?fbclid``,
``;jsessionid``, ``?view=print``, ``/m/ -> /`` mean the same thing on most sites that use them
(Bar-Yossef et al., WWW 2007 §6: a few rule types cover most DUST; Dasgupta et al., KDD 2008
§6: rules generalise across sites of one kind). A rule text trusted on its own evidence by at
least ``min_hosts`` hosts — each host's evidence meeting the trust conditions with k = 1: a pair
with the rule's image, two distinct values for a rule over many values; the confirmations are
pooled across hosts instead of asked of each — and contradicted on fewer than
``max_counter_hosts`` hosts, is an active **prior**. The learner applies active priors to hosts that did not learn the rule
(unless the host knows the rule's name changes content or retired the rule), adopting it on
the host at its first use; adopted rules are re-validated by heavier sampling and by every
window pair, and one contradiction retires the rule on that host and counts against the prior.

Samples that agree with a prior on any host are counted with it (``sampled``): the learner
samples a rule less as this count grows (``DustLearner``: ``sample_halving``), since each is an
independent re-validation of the same rewrite.

The table is a plain dict persisted in the store's meta record (``dust_store``).
"""

from __future__ import annotations

from crawlerd.frontier.dust_rules import Rule, parse_rule

__all__ = ["PriorTable", "MAX_PRIORS"]

MAX_PRIORS = 1024           # rule texts tracked; the least supported go first
MAX_VALUES = 2              # distinct removed values pooled per rule text


class PriorTable:
    """Key: rule text (host-independent, ``Rule.text``). Value: [hosts that vouched for it on their
    own evidence, hosts that contradicted it, samples on any host that agreed with it, then up to
    MAX_VALUES distinct 32-bit hashes of values the vouching hosts removed]. Invariant: at most
    MAX_PRIORS entries; ``active`` holds exactly the rules with support >= min_hosts, counter-hosts
    < max_counter_hosts and, for a rule over many values, two distinct values pooled."""

    def __init__(self, table: dict | None, *, min_hosts: int, max_counter_hosts: int):
        self.min_hosts = min_hosts
        self.max_counter_hosts = max_counter_hosts
        self.table: dict[str, list[int]] = {t: [int(v[0]), int(v[1]), int(v[2]) if len(v) > 2 else 0,
                                                *(int(x) for x in v[3:3 + MAX_VALUES])]
                                            for t, v in (table or {}).items()}
        self._general: dict[str, bool] = {}
        self.active: tuple[Rule, ...] = ()
        self.version = 0            # grows whenever ``active`` changes
        self._rebuild()

    def _is_general(self, text: str) -> bool:
        g = self._general.get(text)
        if g is None:
            try:
                g = parse_rule(text).general
            except ValueError:              # a record from an older grammar: never active
                g = True
            if len(self._general) < 4 * MAX_PRIORS:
                self._general[text] = g
        return g

    def _is_active(self, v: list[int], text: str) -> bool:
        pooled = len(v) - 3 >= MAX_VALUES
        return self.min_hosts > 0 and v[0] >= self.min_hosts and v[1] < self.max_counter_hosts and \
            (pooled or not self._is_general(text))

    def _rebuild(self) -> None:
        rules = []
        for text, v in self.table.items():
            if self._is_active(v, text):
                try:
                    rules.append(parse_rule(text))
                except ValueError:          # a record from an older grammar: ignore it
                    continue
        new = tuple(sorted(rules, key=lambda r: r.text))
        if new != self.active:
            self.active = new
            self.version += 1

    def _entry(self, text: str) -> list[int]:
        v = self.table.get(text)
        if v is None:
            if len(self.table) >= MAX_PRIORS:
                weakest = min(self.table, key=lambda t: (self.table[t][0], -self.table[t][1]))
                del self.table[weakest]
            v = self.table[text] = [0, 0, 0]
        return v

    def supported(self, text: str, values: list[int] | tuple[int, ...] = ()) -> bool:
        """A host vouched for ``text`` on its own evidence, having removed ``values`` (32-bit
        hashes). True when that made it an active prior."""
        v = self._entry(text)
        was = self._is_active(v, text)
        v[0] += 1
        for x in values:
            if x not in v[3:] and len(v) - 3 < MAX_VALUES:
                v.append(int(x))
        if not was and self._is_active(v, text):
            self._rebuild()
            return True
        return False

    def contradicted(self, text: str) -> bool:
        """A host retired ``text`` on a counter-example. True when that ended the prior."""
        v = self._entry(text)
        was = self._is_active(v, text)
        v[1] += 1
        if was and not self._is_active(v, text):
            self._rebuild()
            return True
        return False

    def sampled(self, text: str) -> None:
        """A sample on some host agreed with ``text`` (counted only for texts the table tracks)."""
        v = self.table.get(text)
        if v is not None:
            v[2] += 1

    def agreed(self, text: str) -> int:
        """Samples on any host that agreed with ``text``."""
        v = self.table.get(text)
        return v[2] if v is not None else 0

    def is_active(self, text: str) -> bool:
        v = self.table.get(text)
        return v is not None and self._is_active(v, text)

    def to_record(self) -> dict:
        return {t: list(v) for t, v in self.table.items()}

    def view(self) -> list[dict]:
        return [{"rule": t, "hosts": v[0], "counter_hosts": v[1], "samples_agreed": v[2],
                 "values": len(v) - 3, "active": self._is_active(v, t)}
                for t, v in sorted(self.table.items(), key=lambda x: (-x[1][0], x[0]))]
