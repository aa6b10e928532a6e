"""Fetcher on uvloop against the loopback test server: bytes kept exactly, limits, outcomes."""

import asyncio
import os
import resource
import shutil
import socket
import ssl
import subprocess
import warnings

import pytest
import uvloop

from crawlerd._native.bodypool import BodyPool
from crawlerd.fetch.codec import decode_body
from crawlerd.fetch.curl import Fetcher
from crawlerd.fetch.guard import AddressGuard
from crawlerd.outcome import Outcome
from crawlerd.records import FetchRequest
from crawlerd.simweb.hostile import HostileServer

UA = "crawlerd-test/0.1 (+https://example.org/bot)"


def make_fetcher(guard=None, **kw) -> Fetcher:
    params = dict(user_agent=UA, guard=guard or AddressGuard(["127.0.0.0/8", "::1/128"]), connect_timeout_s=2.0,
                  timeout_s=10.0, low_speed_bytes_per_s=1, low_speed_time_s=10, max_body_bytes=1 << 20,
                  max_header_bytes=64 << 10, max_connections=50, verify_tls=False)
    params.update(kw)
    return Fetcher(asyncio.get_running_loop(), **params)


def run(scenario, *, host="127.0.0.1", **kw):
    """Start a HostileServer and a Fetcher, run ``scenario(fetcher, server, port)``, close both."""
    async def main():
        server = HostileServer(bomb_bytes=8 << 20)
        _, port = await server.start(host)
        f = make_fetcher(**kw)
        try:
            return await scenario(f, server, port)
        finally:
            await f.close(0)
            server.close()
    return uvloop.run(main())


def req(port, path, ip="127.0.0.1", host="site.test", **kw):
    return FetchRequest(url=f"http://{host}:{port}{path}", ip=ip, port=port, **kw)


def test_ok_result_fields():
    async def scenario(f, server, port):
        return await f.fetch(req(port, "/ok"))
    r = run(scenario)
    assert r.outcome is Outcome.OK
    assert r.status == 200
    assert r.body == b"<html><body>ok</body></html>"
    assert r.response_head.startswith(b"HTTP/1.1 200 OK\r\n") and r.response_head.endswith(b"\r\n\r\n")
    assert r.header("content-length") == str(len(r.body))
    assert r.ip == "127.0.0.1" and r.started_at > 0 and r.elapsed_s >= 0
    assert r.error == ""


def test_request_head_is_exactly_what_the_server_received():
    async def scenario(f, server, port):
        return await f.fetch(req(port, "/echo?q=a%20b&x=1", headers=[("If-None-Match", '"abc"')]))
    r = run(scenario)
    assert r.body == r.request_head
    assert r.request_head.startswith(b"GET /echo?q=a%20b&x=1 HTTP/1.1\r\nHost: site.test:")
    assert b"User-Agent: " + UA.encode() + b"\r\n" in r.request_head
    assert b"Accept-Encoding: gzip, deflate, br\r\n" in r.request_head
    assert b'If-None-Match: "abc"\r\n' in r.request_head


def test_request_head_survives_curls_resend_on_a_dead_reused_connection():
    async def scenario(f, server, port):
        await f.fetch(req(port, "/ok"))
        r = await f.fetch(req(port, "/empty"))    # the server drops the reused connection unanswered
        return r, len(server.log), f.stats()["request_heads"]
    r, requests, heads = run(scenario)
    assert requests == 3                          # curl sent /empty again on a fresh connection
    assert r.outcome is Outcome.CONNECTION_RESET
    assert r.request_head.startswith(b"GET /empty HTTP/1.1\r\n") and r.request_head.endswith(b"\r\n\r\n")
    assert heads["unconfirmed"] == 0


def test_path_is_sent_as_given():
    async def scenario(f, server, port):
        return await f.fetch(req(port, "/echo/a/../b/./c"))
    r = run(scenario)
    assert r.request_head.startswith(b"GET /echo/a/../b/./c HTTP/1.1\r\n")


def test_header_injection_is_dropped():
    async def scenario(f, server, port):
        return await f.fetch(req(port, "/echo", headers=[("X-A", "1\r\nX-Evil: 1"), ("X-B", "2")]))
    r = run(scenario)
    assert b"X-Evil" not in r.request_head
    assert b"X-B: 2\r\n" in r.request_head


