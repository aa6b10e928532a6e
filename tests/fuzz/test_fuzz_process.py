"""HTML extraction and sitemap parsing: any bytes give a result, bounded, never an exception."""

from __future__ import annotations

import gzip

from hypothesis import example, given
from hypothesis import strategies as st

from crawlerd.process.html import decode_html, extract, parse_robots_directives, parse_x_robots_tag
from crawlerd.process.sitemaps import parse_sitemap
from tests.fuzz.conftest import budget

_TAG = st.sampled_from(["<a href='", "<a href=", "<A HREF=\"", "<area href=", "<base href=", "<meta name=robots content=",
                        "<meta http-equiv=content-type content='text/html; charset=", "<meta charset=", "<title>",
                        "</title>", "<script>", "</script>", "<style>", "<!--", "-->", "<![CDATA[", "<div>" * 3,
                        "</div>", "<svg><a xlink:href=", "<noscript>", "<template>", "<", ">", "'", "\"", "&amp;",
                        "&#0;", "&#x110000;", "\x00", "rel=nofollow ", "noindex,nofollow", "javascript:x",
                        "//other.example/p", "../../x?y#z", "http://[::1", "utf-16", "shift_jis", "x-user-defined"])
_HTML = st.one_of(
    st.lists(st.one_of(_TAG, st.text(max_size=10)), max_size=60).map(lambda p: "".join(p).encode("utf-8", "surrogatepass")),
    st.binary(max_size=600),
    st.builds(lambda bom, s: bom + s.encode("utf-16-le", "surrogatepass"), st.sampled_from([b"\xff\xfe", b""]),
              st.text(max_size=40)))
_CT = st.one_of(st.none(), st.sampled_from(["text/html", "text/html; charset=utf-16", "text/html; charset=bogus",
                                            "text/html; charset=", "text/html;charset=\"windows-1252\"",
                                            "application/xhtml+xml; charset=iso-2022-jp"]))


@budget()
@given(_HTML, _CT, st.integers(0, 50), st.sampled_from(["http://example.com/a/b", "https://[::1]:8443/"]))
@example(b"<div>" * 20_000, None, 10, "http://example.com/")
def test_extract_never_raises(body, content_type, max_links, base):
    info = extract(body, base, max_links=max_links, content_type=content_type, max_text_chars=5000)
    assert len(info.links) <= max_links
    assert len({href for href, _ in info.links}) == len(info.links)
    assert len(info.text) <= 5000 + 1
    decode_html(body, content_type)


@budget()
@given(st.text(max_size=40), st.lists(st.text(max_size=40), max_size=4))
def test_robots_directives_never_raise(value, values):
    parse_robots_directives(value)
    parse_x_robots_tag(values, "crawlerd")


_XML_BITS = st.sampled_from([
    "<?xml version='1.0' encoding='UTF-8'?>", "<?xml version=\"1.0\" encoding=\"utf-16\"?>",
    "<urlset xmlns='http://www.sitemaps.org/schemas/sitemap/0.9'>", "</urlset>", "<sitemapindex>",
    "</sitemapindex>", "<url>", "</url>", "<sitemap>", "</sitemap>", "<loc>", "</loc>", "<lastmod>", "</lastmod>",
    "<priority>", "</priority>", "http://example.com/dir/p", "http://example.com/other", "https://evil.example/x",
    "2024-02-30", "2024-01-01T25:61:61+99:99", "9999-12-31T23:59:59Z", "0001-01-01", "nan", "1e999", "-0.5", "0.7",
    "<!DOCTYPE x [<!ENTITY a 'aaaa'>]>", "&a;", "&amp;", "<![CDATA[http://example.com/dir/c]]>", "<rss><channel>",
    "<item><link>", "</link></item>", "<feed xmlns='http://www.w3.org/2005/Atom'>", "<entry><link href='",
    "'/></entry>", "\n", " ", "\x00", "<", "&"])
_SITEMAP = st.one_of(st.lists(_XML_BITS, max_size=50).map(lambda p: "".join(p).encode()),
                     st.binary(max_size=400),
                     st.lists(st.text(max_size=30), max_size=10).map(lambda ls: "\n".join(ls).encode("utf-8", "surrogatepass")))


@budget()
@given(_SITEMAP, st.booleans(), st.integers(1, 20), st.integers(1, 5000),
       st.sampled_from(["http://example.com/dir/sitemap.xml", "http://example.com/s.xml", "ftp://x/s", "garbage"]))
@example(gzip.compress(b"\x00" * 100_000), True, 5, 1000, "http://example.com/s.xml")
def test_sitemap_never_raises(data, gz, max_urls, max_bytes, url):
    if gz:
        data = gzip.compress(data)
    sm = parse_sitemap(data, url, max_urls=max_urls, max_bytes=max_bytes)
    assert len(sm.urls) <= max_urls and len(sm.sitemaps) <= max_urls
    for u in sm.urls:
        assert u.priority is None or 0.0 <= u.priority <= 1.0
        assert u.lastmod is None or u.lastmod == u.lastmod     # never nan
