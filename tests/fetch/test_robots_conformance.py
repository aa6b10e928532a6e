"""Every allow/disallow expectation of google/robotstxt's robots_test.cc, run as data.

Three cases contradict RFC 9309 §2.2.2 (percent-encoded unreserved characters, and non-ASCII
octets, match their encoded or plain form alike) and must fail: strict xfail.
"""

import base64
import json
from pathlib import Path

import pytest

from crawlerd.fetch.robots import RobotsRules

DATA = Path(__file__).parent / "data"
FILES = ("robots_google_cases.jsonl", "robots_google_derived_cases.jsonl")

RFC_CONTRADICTS = {
    "ID_Encoding#3": "RFC 9309 §2.2.2: a non-ASCII URL path is %-encoded as UTF-8 before matching, so it "
                     "matches the rule (Google compares raw bytes)",
    "ID_Encoding#5": "RFC 9309 §2.2.2: '/foo/bar/ツ' and '/foo/bar/%E3%83%84' are the same path",
    "ID_Encoding#6": "RFC 9309 §2.2.2: %62%61%7A are unreserved characters and match 'baz'",
}


def _load() -> list:
    cases = []
    for name in FILES:
        for line in (DATA / name).read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            case = json.loads(line)
            marks = ()
            if case["id"] in RFC_CONTRADICTS:
                marks = (pytest.mark.xfail(strict=True, reason=RFC_CONTRADICTS[case["id"]]),)
            cases.append(pytest.param(case, id=case["id"], marks=marks))
    return cases


CASES = _load()


def test_all_cases_loaded():
    assert len(CASES) == 160
    assert {c.id for c in CASES} >= set(RFC_CONTRADICTS)


@pytest.mark.parametrize("case", CASES)
def test_case(case):
    if "robots_b64" in case:
        body = base64.b64decode(case["robots_b64"])
    else:
        body = case["robots"].encode("utf-8")
    rules = RobotsRules.parse(body, case["agent"])
    assert rules.allowed(case["url"]) is case["allowed"], case["note"]
