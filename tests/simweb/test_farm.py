"""simweb's farm shape (a link farm and big legitimate domains) and its one-domain shape."""

import re

import pytest

from crawlerd.simweb.__main__ import main as simweb_main
from crawlerd.simweb.farm import FARM_OUT_LINKS, ROLE_FARM, ROLE_GIANT, FarmShape
from crawlerd.simweb.handler import Handler
from crawlerd.simweb.server import SimServer
from crawlerd.simweb.site import Site
from crawlerd.url.hosts import registered_domain

SHAPE = FarmShape(domains=20, hosts_per_domain=3, in_rate=0.01, giants=3, giant_hosts=4)
HREF = re.compile(rb'href="http://([^/:"]+)')


@pytest.fixture(scope="module")
def web():
    site = Site(80, seed=3, shape=SHAPE)
    return site, Handler(site, 8000)


def test_farm_and_giant_hosts_are_added_after_the_ordinary_ones_and_marked(web):
    site, _ = web
    assert site.n_hosts == 80 and len(site.hosts) == 80 + 3 * 4 + 20 * 3
    desc = site.describe(8000)
    roles = [desc["hosts"][h.name]["role"] for h in site.hosts]
    assert roles[80:92] == [ROLE_GIANT] * 12 and roles[92:] == [ROLE_FARM] * 60
    assert desc["shape"]["farm_domains"] == 20
    plds = {registered_domain(h.name) for h in site.hosts if h.role == ROLE_FARM}
    assert plds == {f"spam{f}.sim" for f in range(20)}
    assert {registered_domain(h.name) for h in site.with_role(ROLE_GIANT)} == {"giant0.sim", "giant1.sim",
                                                                                         "giant2.sim"}
    assert all(h.role != ROLE_FARM for h in site.hosts[:80])
    assert Site(80, seed=3, shape=SHAPE).describe(8000) == desc           # a pure function of the arguments


def test_farm_pages_are_endless_and_link_mostly_to_other_farm_domains(web):
    site, handler = web
    host = site.with_role(ROLE_FARM)[7]
    for k in (0, 17, 999_999_999):
        _, r = handler.handle(f"{host.name}:8000", f"/f/{k}.html")
        assert r.status == 200
        names = [n.decode() for n in HREF.findall(r.body)]
        farm = [n for n in names if ".spam" in n]
        other = {registered_domain(n) for n in farm} - {registered_domain(host.name)}
        assert len(farm) >= FARM_OUT_LINKS and len(other) >= FARM_OUT_LINKS // 2
    assert handler.handle(f"{host.name}:8000", "/f/01.html")[1].status == 404
    assert handler.handle(f"{host.name}:8000", "/p/1.html")[1].status == 404
    assert handler.handle(f"{host.name}:8000", "/f/3.html")[1].body == handler.handle(f"{host.name}:8000",
                                                                                   "/f/3.html")[1].body


def test_ordinary_pages_link_to_giants_often_and_into_the_farm_rarely(web):
    site, handler = web
    pages = farm = giant = 0
    for host in site.hosts[:80]:
        if host.role != "normal":
            continue
        for k in range(0, host.pages, 2):
            _, r = handler.handle(f"{host.name}:8000", f"/p/{k}.html")
            if r.status != 200:
                continue
            pages += 1
            names = HREF.findall(r.body)
            farm += any(b".spam" in n for n in names)
            giant += any(b".giant" in n for n in names)
    assert pages > 1000
    assert 0.3 < giant / pages < 0.7
    assert 0.002 < farm / pages < 0.03                                   # about in_rate = 1%


def test_seeds_leave_the_farm_out():
    seeds = SimServer(Site(30, seed=1, shape=SHAPE)).announcement()["seeds"]
    assert len(seeds) == 30 + 12 and not any(".spam" in s for s in seeds)


def test_one_domain_puts_every_ordinary_host_under_one_registered_domain():
    plain, one = Site(40, seed=2), Site(40, seed=2, shape=FarmShape(one_domain="uni.sim"))
    assert {registered_domain(h.name) for h in one.hosts} == {"uni.sim"}
    assert [h.ip for h in one.hosts] == [h.ip for h in plain.hosts]
    assert [h.pages for h in one.hosts] == [h.pages for h in plain.hosts]


def test_bad_shapes_are_refused(capsys):
    with pytest.raises(ValueError):
        FarmShape(domains=-1)
    with pytest.raises(ValueError):
        FarmShape(one_domain="nodot")
    assert simweb_main(["--farm-domains", "3", "--farm-in-rate", "2"]) == 2
    assert "in_rate" in capsys.readouterr().err