def test_keep_alive_reuses_one_connection():
    async def scenario(f, server, port):
        out = [await f.fetch(req(port, "/page?size=20000")) for _ in range(5)]
        return out, server.connections, f.stats()
    out, connections, stats = run(scenario)
    assert all(r.outcome is Outcome.OK and len(r.body) == 20000 for r in out)
    assert connections == 1
    assert stats["sockets_opened"] == 1


def test_server_closing_idle_connections_is_survived():
    async def scenario(f, server, port):
        out = [await f.fetch(req(port, "/close-after")) for _ in range(20)]
        out.append(await f.fetch(req(port, "/ok")))
        return out, server.connections, f.stats()
    out, connections, stats = run(scenario)
    assert all(r.outcome is Outcome.OK for r in out)
    assert connections == 21                      # a dead idle connection is never reused
    assert stats["watched_fds"] <= 1              # closed sockets are no longer watched


def test_concurrent_fetches_all_complete():
    async def scenario(f, server, port):
        reqs = [req(port, f"/page?size={1000 + i}", host=f"h{i}.test") for i in range(60)]
        return await asyncio.gather(*(f.fetch(r) for r in reqs)), f.in_flight
    out, left = run(scenario)
    assert [len(r.body) for r in out] == [1000 + i for i in range(60)]
    assert left == 0


def test_ready_sockets_beyond_one_callbacks_batch_are_served_on_the_next(monkeypatch):
    """The fetcher hands curl at most READY_EVENTS ready sockets per loop callback; the rest wait
    in the level-triggered epoll set for the next iteration, never for a timeout."""
    import crawlerd.fetch.curl as curl_mod

    monkeypatch.setattr(curl_mod, "READY_EVENTS", 1)

    async def scenario(f, server, port):
        reqs = [req(port, f"/page?size={5000 + i}", host=f"h{i}.test") for i in range(40)]
        t0 = asyncio.get_running_loop().time()
        out = await asyncio.gather(*(f.fetch(r) for r in reqs))
        return out, asyncio.get_running_loop().time() - t0, f.in_flight
    out, took_s, left = run(scenario, timeout_s=30.0, low_speed_time_s=30)
    assert [r.outcome for r in out] == [Outcome.OK] * 40
    assert [len(r.body) for r in out] == [5000 + i for i in range(40)]
    assert took_s < 20.0          # no transfer waited for its timeout to be looked at again
    assert left == 0


def test_chunked_body_is_kept_raw_and_decodes():
    async def scenario(f, server, port):
        return await f.fetch(req(port, "/chunked"))
    r = run(scenario)
    assert r.outcome is Outcome.OK
    assert r.body == b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nX-Trailer: t\r\n\r\n"
    assert r.header("transfer-encoding") == "chunked"
    assert decode_body(r.body, chunked=True, content_encoding=None, max_bytes=100) == b"hello, world"


def test_connection_survives_a_chunked_answer():
    async def scenario(f, server, port):
        a = await f.fetch(req(port, "/chunked"))
        b = await f.fetch(req(port, "/ok"))
        return a, b, server.connections
    a, b, connections = run(scenario)
    assert a.outcome is b.outcome is Outcome.OK
    assert connections == 1                       # curl found the end of the chunked body


def test_gzip_body_is_not_decoded_by_curl():
    async def scenario(f, server, port):
        return await f.fetch(req(port, "/gzip-bomb"))
    r = run(scenario)
    assert r.outcome is Outcome.OK
    assert r.body[:2] == b"\x1f\x8b"
    assert r.header("content-encoding") == "gzip"


def test_interim_1xx_is_dropped_from_response_head():
    async def scenario(f, server, port):
        return await f.fetch(req(port, "/continue"))
    r = run(scenario)
    assert r.status == 200
    assert r.response_head.startswith(b"HTTP/1.1 200 OK")
    assert b"100 Continue" not in r.response_head
    assert r.body == b"after continue"


def test_conditional_get_gives_not_modified():
    async def scenario(f, server, port):
        first = await f.fetch(req(port, "/etag"))
        again = await f.fetch(req(port, "/etag", headers=[("If-None-Match", first.header("etag"))]))
        return first, again
    first, again = run(scenario)
    assert first.outcome is Outcome.OK and first.header("etag") == '"v1"'
    assert again.outcome is Outcome.NOT_MODIFIED and again.status == 304 and again.body == b""


def test_redirect_is_returned_not_followed():
    async def scenario(f, server, port):
        return await f.fetch(req(port, "/redirect?to=/ok")), len(server.log)
    r, requests = run(scenario)
    assert r.outcome is Outcome.OK and r.status == 302
    assert r.header("location") == "/ok"
    assert requests == 1


