"""The shape of the synthetic web: hosts, their IPs, roles, robots.txt variants and page counts.

A :class:`Site` is a pure function of ``(seed, n_hosts, min_pages, max_pages)``: two processes
built with the same arguments describe and serve byte-identical webs. Host ``i`` is named
``h{i}.sim``; its designed address is ``127.A.B.C`` derived from ``i`` (never 127.0.0.1), except
that every tenth group of three hosts shares the first member's address, so per-IP politeness
has something to bite on.

Every special behaviour (robots variant or server role) is placed once on a host chosen from the
seed; the remaining hosts are ordinary and draw an everyday robots.txt variant. ``h0.sim`` is
always an ordinary host with ``Disallow: /private/`` so tests have a fixed, known-good start.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from crawlerd.simweb.farm import ROLE_FARM, FarmShape
from crawlerd.simweb.variants import profile as variant_profile

# --- robots.txt variants (RFC 9309 §2.3.1 outcomes) ---
ROBOTS_ABSENT = "absent"                      # 404: allow all (§2.3.1.3)
ROBOTS_ALLOW_ALL = "allow_all"                # 200, empty Disallow
ROBOTS_DISALLOW_PRIVATE = "disallow_private"  # 200, Disallow: /private/
ROBOTS_CRAWL_DELAY = "crawl_delay"            # 200, Crawl-delay + Disallow: /private/
ROBOTS_AGENT_GROUPS = "agent_groups"          # 200, a group for our token, a stricter one for *
ROBOTS_REDIRECT = "redirect_chain"            # 301 -> 301 -> 200 (§2.3.1.2: follow up to 5 hops)
ROBOTS_401 = "status_401"                     # 4xx: allow all (§2.3.1.3)
ROBOTS_403 = "status_403"
ROBOTS_500 = "status_500"                     # 5xx: disallow all (§2.3.1.4)
ROBOTS_503 = "status_503"
ROBOTS_TIMEOUT = "timeout"                    # no answer: unreachable, disallow all
ROBOTS_RESET = "reset"                        # TCP reset: unreachable, disallow all

ROBOTS_UNAVAILABLE_VARIANTS = frozenset({ROBOTS_500, ROBOTS_503, ROBOTS_TIMEOUT, ROBOTS_RESET})

# --- server roles ---
ROLE_NORMAL = "normal"
ROLE_SLOW = "slow"                  # every answer is delayed SLOW_DELAY_RANGE_S
ROLE_RATE_LIMITED = "rate_limited"  # some answers are 429 with Retry-After
ROLE_FLAKY = "flaky"                # some answers are 503 (no Retry-After: backoff path)
ROLE_TRAP_CALENDAR = "trap_calendar"  # /cal?y=…&m=… with prev/next forever
ROLE_TRAP_SESSION = "trap_session"    # every link carries a fresh ?sid=
ROLE_TRAP_DEPTH = "trap_depth"        # /a/b/a/b/… forever

TRAP_ROLES = frozenset({ROLE_TRAP_CALENDAR, ROLE_TRAP_SESSION, ROLE_TRAP_DEPTH})

AGENT_TOKEN = "crawlerd"            # the product token the agent_groups variant names
CRAWL_DELAY_S = 2.0
RETRY_AFTER_S = 3                   # Retry-After seconds sent with 429
RATE_LIMIT_EVERY = 4                # request n to the rate-limited host is 429 when n % 4 == 1
FLAKY_EVERY = 5                     # request n to the flaky host is 503 when n % 5 == 2
SLOW_DELAY_RANGE_S = (0.5, 2.0)
ROBOTS_HOLD_S = 90.0                # "timeout" robots: silent past a 30 s robots / 60 s fetch timeout
SITEMAP_INDEX_PATH = "/sitemap.xml"       # allow_all hosts announce it in robots.txt
SITEMAP_URLSET_PATH = "/sitemap-1.xml.gz"  # gzipped urlset of /sm/k.html, reachable only via the sitemap
LEAF_PAGES = 10                     # /private/k.html, /private/open/k.html, /nf/k.html, /mnf/k.html, k < 10
MEDIA_FILES = 5                     # /img/k.png, /files/k.txt, /files/k.pdf, /data/k.json, k < 5
NOFOLLOW_PREFIXES = ("/nf/", "/mnf/")  # reachable only through nofollow links

# Special features in placement priority: with few hosts, the first ones win.
_SPECIAL_FEATURES: tuple[tuple[str, str], ...] = (
    ("robots", ROBOTS_CRAWL_DELAY), ("robots", ROBOTS_AGENT_GROUPS), ("robots", ROBOTS_503),
    ("robots", ROBOTS_REDIRECT), ("role", ROLE_SLOW), ("role", ROLE_RATE_LIMITED),
    ("role", ROLE_TRAP_CALENDAR), ("role", ROLE_TRAP_SESSION), ("role", ROLE_TRAP_DEPTH),
    ("robots", ROBOTS_500), ("robots", ROBOTS_401), ("robots", ROBOTS_403), ("robots", ROBOTS_ABSENT),
    ("role", ROLE_FLAKY), ("robots", ROBOTS_TIMEOUT), ("robots", ROBOTS_RESET),
)
_EVERYDAY_ROBOTS = ((ROBOTS_DISALLOW_PRIVATE, 40), (ROBOTS_ALLOW_ALL, 20), (ROBOTS_ABSENT, 20),
                    (ROBOTS_CRAWL_DELAY, 10), (ROBOTS_AGENT_GROUPS, 10))
# profile "web": every ordinary host serves a robots.txt (no 404s), as the hosts of a research crawl do
_EVERYDAY_ROBOTS_WEB = ((ROBOTS_DISALLOW_PRIVATE, 55), (ROBOTS_ALLOW_ALL, 25), (ROBOTS_CRAWL_DELAY, 10),
                        (ROBOTS_AGENT_GROUPS, 10))

# Page shapes. "uniform": 5-30 KB, 10-60 links, uniformly drawn (the shape tests were written for).
# "web": log-normal sizes and link counts, as measured on the real web (HTML transfer sizes and
# outlink counts are heavy-tailed: most pages are small, a few are very large or very link-rich).
PROFILE_UNIFORM = "uniform"
PROFILE_WEB = "web"
PROFILES = (PROFILE_UNIFORM, PROFILE_WEB)
WEB_SIZE_MEDIAN_BYTES = 16 * 1024
WEB_SIZE_SIGMA = 0.7                 # ln-space: the middle 68% of pages are 8-32 KB
WEB_SIZE_RANGE_BYTES = (1024, 256 * 1024)
WEB_LINKS_MEDIAN = 32
WEB_LINKS_SIGMA = 0.7
WEB_LINKS_RANGE = (2, 400)


def ip_for_slot(slot: int) -> str:
    """Designed address of IP slot ``slot``: 127.A.B.C with every octet in 1..250 (never 127.0.0.1)."""
    return f"127.{1 + slot // 62500}.{1 + (slot // 250) % 250}.{1 + slot % 250}"


def ip_slot(i: int) -> int:
    """Hosts 3g, 3g+1, 3g+2 share an address when g % 10 == 0 (h0-h2, h30-h32, …)."""
    group = i // 3
    return 3 * group if group % 10 == 0 else i


@dataclass(frozen=True, slots=True)
class RobotsGroup:
    """One robots.txt group: the agents it names and its rules in file order."""
    agents: tuple[str, ...]
    rules: tuple[tuple[str, str], ...]      # ("allow" | "disallow", pattern)
    crawl_delay_s: float | None = None


@dataclass(frozen=True, slots=True)
class RobotsSpec:
    """What a host answers for /robots.txt and what it means (the oracle for the ledger checks).

    Invariant: ``unavailable`` iff the variant is 5xx or unreachable; then ``groups`` is empty and
    nothing but ``paths`` may be fetched from the host.
    """
    variant: str
    status: int                              # 0 when no HTTP answer (timeout, reset)
    text: str                                # body served with a 2xx ("" otherwise)
    groups: tuple[RobotsGroup, ...]
    paths: tuple[str, ...]                   # robots paths on this host (redirect hops included)
    unavailable: bool


def robots_spec(variant: str) -> RobotsSpec:
    if variant == ROBOTS_ABSENT:
        return RobotsSpec(variant, 404, "", (), ("/robots.txt",), False)
    if variant == ROBOTS_ALLOW_ALL:
        text = "# simweb\nUser-agent: *\nDisallow:\n"
        return RobotsSpec(variant, 200, text, (RobotsGroup(("*",), ()),), ("/robots.txt",), False)
    if variant in (ROBOTS_DISALLOW_PRIVATE, ROBOTS_REDIRECT):
        text = "# simweb\nUser-agent: *\nDisallow: /private/\n"
        group = RobotsGroup(("*",), (("disallow", "/private/"),))
        paths = ("/robots.txt",) if variant == ROBOTS_DISALLOW_PRIVATE else (
            "/robots.txt", "/moved/robots-hop.txt", "/moved/robots-final.txt")
        status = 200 if variant == ROBOTS_DISALLOW_PRIVATE else 301
        return RobotsSpec(variant, status, text, (group,), paths, False)
    if variant == ROBOTS_CRAWL_DELAY:
        text = f"# simweb\nUser-agent: *\nCrawl-delay: {CRAWL_DELAY_S:g}\nDisallow: /private/\n"
        group = RobotsGroup(("*",), (("disallow", "/private/"),), CRAWL_DELAY_S)
        return RobotsSpec(variant, 200, text, (group,), ("/robots.txt",), False)
    if variant == ROBOTS_AGENT_GROUPS:
        # RFC 9309 §2.2.1: product tokens match case-insensitively; a group may name several agents;
        # the most specific group wins over "*". §2.2.2: longest match wins, "$" and "*" are special.
        text = ("# simweb: agent-specific groups\n"
                "User-agent: otherbot\nDisallow: /\n\n"
                "User-agent: CrawlerD\nUser-agent: somebot\n"
                "Disallow: /private/\nAllow: /private/open/\nDisallow: /*.json$\n\n"
                "User-agent: *\nDisallow: /\n")
        groups = (
            RobotsGroup(("otherbot",), (("disallow", "/"),)),
            RobotsGroup(("crawlerd", "somebot"),
                        (("disallow", "/private/"), ("allow", "/private/open/"), ("disallow", "/*.json$"))),
            RobotsGroup(("*",), (("disallow", "/"),)),
        )
        return RobotsSpec(variant, 200, text, groups, ("/robots.txt",), False)
    status = {ROBOTS_401: 401, ROBOTS_403: 403, ROBOTS_500: 500, ROBOTS_503: 503}.get(variant)
    if status is not None:
        return RobotsSpec(variant, status, "", (), ("/robots.txt",), variant in ROBOTS_UNAVAILABLE_VARIANTS)
    if variant in (ROBOTS_TIMEOUT, ROBOTS_RESET):
        return RobotsSpec(variant, 0, "", (), ("/robots.txt",), True)
    raise ValueError(f"unknown robots variant {variant!r}")


@dataclass(frozen=True, slots=True)
class HostSpec:
    """One simulated host. Key: ``name`` (``h{index}.sim``).

    Invariants: pages are ``/p/0.html`` … ``/p/{pages-1}.html``; every key of ``exact_dups`` and
    ``near_dups`` is a page index whose body copies (exactly, or but for one line) the page it maps
    to, which is a smaller index and itself an original.
    """
    index: int
    name: str
    ip: str
    role: str
    robots: RobotsSpec
    pages: int
    gzip: bool                                  # answers Accept-Encoding: gzip with gzip
    exact_dups: dict[int, int] = field(default_factory=dict)
    near_dups: dict[int, int] = field(default_factory=dict)
    meta_nofollow: frozenset[int] = frozenset()
    variants: tuple[str, ...] = ()              # URL variant kinds it serves (simweb.variants)

    def describe(self) -> dict:
        r = self.robots
        return {
            "index": self.index, "ip": self.ip, "role": self.role, "pages": self.pages, "gzip": self.gzip,
            "robots": {
                "variant": r.variant, "status": r.status, "text": r.text, "paths": list(r.paths),
                "unavailable": r.unavailable,
                "groups": [{"agents": list(g.agents), "rules": [list(x) for x in g.rules],
                            "crawl_delay_s": g.crawl_delay_s} for g in r.groups],
            },
            "exact_dups": sorted([k, v] for k, v in self.exact_dups.items()),
            "near_dups": sorted([k, v] for k, v in self.near_dups.items()),
            "meta_nofollow": sorted(self.meta_nofollow),
            "variants": list(self.variants),
        }


class Site:
    """All hosts of one synthetic web. Key: host name. Invariant: pure function of the arguments."""

    def __init__(self, n_hosts: int = 200, seed: int = 1, min_pages: int = 20, max_pages: int = 500,
                 profile: str = PROFILE_UNIFORM, variant_share: float = 0.0,
                 shape: FarmShape | None = None) -> None:
        if n_hosts < 1:
            raise ValueError("n_hosts must be >= 1")
        if not 1 <= min_pages <= max_pages:
            raise ValueError("need 1 <= min_pages <= max_pages")
        if profile not in PROFILES:
            raise ValueError(f"profile must be one of {', '.join(PROFILES)}, got {profile!r}")
        self.seed = seed
        self.n_hosts = n_hosts                   # ordinary hosts: indices below n_hosts (see farm.py for the rest)
        self.profile = profile
        self.variant_share = variant_share
        self.shape = shape or FarmShape()
        rng = random.Random(f"simweb-site/{seed}/{n_hosts}")
        candidates = list(range(1, n_hosts))
        rng.shuffle(candidates)
        special = dict(zip(candidates, _SPECIAL_FEATURES, strict=False))
        variants, weights = zip(*(_EVERYDAY_ROBOTS_WEB if profile == PROFILE_WEB else _EVERYDAY_ROBOTS),
                                strict=True)
        hosts: list[HostSpec] = []
        for i in range(n_hosts):
            hrng = random.Random(f"simweb-host/{seed}/{i}")
            role, variant = ROLE_NORMAL, hrng.choices(variants, weights)[0]
            if i == 0:
                variant = ROBOTS_DISALLOW_PRIVATE
            elif i in special:
                kind, value = special[i]
                if kind == "role":
                    role, variant = value, ROBOTS_ALLOW_ALL
                else:
                    variant = value
            pages = hrng.randint(min_pages, max_pages)
            n_special = max(1, pages // 50)
            picks = hrng.sample(range(1, pages), min(3 * n_special, pages - 1)) if pages > 1 else []
            meta_nf = frozenset(picks[2 * n_special:])
            exact = {k: hrng.randrange(k) for k in picks[:n_special]}
            near = {k: hrng.randrange(k) for k in picks[n_special:2 * n_special]}
            # a copy's source is an ordinary original: not a copy, not a meta-nofollow page
            copies = exact.keys() | near.keys() | meta_nf
            exact = {k: v for k, v in exact.items() if v not in copies}
            near = {k: v for k, v in near.items() if v not in copies}
            # URL variants only on ordinary hosts (traps and hostile roles stay what they are), never h0
            kinds = variant_profile(seed, i, variant_share) if role == ROLE_NORMAL and i else ()
            hosts.append(HostSpec(i, self.shape.ordinary_name(i), ip_for_slot(ip_slot(i)), role, robots_spec(variant),
                                  pages, gzip=hrng.random() < 0.3, exact_dups=exact, near_dups=near,
                                  meta_nofollow=meta_nf, variants=kinds))
        for name, role, pages in self.shape.extra_hosts():      # giants and farm hosts (farm.py)
            i = len(hosts)
            variant = ROBOTS_ABSENT if role == ROLE_FARM else ROBOTS_DISALLOW_PRIVATE
            hosts.append(HostSpec(i, name, ip_for_slot(ip_slot(i)), role, robots_spec(variant), pages, gzip=False))
        self.hosts: tuple[HostSpec, ...] = tuple(hosts)
        self.by_name: dict[str, HostSpec] = {h.name: h for h in hosts}

    def host(self, name: str) -> HostSpec | None:
        return self.by_name.get(name)

    def with_role(self, role: str) -> list[HostSpec]:
        return [h for h in self.hosts if h.role == role]

    def with_robots(self, variant: str) -> list[HostSpec]:
        return [h for h in self.hosts if h.robots.variant == variant]

    def describe(self, port: int | None = None) -> dict:
        """The site description served at GET /site (JSON-ready)."""
        return {
            "seed": self.seed, "n_hosts": self.n_hosts, "port": port, "profile": self.profile, "agent_token": AGENT_TOKEN,
            "nofollow_prefixes": list(NOFOLLOW_PREFIXES), "retry_after_s": RETRY_AFTER_S,
            "crawl_delay_s": CRAWL_DELAY_S, "slow_delay_range_s": list(SLOW_DELAY_RANGE_S),
            "robots_hold_s": ROBOTS_HOLD_S, "leaf_pages": LEAF_PAGES, "media_files": MEDIA_FILES,
            "variant_share": self.variant_share,
            "hosts": {h.name: h.describe() for h in self.hosts},
            **({"shape": self.shape.describe()} if self.shape.active else {}),
        }
