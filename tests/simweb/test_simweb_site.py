"""The site model and request routing, without sockets: determinism, host layout, page shapes,
robots variants, special hosts, conditional requests."""

from __future__ import annotations

import email.utils
import gzip
import re
from urllib.parse import urljoin, urlsplit

import pytest

from crawlerd.simweb import site as S
from crawlerd.simweb.handler import ACTION_HOLD, ACTION_RESET, Handler

PORT = 8123
HREF = re.compile(rb'<a href="([^"]*)"( rel="nofollow")?>')
TAG = re.compile(rb"<[^>]*>")


@pytest.fixture(scope="module")
def site():
    return S.Site(60, seed=5)


@pytest.fixture(scope="module")
def handler(site):
    return Handler(site, PORT)


def get(handler, host, target, **kw):
    return handler.handle(f"{host}:{PORT}", target, **kw)[1]


def normal_hosts(site):
    return [h for h in site.hosts if h.role == S.ROLE_NORMAL and not h.robots.unavailable]


# --- determinism ---

def test_same_seed_same_site_and_bodies():
    a, b = S.Site(40, seed=9), S.Site(40, seed=9)
    assert a.describe(PORT) == b.describe(PORT)
    ha, hb = Handler(a, PORT), Handler(b, PORT)
    for host in a.hosts[:10]:
        for target in ("/", "/p/0.html", "/p/7.html", "/private/3.html", "/img/2.png"):
            ra, rb = get(ha, host.name, target), get(hb, host.name, target)
            assert (ra.status, ra.body, ra.headers) == (rb.status, rb.body, rb.headers)


def test_different_seed_different_site():
    a, b = S.Site(40, seed=9), S.Site(40, seed=10)
    assert a.describe(PORT) != b.describe(PORT)
    body_a = get(Handler(a, PORT), "h0.sim", "/p/0.html").body
    assert body_a != get(Handler(b, PORT), "h0.sim", "/p/0.html").body


# --- layout ---

def test_ips_are_loopback_never_127_0_0_1_and_some_groups_share(site):
    ips = [h.ip for h in site.hosts]
    assert all(ip.startswith("127.") and ip != "127.0.0.1" for ip in ips)
    assert site.hosts[0].ip == site.hosts[1].ip == site.hosts[2].ip       # group 0 shares
    assert site.hosts[30].ip == site.hosts[31].ip == site.hosts[32].ip    # group 10 shares
    assert len({site.hosts[i].ip for i in range(3, 30)}) == 27            # the rest do not
    assert len(set(ips)) == 60 - 4


def test_every_special_feature_is_placed_once(site):
    for role in (S.ROLE_SLOW, S.ROLE_RATE_LIMITED, S.ROLE_FLAKY, S.ROLE_TRAP_CALENDAR, S.ROLE_TRAP_SESSION,
                 S.ROLE_TRAP_DEPTH):
        assert len(site.with_role(role)) == 1, role
    for variant in (S.ROBOTS_503, S.ROBOTS_500, S.ROBOTS_401, S.ROBOTS_403, S.ROBOTS_REDIRECT,
                    S.ROBOTS_TIMEOUT, S.ROBOTS_RESET):
        assert len(site.with_robots(variant)) == 1, variant
    for variant in (S.ROBOTS_ABSENT, S.ROBOTS_CRAWL_DELAY, S.ROBOTS_AGENT_GROUPS, S.ROBOTS_DISALLOW_PRIVATE):
        assert site.with_robots(variant), variant
    assert site.hosts[0].role == S.ROLE_NORMAL and site.hosts[0].robots.variant == S.ROBOTS_DISALLOW_PRIVATE


def test_page_counts_in_range():
    s = S.Site(30, seed=1, min_pages=5, max_pages=9)
    assert all(5 <= h.pages <= 9 for h in s.hosts)


# --- pages ---