def test_http_error_status_is_ok_transport_outcome():
    async def scenario(f, server, port):
        return await f.fetch(req(port, "/status/503"))
    r = run(scenario)
    assert r.outcome is Outcome.OK and r.status == 503


def test_unsupported_scheme_is_refused_without_connecting():
    async def scenario(f, server, port):
        r = await f.fetch(FetchRequest(url=f"ftp://site.test:{port}/x", ip="127.0.0.1", port=port))
        return r, server.connections
    r, connections = run(scenario)
    assert r.outcome is Outcome.UNSUPPORTED_SCHEME
    assert connections == 0


def test_forbidden_address_is_refused_before_connecting():
    async def scenario(f, server, port):
        r = await f.fetch(req(port, "/ok"))
        return r, server.connections
    r, connections = run(scenario, guard=AddressGuard([]))   # loopback not allowed
    assert r.outcome is Outcome.BLOCKED_ADDRESS
    assert "loopback" in r.error
    assert connections == 0


class _FlipGuard(AddressGuard):
    """Allows the first check (the shard's) and refuses the second (the socket's)."""

    def __init__(self):
        super().__init__(["127.0.0.0/8"])
        self.calls = 0

    def allowed(self, ip):
        self.calls += 1
        return self.calls == 1


def test_socket_open_checks_the_address_again():
    guard = _FlipGuard()

    async def scenario(f, server, port):
        r = await f.fetch(req(port, "/ok"))
        return r, server.connections
    r, connections = run(scenario, guard=guard)
    assert r.outcome is Outcome.BLOCKED_ADDRESS
    assert guard.calls >= 2                       # the shard's check, then the socket's
    assert connections == 0


def test_closed_gate_refuses_before_connecting():
    async def scenario(f, server, port):
        f.gate = lambda: False
        r = await f.fetch(req(port, "/ok"))
        return r, server.connections
    r, connections = run(scenario)
    assert r.outcome is Outcome.ABORTED and "fenced" in r.error
    assert connections == 0


def test_gate_closed_while_connecting_stops_the_request_before_it_is_sent():
    calls = []

    def gate():                                   # open for the start, closed once connected
        calls.append(1)
        return len(calls) == 1

    async def scenario(f, server, port):
        f.gate = gate
        r = await f.fetch(req(port, "/ok"))
        await asyncio.sleep(0.05)
        other = make_fetcher()
        ok = await other.fetch(req(port, "/ok"))                   # the server itself answers
        await other.close(0)
        return r, ok, list(server.log)
    r, ok, log = run(scenario)
    assert len(calls) == 2
    assert r.outcome is Outcome.ABORTED and "fenced" in r.error and r.status == 0
    assert ok.outcome is Outcome.OK
    assert len(log) == 1                          # only the second fetcher's request reached it


def test_gate_set_after_ungated_transfers_is_asked_before_the_next_request_is_sent():
    """Without a gate no pre-request callback runs; a gate set later is asked on the same
    (reused) handles before their next request goes out."""
    calls = []

    def gate():                                   # open for the start, closed once connected
        calls.append(1)
        return len(calls) == 1

    async def scenario(f, server, port):
        first = await f.fetch(req(port, "/ok"))   # no gate: the handle goes back to the pool
        f.gate = gate
        r = await f.fetch(req(port, "/ok"))
        return first, r, list(server.log)
    first, r, log = run(scenario)
    assert first.outcome is Outcome.OK
    assert len(calls) == 2
    assert r.outcome is Outcome.ABORTED and "fenced" in r.error and r.status == 0
    assert len(log) == 1                          # only the ungated request reached the server


def test_connect_refused():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    dead_port = probe.getsockname()[1]
    probe.close()                                  # nothing listens there now

    async def scenario(f, server, port):
        return await f.fetch(req(dead_port, "/ok"))
    assert run(scenario).outcome is Outcome.CONNECT_REFUSED


def test_connect_timeout(silent_port):
    async def scenario(f, server, _port):
        return await f.fetch(req(silent_port, "/ok"))
    assert run(scenario, connect_timeout_s=0.3).outcome is Outcome.CONNECT_TIMEOUT


def _self_signed(tmp_path):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    proc = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                           "-out", str(cert), "-days", "1", "-subj", "/CN=tls.test"], capture_output=True)
    if proc.returncode != 0:
        pytest.skip("openssl cannot make a test certificate")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(cert), str(key))
    return ctx


