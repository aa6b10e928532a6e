"""URL normalisation never raises, returns ASCII http(s) URLs, and is idempotent."""

from __future__ import annotations

import ipaddress

from hypothesis import example, given
from hypothesis import strategies as st

from crawlerd.url.canonical import fingerprint, normalize
from crawlerd.url.filter import UrlFilter
from crawlerd.url.hosts import host_key, host_of, port_of, registered_domain
from tests.fuzz.conftest import budget

_CHARS = list("aZ09-._~:/?#[]@!$&'()*+,;=% \t\n\r\\\"<>^`{|}\x00\x7f\x85\xa0ü€ß\u3002\uff0e\ufffd\u200d\U0001f600")
_text = st.text(alphabet=st.sampled_from(_CHARS), max_size=30)


_NAME = st.from_regex(r"[a-z0-9\-_]{0,12}(\.[a-z0-9\-]{0,8}){0,4}\.?", fullmatch=True)
_NUMBER = st.one_of(st.integers(0, 2**33).map(str), st.integers(0, 300).map(hex),
                    st.integers(0, 300).map(lambda n: "0" + format(n, "o")))
_NUMERIC = st.lists(_NUMBER, min_size=1, max_size=5).map(".".join)      # numeric IPv4 spellings (WHATWG)
_V6 = st.builds(lambda a, form: f"[{a.compressed if form == 0 else a.exploded if form == 1 else str(a).upper()}]",
                st.ip_addresses(v=6), st.integers(0, 2))
# IPv4-mapped and other embedded-IPv4 literals, dotted or all hex
_EMBEDDED = st.builds(lambda v4, prefix, dotted: f"[{prefix}{v4}]" if dotted
                      else f"[{ipaddress.IPv6Address(prefix + str(v4))}]",
                      st.ip_addresses(v=4), st.sampled_from(["::ffff:", "::FFFF:", "::", "::ffff:0:", "64:ff9b::"]),
                      st.booleans())
_IDN = st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=12)
_PCT = st.builds(lambda hx, t: "%" + hx + t, st.from_regex(r"[0-9a-fA-F]{0,2}", fullmatch=True), _text)
HOSTS = st.one_of(_NAME, _NUMERIC, _V6, _EMBEDDED, _IDN, _PCT, _text)


@st.composite
def urls(draw) -> str:
    scheme = draw(st.sampled_from(["http", "https", "HTTP", "hTTps", "ftp", "javascript", "mailto", ""]))
    sep = draw(st.sampled_from(["://", ":", "//", ":\\\\", ":/", ":///", ""]))
    user = draw(st.sampled_from(["", "u@", "u:p@", "@", "a@b@"]))
    port = draw(st.sampled_from(["", ":", ":80", ":443", ":0", ":65535", ":65536", ":08080", ":x", ":-1"]))
    path = draw(st.lists(st.sampled_from(["", ".", "..", "a", "%2e", "%2E%2e", "b c", "%", "%zz", "ü", "\\"]),
                         max_size=6))
    query = draw(st.sampled_from(["", "?", "?a=1&b", "?%41=%e2%82%ac", "??#"])) + draw(_text)
    frag = draw(st.sampled_from(["", "#", "#f", "#a#b"]))
    return f"{scheme}{sep}{user}{draw(HOSTS)}{port}/{'/'.join(path)}{query}{frag}"


BASES = [None, "http://example.com/a/b/c?q=1", "https://[::1]:8443/x/", "http://127.0.0.1/", "garbage"]


def _check(out: str | None, base: str | None) -> None:
    if out is None:
        return
    assert out.isascii() and out.startswith(("http://", "https://"))
    assert "#" not in out and " " not in out
    assert normalize(out) == out, "not idempotent"
    assert normalize(out, base) == out
    hk = host_key(out)
    assert out.startswith(hk) and out[len(hk)] == "/"
    assert fingerprint(out) == fingerprint(normalize(out))
    assert 0 < port_of(out) < 65536
    registered_domain(host_of(out))


@budget()
@given(urls(), st.sampled_from(BASES))
@example("http://[::ffff:127.1.1.1]/", None)
@example("http://[::ffff:0:127.1.1.1]/", None)
def test_normalize_generated_urls(url, base):
    _check(normalize(url, base), base)


@budget()
@given(st.text(max_size=120), st.sampled_from(BASES))
def test_normalize_any_text(text, base):
    _check(normalize(text, base), base)


@budget(0.5)
@given(st.lists(urls(), max_size=20))
def test_filter_never_raises(batch):
    f = UrlFilter(max_url_length=2048, max_path_depth=8, max_repeated_segments=2, max_query_params=5,
                  max_param_values=3, state_bytes=4096)
    for u in batch:
        n = normalize(u)
        if n is not None:
            reason = f.check(n)
            assert reason is None or isinstance(reason, str)
