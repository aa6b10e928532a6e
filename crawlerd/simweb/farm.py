"""simweb shapes for per-domain budgets: a link farm with big legitimate domains, and one domain for all.

Farm (``--farm-domains N``): besides the ordinary hosts ``h{i}.sim`` (one registered domain each)
the web gets

* ``giants`` big legitimate domains ``giant{g}.sim``, each of ``giant_hosts`` hosts
  ``w{j}.giant{g}.sim`` with ``GIANT_PAGES`` pages whose links lead mostly within the domain;
  ordinary pages link to a giant page with probability ``GIANT_LINK_P`` (popular sites: many
  distinct domains link to them);
* ``domains`` farm domains ``spam{f}.sim`` of ``hosts_per_domain`` hosts ``h{j}.spam{f}.sim``, each
  with endless pages ``/f/{k}.html`` (any k below ``FARM_PAGES``) that link to pages of their own
  domain and mostly of other farm domains; an ordinary page links into the farm with probability
  ``in_rate`` (a tiny share of ordinary links).

Farm hosts have role ``farm`` in the site description (``GET /site``), so a benchmark can count
farm fetches from the ledger; giants have role ``giant``. Neither is in the announced seeds'
``farm`` part: only ordinary hosts and giants are announced.

One domain (``--one-domain D``): the ordinary hosts are named ``h{i}.D`` instead of ``h{i}.sim``,
so every host sits under the one registered domain ``D`` (a university, a hosting provider).
Everything else (pages, links, addresses) is the same web, so the two can be compared.

Everything here is a pure function of the seed and the arguments, like the rest of simweb.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

ROLE_FARM = "farm"
ROLE_GIANT = "giant"
GIANT_PAGES = 2000
GIANT_LINK_P = 0.5
FARM_PAGES = 10 ** 9
FARM_OWN_LINKS = 8              # links of a farm page to its own domain
FARM_OUT_LINKS = 16             # links of a farm page to other farm domains
GIANT_SIBLING_LINKS = 6         # links of a giant page to other hosts of its domain


@dataclass(frozen=True, slots=True)
class FarmShape:
    """The extra parts of a farm web; ``domains == 0`` and ``giants == 0``: none.

    Invariant: host names are distinct from ordinary ones (they have a third label).
    """
    domains: int = 0
    hosts_per_domain: int = 3
    in_rate: float = 0.002
    giants: int = 0
    giant_hosts: int = 20
    one_domain: str = ""

    def __post_init__(self) -> None:
        if self.domains < 0 or self.giants < 0 or self.hosts_per_domain < 1 or self.giant_hosts < 1:
            raise ValueError("farm: need domains, giants >= 0 and hosts_per_domain, giant_hosts >= 1")
        if not 0.0 <= self.in_rate <= 1.0:
            raise ValueError("farm: in_rate must be in [0, 1]")
        if self.one_domain and ("." not in self.one_domain or self.one_domain.startswith(".")):
            raise ValueError(f"one_domain {self.one_domain!r}: expected a registered domain like example.sim")

    @property
    def active(self) -> bool:
        return bool(self.domains or self.giants or self.one_domain)

    def ordinary_name(self, i: int) -> str:
        return f"h{i}.{self.one_domain}" if self.one_domain else f"h{i}.sim"

    def extra_hosts(self) -> list[tuple[str, str, int]]:
        """(name, role, pages) of the giants' and the farm's hosts, in index order."""
        out = [(f"w{j}.giant{g}.sim", ROLE_GIANT, GIANT_PAGES) for g in range(self.giants)
               for j in range(self.giant_hosts)]
        out += [(f"h{j}.spam{f}.sim", ROLE_FARM, FARM_PAGES) for f in range(self.domains)
                for j in range(self.hosts_per_domain)]
        return out

    def describe(self) -> dict:
        return {"farm_domains": self.domains, "farm_hosts_per_domain": self.hosts_per_domain,
                "farm_in_rate": self.in_rate, "giants": self.giants, "giant_hosts": self.giant_hosts,
                "one_domain": self.one_domain}


class FarmLinks:
    """Links of the farm shape, for one site: into the giants and the farm from ordinary pages,
    within a giant's hosts, and the farm's pages themselves. Holds no per-request state."""

    __slots__ = ("shape", "giants", "farm", "by_domain", "ordinary")

    def __init__(self, shape: FarmShape, hosts, ordinary) -> None:
        self.shape = shape
        self.giants = [h for h in hosts if h.role == ROLE_GIANT]
        self.farm = [h for h in hosts if h.role == ROLE_FARM]
        self.ordinary = ordinary
        self.by_domain: dict[str, list] = {}
        for h in self.giants + self.farm:
            self.by_domain.setdefault(h.name.split(".", 1)[1], []).append(h)

    def extra_hrefs(self, host, rng: random.Random, authority) -> list[str]:
        """Absolute links an ordinary or giant page adds to its own (``authority(host)`` -> netloc)."""
        out = []
        if host.role == ROLE_GIANT:
            sib = self.by_domain[host.name.split(".", 1)[1]]
            for _ in range(GIANT_SIBLING_LINKS):
                o = sib[int(rng.random() * len(sib))]
                out.append(f"http://{authority(o)}/p/{int(rng.random() * o.pages)}.html")
            return out
        if host.role == ROLE_FARM:
            return out
        if self.giants and rng.random() < GIANT_LINK_P:
            o = self.giants[int(rng.random() * len(self.giants))]
            out.append(f"http://{authority(o)}/p/{int(rng.random() * o.pages)}.html")
        if self.farm and rng.random() < self.shape.in_rate:
            o = self.farm[int(rng.random() * len(self.farm))]
            out.append(f"http://{authority(o)}/f/{int(rng.random() * FARM_PAGES)}.html")
        return out

    def farm_page(self, renderer, host, k: int) -> bytes:
        """``/f/{k}.html`` (or ``/``, k = -1) of a farm host: spam text, links mostly to other farm domains."""
        rng = random.Random(f"simweb-farm/{renderer.seed}/{host.index}/{k}")
        domain = host.name.split(".", 1)[1]
        own = self.by_domain[domain]
        ordinary = self.ordinary
        links = []
        for _ in range(FARM_OWN_LINKS):
            o = own[int(rng.random() * len(own))]
            links.append((f"http://{renderer.authority(o)}/f/{int(rng.random() * FARM_PAGES)}.html", "more", False))
        for _ in range(FARM_OUT_LINKS):
            o = self.farm[int(rng.random() * len(self.farm))]
            links.append((f"http://{renderer.authority(o)}/f/{int(rng.random() * FARM_PAGES)}.html", "best", False))
        o = ordinary[int(rng.random() * len(ordinary))]
        links.append((f"http://{renderer.authority(o)}/", o.name, False))
        return renderer.text_page(f"{domain} offers {k}", 1500, rng, links)