@pytest.mark.skipif(not shutil.which("openssl"), reason="needs the openssl tool")
def test_tls_unverified_by_default_and_refused_when_verifying(tmp_path):
    ctx = _self_signed(tmp_path)

    async def main():
        server = HostileServer()
        _, port = await server.start(ssl=ctx)
        lax, strict = make_fetcher(), make_fetcher(verify_tls=True)
        try:
            url = f"https://tls.test:{port}/echo"
            a = await lax.fetch(FetchRequest(url=url, ip="127.0.0.1", port=port))
            b = await lax.fetch(FetchRequest(url=url, ip="127.0.0.1", port=port))
            c = await strict.fetch(FetchRequest(url=url, ip="127.0.0.1", port=port))
            return a, b, c, server.connections
        finally:
            await lax.close(0)
            await strict.close(0)
            server.close()
    a, b, c, connections = uvloop.run(main())
    assert a.outcome is Outcome.OK and b.outcome is Outcome.OK
    assert a.body == a.request_head                # the head is captured before encryption, as sent
    assert a.request_head.startswith(b"GET /echo HTTP/1.1\r\nHost: tls.test:")
    assert c.outcome is Outcome.TLS_ERROR
    assert connections == 1                        # lax reused its TLS connection; strict never finished a handshake


def test_total_timeout():
    async def scenario(f, server, port):
        return await f.fetch(req(port, "/drip"))
    r = run(scenario, timeout_s=1.0, low_speed_bytes_per_s=1, low_speed_time_s=30)
    assert r.outcome is Outcome.TIMEOUT


def test_drip_is_too_slow():
    async def scenario(f, server, port):
        return await f.fetch(req(port, "/drip"))
    r = run(scenario, low_speed_bytes_per_s=100, low_speed_time_s=1)
    assert r.outcome is Outcome.TOO_SLOW


def test_per_request_body_cap_overrides_default():
    async def scenario(f, server, port):
        small = await f.fetch(req(port, "/page?size=5000", max_body_bytes=4096))
        fine = await f.fetch(req(port, "/page?size=5000"))
        return small, fine
    small, fine = run(scenario)
    assert small.outcome is Outcome.TOO_LARGE
    assert fine.outcome is Outcome.OK


def test_body_cap_without_content_length():
    async def scenario(f, server, port):
        return await f.fetch(req(port, "/endless-chunked"))
    r = run(scenario, max_body_bytes=100_000)
    assert r.outcome is Outcome.TOO_LARGE
    assert r.error == "body exceeds 100000 bytes"
    assert len(r.body) <= 100_000                  # what arrived before the cut-off, never more


def test_header_cap_below_curls_own_limit():
    async def main():
        server = HostileServer(huge_header_bytes=100_000)   # over our 64 KiB cap, under curl's 300 KB
        _, port = await server.start()
        f = make_fetcher()
        try:
            return await f.fetch(req(port, "/huge-headers")), await f.fetch(req(port, "/ok"))
        finally:
            await f.close(0)
            server.close()
    r, after = uvloop.run(main())
    assert r.outcome is Outcome.HEADERS_TOO_LARGE
    assert r.error == f"response headers exceed {64 << 10} bytes"
    assert r.body == b"" and len(r.response_head) <= 64 << 10
    assert after.outcome is Outcome.OK


def test_close_abandons_a_drip_within_grace():
    async def scenario(f, server, port):
        task = asyncio.ensure_future(f.fetch(req(port, "/drip")))
        await server.wait_requests(1)
        await f.close(0.1)
        r = await task
        after = await f.fetch(req(port, "/ok"))
        return r, after, f.stats()
    r, after, stats = run(scenario, timeout_s=60.0)
    assert r.outcome is Outcome.ABORTED
    assert r.elapsed_s < 30                        # abandoned, not run to its 60 s timeout
    assert after.outcome is Outcome.ABORTED        # a closed fetcher takes no new work
    assert stats["in_flight"] == 0 and stats["watched_fds"] == 0


def test_close_lets_quick_transfers_finish():
    async def scenario(f, server, port):
        tasks = [asyncio.ensure_future(f.fetch(req(port, f"/page?size={i + 1}", host=f"q{i}.test")))
                 for i in range(10)]
        await asyncio.sleep(0)                     # let every fetch register its handle
        await f.close(5.0)
        return [t.result() for t in tasks]
    out = run(scenario)
    assert [r.outcome for r in out] == [Outcome.OK] * 10


