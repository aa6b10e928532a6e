"""bench/peers/scrapy_peer.py: settings match crawlerd's politeness defaults; the spider follows
what crawlerd would follow (no rel=nofollow, nothing from a meta-nofollow page)."""


import pytest

pytest.importorskip("scrapy")
from scrapy.http import HtmlResponse, Response  # noqa: E402

from tests.bench.scripts import load_bench  # noqa: E402

peer = load_bench("peers/scrapy_peer.py")


def _html(url: str, body: str) -> HtmlResponse:
    return HtmlResponse(url=url, body=body.encode(), encoding="utf-8")


def test_settings_are_polite_and_bounded():
    s = peer.peer_settings(30.0, user_agent="ua (operator: x@localhost)", robots_agent="crawlerd", delay_s=1.0,
                           concurrency=1000, timeout_s=60.0, log_level="WARNING")
    assert s["ROBOTSTXT_OBEY"] is True and s["ROBOTSTXT_USER_AGENT"] == "crawlerd"
    assert s["DOWNLOAD_DELAY"] == 1.0 and s["RANDOMIZE_DOWNLOAD_DELAY"] is False
    assert s["AUTOTHROTTLE_ENABLED"] is False
    assert s["CONCURRENT_REQUESTS_PER_DOMAIN"] == 1 and s["CONCURRENT_REQUESTS"] == 1000
    assert s["CLOSESPIDER_TIMEOUT"] == 30.0
    assert s["COOKIES_ENABLED"] is False and s["TELNETCONSOLE_ENABLED"] is False


def test_parse_follows_links_but_not_nofollow_or_junk():
    spider = peer.SimWebSpider(seeds=["http://h0.sim:8080/"])
    body = ('<html><body><a href="/p/1.html">a</a> <a href="../p/2.html#x">b</a>'
            '<a rel="NoFollow external" href="/nf/1">c</a><a href="#top">d</a>'
            '<a href="mailto:x@y">e</a><a href="http://h1.sim:8080/p/0.html">f</a></body></html>')
    reqs = list(spider.parse(_html("http://h0.sim:8080/p/0.html", body)))
    assert [r.url.split("#")[0] for r in reqs] == ["http://h0.sim:8080/p/1.html", "http://h0.sim:8080/p/2.html",
                                     "http://h1.sim:8080/p/0.html"]
    assert spider.pages == 1 and spider.links_followed == 3


def test_meta_nofollow_page_and_binary_response_yield_nothing():
    spider = peer.SimWebSpider(seeds=[])
    page = ('<html><head><META NAME="Robots" content="noindex, NOFOLLOW"></head>'
            '<body><a href="/mnf/1">x</a></body></html>')
    assert list(spider.parse(_html("http://h0.sim/p/3.html", page))) == []
    assert list(spider.parse(Response(url="http://h0.sim/img/1.png", body=b"\x89PNG"))) == []
    assert spider.pages == 2


def test_meta_none_counts_as_nofollow():
    resp = _html("http://h0.sim/", '<meta name="robots" content="none"><a href="/x">x</a>')
    assert peer._meta_nofollow(resp) is True
    assert peer._meta_nofollow(_html("http://h0.sim/", '<meta name="robots" content="noindex">')) is False
