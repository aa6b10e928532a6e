"""The STAR budget rule: URLs a registered domain passes per BEAST queue, from its in-degree."""

from __future__ import annotations


class BudgetRule:
    """``budget(d) = min(max_budget, base_budget + per_inlink x d)`` for in-degree ``d``.

    IRLbot (Lee et al., TWeb 2009, §7) gives every pay-level domain a small base and scales the
    budget of reputable domains up to a large cap; here the scaling is linear in the number of
    distinct domains vouching for it (``graph.DomainGraph``). The budget is counted per BEAST queue
    (one pass of the reader), charged when a URL passes to the frontier.
    """

    __slots__ = ("base_budget", "per_inlink", "max_budget")

    def __init__(self, base_budget: int, per_inlink: int, max_budget: int):
        if base_budget < 1 or per_inlink < 0 or max_budget < base_budget:
            raise ValueError("need base_budget >= 1, per_inlink >= 0 and max_budget >= base_budget")
        self.base_budget = base_budget
        self.per_inlink = per_inlink
        self.max_budget = max_budget

    def budget(self, indegree: int) -> int:
        b = self.base_budget + self.per_inlink * indegree
        return b if b < self.max_budget else self.max_budget

    def params(self) -> list[int]:
        return [self.base_budget, self.per_inlink, self.max_budget]
