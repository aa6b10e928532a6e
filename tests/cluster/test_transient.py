"""Which JetStream errors a node waits out (``engine.transient``, used by ``Engine.retry``) and which
it raises at once. A three-machine cluster that has just started answers a KV or stream creation
with "no suitable peers for placement, peer offline" (10005) until every peer is seen online; a
node started then must retry, not exit (it did, failing a cluster crawl's start)."""

import nats.js.errors as jserr

from crawlerd.cluster.engine import transient


def api_error(err_code: int, description: str) -> jserr.APIError:
    """The error nats-py raises for a JetStream API answer with this code (``APIError.from_error``)."""
    try:
        raise jserr.APIError.from_error({"code": 400, "err_code": err_code, "description": description})
    except jserr.APIError as e:
        return e


def test_placement_while_the_cluster_forms_is_waited_out():
    assert transient(api_error(10005, "no suitable peers for placement, peer offline"))
    assert transient(api_error(10074, "JetStream system temporarily unavailable"))
    assert transient(TimeoutError())


def test_a_refusal_that_will_not_change_is_raised_at_once():
    assert not transient(api_error(10058, "stream name already in use with a different configuration"))
    assert not transient(api_error(10071, "wrong last sequence: 4"))
    assert not transient(ValueError("bad bucket name"))
