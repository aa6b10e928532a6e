"""The answering side shared by the dedup channel and the per-IP turns (``cluster.answerer``).

Over a real NATS server both services are exercised by tests/cluster/test_ipgrants.py and the
cluster crawls; here the rule they share is checked on its own: a request that does not decode is
left unanswered (the asker's timeout covers it) and nothing is counted, a good one is answered
once, and a request without a reply subject is handled but not answered.
"""

import asyncio
import json

from crawlerd.cluster.answerer import Answerer
from crawlerd.cluster.dedup import OwnerService
from crawlerd.cluster.engine import Names
from crawlerd.cluster.ipgrants import IpTurnService
from crawlerd.cluster.ipturns import IpTurns


class Msg:
    """What a NATS subscription callback receives: payload, reply subject, respond()."""

    def __init__(self, data: bytes, reply: str = "_INBOX.1"):
        self.data, self.reply, self.sent = data, reply, []

    async def respond(self, out: bytes) -> None:
        self.sent.append(out)


class Doubler(Answerer):
    what = "doubling"

    def answer(self, data: bytes) -> bytes:
        return json.dumps(2 * json.loads(data)["x"]).encode()


class NoLink:
    names = Names("t")


def run(service: Answerer, msg: Msg) -> Msg:
    asyncio.run(service._on_msg(msg))
    return msg


def test_a_request_is_answered_once_and_counted():
    s = Doubler(NoLink(), "subj")
    assert run(s, Msg(b'{"x": 21}')).sent == [b"42"]
    assert s.answered == 1


def test_a_request_that_does_not_decode_is_left_unanswered(caplog):
    s = Doubler(NoLink(), "subj")
    for bad in (b"not json", b'{"y": 1}', b'{"x": null}'):
        assert run(s, Msg(bad)).sent == []
    assert s.answered == 0
    assert sum("doubling on subj not understood" in r.getMessage() for r in caplog.records) == 3


def test_a_request_without_reply_subject_is_handled_but_not_answered():
    seen = []
    s = OwnerService(NoLink(), 3, lambda data: seen.append(data) or b"ok")
    assert run(s, Msg(b"claim", reply="")).sent == []
    assert seen == [b"claim"] and s.answered == 0
    assert s.subject == Names("t").dedup_subject(3)


def test_the_ip_turn_service_answers_through_the_shared_rule():
    s = IpTurnService(NoLink(), 0, IpTurns(grant_s=5.0, drain_s=0.0, now=0.0))
    out = run(s, Msg(json.dumps({"n": "a", "s": 1, "w": [7]}).encode())).sent
    assert len(out) == 1 and len(json.loads(out[0])["r"]) == 1 and s.answered == 1
    assert run(s, Msg(b'{"n": "a"}')).sent == [] and s.answered == 1
