"""Per-domain crawl budgets against spam and traps: STAR and BEAST (IRLbot, Lee et al., TWeb 2009, §7).

STAR (``graph``) gives every pay-level domain a reputation: the number of other domains vouching
for it, counted from the unique domain -> domain links a DRUM keeps (``edges``). ``rule`` turns it
into a budget: URLs per BEAST queue, a small base growing linearly to a cap. BEAST (``beast``)
passes a domain's URLs to the frontier up to its budget while the reader stands on a queue, spreads
the rest over later queues (geometrically further apart for a domain still over budget at each
wrap-around) and moves the reader on as soon as the frontier runs short: spam is delayed, never
dropped, and the fetcher is never idle while a deferred URL exists; its ``reader`` keeps where the
reader stands, the domains listed per queue and those due now. ``store`` holds both in one
LMDB environment (and BEAST's per-domain record); ``audit`` checks BEAST's tables against each
other; ``stage`` is the shard's interface, with the edge DRUM on its own thread.
"""

from crawlerd.frontier.budgets.beast import Beast
from crawlerd.frontier.budgets.edges import EdgeClock, EdgeDrum
from crawlerd.frontier.budgets.graph import MODES, DomainGraph
from crawlerd.frontier.budgets.rule import BudgetRule
from crawlerd.frontier.budgets.stage import Budgets, pld_of
from crawlerd.frontier.budgets.store import BudgetStore, domain_key, domain_name

__all__ = ["MODES", "Beast", "BudgetRule", "BudgetStore", "Budgets", "DomainGraph", "EdgeClock", "EdgeDrum",
           "domain_key", "domain_name", "pld_of"]
