import email.utils

import pytest

from crawlerd.shard.hostfiles import parse_retry_after

NOW = 1_800_000_000.0


@pytest.mark.parametrize("value, expected", [
    ("120", 120.0), (" 3 ", 3.0), ("0", 0.0),
    (email.utils.formatdate(NOW + 90, usegmt=True), 90.0),
    (email.utils.formatdate(NOW - 90, usegmt=True), 0.0),       # a date in the past: retry now
    (None, None), ("", None), ("soon", None), ("-5", None), ("1e9999", None), ("Fri, 99 Foo 2026", None),
])
def test_retry_after_seconds_or_http_date(value, expected):
    got = parse_retry_after(value, NOW)
    assert got == (pytest.approx(expected, abs=1.0) if expected is not None else None)
