"""UrlFilter: crawler-trap defences and their memory bound."""

import pytest

from crawlerd.url.filter import (
    PARAM_VALUES,
    PATH_TOO_DEEP,
    REPEATED_SEGMENTS,
    TOO_MANY_PARAMS,
    URL_TOO_LONG,
    UrlFilter,
)


def test_plain_urls_pass():
    f = UrlFilter()
    for url in ("http://a.com/", "http://a.com/x/y/z.html", "https://a.com/p?a=1&b=2",
                "http://a.com/docs/docs/", "http://a.com/a/b/a/b/"):
        assert f.check(url) is None, url
    assert sum(f.drops.values()) == 0


def test_length():
    f = UrlFilter(max_url_length=100)
    assert f.check("http://a.com/" + "x" * 87) is None          # exactly 100
    assert f.check("http://a.com/" + "x" * 88) == URL_TOO_LONG
    assert f.drops[URL_TOO_LONG] == 1


def test_path_depth():
    f = UrlFilter(max_path_depth=3)
    assert f.check("http://a.com/1/2/3/") is None
    assert f.check("http://a.com/1//2/3") is None                  # empty segments do not count
    assert f.check("http://a.com/1/2/3/4") == PATH_TOO_DEEP


@pytest.mark.parametrize(("path", "max_repeats", "dropped"), [
    ("/a/b/a/b/", 1, True),
    ("/a/b/a/b/", 2, False),
    ("/a/b/a/b/a/b/", 2, True),
    ("/x/a/a/a/y", 2, True),
    ("/x/a/a/y", 2, False),
    ("/p/q/r/s/q/r/s/q/r/s/t", 2, True),          # a run of three, three times
    ("/p/q/r/s/q/r/s/t", 2, False),
    ("/a/b/c/a/b/c", 1, True),
    ("/a/b/x/a/b", 1, False),                       # repeated, but not in a row
    ("/a/b/c/d/e/f", 1, False),
])
def test_repeated_segments(path, max_repeats, dropped):
    f = UrlFilter(max_repeated_segments=max_repeats)
    assert f.check("http://a.com" + path) == (REPEATED_SEGMENTS if dropped else None)


@pytest.mark.parametrize(("depth", "repeats"), [(1, 1), (2, 2), (3, 1), (1, 3), (4, 4)])
def test_segment_checks_on_few_slashes_and_with_a_given_host_key(depth, repeats):
    """The segment checks read segments, not slashes (empty ones do not count), whether or not
    the caller gives the host key; the answers are those of counting the segments outright."""
    import random
    rng = random.Random(depth * 10 + repeats)
    f, g = UrlFilter(max_path_depth=depth, max_repeated_segments=repeats), UrlFilter(
        max_path_depth=depth, max_repeated_segments=repeats)
    for _ in range(3000):
        parts = [rng.choice(["", "a", "b", "c"]) for _ in range(rng.randrange(0, 8))]
        key = rng.choice(["http://a.com", "https://b.org:8443"])
        url = key + "/" + "/".join(parts) + rng.choice(["", "/", "?x=1"])
        segs = [s for s in url[len(key):].partition("?")[0].split("/") if s]
        want = None
        if len(segs) > depth:
            want = PATH_TOO_DEEP
        elif len(segs) > repeats and any(
                all(segs[i + k * n:i + (k + 1) * n] == segs[i:i + n] for k in range(1, repeats + 1))
                for n in range(1, len(segs) + 1) for i in range(0, len(segs) - n * (repeats + 1) + 1)):
            want = REPEATED_SEGMENTS
        assert f.check(url) == want, url
        assert g.check(url, key) == want, url


def test_too_many_query_params():
    f = UrlFilter(max_query_params=3)
    assert f.check("http://a.com/p?a=1&b=2&c=3") is None
    assert f.check("http://a.com/p?a=1&&b=2&c=3&") is None        # empty pieces are not parameters
    assert f.check("http://a.com/p?a=1&b=2&c=3&d=4") == TOO_MANY_PARAMS


def test_param_value_cap_per_host_path_and_name():
    f = UrlFilter(max_param_values=3)
    for day in range(3):
        assert f.check(f"http://cal.com/day?d={day}&view=m") is None
    assert f.check("http://cal.com/day?d=99&view=m") == PARAM_VALUES    # a fourth value of d
    assert f.check("http://cal.com/day?d=1&view=m") is None              # known values still pass
    assert f.check("http://cal.com/day?view=w") is None                  # other parameter: own count
    assert f.check("http://cal.com/week?d=99") is None                   # other path: own count
    assert f.check("http://other.com/day?d=99") is None                  # other host: own count
    assert f.check("https://cal.com/day?d=99") is None                   # other host key
    assert f.drops == {PARAM_VALUES: 1}


def test_dropped_url_consumes_no_value_slots():
    f = UrlFilter(max_param_values=2)
    assert f.check("http://a.com/p?x=1&y=1") is None
    assert f.check("http://a.com/p?x=2&y=2") is None
    assert f.check("http://a.com/p?x=3&y=1") == PARAM_VALUES          # x full
    assert f.tracked_values == 4                                       # y=1 known; x=3 not stored
    assert f.check("http://a.com/p?x=1&y=2") is None


def one_host_bytes(values: int) -> int:
    probe = UrlFilter(max_param_values=100)
    for i in range(values):
        probe.check(f"http://h0.com/p?x={i}")
    return probe.memory()["bytes"]


def test_memory_bounded_by_hosts_lru():
    f = UrlFilter(max_param_values=5, state_bytes=3 * one_host_bytes(1))
    for i in range(10):
        assert f.check(f"http://h{i}.com/p?x=1") is None
        assert f.tracked_hosts <= 3 and f.memory()["bytes"] <= f.memory()["cap_bytes"]
    assert f.tracked_hosts == 3
    assert f.tracked_values == 3


def test_memory_bounded_by_tracked_values_and_lru_order():
    per_value = one_host_bytes(2) - one_host_bytes(1)
    host = one_host_bytes(1) - per_value + 1          # a host with one pattern ("old.com": 1 char more)
    f = UrlFilter(max_param_values=100, state_bytes=3 * host + 10 * per_value)
    for i in range(4):
        f.check(f"http://old.com/p?x={i}")
    for i in range(4):
        f.check(f"http://mid.com/p?x={i}")
    f.check("http://old.com/p?x=0")                    # old.com is now the most recent
    for i in range(4):
        f.check(f"http://new.com/p?x={i}")             # 12 > 10: the LRU host (mid.com) goes
        assert f.tracked_values <= 10
    assert f.tracked_values == 8
    f.check("http://old.com/p?x=3")                    # old.com was kept: a known value adds nothing
    assert f.tracked_values == 8
    f.check("http://mid.com/p?x=3")                    # mid.com was forgotten: counts afresh
    assert f.tracked_values == 9


def test_single_host_over_budget_is_reset_not_grown():
    f = UrlFilter(max_param_values=100, state_bytes=one_host_bytes(5))
    for i in range(50):
        assert f.check(f"http://a.com/p?x={i}") is None
        assert f.tracked_values <= 5 and f.memory()["bytes"] <= f.memory()["cap_bytes"]


def test_bad_limits_rejected():
    with pytest.raises(ValueError):
        UrlFilter(max_param_values=0)
