"""parse_sitemap: the formats of the sitemaps.org protocol, its same-site rule, and hostile input."""

import gzip
import zlib
from datetime import UTC, datetime

import pytest

from crawlerd.process.sitemaps import parse_sitemap

SM = "https://www.example.com/sitemap.xml"
NS = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'


def urlset(*entries: str, ns: str = NS) -> bytes:
    return f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset {ns}>{"".join(entries)}</urlset>'.encode()


def url(loc: str, extra: str = "") -> str:
    return f"<url><loc>{loc}</loc>{extra}</url>"


def ts(*args) -> float:
    return datetime(*args, tzinfo=UTC).timestamp()


# ------------------------------------------------------------------ formats


def test_urlset_with_fields():
    data = urlset(
        url("https://www.example.com/a", "<lastmod>2024-05-01</lastmod><priority>0.8</priority>"
                                         "<changefreq>daily</changefreq>"),
        url("  https://www.example.com/b?x=1&amp;y=2  ", "<priority>2.0</priority><lastmod>junk</lastmod>"),
    )
    sm = parse_sitemap(data, SM)
    assert [u.url for u in sm.urls] == ["https://www.example.com/a", "https://www.example.com/b?x=1&y=2"]
    assert sm.urls[0].lastmod == ts(2024, 5, 1) and sm.urls[0].priority == 0.8
    assert sm.urls[1].lastmod is None and sm.urls[1].priority is None
    assert sm.errors == [] and sm.rejected == 0 and sm.sitemaps == []


def test_sitemap_index():
    data = (f'<sitemapindex {NS}>'
            '<sitemap><loc>https://www.example.com/s1.xml.gz</loc><lastmod>2024-01-01</lastmod></sitemap>'
            '<sitemap><loc>https://www.example.com/deep/s2.xml</loc></sitemap>'
            '<sitemap><loc>https://evil.example/s3.xml</loc></sitemap>'
            '</sitemapindex>').encode()
    sm = parse_sitemap(data, "https://www.example.com/sitemaps/index.xml")
    # children need the same site only, not the same directory
    assert sm.sitemaps == ["https://www.example.com/s1.xml.gz", "https://www.example.com/deep/s2.xml"]
    assert sm.rejected == 1 and sm.urls == []


def test_gzip_and_concatenated_members():
    data = urlset(url("https://www.example.com/a"), url("https://www.example.com/b"))
    assert [u.url for u in parse_sitemap(gzip.compress(data), SM).urls][-1] == "https://www.example.com/b"
    text = gzip.compress(b"https://www.example.com/1\n") + gzip.compress(b"https://www.example.com/2\n")
    assert [u.url for u in parse_sitemap(text, SM).urls] == ["https://www.example.com/1",
                                                             "https://www.example.com/2"]


def test_plain_text():
    data = b"\xef\xbb\xbfhttps://www.example.com/a\r\n\r\n  https://www.example.com/b  \nftp://x/y\nnot a url\n"
    sm = parse_sitemap(data, "https://www.example.com/sitemap.txt")
    assert [u.url for u in sm.urls] == ["https://www.example.com/a", "https://www.example.com/b"]
    assert sm.rejected == 2


def test_namespace_prefixes_and_extensions():
    data = (b'<sm:urlset xmlns:sm="http://www.sitemaps.org/schemas/sitemap/0.9" '
            b'xmlns:image="http://www.google.com/schemas/sitemap-image/1.1" '
            b'xmlns:xhtml="http://www.w3.org/1999/xhtml">'
            b'<sm:url><xhtml:link rel="alternate" hreflang="de" href="https://www.example.com/de/a"/>'
            b'<sm:loc>https://www.example.com/a</sm:loc>'
            b'<image:image><image:loc>https://cdn.example.net/i.jpg</image:loc></image:image></sm:url>'
            b'</sm:urlset>')
    sm = parse_sitemap(data, SM)
    assert [u.url for u in sm.urls] == ["https://www.example.com/a"]
    assert sm.rejected == 0


