"""HTML extraction: links, base href, robots meta and X-Robots-Tag, charsets, hostile input."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crawlerd.process.html import (
    PageInfo,
    charset_from_content_type,
    decode_html,
    extract,
    parse_robots_directives,
    parse_x_robots_tag,
)

PAGE = "http://ex.com/dir/page.html"


def test_links_in_document_order_with_rel_nofollow():
    info = extract(b"""<html><body>
        <a href="a.html">A</a>
        <a href="b.html" rel="NoFollow noopener">B</a>
        <a href="c.html" rel="nofollowish">C</a>
        <map><area href="/area" alt="x"><area alt="no href"></map>
        <a name="anchor-only">no href</a>
        <a href="">empty</a>
        <link href="/style.css" rel="stylesheet">
        </body></html>""", PAGE)
    assert info.links == [("a.html", False), ("b.html", True), ("c.html", False), ("/area", False), ("", False)]
    assert info.base_url == PAGE
    assert not info.noindex and not info.nofollow


def test_duplicate_hrefs_kept_once_followable_if_any_occurrence_is():
    info = extract(b'<a href="x" rel="nofollow">1</a><a href="y" rel=nofollow>2</a>'
                   b'<a href="x">3</a><a href="y" rel="NOFOLLOW">4</a>', PAGE)
    assert info.links == [("x", False), ("y", True)]


def test_max_links():
    body = "".join(f'<a href="/p{i}">{i}</a>' for i in range(100)).encode()
    assert [h for h, _ in extract(body, PAGE, max_links=10).links] == [f"/p{i}" for i in range(10)]
    assert extract(body, PAGE, max_links=0).links == []


def test_links_inside_script_template_and_comments_are_not_links():
    info = extract(b'<script>document.write("<a href=js>")</script><!-- <a href="c"> -->'
                   b'<template><a href="t">t</a></template><textarea><a href="ta"></textarea><a href="real">', PAGE)
    assert info.links == [("real", False)]


@pytest.mark.parametrize(("head", "expected"), [
    ('<base href="/sub/dir/">', "http://ex.com/sub/dir/"),
    ('<base href="https://other.org/x/">', "https://other.org/x/"),
    ('<base href="../up/">', "http://ex.com/up/"),
    ('<base target="_blank"><base href="/second/">', "http://ex.com/second/"),
    ('<base href="/first/"><base href="/second/">', "http://ex.com/first/"),
    ('<base href="javascript:alert(1)">', PAGE),
    ('<base href="http://[bad/">', PAGE),
    ("<base>", PAGE),
])
def test_base_href(head, expected):
    assert extract(f"<html><head>{head}</head><body></body></html>".encode(), PAGE).base_url == expected


@pytest.mark.parametrize(("metas", "noindex", "nofollow"), [
    ('<meta name="robots" content="noindex">', True, False),
    ('<meta name="robots" content="nofollow">', False, True),
    ('<meta name="ROBOTS" content="NoIndex, NoFollow">', True, True),
    ('<meta name="robots" content="none">', True, True),
    ('<meta name="robots" content="all">', False, False),
    ('<meta name="robots" content="index,follow">', False, False),
    ('<meta name="robots" content="noindex nofollow">', True, True),
    ('<meta name="robots" content=" noarchive , nofollow ">', False, True),
    ('<meta name="crawlerd" content="noindex">', True, False),
    ('<meta name="CrawlerD" content="nofollow">', False, True),
    ('<meta name="googlebot" content="noindex, nofollow">', False, False),
    ('<meta name="robots" content="noindex"><meta name="crawlerd" content="nofollow">', True, True),
    ('<meta name="robots" content="all"><meta name="robots" content="noindex">', True, False),
    ('<meta name="robots">', False, False),
    ('<meta content="noindex">', False, False),
    ('<meta name=" robots " content="noindex">', True, False),
])
def test_meta_robots(metas, noindex, nofollow):
    info = extract(f"<html><head>{metas}</head><body>x</body></html>".encode(), PAGE)
    assert (info.noindex, info.nofollow) == (noindex, nofollow)


def test_meta_robots_for_another_agent_token():
    body = b'<meta name="otherbot" content="noindex"><meta name="crawlerd" content="nofollow">'
    info = extract(body, PAGE, agent_token="OtherBot")
    assert (info.noindex, info.nofollow) == (True, False)


@pytest.mark.parametrize(("values", "expected"), [
    ([], (False, False)),
    (["noindex"], (True, False)),
    (["noindex, nofollow"], (True, True)),
    (["NOINDEX,NOFOLLOW"], (True, True)),
    (["none"], (True, True)),
    (["all"], (False, False)),
    (["noarchive", "nofollow"], (False, True)),
    (["crawlerd: noindex"], (True, False)),
    (["CrawlerD: noindex, nofollow"], (True, True)),
    (["otherbot: noindex, nofollow"], (False, False)),
    (["otherbot: noindex", "crawlerd: nofollow"], (False, True)),
    (["otherbot: noindex, crawlerd: nofollow"], (False, True)),
    (["crawlerd: nofollow, otherbot: noindex"], (False, True)),
    (["noindex", "otherbot: nofollow"], (True, False)),
    (["otherbot: nofollow", "noindex"], (True, False)),
    (["crawlerd:"], (False, False)),
    (["max-snippet: 20, nofollow"], (False, True)),
    (["unavailable_after: 25 Jun 2010 15:00:00 PST"], (False, False)),
    (["unavailable_after: Friday, 25-Jun-2010 15:00:00 PST, noindex"], (True, False)),
    (["crawlerd: unavailable_after: 25 Jun 2010 15:00:00 PST"], (False, False)),
    ([", ,", ""], (False, False)),
    (["crawlerdx: noindex"], (False, False)),
])
def test_x_robots_tag(values, expected):
    assert parse_x_robots_tag(values, "crawlerd") == expected


def test_parse_robots_directives():
    assert parse_robots_directives("NONE") == (True, True)
    assert parse_robots_directives("index, follow, noimageindex") == (False, False)


def test_title_and_visible_text():
    info = extract(b"""<html><head><title>  Hello
        World </title><style>.x { color: red }</style><script>var hidden = 1;</script></head>
        <body><h1>Heading</h1><p>Some <b>bold</b>   text.</p>
        <script>alert("no")</script><noscript>enable js</noscript><style>p{}</style>
        <svg><text>svg text</text></svg><template>tmpl</template><p>End</p></body></html>""", PAGE)
    assert info.title == "Hello World"
    assert info.text == "Heading Some bold text. End"


def test_text_cap():
    body = ("<p>" + "word " * 1000 + "</p>").encode()
    assert len(extract(body, PAGE, max_text_chars=100).text) == 100


@pytest.mark.parametrize(("body", "content_type", "codec", "title"), [
    ("<title>Wérld</title>".encode(), None, "utf-8", "Wérld"),
    ("<title>Wérld</title>".encode("latin-1"), "text/html; charset=ISO-8859-1", "cp1252", "Wérld"),
    ("<title>Wérld</title>".encode("latin-1"), 'text/html; charset="latin1"', "cp1252", "Wérld"),
    ('<meta charset="windows-1252"><title>Wérld</title>'.encode("cp1252"), None, "cp1252", "Wérld"),
    ('<meta http-equiv="Content-Type" content="text/html; charset=shift_jis"><title>日本</title>'.encode("cp932"),
     None, "cp932", "日本"),
    ('<meta charset="koi8-r"><title>Мир</title>'.encode("koi8-r"), "text/html", "koi8-r", "Мир"),
    # the HTTP charset wins over the meta one
    ('<meta charset="koi8-r"><title>Wérld</title>'.encode(), "text/html; charset=utf-8", "utf-8", "Wérld"),
    # BOM wins over everything
    (b"\xef\xbb\xbf<title>W\xc3\xa9rld</title>", "text/html; charset=koi8-r", "utf-8", "Wérld"),
    ("<title>Wérld</title>".encode("utf-16-le"), None, "utf-8", ""),          # no BOM: not guessed
    (b"\xff\xfe" + "<title>Wérld</title>".encode("utf-16-le"), None, "utf-16-le", "Wérld"),
    ('<meta charset="utf-16"><title>Wérld</title>'.encode(), None, "utf-8", "Wérld"),
    # unknown or hostile labels fall back to UTF-8
    ('<meta charset="no-such-codec"><title>Wérld</title>'.encode(), None, "utf-8", "Wérld"),
    (b'<meta charset="bz2"><title>x</title>', None, "utf-8", "x"),
    (b'<meta charset="unicode_escape"><title>\\x41</title>', None, "utf-8", "\\x41"),
    ("<title>Wérld</title>".encode(), "text/html; charset=idna", "utf-8", "Wérld"),
    (b"<title>W\xe9rld</title>", None, "utf-8", "W\ufffdrld"),                  # invalid UTF-8: replaced
])
def test_charsets(body, content_type, codec, title):
    info = extract(body, PAGE, content_type=content_type)
    assert info.encoding == codec
    assert info.title == title


def test_charset_helpers():
    assert charset_from_content_type("text/html; charset=UTF-8") == "UTF-8"
    assert charset_from_content_type("text/html") is None
    assert charset_from_content_type(None) is None
    assert decode_html(b"abc") == ("abc", "utf-8")


@pytest.mark.parametrize("body", [
    b"",
    b"\x00\x00\x00",
    b"<<<<>>>><a href=",
    b"<a href='unterminated",
    b"<html><body><a href=x><div></a></div></p></table><a href=y>",
    b"</html></body></a>" * 100,
    b"<!--" + b"x" * 1000,
    b"<script>" + b"<a href=x>" * 100,
    b"<a href=\"\x00\x01\xff\">",
    b"\xff\xfe\xfd\xfc" * 100,
    b"<meta charset=\"\xff\xfe\"><a href=ok>",
    b"<table><tr><td><a href=t>" * 50,
    b'<base href="\x00"><a href=x>',
])
def test_malformed_html_never_raises(body):
    info = extract(body, PAGE)
    assert isinstance(info, PageInfo)
    assert all(isinstance(h, str) and isinstance(nf, bool) for h, nf in info.links)


def test_area_and_a_links_keep_document_order_across_namespaces():
    info = extract(b'<map><area href="/first"></map><a href="/second">2</a>'
                   b'<svg><a href="/svg-a"><title>t</title></a></svg><area href="/last">', PAGE)
    assert [h for h, _ in info.links] == ["/first", "/second", "/svg-a", "/last"]
    assert info.title == "t"            # the first title element in document order, as before


def test_misnested_html_still_yields_links():
    info = extract(b"<p><a href=x>one<div>two</a></div><a href=y>", PAGE)
    assert [h for h, _ in info.links][:1] == ["x"]
    assert ("y", False) in info.links


def test_pathological_nesting_is_cut_not_parsed():
    # 200,000 nested <div>s would take lexbor minutes (quadratic tree building).
    body = b'<a href="before">b</a>' + b"<div>" * 200_000 + b'<a href="after">a</a>'
    info = extract(body, PAGE)
    assert info.truncated
    assert info.links == [("before", False)]


def test_deep_but_normal_page_is_not_cut():
    body = (b"<div>" * 100 + b'<p>x <a href="/l">l</a> <img src=i.png><br>' * 3000 + b"</div>" * 100)
    info = extract(body, PAGE)
    assert not info.truncated
    assert info.links == [("/l", False)]


@pytest.mark.parametrize(("body", "content_type", "codec", "title"), [
    ("<title>Wérld</title>".encode(), None, "utf-8", "Wérld"),
    (b"\xef\xbb\xbf<title>W\xc3\xa9rld</title>", "text/html; charset=koi8-r", "utf-8", "Wérld"),
    ('<meta charset="windows-1252"><title>Wérld</title>'.encode("cp1252"), None, "cp1252", "Wérld"),
    ("<title>Wérld</title>".encode("latin-1"), "text/html; charset=ISO-8859-1", "cp1252", "Wérld"),
    (b"<title>W\xe9rld</title>", None, "utf-8", "W\ufffdrld"),
])
def test_a_page_with_many_tags_decides_its_codec_once(monkeypatch, body, content_type, codec, title):
    """Past _SCAN_ABOVE_TAGS a page is decoded for the depth scan: with the codec found once."""
    import crawlerd.process.html as html_mod
    calls = []
    real = html_mod.page_codec
    monkeypatch.setattr(html_mod, "page_codec", lambda *a: calls.append(1) or real(*a))
    info = extract(body + b"<br>" * 5000 + b'<a href="/x">x</a>', PAGE, content_type=content_type)
    assert calls == [1]
    assert (info.encoding, info.title, info.links, info.truncated) == (codec, title, [("/x", False)], False)


def test_stray_end_tags_do_not_hide_nesting():
    body = b"<div>" * 5000 + b"</nope>" * 5000 + b'<a href="deep">'
    assert extract(body, PAGE).truncated


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=2000))
def test_random_bytes_never_raise(body):
    info = extract(body, PAGE)
    assert isinstance(info.text, str)


HTMLISH = st.lists(st.sampled_from([
    "<a href='x'>", "<a href=y rel=nofollow>", "</a>", "<div>", "</div>", "<p>", "<base href='/b/'>",
    "<meta name=robots content=noindex>", "<title>", "</title>", "<script>", "</script>", "<table>", "<td>",
    "<!--", "-->", "text", "\x00", "é", "<area href=z>", "<", ">", "\"", "'", "=",
]), max_size=80).map("".join)


@settings(max_examples=150, deadline=None)
@given(HTMLISH)
def test_random_tag_soup_never_raises(doc):
    for codec in ("utf-8", "latin-1"):
        info = extract(doc.encode(codec, "replace"), PAGE)
        assert len(info.links) == len({h for h, _ in info.links})


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(["<a href='x'>", "<a href=\"é/ü\">", "</a>", "<p>", "<title>", "</title>",
                                 "<meta name=robots content=nofollow>", "<base href='/b/'>", "<script>",
                                 "</script>", "text", "Grüße", "日本", "\x00", "\U0001f600", " ", "<", ">"]),
                max_size=60).map("".join))
def test_a_utf8_page_parses_the_same_as_its_decoded_text(doc):
    """Valid UTF-8 goes to the parser as bytes (no decode): what it finds equals what the same
    text gives through the decoding path (a UTF-16 page with its BOM is always decoded first)."""
    def found(info: PageInfo):
        return (info.links, info.base_url, info.noindex, info.nofollow, info.title, info.canonical, info.text)

    decoded = extract(b"\xff\xfe" + doc.encode("utf-16-le"), PAGE)
    assert decoded.encoding == "utf-16-le"
    for body in (doc.encode(), b"\xef\xbb\xbf" + doc.encode()):
        info = extract(body, PAGE)
        assert info.encoding == "utf-8"
        assert found(info) == found(decoded)


def test_rel_canonical_first_one_resolved_against_the_base():
    from crawlerd.process.html import extract
    info = extract(b'<html><head><base href="/docs/"><link rel="alternate" href="/x">'
                   b'<link rel="Canonical Other" href="page.html?a=1#top"><link rel="canonical" href="/second">'
                   b'</head><body>t</body></html>', "http://h.example/p/1.html?view=print")
    assert info.canonical == "http://h.example/docs/page.html?a=1"
    assert extract(b"<p>no canonical</p>", "http://h.example/").canonical == ""
    assert extract(b'<link rel="canonical" href="javascript:void(0)">', "http://h.example/").canonical == ""


@pytest.mark.parametrize("value,expected", [
    ('<http://h.example/c>; rel="canonical"', "http://h.example/c"),
    ('</c?x=1>; rel=canonical', "http://h.example/c?x=1"),
    ('<https://cdn.example/a.css>; rel="preload"; as="style", </canon>; rel="canonical"', "http://h.example/canon"),
    ('</a>; rel="alternate"', ""),
    ("", ""),
])
def test_canonical_from_link_header(value, expected):
    from crawlerd.process.html import canonical_from_link_header
    assert canonical_from_link_header(value, "http://h.example/p") == expected