def test_cancelled_fetch_releases_its_handle():
    async def scenario(f, server, port):
        task = asyncio.ensure_future(f.fetch(req(port, "/drip")))
        await server.wait_requests(1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return f.in_flight, await f.fetch(req(port, "/ok"))
    left, after = run(scenario)
    assert left == 0
    assert after.outcome is Outcome.OK


def _open_fds() -> int:
    import os
    return len(os.listdir("/proc/self/fd"))


def test_close_releases_every_socket():
    async def scenario(f, server, port):
        before = _open_fds()
        g = make_fetcher()
        await asyncio.gather(*(g.fetch(req(port, "/ok", host=f"s{i}.test")) for i in range(30)))
        await g.fetch(req(port, "/close-after"))
        opened = g.stats()["sockets_opened"]
        await g.close(0)
        await server.wait_all_closed()            # the server saw every client socket close
        return before, _open_fds(), opened, g.stats()
    before, after, opened, stats = run(scenario)
    assert opened >= 30
    assert after == before
    assert stats["watched_fds"] == 0


def test_dead_idle_connections_close_without_warning_or_fd_leak():
    """curl closes idle pooled connections the server dropped, long after the easy handle that
    opened them went back to the pool: nothing may go to stderr and no fd may stay open."""
    async def scenario(f, server, port):
        reqs = [req(port, "/close-after" if i % 2 else "/ok", host=f"h{i}.test") for i in range(10)]
        fds = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = list(await asyncio.gather(*(f.fetch(r) for r in reqs)))   # ten handles, ten connections
            for _ in range(6):
                out += [await f.fetch(r) for r in reqs]  # handles come back in another order
                fds.append(_open_fds())
        return out, [str(w.message) for w in caught], fds, f.stats()
    out, caught, fds, stats = run(scenario)
    assert all(r.outcome is Outcome.OK for r in out)
    assert caught == []
    assert fds[-1] == fds[0]                       # every dead connection's socket was closed
    assert stats["sockets_opened"] == 10 + 6 * 5


def test_no_free_fd_is_an_outcome_not_a_traceback(capfd):
    async def scenario(f, server, port):
        probe = os.dup(0)                          # the lowest free fd number
        os.close(probe)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (probe, hard))   # no new fd can be opened now
        try:
            starved = await f.fetch(req(port, "/ok"))
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        return starved, await f.fetch(req(port, "/ok"))
    starved, after = run(scenario)
    assert starved.outcome is Outcome.NETWORK_ERROR
    assert "cannot open a socket" in starved.error
    assert after.outcome is Outcome.OK
    assert capfd.readouterr().err == ""           # the daemon's stderr stays one event per line


def test_ipv6_loopback_pinning():
    try:
        probe = socket.socket(socket.AF_INET6)
        probe.bind(("::1", 0))
        probe.close()
    except OSError:
        pytest.skip("no IPv6 loopback")

    async def scenario(f, server, port):
        return await f.fetch(req(port, "/echo", ip="::1"))
    r = run(scenario, host="::1")
    assert r.outcome is Outcome.OK
    assert r.ip == "::1"
    assert b"Host: site.test:" in r.request_head


def test_bodies_go_into_the_body_pool_and_to_the_heap_when_it_is_full():
    """With a body pool the body is written into its blocks (the same bytes as without one); a
    body larger than the free blocks falls back to the heap whole; a result nobody holds gives its
    blocks back."""
    pool = BodyPool(64 * 1024, 1024)

    async def scenario(f, server, port):
        plain = make_fetcher()
        try:
            heap = await plain.fetch(req(port, "/gzip-bomb"))
        finally:
            await plain.close(0)
        pooled = await f.fetch(req(port, "/gzip-bomb"))
        used = pool.used
        big = await f.fetch(req(port, "/endless-chunked", max_body_bytes=200_000))
        return heap, pooled, used, big

    heap, pooled, used, big = run(scenario, body_pool=pool)
    try:
        assert heap.pooled is None and len(heap.body) > 1024
        assert pooled.outcome is Outcome.OK and pooled.body == b"" and pooled.pooled is not None
        assert pooled.content() == heap.body and pooled.size == len(heap.body)
        assert used == -(-len(heap.body) // 1024)
        assert big.outcome is Outcome.TOO_LARGE and big.pooled is None and len(big.body) > pool.cap_bytes
        assert pool.fallbacks == 1
        del pooled
        assert pool.used == 0 and pool.bodies == 0
    finally:
        pool.close()