def test_rss_and_atom():
    rss = (b'<rss version="2.0"><channel><title>t</title><link>https://www.example.com/</link>'
           b'<item><title>x</title><link>https://www.example.com/p1</link></item>'
           b'<item><link>https://www.example.com/p2</link></item></channel></rss>')
    assert [u.url for u in parse_sitemap(rss, SM).urls] == ["https://www.example.com/p1",
                                                            "https://www.example.com/p2"]
    atom = (b'<feed xmlns="http://www.w3.org/2005/Atom"><link href="https://www.example.com/"/>'
            b'<entry><link rel="edit" href="https://www.example.com/edit/1"/>'
            b'<link href="https://www.example.com/e1"/></entry></feed>')
    assert [u.url for u in parse_sitemap(atom, SM).urls] == ["https://www.example.com/e1"]


def test_encodings():
    body = '<?xml version="1.0" encoding="ISO-8859-1"?><urlset><url><loc>https://www.example.com/caf\u00e9</loc></url></urlset>'
    assert parse_sitemap(body.encode("latin-1"), SM).urls[0].url == "https://www.example.com/caf\u00e9"
    body16 = '<?xml version="1.0" encoding="UTF-16"?><urlset><url><loc>https://www.example.com/x</loc></url></urlset>'
    assert parse_sitemap(body16.encode("utf-16"), SM).urls[0].url == "https://www.example.com/x"


@pytest.mark.parametrize("text,expected", [
    ("2024", ts(2024, 1, 1)),
    ("2024-05", ts(2024, 5, 1)),
    ("2024-05-01T10:20+02:00", ts(2024, 5, 1, 8, 20)),
    ("2024-05-01T10:20:30Z", ts(2024, 5, 1, 10, 20, 30)),
    ("2024-05-01T10:20:30.5-01:30", ts(2024, 5, 1, 11, 50, 30) + 0.5),
    ("2024-05-01T10:20:30", ts(2024, 5, 1, 10, 20, 30)),
    ("2024-13-01", None),
    ("yesterday", None),
    ("2024-05-01T10:20:30+25:00", None),
])
def test_lastmod_formats(text, expected):
    sm = parse_sitemap(urlset(url("https://www.example.com/a", f"<lastmod>{text}</lastmod>")), SM)
    assert sm.urls[0].lastmod == expected


# ------------------------------------------------------------------ same-site rule


@pytest.mark.parametrize("loc,kept", [
    ("https://www.example.com/catalog/a", True),
    ("https://WWW.EXAMPLE.COM:443/catalog/a", True),
    ("https://www.example.com/catalog/", True),
    ("https://www.example.com/catalog", False),            # outside the directory
    ("https://www.example.com/other/a", False),
    ("http://www.example.com/catalog/a", False),           # other scheme
    ("https://www.example.com:8443/catalog/a", False),     # other port
    ("https://example.com/catalog/a", False),              # other host
    ("https://www.example.com.evil.net/catalog/a", False),
    ("/catalog/a", False),                                 # relative: not allowed by the protocol
    ("https://[::1/catalog/a", False),                     # unparseable
    ("https://www.example.com/catalog/" + "a" * 2100, False),  # too long
])
def test_same_site_and_directory(loc, kept):
    sm = parse_sitemap(urlset(url(loc)), "https://www.example.com/catalog/sitemap.xml")
    assert (len(sm.urls) == 1) is kept
    assert sm.rejected == (0 if kept else 1)


def test_bad_sitemap_url():
    sm = parse_sitemap(urlset(url("https://www.example.com/a")), "not a url")
    assert sm.urls == [] and sm.errors


# ------------------------------------------------------------------ limits and hostile input


def test_max_urls():
    data = urlset(*(url(f"https://www.example.com/{i}") for i in range(100)))
    sm = parse_sitemap(data, SM, max_urls=10)
    assert len(sm.urls) == 10 and any("more than 10" in e for e in sm.errors)
    txt = "\n".join(f"https://www.example.com/{i}" for i in range(100)).encode()
    assert len(parse_sitemap(txt, SM, max_urls=7).urls) == 7


