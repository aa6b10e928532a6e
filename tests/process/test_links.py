"""links_from_page: dedup, fast path agreeing with normalize, fingerprints and host keys.

Every case runs against the native resolver and its pure-Python reference (``impl``)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crawlerd._native import links as links_native
from crawlerd._native import links_ref
from crawlerd.process.links import RESOLVER_HELPERS, links_from_page
from crawlerd.records import Link
from crawlerd.url.canonical import PATH_CHARS, QUERY_CHARS, fingerprint, normalize, parse_base
from crawlerd.url.hosts import host_key

BASE = "https://www.example.com/news/world/article-1.html?page=2"


IMPLS = pytest.mark.parametrize("impl", ["native", "ref"])


def _links(impl):
    """``links_from_page`` with the native resolver or the reference."""
    resolver = (links_native if impl == "native" else links_ref).LinkResolver(*RESOLVER_HELPERS)

    def resolve(hrefs, base_url, *, max_url_length=2048):
        return resolver.resolve(list(hrefs), base_url, parse_base(base_url), max_url_length)
    return resolve


def test_the_wrapper_uses_the_native_kernel_and_the_reference_the_same_classes():
    from crawlerd.process import links
    assert isinstance(links.resolver, links_native.LinkResolver)
    assert (links_ref.PATH_CHARS, links_ref.QUERY_CHARS) == (PATH_CHARS, QUERY_CHARS)
    assert [lk.url for lk in links_from_page([("/a", False)], BASE)] == ["https://www.example.com/a"]


@IMPLS
def test_typical_page(impl):
    hrefs = [
        ("/about/", False),
        ("related.html", False),
        ("../index.html", False),
        ("https://www.example.com/news?id=7&ref=home", False),
        ("//cdn.example.net/app.js", False),
        ("HTTP://Other.ORG:80/A%7e", True),
        ("mailto:x@example.com", False),
        ("javascript:void(0)", False),
        ("#top", False),
        ("?page=3", False),
    ]
    links = _links(impl)(hrefs, BASE)
    assert [(lk.url, lk.host_key, lk.nofollow) for lk in links] == [
        ("https://www.example.com/about/", "https://www.example.com", False),
        ("https://www.example.com/news/world/related.html", "https://www.example.com", False),
        ("https://www.example.com/news/index.html", "https://www.example.com", False),
        ("https://www.example.com/news?id=7&ref=home", "https://www.example.com", False),
        ("https://cdn.example.net/app.js", "https://cdn.example.net", False),
        ("http://other.org/A~", "http://other.org", True),
        ("https://www.example.com/news/world/article-1.html?page=2", "https://www.example.com", False),
        ("https://www.example.com/news/world/article-1.html?page=3", "https://www.example.com", False),
    ]
    assert all(isinstance(lk, Link) and lk.fp == fingerprint(lk.url) for lk in links)


@IMPLS
def test_duplicates_before_and_after_normalising(impl):
    hrefs = [("/a", True), ("/a", False), ("/a#x", True), ("https://WWW.example.com/a", True),
             ("/b", True), ("/b", True), ("/./b", True)]
    links = _links(impl)(hrefs, BASE)
    assert [(lk.url, lk.nofollow) for lk in links] == [
        ("https://www.example.com/a", False),          # one followable occurrence makes it followable
        ("https://www.example.com/b", True),
    ]


@IMPLS
def test_max_url_length(impl):
    long_path = "/" + "x" * 100
    links = _links(impl)([(long_path, False), ("/short", False)], "http://a.com/", max_url_length=50)
    assert [lk.url for lk in links] == ["http://a.com/short"]
    assert len(_links(impl)([(long_path, False)], "http://a.com/", max_url_length=113)) == 1
    assert len(_links(impl)([(long_path, False)], "http://a.com/", max_url_length=112)) == 0


@IMPLS
def test_invalid_base_keeps_absolute_links_only(impl):
    links = _links(impl)([("rel", False), ("http://a.com/x", False), ("//b.com/", False)], "not a url")
    assert [lk.url for lk in links] == ["http://a.com/x"]


@IMPLS
def test_bad_hosts_dropped_in_fast_path(impl):
    hrefs = [("http://a..b/", False), ("//a..b/x", False), ("http://1.2.3.4.5/", False), ("http://ok.com:99999/", False)]
    assert _links(impl)(hrefs, BASE) == []


@IMPLS
def test_empty(impl):
    assert _links(impl)([], BASE) == []


FAST_CASES = [
    "/", "/a/b", "/a/b/", "/a?b=c&d", "/a?", "/a#f", "/a?b#f", "/.well-known/x", "/a/./b", "/a/../b", "/a/..",
    "a", "a/b", "a?x", "a/./b", "a/../../../b", "a:b", "1a:b", "_x", "~u/", "a//b", "a/b/.",
    "http://A.com", "http://a.com", "http://a.com:80/x", "http://a.com:8080", "https://a.com:443/?", "http://a.com.",
    "https://a.com/x#y z", "http://a.com?x", "http://a.com/a/../b", "http://0x7f.1/", "http://1.2.3.4:0/",
    "//a.com/x", "//a.com", "///a.com/x", "http:/a.com/x", "httpx://a.com/", "https:a", "http://a.com:/",
    "http://a_b.com/", "http://-.com/", "http://a.com:0080/", "http://a.com:1/", "http://a.com/%41",
    "", "#", "#f", "#f?g", "?", "?a=b", "?a=b#f", "?a b", "?a?b", "/?x", "h", "help.html", "http", "httpdocs/a",
    "?%41", "#\t", "a b", "a#/../x", ".", "..", "./", "../", "./a", "../a", "../../../x?y", ".x", "..x/./y",
    "./a#f", "../?q", "//a.com/./x/../y",
]


@pytest.mark.parametrize("href", FAST_CASES)
@pytest.mark.parametrize("base", [BASE, "http://a.com", "http://a.com/dir/", "https://[::1]:8443/x/y"])
@IMPLS
def test_fast_path_agrees_with_normalize(impl, href, base):
    links = _links(impl)([(href, False)], base)
    expected = normalize(href, base)
    assert (links[0].url if links else None) == expected
    if links:
        assert links[0].host_key == host_key(expected)


HREF_CHARS = st.sampled_from(list("aB9-._~!$&'()*+,;=:@/?#%. \\\t") + ["..", "./", "//", "http://", "https://",
                                                                           "x.com", ":8080", "%2e", "ü", "@"])


@settings(max_examples=500, deadline=None)
@given(st.lists(HREF_CHARS, max_size=20).map("".join),
       st.sampled_from([BASE, "http://a.com/p/q", "https://b.org"]))
@IMPLS
def test_fast_path_agrees_with_normalize_property(impl, href, base):
    links = _links(impl)([(href, False)], base)
    assert (links[0].url if links else None) == normalize(href, base)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.lists(HREF_CHARS, max_size=12).map("".join), st.booleans()), max_size=12),
       st.sampled_from([BASE, "http://a.com/p/q", "https://b.org", "http://x.com:8080/d/", "not a url"]),
       st.sampled_from([2048, 30]))
def test_native_and_reference_give_the_same_links(pairs, base, max_url_length):
    native, ref = _links("native"), _links("ref")
    got, want = native(pairs, base, max_url_length=max_url_length), ref(pairs, base, max_url_length=max_url_length)
    assert [(lk.url, lk.fp, lk.host_key, lk.nofollow) for lk in got] == \
        [(lk.url, lk.fp, lk.host_key, lk.nofollow) for lk in want]