def test_pages_have_text_size_links_and_resolve_to_known_hosts(site, handler):
    hosts = normal_hosts(site)[:6]
    n_cross = 0
    for host in hosts:
        for k in range(0, host.pages, max(1, host.pages // 8)):
            if k in host.meta_nofollow or k in host.near_dups or k in host.exact_dups:
                continue
            r = get(handler, host.name, f"/p/{k}.html")
            assert r.status == 200 and r.content_type.startswith("text/html")
            assert 5 * 1024 <= len(r.body) <= 40 * 1024
            hrefs = [m.group(1).decode() for m in HREF.finditer(r.body)]
            assert 10 <= len(hrefs) <= 60
            base = f"http://{host.name}:{PORT}/p/{k}.html"
            for href in hrefs:
                u = urlsplit(urljoin(base, href))
                assert u.hostname in site.by_name, href   # never a name outside the synthetic web
                n_cross += u.hostname != host.name
    assert n_cross > 0


def test_link_forms_cover_relative_dotdot_fragment_nofollow(site, handler):
    host = normal_hosts(site)[0]
    bodies = b"".join(get(handler, host.name, f"/p/{k}.html").body for k in range(min(host.pages, 20)))
    hrefs = [m.group(1).decode() for m in HREF.finditer(bodies)]
    assert any(h.startswith("../") for h in hrefs)
    assert any(re.fullmatch(r"\d+\.html", h) for h in hrefs)
    assert any("#" in h for h in hrefs)
    assert any(h.startswith("//") for h in hrefs)
    assert any(h.startswith("/private/") for h in hrefs)
    nofollow = [m.group(1).decode() for m in HREF.finditer(bodies) if m.group(2)]
    assert nofollow and all(h.startswith("/nf/") for h in nofollow)
    assert not any(h.startswith("/nf/") for m in HREF.finditer(bodies) if not m.group(2)
                   for h in [m.group(1).decode()])


def test_exact_and_near_duplicates(site, handler):
    hosts = [h for h in normal_hosts(site) if h.exact_dups and h.near_dups]
    assert hosts
    host = hosts[0]
    for k, src in host.exact_dups.items():
        assert get(handler, host.name, f"/p/{k}.html").body == get(handler, host.name, f"/p/{src}.html").body
    for k, src in host.near_dups.items():
        a = get(handler, host.name, f"/p/{k}.html").body
        b = get(handler, host.name, f"/p/{src}.html").body
        assert a != b and abs(len(a) - len(b)) < 60
        assert TAG.sub(b" ", a).split() == TAG.sub(b" ", b).split()   # same visible text, other markup
        unmarked = re.sub(rb"<!--.*?-->", b"", a).replace(f' class="rev-{k}"'.encode(), b"")
        assert unmarked.replace(b"\n<h1>", b"<h1>") == b


def test_site_invariants_hold_for_every_host():
    site = S.Site(120, seed=11)
    for h in site.hosts:
        copies = h.exact_dups.keys() | h.near_dups.keys()
        assert not copies & h.meta_nofollow
        for k, src in (h.exact_dups | h.near_dups).items():
            assert 0 <= src < k < h.pages and src not in copies and src not in h.meta_nofollow
        r = h.robots
        assert r.unavailable == (r.variant in S.ROBOTS_UNAVAILABLE_VARIANTS)
        if r.unavailable:
            assert r.groups == ()
        assert r.paths[0] == "/robots.txt"


def test_meta_nofollow_pages_link_only_to_mnf(site, handler):
    host = next(h for h in normal_hosts(site) if h.meta_nofollow)
    k = min(host.meta_nofollow)
    body = get(handler, host.name, f"/p/{k}.html").body
    assert b'<meta name="robots" content="nofollow">' in body
    hrefs = [m.group(1).decode() for m in HREF.finditer(body)]
    assert hrefs and all(h.startswith("/mnf/") for h in hrefs)


def test_media_redirect_and_missing(handler):
    png = get(handler, "h0.sim", "/img/1.png")
    assert png.status == 200 and png.content_type == "image/png" and png.body.startswith(b"\x89PNG")
    assert get(handler, "h0.sim", "/data/2.json").content_type == "application/json"
    assert get(handler, "h0.sim", "/files/0.pdf").body.startswith(b"%PDF")
    r = get(handler, "h0.sim", "/r/3")
    assert r.status == 301 and ("Location", "/p/3.html") in r.headers
    assert get(handler, "h0.sim", "/p/03.html").status == 404         # one URL per page
    assert get(handler, "h0.sim", f"/p/{handler.site.hosts[0].pages}.html").status == 404
    assert get(handler, "nowhere.sim", "/").status == 421


# --- robots variants ---

@pytest.mark.parametrize("variant,status", [(S.ROBOTS_ABSENT, 404), (S.ROBOTS_401, 401), (S.ROBOTS_403, 403),
                                            (S.ROBOTS_500, 500), (S.ROBOTS_503, 503)])
def test_robots_status_variants(site, handler, variant, status):
    host = site.with_robots(variant)[0]
    assert get(handler, host.name, "/robots.txt").status == status


def test_robots_text_variants(site, handler):
    dp = get(handler, site.with_robots(S.ROBOTS_DISALLOW_PRIVATE)[0].name, "/robots.txt")
    assert dp.status == 200 and b"Disallow: /private/" in dp.body
    cd = get(handler, site.with_robots(S.ROBOTS_CRAWL_DELAY)[0].name, "/robots.txt")
    assert b"Crawl-delay: 2" in cd.body
    ag = get(handler, site.with_robots(S.ROBOTS_AGENT_GROUPS)[0].name, "/robots.txt")
    assert b"User-agent: CrawlerD" in ag.body and b"Allow: /private/open/" in ag.body


def test_robots_redirect_chain(site, handler):
    host = site.with_robots(S.ROBOTS_REDIRECT)[0]
    target, hops = "/robots.txt", 0
    while True:
        r = get(handler, host.name, target)
        if r.status != 301:
            break
        target = urlsplit(dict(r.headers)["Location"]).path
        hops += 1
    assert hops == 2 and r.status == 200 and b"Disallow: /private/" in r.body


def test_robots_timeout_and_reset_actions(site, handler):
    hold = get(handler, site.with_robots(S.ROBOTS_TIMEOUT)[0].name, "/robots.txt")
    assert hold.action == ACTION_HOLD and hold.delay_s > 30
    assert get(handler, site.with_robots(S.ROBOTS_RESET)[0].name, "/robots.txt").action == ACTION_RESET


# --- special hosts ---

def test_rate_limited_host_429_cadence_with_retry_after(site):
    h = Handler(site, PORT)
    host = site.with_role(S.ROLE_RATE_LIMITED)[0]
    statuses = [get(h, host.name, f"/p/{i % host.pages}.html").status for i in range(8)]
    assert statuses == [200, 429, 200, 200, 200, 429, 200, 200]
    r = get(h, host.name, "/robots.txt")
    assert r.status == 200                                              # robots.txt is exempt
    r429 = [r for r in (get(h, host.name, "/") for _ in range(4)) if r.status != 200][0]
    assert r429.status == 429 and ("Retry-After", str(S.RETRY_AFTER_S)) in r429.headers
    assert r429.retry_after_s == S.RETRY_AFTER_S


def test_flaky_host_503_sometimes(site):
    h = Handler(site, PORT)
    host = site.with_role(S.ROLE_FLAKY)[0]
    statuses = [get(h, host.name, "/").status for _ in range(10)]
    assert statuses.count(503) == 2 and statuses.count(200) == 8


def test_slow_host_delay_range(site, handler):
    host = site.with_role(S.ROLE_SLOW)[0]
    delays = {get(handler, host.name, f"/p/{k}.html").delay_s for k in range(10)}
    lo, hi = S.SLOW_DELAY_RANGE_S
    assert all(lo <= d <= hi for d in delays) and len(delays) > 1


def test_calendar_trap_links_forever(site, handler):
    host = site.with_role(S.ROLE_TRAP_CALENDAR)[0]
    body = get(handler, host.name, "/cal?y=2026&m=12").body
    assert b'href="/cal?y=2027&amp;m=1"' in body or b'href="/cal?y=2027&m=1"' in body
    assert get(handler, host.name, "/cal?y=9000&m=1").status == 200
    assert get(handler, host.name, "/cal?y=2026&m=13").status == 404


def test_session_trap_fresh_sid_every_response(site, handler):
    host = site.with_role(S.ROLE_TRAP_SESSION)[0]
    a = get(handler, host.name, "/p/1.html?sid=abc").body
    b = get(handler, host.name, "/p/1.html?sid=abc").body
    sids_a = set(re.findall(rb"sid=([0-9a-f]+)", a))
    sids_b = set(re.findall(rb"sid=([0-9a-f]+)", b))
    assert len(sids_a) == 1 and len(sids_b) == 1 and sids_a != sids_b
    assert re.sub(rb"sid=[0-9a-f]+", b"", a) == re.sub(rb"sid=[0-9a-f]+", b"", b)


def test_depth_trap(site, handler):
    host = site.with_role(S.ROLE_TRAP_DEPTH)[0]
    deep = "/a/b" * 50 + "/"
    r = get(handler, host.name, deep)
    assert r.status == 200 and b'href="a/"' in r.body and b'href="b/"' in r.body
    assert get(handler, host.name, "/a/c/").status == 404


# --- conditional requests and encoding ---

def test_etag_and_last_modified_give_304(handler):
    r = get(handler, "h0.sim", "/p/2.html")
    hdr = dict(r.headers)
    assert get(handler, "h0.sim", "/p/2.html", inm=hdr["ETag"]).status == 304
    assert get(handler, "h0.sim", "/p/2.html", inm='"nope"').status == 200
    assert get(handler, "h0.sim", "/p/2.html", ims=hdr["Last-Modified"]).status == 304
    lm = email.utils.parsedate_to_datetime(hdr["Last-Modified"]).timestamp()
    earlier = email.utils.formatdate(lm - 86400, usegmt=True)
    assert get(handler, "h0.sim", "/p/2.html", ims=earlier).status == 200
    # If-None-Match takes precedence over If-Modified-Since (RFC 9110 §13.1.3)
    assert get(handler, "h0.sim", "/p/2.html", inm='"nope"', ims=hdr["Last-Modified"]).status == 200


def test_gzip_hosts_encode_when_asked(site, handler):
    host = next(h for h in normal_hosts(site) if h.gzip)
    plain = get(handler, host.name, "/p/1.html")
    gz = get(handler, host.name, "/p/1.html", accept_gzip=True)
    assert ("Content-Encoding", "gzip") in gz.headers and gzip.decompress(gz.body) == plain.body
    assert dict(gz.headers)["ETag"] != dict(plain.headers)["ETag"]
    other = next(h for h in normal_hosts(site) if not h.gzip)
    assert ("Content-Encoding", "gzip") not in get(handler, other.name, "/p/1.html", accept_gzip=True).headers


def test_cache_stays_within_budget(site):
    h = Handler(site, PORT, cache_bytes=200_000)
    host = normal_hosts(site)[0]
    for k in range(min(host.pages, 40)):
        get(h, host.name, f"/p/{k}.html")
    assert h.cached_bytes <= 200_000 and sum(len(e.body) for e in h.cache.values()) == h.cached_bytes


def test_host_header_forms(handler):
    from crawlerd.simweb.handler import host_name
    assert host_name("H0.SIM:8080") == host_name("h0.sim.") == host_name("h0.sim") == "h0.sim"
    assert get(handler, "H0.Sim.", "/p/1.html").status == 200
