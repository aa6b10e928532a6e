"""simweb's URL variants: what each kind serves, the canonical links, the bench's content oracle."""

from __future__ import annotations

import hashlib
import re
from urllib.parse import urljoin, urlsplit

import pytest

from crawlerd.process.html import extract
from crawlerd.simweb import site as S
from crawlerd.simweb.handler import Handler
from crawlerd.simweb.variants import content_key

PORT = 8123
HREF = re.compile(rb'<a href="([^"]*)"')


@pytest.fixture(scope="module")
def site():
    return S.Site(120, seed=3, variant_share=0.6)


@pytest.fixture(scope="module")
def handler(site):
    return Handler(site, PORT)


def get(handler, host, target):
    return handler.handle(f"{host.name}:{PORT}", target)[1]


def hosts_with(site, kind):
    return [h for h in site.hosts if any(v.split(":")[0] == kind or v == kind for v in h.variants)]


def text_of(host, target, body):
    return extract(body, f"http://{host.name}:{PORT}{target}").text


def canonical_of(host, target, body):
    return extract(body, f"http://{host.name}:{PORT}{target}").canonical


def linked_targets(handler, host, k=None):
    """Same-host targets linked from the home page and a few pages."""
    out = set()
    for path in ["/"] + [f"/p/{i}.html" for i in range(min(host.pages, 6))]:
        base = f"http://{host.name}:{PORT}{path}"
        for href in HREF.findall(get(handler, host, path).body):
            u = urlsplit(urljoin(base, href.decode()))
            if u.hostname == host.name:
                out.add(u.path + (f"?{u.query}" if u.query else ""))
    return out


def test_only_ordinary_hosts_and_never_h0_have_variants(site):
    with_v = [h for h in site.hosts if h.variants]
    assert 0.3 * len(site.hosts) < len(with_v) < 0.7 * len(site.hosts)
    assert all(h.role == S.ROLE_NORMAL for h in with_v) and not site.hosts[0].variants
    assert site.describe()["hosts"][with_v[0].name]["variants"] == list(with_v[0].variants)
    assert not any(h.variants for h in S.Site(120, seed=3).hosts)          # off by default


@pytest.mark.parametrize("kind", ["tracking", "sort"])
def test_exact_variants_serve_the_same_bytes(site, handler, kind):
    n = 0
    for host in hosts_with(site, kind)[:4]:
        for t in sorted(linked_targets(handler, host)):
            path = t.partition("?")[0]
            if t == path or not path.startswith("/p/") or ("utm_" not in t and "ref=" not in t and "fbclid" not in t
                                                         and "sort=" not in t):
                continue
            if "page=" in t or "lang=" in t or "view=" in t or "sid=" in t:
                continue
            assert get(handler, host, t).body == get(handler, host, path).body, t
            assert content_key(site.describe(PORT)["hosts"][host.name], t) == f"p/{path[3:-5]}"
            n += 1
    assert n > 0


@pytest.mark.parametrize("kind,marker", [("print", "view=print"), ("mobile", "/m/p/"), ("session", "sid")])
def test_view_variants_keep_the_text_and_name_the_canonical(site, handler, kind, marker):
    n = 0
    for host in hosts_with(site, kind)[:4]:
        desc = site.describe(PORT)["hosts"][host.name]
        for t in sorted(x for x in linked_targets(handler, host) if marker in x):
            v = get(handler, host, t)
            path = ("/p/" + t.split("/p/", 1)[1]).split("?")[0].split(";")[0]
            c = get(handler, host, path)
            assert v.status == 200 and hashlib.sha1(v.body).digest() != hashlib.sha1(c.body).digest()
            assert text_of(host, t, v.body) == text_of(host, path, c.body), t
            assert canonical_of(host, t, v.body) == f"http://{host.name}:{PORT}{path}"
            assert content_key(desc, t) == content_key(desc, path) == f"p/{path[3:-5]}"
            n += 1
    assert n > 0


@pytest.mark.parametrize("kind,param", [("paged", "page"), ("lang", "lang")])
def test_parameters_that_change_the_page(site, handler, kind, param):
    n = 0
    for host in hosts_with(site, kind)[:4]:
        desc = site.describe(PORT)["hosts"][host.name]
        for t in sorted(x for x in linked_targets(handler, host) if f"{param}=" in x):
            path = t.partition("?")[0]
            v, c = get(handler, host, t), get(handler, host, path)
            assert text_of(host, t, v.body) != text_of(host, path, c.body)
            assert canonical_of(host, t, v.body) == f"http://{host.name}:{PORT}{t}"    # its own canonical
            assert content_key(desc, t) != content_key(desc, path)
            n += 1
    assert n > 0
    host = hosts_with(site, "paged")[0]
    assert get(handler, host, "/p/1.html?page=1").body == get(handler, host, "/p/1.html").body


def test_variants_of_other_hosts_are_not_served(site, handler):
    plain = next(h for h in site.hosts if h.role == S.ROLE_NORMAL and not h.variants and h.index)
    assert get(handler, plain, "/m/p/1.html").status == 404
    only_print = next(h for h in site.hosts if h.variants and "mobile" not in h.variants)
    assert get(handler, only_print, "/m/p/1.html").status == 404
    assert content_key(site.describe(PORT)["hosts"][plain.name], "/p/1.html") is None


def test_rendering_is_deterministic(site):
    a, b = Handler(site, PORT), Handler(S.Site(120, seed=3, variant_share=0.6), PORT)
    host = next(h for h in site.hosts if h.variants)
    for t in ["/", "/p/2.html", "/p/2.html?view=print", "/m/p/2.html", "/p/2.html?page=3"]:
        assert a.handle(f"{host.name}:{PORT}", t)[1].body == b.handle(f"{host.name}:{PORT}", t)[1].body
