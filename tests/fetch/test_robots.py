"""RobotsRules: RFC 9309 matching beyond the google/robotstxt cases, hostile files, and a
reference matcher compared on generated rules."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crawlerd.fetch.robots import RobotsRules, check_lines, normalize_path, path_of


def rules(text: str, agent: str = "crawlerd", **kw) -> RobotsRules:
    return RobotsRules.parse(text.encode("utf-8"), agent, **kw)


# ------------------------------------------------------------------ URL handling


@pytest.mark.parametrize("url,path", [
    ("", "/"),
    ("http://example.com", "/"),
    ("https://example.com/", "/"),
    ("https://example.com:8080/a/b?c=d#frag", "/a/b?c=d"),
    ("https://example.com?q", "/?q"),
    ("https://user@example.com/a;p?q", "/a;p?q"),
    ("http://example.com#frag/x", "/"),
    ("/a/b?c", "/a/b?c"),
    ("/a#b", "/a"),
    ("//example.com/x", "/x"),
    ("example.com/a", "/a"),
])
def test_path_of(url, path):
    assert path_of(url) == path


@pytest.mark.parametrize("raw,norm", [
    ("/a/b", "/a/b"),
    ("/%7Euser/%41%62", "/~user/Ab"),          # unreserved: decoded
    ("/a%2fb%2Fc", "/a%2Fb%2Fc"),              # reserved: kept, upper-cased hex
    ("/caf\u00e9", "/caf%C3%A9"),              # non-ASCII: UTF-8, upper-case
    ("/a b\tc", "/a%20b%09c"),                 # space and controls encoded
    ("/100%", "/100%25"),                      # a lone "%" is a literal "%"
    ("/%zz%4", "/%25zz%254"),
    ("/%e3%83%84", "/%E3%83%84"),
    ("/ツ", "/%E3%83%84"),
])
def test_normalize_path(raw, norm):
    assert normalize_path(raw) == norm
    assert normalize_path(norm) == norm        # idempotent


# ------------------------------------------------------------------ matching


def test_percent_encoding_matches_both_ways():
    r = rules("User-agent: *\nDisallow: /~joe/\nDisallow: /caf\u00e9\nDisallow: /a%2Fb\n")
    assert not r.allowed("http://x/%7Ejoe/page")
    assert not r.allowed("http://x/%7ejoe/page")
    assert not r.allowed("http://x/~joe/page")
    assert not r.allowed("http://x/caf%c3%a9/menu")
    assert not r.allowed("http://x/caf\u00e9/menu")
    assert not r.allowed("http://x/a%2fb")
    assert r.allowed("http://x/a/b")           # %2F is reserved: not the same as "/"


@pytest.mark.parametrize("rule, url, hit", [
    # RFC 9309 §2.2.3: a percent-encoded special character matches the literal character
    ("/path/file-with-a-%2A.html", "https://www.example.com/path/file-with-a-*.html", True),
    ("/path/foo-%24", "https://www.example.com/path/foo-$", True),
    ("/path/file-with-a-%2a.html", "https://x/path/file-with-a-*.html", True),   # hex case
    ("/path/file-with-a-%2A.html", "https://x/path/file-with-a-%2A.html", True),  # encoded in the URL too
    # ...and is not a wildcard or an anchor
    ("/path/file-with-a-%2A.html", "https://x/path/file-with-a-b.html", False),
    ("/path/file-with-a-%2A.html", "https://x/path/file-with-a-.html", False),
    ("/path/foo-%24", "https://x/path/foo-", False),
    ("/path/foo-%24", "https://x/path/foo-$bar", True),          # a prefix like any literal
    ("/a%2A", "https://x/a", False),
    # the special forms still work next to encoded ones
    ("/*%2A", "https://x/anything*", True),
    ("/*%2A", "https://x/anything", False),
    ("/x%24$", "https://x/x$", True),
    ("/x%24$", "https://x/x$y", False),
    ("/a$b", "https://x/a$b", True),              # a "$" before the end is a literal "$"
    ("/a$b", "https://x/ab", False),
    ("/100%", "https://x/100%25", True),          # a lone "%" is the character "%"
    ("/100%", "https://x/100%24", False),
])
def test_encoded_special_characters(rule, url, hit):
    r = rules(f"User-agent: *\nDisallow: {rule}\n")
    assert r.allowed(url) is not hit


def test_robots_txt_always_allowed():
    r = rules("User-agent: *\nDisallow: /\n")
    assert r.allowed("http://x/robots.txt")
    assert r.allowed("/robots.txt?v=1")
    assert not r.allowed("http://x/robots.txt.bak")
    assert not r.allowed("http://x/")
    d = RobotsRules.disallow_all()
    assert d.allowed("https://x/robots.txt")
    assert not d.allowed("https://x/anything")
    assert RobotsRules.allow_all().allowed("https://x/anything")


def test_longest_match_and_ties():
    r = rules("User-agent: *\nDisallow: /a\nAllow: /a/b\nDisallow: /a/b/c\nAllow: /x$\nDisallow: /x\n")
    assert not r.allowed("/a/x")
    assert r.allowed("/a/b/x")
    assert not r.allowed("/a/b/c/d")
    assert r.allowed("/x")                     # Allow /x$ is longer than Disallow /x
    assert not r.allowed("/xy")
    tie = rules("User-agent: *\nDisallow: /p*\nAllow: /p$\n")
    assert tie.allowed("/p")                   # equal length: Allow wins


@pytest.mark.parametrize("pattern,path,hit", [
    ("/*.php$", "/a/b.php", True),
    ("/*.php$", "/a/b.php?x", False),
    ("/*.php", "/a/b.php?x", True),
    ("/a*b*c", "/axxbyyc", True),
    ("/a*b*c", "/axxcyyb", False),
    ("/a*b*c$", "/abcbc", True),
    ("/a*b*c$", "/abcb", False),
    ("/a*bc$", "/abc", True),                  # tail may start right after the head
    ("/a*ab$", "/ab", False),                  # tail must not overlap the head
    ("*/private/", "/x/private/y", True),
    ("/fish*", "/fish", True),
    ("/fish*$", "/fishes", True),
    ("/*", "/", True),
    ("/a$b", "/a$b", True),                    # "$" inside a pattern is a literal
    ("/a$b", "/a", False),
    ("/**x***y", "/_x_y", True),
])
def test_wildcards(pattern, path, hit):
    r = rules(f"User-agent: *\nDisallow: {pattern}\n")
    assert r.allowed(path) is not hit


def test_patterns_that_cannot_match_are_ignored():
    r = rules("User-agent: *\nDisallow: foo\nDisallow:\nAllow:\n")
    assert r.rule_count == 0
    assert r.allowed("/foo")


# ------------------------------------------------------------------ groups


def test_group_selection_and_merging():
    text = ("User-agent: *\nDisallow: /all\n\n"
            "User-agent: CrawlerD/2.0\nDisallow: /one\n\n"
            "User-agent: other\nDisallow: /other\n\n"
            "user-agent: CRAWLERD\nDisallow: /two\n")
    r = rules(text)
    assert not r.allowed("/one") and not r.allowed("/two")
    assert r.allowed("/all")                   # a named group replaces "*" entirely
    assert r.allowed("/other")
    other = rules(text, agent="somebot")
    assert not other.allowed("/all") and other.allowed("/one")


def test_agent_token_prefix_is_not_a_match():
    r = rules("User-agent: crawlerdx\nDisallow: /\nUser-agent: crawler\nDisallow: /\n")
    assert r.allowed("/page")


def test_crawl_delay_and_sitemaps():
    text = ("Sitemap: https://x/s1.xml\n"
            "User-agent: *\nCrawl-delay: 10\nDisallow: /a\n"
            "User-agent: crawlerd\nCrawl-delay: 2.5\nCrawl-delay: 4\nDisallow: /b\n"
            "Sitemap: https://x/s2.xml # trailing comment\n"
            "User-agent: other\nCrawl-delay: nan\nCrawl-delay: -1\n")
    assert rules(text).crawl_delay == 4.0
    assert rules(text, agent="zz").crawl_delay == 10.0
    assert rules(text, agent="other").crawl_delay is None
    assert rules(text).sitemaps == ["https://x/s1.xml", "https://x/s2.xml"]


def test_unknown_lines_do_not_end_a_group():
    r = rules("User-agent: a\nNoindex: /x\nCrawl-delay: 1\nUser-agent: crawlerd\nDisallow: /p\n")
    assert not r.allowed("/p")
    assert r.crawl_delay == 1.0


def test_rules_before_any_group_are_ignored():
    assert rules("Disallow: /\nUser-agent: crawlerd\nAllow: /x\n").allowed("/y")


def test_comments_whitespace_and_missing_colon():
    r = rules("  User-agent :  crawlerd   # us\n\tDisallow\t:\t/a #b\nDisallow /c\n# Disallow: /d\n")
    assert not r.allowed("/a") and not r.allowed("/c")
    assert r.allowed("/d") and r.allowed("/b")


# ------------------------------------------------------------------ bytes, sizes, hostile files


@pytest.mark.parametrize("eol", ["\n", "\r\n", "\r"])
def test_line_endings_and_bom(eol):
    text = eol.join(["User-agent: other", "Disallow: /", "User-agent: crawlerd", "Disallow: /p", ""])
    for body in (text.encode(), b"\xef\xbb\xbf" + text.encode()):
        r = RobotsRules.parse(body, "crawlerd")
        assert not r.allowed("/p") and r.allowed("/q")


def test_invalid_utf8_body():
    r = RobotsRules.parse(b"User-agent: *\nDisallow: /\xff\xfe\nDisallow: /\xe3\x83\x84\n", "x")
    assert not r.allowed("/%FF%FEz")
    assert not r.allowed("/ツ")
    assert r.allowed("/%FF")


def test_500_kib_parsed_and_cap_honoured():
    filler = ("# " + "x" * 1000 + "\n") * 520            # > 500 KiB of comments
    text = filler + "User-agent: *\nDisallow: /late\n"
    assert len(text) > 500 * 1024
    assert not rules(text).allowed("/late")                # default max_bytes: 512 KiB
    assert rules(text, max_bytes=100 * 1024).allowed("/late")


def test_line_cut_by_max_bytes_is_dropped():
    text = "User-agent: *\nDisallow: /\nAllow: /public-but-long\n"
    r = rules(text, max_bytes=len(text) - 8)   # the cut would leave "Allow: /public-b"
    assert not r.allowed("/public-b")
    assert r.rule_count == 1


def test_many_rules():
    lines = ["User-agent: *"] + [f"Disallow: /d{i}/" for i in range(20000)] + ["Allow: /d77/ok"]
    r = rules("\n".join(lines))
    assert r.rule_count == 20001
    assert not r.allowed("/d19999/x") and r.allowed("/d77/ok") and r.allowed("/e")


def test_many_general_rules_without_buckets():
    lines = ["User-agent: *"] + [f"Disallow: /*x{i}y" for i in range(3000)]
    lines += [f"Disallow: /p{i}/" for i in range(3000)]
    r = rules("\n".join(lines))
    assert not r.allowed("/a/x2999y") and not r.allowed("/p5/") and r.allowed("/q")


def test_hostile_lines_stay_linear():
    # quadratic or exponential matching would never finish on these sizes
    stars = "/" + "*a" * 2000 + "*b"
    spaces = "Disallow:" + " " * 100_000 + "/y" + " " * 100_000
    long_value = "Disallow: /" + "a" * 300_000
    body = (f"User-agent: *\n{stars}\n{spaces}\nDisallow: {stars}\n{long_value}\nDisallow: /x \n"
            + "\t" * 100_000 + "\n" + "Disallow /z " * 10_000)
    r = rules(body)
    assert not r.allowed("/x")
    assert r.allowed("/y")                     # its line was cut before the value
    assert not r.allowed("/" + "a" * 20_000)   # the long rule, cut at 16663 characters, applies
    assert r.allowed("/" + "a" * 16_000)       # ...as that shorter prefix
    assert r.allowed("/" + "a" * 1999 + "b" * 5000)   # the star rule needs 2000 "a"s before a "b"
    assert not r.allowed("/" + "a" * 2000 + "b")


def test_line_of_stars_only():
    r = rules("User-agent: *\nDisallow: " + "*" * 50_000 + "\n")
    assert not r.allowed("/anything")


# ------------------------------------------------------------------ reference matcher


def _reference(text: str, path: str) -> bool:
    """Straight from RFC 9309 §2.2.2, slow and obvious: try every rule, keep the longest match."""
    best: tuple[int, bool] | None = None
    for line in text.split("\n"):
        key, _, value = line.partition(":")
        if key not in ("allow", "disallow") or not value:
            continue
        pat = normalize_path(value)
        anchored = pat.endswith("$")
        body = pat[:-1] if anchored else pat
        # RFC 9309 §2.2.3: "*" is any run, "%2A" and "%24" the literal characters
        tokens = re.findall(r"%2A|%24|.", body, re.S)
        rx = "".join(".*" if t == "*" else re.escape({"%2A": "*", "%24": "$"}.get(t, t)) for t in tokens)
        rx += r"\Z" if anchored else ""
        if re.match(rx, normalize_path(path).replace("%2A", "*").replace("%24", "$"), re.S):
            cand = (len(pat), key == "allow")
            if best is None or cand > best:
                best = cand
    return True if best is None else best[1]


_pattern = st.text(alphabet="/ab.?*$%2A4", min_size=1, max_size=9).map(lambda s: "/" + s)
_path = st.text(alphabet="/ab.?*$%2A4", max_size=12).map(lambda s: "/" + s)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.booleans(), _pattern), max_size=12), st.lists(_path, min_size=1, max_size=8))
def test_matches_reference(rule_list, paths):
    text = "user-agent: *\n" + "\n".join(f"{'allow' if a else 'disallow'}:{p}" for a, p in rule_list)
    r = RobotsRules.parse(text.encode(), "crawlerd")
    for path in paths:
        if path.startswith("/robots.txt"):
            continue
        assert r.allowed("http://h" + path) is _reference(text, path), (text, path)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), _pattern), max_size=12), st.lists(_path, min_size=1, max_size=12))
def test_a_run_of_urls_in_one_call_matches_the_reference_url_by_url(rule_list, paths):
    """``disallowed`` (the intake's call for a host's run of URLs, absolute or paths) names exactly
    the positions the reference disallows, in order."""
    text = "user-agent: *\n" + "\n".join(f"{'allow' if a else 'disallow'}:{p}" for a, p in rule_list)
    r = RobotsRules.parse(text.encode(), "crawlerd")
    # a bare path as the intake passes one (not "//...": that reads as an authority)
    urls = [("http://h" + p) if i % 2 or p[1:2] == "/" else p for i, p in enumerate(paths)]
    want = [i for i, p in enumerate(paths)
            if not (p.startswith("/robots.txt") and (len(p) == 11 or p[11] == "?")) and not _reference(text, p)]
    assert r.disallowed(urls) == want, (text, paths)


def test_check_lines():
    body = b"User-agent: *\nDisallow: /private\n"
    assert check_lines(body, "crawlerd", ["https://x/a", "https://x/private/b"]) == [
        "allow https://x/a", "disallow https://x/private/b"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), _pattern), max_size=20), st.lists(_path, max_size=20))
def test_rule_lists_invariant(rule_list, paths):
    """Every list is sorted by decreasing rank; a merged list is its bucket plus the general rules."""
    text = "user-agent: *\n" + "\n".join(f"{'allow' if a else 'disallow'}:{p}" for a, p in rule_list)
    r = RobotsRules.parse(text.encode(), "crawlerd")
    for path in paths:
        r.allowed("http://h" + path)
    lists = [r._general, *r._buckets.values(), *r._merged.values()]
    for rules_ in lists:
        ranks = [rule[0] for rule in rules_]
        assert ranks == sorted(ranks, reverse=True)
    for key, bucket in r._buckets.items():
        assert all(rule[2].startswith(key) for rule in bucket) and len(key) == 3
    assert all(len(rule[2]) < 3 for rule in r._general)
    for key, merged in r._merged.items():
        assert sorted(merged) == sorted(r._buckets.get(key, ()) + r._general)