def test_gzip_bomb_ends_at_the_cap():
    bomb = gzip.compress(b"\n" * (16 * 1024 * 1024), compresslevel=9)   # 16 MiB of newlines, ~16 KiB
    assert len(bomb) < 200 * 1024
    sm = parse_sitemap(bomb, SM, max_bytes=1024 * 1024)
    assert sm.urls == [] and any("expands past" in e for e in sm.errors)


def test_bad_and_truncated_gzip():
    data = gzip.compress(urlset(*(url(f"https://www.example.com/{i}") for i in range(500))))
    sm = parse_sitemap(data[: len(data) // 2], SM)
    assert any("truncated" in e for e in sm.errors)
    assert 0 < len(sm.urls) < 500                            # what arrived is kept
    sm = parse_sitemap(b"\x1f\x8b" + b"\x00" * 50, SM)
    assert sm.urls == [] and any("gzip" in e for e in sm.errors)


def test_plain_bytes_cap():
    data = urlset(*(url(f"https://www.example.com/{i}") for i in range(1000)))
    sm = parse_sitemap(data, SM, max_bytes=len(data) // 2)
    assert 0 < len(sm.urls) < 1000 and len(sm.errors) == 2  # cap, then the cut-off XML


BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
 <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
 <!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
 <!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
 <!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">
]>
<urlset><url><loc>https://www.example.com/&lol9;</loc></url></urlset>"""

EXTERNAL_ENTITY = b"""<?xml version="1.0"?>
<!DOCTYPE urlset [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>
<urlset><url><loc>https://www.example.com/&xxe;</loc></url></urlset>"""


@pytest.mark.parametrize("data", [BILLION_LAUGHS, EXTERNAL_ENTITY,
                                  b'<!DOCTYPE urlset SYSTEM "http://127.0.0.1:9/dtd"><urlset/>'])
def test_doctype_refused(data):
    sm = parse_sitemap(data, SM)
    assert sm.urls == [] and any("DOCTYPE" in e for e in sm.errors)


def test_undefined_entity_is_an_error():
    sm = parse_sitemap(urlset(url("https://www.example.com/a"), url("https://www.example.com/&nope;")), SM)
    assert [u.url for u in sm.urls] == ["https://www.example.com/a"]
    assert any("malformed" in e for e in sm.errors)


@pytest.mark.parametrize("data", [
    b"", b"   ", b"<", b"<urlset", b"<urlset><url><loc>https://www.example.com/a",
    b"<html><body>Not Found</body></html>", b"<?xml version='1.0'?>", b"\x00\x01\x02<urlset/>",
    b"<urlset><url><loc>https://www.example.com/a</loc></url><url><loc>x</loc></urlset>",
    b"<urlset>" + b"<a>" * 50_000 + b"</urlset>",
    zlib.compress(b"<urlset/>"),                 # zlib, not gzip: read as text, rejected
])
def test_malformed_never_raises(data):
    sm = parse_sitemap(data, SM)
    assert isinstance(sm.errors, list)
    assert all(u.url.startswith("https://www.example.com/") for u in sm.urls)


def test_truncated_xml_keeps_complete_entries():
    data = urlset(*(url(f"https://www.example.com/{i}") for i in range(10)))
    sm = parse_sitemap(data[:-30], SM)
    assert len(sm.urls) == 9 and any("malformed" in e for e in sm.errors)


def test_huge_loc_text_is_rejected_not_kept():
    sm = parse_sitemap(urlset(url("https://www.example.com/" + "a" * 1_000_000)), SM)
    assert sm.urls == [] and sm.rejected == 1


def test_not_a_sitemap_root():
    sm = parse_sitemap(b"<html><body><a href='https://www.example.com/x'>x</a></body></html>", SM)
    assert sm.urls == [] and any("not a sitemap" in e for e in sm.errors)
