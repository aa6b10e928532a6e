"""URL normalisation, fingerprints, host keys and registered domains."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crawlerd.url.canonical import MAX_INPUT_CHARS, fingerprint, normalize, normalize_authority
from crawlerd.url.hosts import host_key, host_of, port_of, registered_domain

RFC_BASE = "http://a/b/c/d;p?q"

# RFC 3986 §5.4.1 normal examples.
RFC_NORMAL = [
    ("g:h", None),                       # not http(s)
    ("g", "http://a/b/c/g"),
    ("./g", "http://a/b/c/g"),
    ("g/", "http://a/b/c/g/"),
    ("/g", "http://a/g"),
    ("//g", "http://g/"),
    ("?y", "http://a/b/c/d;p?y"),
    ("g?y", "http://a/b/c/g?y"),
    ("#s", "http://a/b/c/d;p?q"),
    ("g#s", "http://a/b/c/g"),
    ("g?y#s", "http://a/b/c/g?y"),
    (";x", "http://a/b/c/;x"),
    ("g;x", "http://a/b/c/g;x"),
    ("g;x?y#s", "http://a/b/c/g;x?y"),
    ("", "http://a/b/c/d;p?q"),
    (".", "http://a/b/c/"),
    ("./", "http://a/b/c/"),
    ("..", "http://a/b/"),
    ("../", "http://a/b/"),
    ("../g", "http://a/b/g"),
    ("../..", "http://a/"),
    ("../../", "http://a/"),
    ("../../g", "http://a/g"),
]

# RFC 3986 §5.4.2 abnormal examples ("http:g" as in the non-strict parser and browsers).
RFC_ABNORMAL = [
    ("../../../g", "http://a/g"),
    ("../../../../g", "http://a/g"),
    ("/./g", "http://a/g"),
    ("/../g", "http://a/g"),
    ("g.", "http://a/b/c/g."),
    (".g", "http://a/b/c/.g"),
    ("g..", "http://a/b/c/g.."),
    ("..g", "http://a/b/c/..g"),
    ("./../g", "http://a/b/g"),
    ("./g/.", "http://a/b/c/g/"),
    ("g/./h", "http://a/b/c/g/h"),
    ("g/../h", "http://a/b/c/h"),
    ("g;x=1/./y", "http://a/b/c/g;x=1/y"),
    ("g;x=1/../y", "http://a/b/c/y"),
    ("g?y/./x", "http://a/b/c/g?y/./x"),
    ("g?y/../x", "http://a/b/c/g?y/../x"),
    ("g#s/./x", "http://a/b/c/g"),
    ("g#s/../x", "http://a/b/c/g"),
    ("http:g", "http://a/b/c/g"),
]


@pytest.mark.parametrize(("ref", "expected"), RFC_NORMAL + RFC_ABNORMAL)
def test_rfc3986_resolution_examples(ref, expected):
    assert normalize(ref, RFC_BASE) == expected


BASE = "http://Example.com/a/b/c?q=1"

CASES = [
    # case, default ports, empty path, fragment
    ("HTTP://WWW.Example.COM", None, "http://www.example.com/"),
    ("https://example.com:443/x", None, "https://example.com/x"),
    ("http://example.com:443/x", None, "http://example.com:443/x"),
    ("http://example.com:80/x#top", None, "http://example.com/x"),
    ("http://example.com:8080", None, "http://example.com:8080/"),
    ("http://example.com:/", None, "http://example.com/"),
    ("http://example.com:00080/", None, "http://example.com/"),
    # percent-encoding
    ("http://a.com/%7efoo/%41%2f%2F?x=%2b%7E", None, "http://a.com/~foo/A%2F%2F?x=%2B~"),
    ("http://a.com/%zz%4", None, "http://a.com/%25zz%254"),
    ("http://a.com/a b?c d", None, "http://a.com/a%20b?c%20d"),
    ("http://a.com/ü?ä=ö", None, "http://a.com/%C3%BC?%C3%A4=%C3%B6"),
    ("http://a.com/[x]{y}|^`\"<>", None, "http://a.com/%5Bx%5D%7By%7D%7C%5E%60%22%3C%3E"),
    ("http://a.com/\x00\x01\x7f", None, "http://a.com/%00%01%7F"),
    ("http://a.com/\ud800", None, "http://a.com/%ED%A0%80"),
    ("http://a.com/p?a=1&b=2&a=0&b", None, "http://a.com/p?a=1&b=2&a=0&b"),     # order kept
    ("http://a.com/p?x=a/b?c", None, "http://a.com/p?x=a/b?c"),
    ("http://a.com/%2e%2E/x/%2e/y", None, "http://a.com/x/y"),
    # empty query rule
    ("http://a.com/p?", None, "http://a.com/p"),
    ("http://a.com/p?#frag", None, "http://a.com/p"),
    ("?", BASE, "http://example.com/a/b/c"),
    # whitespace and controls (WHATWG)
    ("  \t http://a.com/x \n", None, "http://a.com/x"),
    ("http://a.\tcom/x\ny", None, "http://a.com/xy"),
    ("\x00\x1fhttp://a.com/\x1f", None, "http://a.com/"),
    ("java\nscript:alert(1)", BASE, None),
    # slashes
    ("http:/x", None, "http://x/"),
    ("http:x", None, "http://x/"),
    ("http:/x", BASE, "http://example.com/x"),
    ("http:x", BASE, "http://example.com/a/b/x"),
    ("https:x", BASE, "https://x/"),
    ("http:///x.com/y", None, "http://x.com/y"),
    ("http:\\\\x.com\\y\\z?a\\b", None, "http://x.com/y/z?a%5Cb"),
    ("\\\\cdn.com/x", BASE, "http://cdn.com/x"),
    ("\\x", BASE, "http://example.com/x"),
    ("//cdn.example.org/lib.js", "https://a.com/", "https://cdn.example.org/lib.js"),
    ("http://a.com//x//y/", None, "http://a.com//x//y/"),
    ("http://a.com?x=1", None, "http://a.com/?x=1"),
    # userinfo is dropped
    ("http://user:pass@Host.com/", None, "http://host.com/"),
    ("http://good.com@evil.com/", None, "http://evil.com/"),
    ("http://a@b@c.com/", None, "http://c.com/"),
    # hosts
    ("http://a.com./", None, "http://a.com/"),
    ("http://a..com/", None, None),
    ("http://.a.com/", None, None),
    ("http://a.com../", None, None),
    ("http://a b.com/", None, None),
    ("http://a<b.com/", None, None),
    ("http://ex%41mple.com/", None, "http://example.com/"),
    ("http://ex%ff.com/", None, None),
    ("http://a_b.com/", None, "http://a_b.com/"),
    ("http://" + "a" * 64 + ".com/", None, None),
    ("http://" + "a." * 130 + "com/", None, None),
    ("http:///", None, None),
    ("http://", None, None),
    ("http://:80/", None, None),
    ("http://@/", None, None),
    # IDNA (UTS #46 non-transitional, as browsers)
    ("http://Bücher.example/", None, "http://xn--bcher-kva.example/"),
    ("http://faß.de/", None, "http://xn--fa-hia.de/"),
    ("http://ＥＸＡＭＰＬＥ。com/", None, "http://example.com/"),
    ("http://☃.net/", None, "http://xn--n3h.net/"),
    ("http://xn--bcher-kva.example/", None, "http://xn--bcher-kva.example/"),
    ("http://xn--zz.com/", None, None),
    ("http://\u2028.com/", None, None),
    ("http://a\ufffdb.com/", None, None),
    # IPv4 spellings (WHATWG)
    ("http://127.0.0.1:8080/", None, "http://127.0.0.1:8080/"),
    ("http://0x7f.1/", None, "http://127.0.0.1/"),
    ("http://2130706433/", None, "http://127.0.0.1/"),
    ("http://0177.0.0.01/", None, "http://127.0.0.1/"),
    ("http://1.2.3.4.5/", None, None),
    ("http://256.1.1.1/", None, None),
    ("http://1.2.3.256/", None, None),
    ("http://1.2.65535/", None, "http://1.2.255.255/"),   # the last part fills the rest (WHATWG)
    ("http://1.2.65536/", None, None),
    ("http://4294967296/", None, None),
    ("http://a.1/", None, None),
    ("http://1.a/", None, "http://1.a/"),              # ends in a label, not a number: a name
    ("http://99999999999999999999999999/", None, None),
    # IPv6
    ("http://[::1]:8080/x", None, "http://[::1]:8080/x"),
    ("http://[2001:DB8:0:0:1:0:0:1]/", None, "http://[2001:db8::1:0:0:1]/"),
    ("http://[::FFFF:1.2.3.4]/", None, "http://1.2.3.4/"),          # IPv4-mapped: its IPv4 host
    ("http://[::ffff:127.1.1.1]:8080/a", None, "http://127.1.1.1:8080/a"),
    ("https://[::ffff:7f01:101]:443/", None, "https://127.1.1.1/"),
    ("http://[::127.0.0.1]/", None, "http://[::7f00:1]/"),           # IPv4-compatible (deprecated): not mapped
    ("http://[::ffff:0:1.2.3.4]/", None, "http://[::ffff:0:102:304]/"),  # SIIT: not mapped
    ("http://[::1/", None, None),
    ("http://[zz]/", None, None),
    ("http://[1:2:3:4:5:6:7:8:9]/", None, None),
    ("http://[fe80::1%25eth0]/", None, None),
    ("http://[::1]x/", None, None),
    ("http://::1/", None, None),
    # ports
    ("http://a.com:65535/", None, "http://a.com:65535/"),
    ("http://a.com:65536/", None, None),
    ("http://a.com:0/", None, None),
    ("http://a.com:-1/", None, None),
    ("http://a.com:8o/", None, None),
    ("http://a.com:8:8/", None, None),
    ("http://a.com:٣/", None, None),              # non-ASCII digit
    ("http://a.com:99999999999999999999/", None, None),
    # schemes
    ("javascript:alert(1)", BASE, None),
    ("JavaScript:void(0)", BASE, None),
    ("mailto:a@b.com", BASE, None),
    ("data:text/html,<b>x</b>", BASE, None),
    ("tel:+123", BASE, None),
    ("ftp://a.com/", None, None),
    ("c:\\windows", BASE, None),
    ("x", None, None),
    ("/x", None, None),
    ("", None, None),
    ("x", "mailto:a@b.com", None),
    ("x", "not a url", None),
    # relative
    ("../d", BASE, "http://example.com/a/d"),
    ("?z=2", BASE, "http://example.com/a/b/c?z=2"),
    ("#f", BASE, "http://example.com/a/b/c?q=1"),
    ("", BASE, "http://example.com/a/b/c?q=1"),
    ("/a/b/..", BASE, "http://example.com/a/"),
    ("1a:b", BASE, "http://example.com/a/b/1a:b"),
    ("g", "http://a.com", "http://a.com/g"),
]


@pytest.mark.parametrize(("url", "base", "expected"), CASES)
def test_normalize_table(url, base, expected):
    assert normalize(url, base) == expected


def test_hostile_inputs_return_none_without_raising():
    assert normalize("http://a.com/" + "x" * MAX_INPUT_CHARS) is None
    assert normalize("http://a.com/" + "x" * 3000) == "http://a.com/" + "x" * 3000   # length cap is the filter's
    assert normalize(None) is None                        # type: ignore[arg-type]
    assert normalize(b"http://a.com/") is None           # type: ignore[arg-type]
    assert normalize("x", base=b"http://a.com/") is None  # type: ignore[arg-type]
    assert normalize("http://" + "1" * 5000 + "/") is None
    assert normalize("http://[" + ":" * 5000 + "]/") is None
    assert normalize("http://" + "%" * 5000 + "/") is None


URLISH = st.text(
    alphabet=st.sampled_from(list("aZ09-._~:/?#[]@!$&'()*+,;=% \t\n\\\"<>^`{|}\x00\x7fü€\u3002\ufffd.")),
    max_size=60,
)


@settings(max_examples=400, deadline=None)
@given(prefix=st.sampled_from(["", "http://", "https://a.com", "HTTP://[", "//", "http:", "/", "../"]),
       tail=URLISH, base=st.sampled_from([None, BASE, "https://x.org/p/q/", "garbage"]))
def test_normalize_total_ascii_and_idempotent(prefix, tail, base):
    out = normalize(prefix + tail, base)
    if out is None:
        return
    assert out.isascii()
    assert out.startswith(("http://", "https://"))
    assert "#" not in out and " " not in out
    assert normalize(out) == out
    assert normalize(out, base) == out
    assert host_key(out) + out[len(host_key(out)):] == out


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_normalize_never_raises_on_any_text(text):
    for base in (None, BASE):
        out = normalize(text, base)
        assert out is None or normalize(out) == out


def test_normalize_authority_cached_and_validates():
    assert normalize_authority("https", "User@WWW.A.com:443") == "www.a.com"
    assert normalize_authority("http", "a.com:8080") == "a.com:8080"
    assert normalize_authority("http", "a..com") is None


def test_fingerprint_is_stable_unsigned_64_bit():
    # Pinned values: a fingerprint change would silently re-crawl everything.
    assert fingerprint("http://example.com/") == 0xb97a010e03af1e2b
    assert fingerprint("https://example.com/a?b=1") == 0x9d5e03f0dc5e381f
    fps = {fingerprint(f"http://example.com/{i}") for i in range(1000)}
    assert len(fps) == 1000
    assert all(0 <= fp < 1 << 64 for fp in fps)
    assert fingerprint(normalize("HTTP://Example.COM:80/#x")) == fingerprint("http://example.com/")


def test_host_helpers():
    assert host_key("http://a.com/x?y") == "http://a.com"
    assert host_key("https://a.com:8443/") == "https://a.com:8443"
    assert host_key("http://[::1]:81/") == "http://[::1]:81"
    assert host_of("https://a.com:8443/x") == "a.com"
    assert host_of("http://[::1]:81/") == "::1"
    assert host_of("http://127.0.0.1/") == "127.0.0.1"
    assert port_of("https://a.com/") == 443
    assert port_of("http://a.com/") == 80
    assert port_of("http://a.com:8080/") == 8080
    assert port_of("http://[::1]/") == 80
    assert port_of("https://[::1]:444/x:5") == 444
    with pytest.raises(ValueError):
        host_key("mailto:a@b")
    with pytest.raises(ValueError):
        host_of("a.com/x")


@pytest.mark.parametrize(("host", "domain"), [
    ("www.example.com", "example.com"),
    ("a.b.example.co.uk", "example.co.uk"),
    ("example.co.uk", "example.co.uk"),
    ("co.uk", "co.uk"),                      # a public suffix is its own key
    ("alice.github.io", "alice.github.io"),  # private section: separate owners
    ("x.alice.github.io", "alice.github.io"),
    ("localhost", "localhost"),
    ("WWW.Example.COM", "example.com"),
    ("127.0.0.1", "127.0.0.1"),
    ("::1", "::1"),
    ("[::1]", "[::1]"),
    ("xn--bcher-kva.example", "xn--bcher-kva.example"),
    ("a.xn--fiqs8s", "a.xn--fiqs8s"),        # .中国 in punycode
])
def test_registered_domain(host, domain):
    assert registered_domain(host) == domain


def test_shard_of_partitions_by_registered_domain():
    from crawlerd.url.hosts import shard_of, shard_of_url
    assert shard_of("www.example.co.uk", 1) == 0
    n = 7
    # every host of a registered domain lands in one shard
    assert len({shard_of(h, n) for h in ("example.co.uk", "a.example.co.uk", "b.c.example.co.uk")}) == 1
    assert shard_of_url("https://a.example.co.uk:8443/x?y", n) == shard_of("example.co.uk", n)
    # private suffixes are owners: alice.github.io and bob.github.io are partitioned separately
    owners = {shard_of(f"u{i}.github.io", n) for i in range(200)}
    assert owners == set(range(n))
    spread = [0] * n
    for i in range(7000):
        spread[shard_of(f"h{i}.sim", n)] += 1
    assert min(spread) > 800 and max(spread) < 1200       # xxh3: an even spread
