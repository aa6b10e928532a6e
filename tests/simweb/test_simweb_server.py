"""simweb over the wire: a subprocess on port 0 (bind 127.0.0.1), its answers and its ledger."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from crawlerd.simweb import SimWebProcess
from crawlerd.simweb.netns import check_bind, in_private_netns

AGENT = "crawlerd-test/1.0 (+tests)"


@pytest.fixture(scope="module")
def sim():
    with SimWebProcess(hosts=40, seed=4, min_pages=20, max_pages=60) as s:
        yield s


@pytest.fixture(scope="module")
def site(sim):
    return sim.site()


def host_with(site, *, role=None, robots=None):
    for name, h in site["hosts"].items():
        if (role is None or h["role"] == role) and (robots is None or h["robots"]["variant"] == robots):
            return name
    raise LookupError((role, robots))


def get(sim, host, target, headers=None, method="GET"):
    conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=10)
    try:
        conn.request(method, target,
                     headers={"Host": f"{host}:{sim.port}", "User-Agent": AGENT, **(headers or {})})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def raw_exchange(port, data: bytes, timeout=10.0) -> bytes:
    """Send data, half-close, read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def wait_ledger(sim, pred, deadline_s=10.0):
    """Poll the ledger until an entry satisfies pred (the server notices a client close asynchronously)."""
    end = time.monotonic() + deadline_s
    while True:
        hits = [e for e in sim.ledger() if pred(e)]
        if hits or time.monotonic() > end:
            return hits
        time.sleep(0.02)


def test_announcement(sim):
    assert sim.port > 0 and sim.control_port > 0 and sim.bind == "127.0.0.1"
    assert len(sim.hosts) == 40 and set(sim.static_hosts.values()) == {"127.0.0.1"}
    assert "127.0.0.1" not in sim.hosts.values()
    assert sim.seeds[0] == f"http://h0.sim:{sim.port}/" and len(sim.seeds) == 40


def test_serves_a_page_and_ledger_records_it(sim):
    status, headers, body = get(sim, "h0.sim", "/p/5.html?x=1")
    assert status == 200 and body.startswith(b"<!DOCTYPE html>")
    assert int(headers["Content-Length"]) == len(body) and "ETag" in headers and "Date" in headers
    [e] = wait_ledger(sim, lambda e: e.target == "/p/5.html?x=1")
    assert (e.host, e.ip, e.method, e.status, e.user_agent) == ("h0.sim", "127.0.0.1", "GET", 200, AGENT)
    assert e.bytes > len(body) and e.t_end >= e.t_start > 0 and e.t_start_wall > 1.6e9
    assert e.t_end_wall >= e.t_start_wall


def test_conditional_get_304_and_headers_recorded(sim):
    _, headers, _ = get(sim, "h0.sim", "/p/6.html")
    status, h304, body = get(sim, "h0.sim", "/p/6.html", {"If-None-Match": headers["ETag"]})
    assert status == 304 and body == b"" and h304["ETag"] == headers["ETag"]
    status, _, _ = get(sim, "h0.sim", "/p/6.html", {"If-Modified-Since": headers["Last-Modified"]})
    assert status == 304
    hits = wait_ledger(sim, lambda e: e.target == "/p/6.html" and e.status == 304)
    assert {e.if_none_match for e in hits} == {headers["ETag"], ""}
    assert {e.if_modified_since for e in hits} == {"", headers["Last-Modified"]}


def test_head_has_length_but_no_body(sim):
    _, headers, body = get(sim, "h0.sim", "/p/7.html")
    status, hh, hbody = get(sim, "h0.sim", "/p/7.html", method="HEAD")
    assert status == 200 and hbody == b"" and hh["Content-Length"] == str(len(body))


def test_keep_alive_and_pipelining_on_one_connection(sim):
    reqs = b"".join(f"GET /p/{k}.html HTTP/1.1\r\nHost: h0.sim\r\n\r\n".encode() for k in range(3))
    reqs += b"GET /p/3.html HTTP/1.1\r\nHost: h0.sim\r\nConnection: close\r\n\r\n"
    out = raw_exchange(sim.port, reqs)
    assert out.count(b"HTTP/1.1 200 OK\r\n") == 4 and out.rstrip().endswith(b"</html>")
    hits = wait_ledger(sim, lambda e: e.user_agent == "" and e.host == "h0.sim" and e.method == "GET")
    conns = {e.conn for e in hits if e.target in ("/p/0.html", "/p/1.html", "/p/2.html", "/p/3.html")}
    assert len(conns) == 1


def test_malformed_requests(sim):
    assert raw_exchange(sim.port, b"GARBAGE\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert raw_exchange(sim.port, b"GET /p/1.html HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 400 ")  # no Host
    assert raw_exchange(sim.port, b"GET / HTTP/2.0\r\nHost: h0.sim\r\n\r\n").startswith(b"HTTP/1.1 505 ")
    post = b"POST / HTTP/1.1\r\nHost: h0.sim\r\nContent-Length: 2\r\n\r\nhi"
    assert raw_exchange(sim.port, post).startswith(b"HTTP/1.1 405 ")
    big = b"GET / HTTP/1.1\r\nHost: h0.sim\r\nX: " + b"a" * 20000 + b"\r\n\r\n"
    assert raw_exchange(sim.port, big).startswith(b"HTTP/1.1 431 ")
    assert wait_ledger(sim, lambda e: e.note == "bad_request")


@pytest.mark.parametrize("variant,status", [
    ("absent", 404), ("disallow_private", 200), ("crawl_delay", 200), ("agent_groups", 200),
    ("status_401", 401), ("status_403", 403), ("status_500", 500), ("status_503", 503), ("redirect_chain", 301)])
def test_robots_variants_over_the_wire(sim, site, variant, status):
    host = host_with(site, robots=variant)
    got, headers, body = get(sim, host, "/robots.txt")
    assert got == status
    if variant == "redirect_chain":
        assert headers["Location"] == f"http://{host}:{sim.port}/moved/robots-hop.txt"
    assert wait_ledger(sim, lambda e: e.host == host and e.target == "/robots.txt" and e.status == status)


def test_robots_reset_sends_rst(sim, site):
    host = host_with(site, robots="reset")
    with socket.create_connection(("127.0.0.1", sim.port), timeout=10) as s:
        s.sendall(f"GET /robots.txt HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        with pytest.raises(ConnectionResetError):
            while s.recv(65536):
                pass
    [e] = wait_ledger(sim, lambda e: e.host == host and e.note == "reset")
    assert e.status == 0


def test_robots_timeout_says_nothing(sim, site):
    host = host_with(site, robots="timeout")
    with socket.create_connection(("127.0.0.1", sim.port), timeout=0.5) as s:
        s.sendall(f"GET /robots.txt HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        with pytest.raises(TimeoutError):
            s.recv(65536)
    # we hung up first: the server records the request as unanswered
    [e] = wait_ledger(sim, lambda e: e.host == host and e.note == "client_closed")
    assert e.status == 0 and e.t_end > e.t_start


def test_slow_host_answer_is_delayed(sim, site):
    host = host_with(site, role="slow")
    status, _, _ = get(sim, host, "/p/1.html")
    assert status == 200
    [e] = wait_ledger(sim, lambda e: e.host == host and e.target == "/p/1.html")
    assert e.t_end - e.t_start >= 0.5


def test_rate_limited_host_announces_retry_after(sim, site):
    host = host_with(site, role="rate_limited")
    statuses = [get(sim, host, "/")[0] for _ in range(4)]
    assert statuses.count(429) == 1
    [e] = wait_ledger(sim, lambda e: e.host == host and e.status == 429)
    assert e.retry_after_s == site["retry_after_s"]


def test_control_reset_and_since(sim):
    get(sim, "h0.sim", "/p/8.html")
    before = sim.ledger()
    assert before
    last = before[-1].seq
    assert sim.ledger(since=last + 1) == []
    cleared = sim.reset_ledger()
    assert cleared >= len(before)
    get(sim, "h0.sim", "/p/9.html")
    after = sim.ledger()
    assert [e.target for e in after] == ["/p/9.html"] and after[0].seq > last


def test_control_unknown_endpoint_is_404(sim):
    conn = http.client.HTTPConnection("127.0.0.1", sim.control_port, timeout=10)
    conn.request("GET", "/nope")
    assert conn.getresponse().status == 404
    conn.close()


def test_same_seed_same_site_over_the_wire(sim, site):
    with SimWebProcess(hosts=40, seed=4, min_pages=20, max_pages=60) as other:
        other_site = other.site()
        other_site.pop("port")
        assert other_site == {k: v for k, v in site.items() if k != "port"}
        # bodies differ only in the port inside absolute links
        a = get(sim, "h3.sim", "/p/2.html")[2].replace(str(sim.port).encode(), b"PORT")
        b = get(other, "h3.sim", "/p/2.html")[2].replace(str(other.port).encode(), b"PORT")
        assert a == b


def test_sigterm_writes_ledger_and_exits_zero(tmp_path):
    out = tmp_path / "ledger.jsonl"
    sim = SimWebProcess(hosts=5, seed=1, max_pages=30, ledger_out=str(out)).start()
    try:
        assert get(sim, "h0.sim", "/robots.txt")[0] == 200
        assert get(sim, "h0.sim", "/p/1.html")[0] == 200
    finally:
        rc = sim.stop()
    assert rc == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [d["target"] for d in lines] == ["/robots.txt", "/p/1.html"]
    assert all(d["status"] == 200 and d["host"] == "h0.sim" for d in lines)


def test_bind_policy():
    assert check_bind("127.0.0.1") is None and check_bind("127.9.8.7") is None and check_bind("::1") is None
    assert "loopback" in check_bind("10.1.2.3")
    assert "not an IP" in check_bind("localhost")
    if in_private_netns():
        assert check_bind("0.0.0.0") is None
    else:
        assert "namespace" in check_bind("0.0.0.0")


@pytest.mark.skipif(in_private_netns(), reason="refusal applies outside a private namespace")
def test_cli_refuses_0000_outside_namespace():
    r = subprocess.run([sys.executable, "-m", "crawlerd.simweb", "--bind", "0.0.0.0", "--hosts", "3"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == "" and "namespace" in r.stderr


def _unshare_works() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        return False
    return subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0


@pytest.mark.netns
@pytest.mark.skipif(not _unshare_works(), reason="needs root and unshare -n")
def test_per_host_ips_inside_private_namespace():
    script = textwrap.dedent("""
        import http.client, json
        from crawlerd.simweb import SimWebProcess
        with SimWebProcess(hosts=35, seed=2, bind="0.0.0.0", max_pages=30) as sim:
            out = {}
            for name in ("h0.sim", "h1.sim", "h5.sim", "h31.sim"):
                ip = sim.static_hosts[name]
                c = http.client.HTTPConnection(ip, sim.port, timeout=10)
                c.request("GET", "/", headers={"Host": name})
                c.getresponse().read()
                c.close()
            print(json.dumps({"static": sim.static_hosts,
                              "ledger": [[e.host, e.ip] for e in sim.ledger()]}))
    """)
    r = subprocess.run(["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$0" -c "$1"', sys.executable,
                        script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    static = res["static"]
    assert static["h0.sim"] == static["h1.sim"] != static["h5.sim"] and "127.0.0.1" not in static.values()
    assert res["ledger"] == [[n, static[n]] for n in ("h0.sim", "h1.sim", "h5.sim", "h31.sim")]


def test_ledger_checks_on_real_traffic(sim, site):
    """A polite sequential client passes; two concurrent requests to the slow host are caught."""
    from crawlerd.simweb.ledger import HOST_OVERLAP, politeness_violations, robots_violations

    sim.reset_ledger()
    gap = 0.05
    for host in ("h0.sim", host_with(site, robots="agent_groups")):
        get(sim, host, "/robots.txt")
        for k in range(3):
            time.sleep(gap)          # the client's politeness gap itself, not a synchronisation
            get(sim, host, f"/p/{k}.html")
    polite = sim.ledger()
    assert len(polite) == 8
    assert politeness_violations(polite, min_gap_s=gap, tolerance_s=0.0) == []
    assert robots_violations(polite, site, agent="crawlerd") == []
    assert politeness_violations(polite, min_gap_s=10.0)          # a stricter rule does flag them

    slow = host_with(site, role="slow")
    with socket.create_connection(("127.0.0.1", sim.port), timeout=10) as a, \
            socket.create_connection(("127.0.0.1", sim.port), timeout=10) as b:
        a.sendall(f"GET /p/2.html HTTP/1.1\r\nHost: {slow}\r\nConnection: close\r\n\r\n".encode())
        wait_ledger(sim, lambda e: e.host == slow and e.target == "/p/2.html")   # a is being answered
        b.sendall(f"GET /p/3.html HTTP/1.1\r\nHost: {slow}\r\nConnection: close\r\n\r\n".encode())
        for s in (a, b):
            while s.recv(65536):
                pass
    entries = wait_ledger(sim, lambda e: e.host == slow and e.t_end > 0)
    kinds = [v.kind for v in politeness_violations(entries, min_gap_s=0.0) if v.key == slow]
    assert kinds == [HOST_OVERLAP]


def test_dns_port_answers_every_host():
    import struct

    with SimWebProcess(hosts=4, seed=1, max_pages=20, dns_port=0) as sim:
        assert sim.dns_port
        name = "h2.sim"
        qname = b"".join(bytes([len(label)]) + label.encode() for label in name.split(".")) + b"\x00"
        query = struct.pack("!HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + qname + struct.pack("!HH", 1, 1)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(10)
            s.sendto(query, ("127.0.0.1", sim.dns_port))
            reply, _ = s.recvfrom(512)
        qid, flags, _, ancount = struct.unpack("!HHHH", reply[:8])
        assert qid == 0x1234 and flags & 0x000F == 0 and ancount == 1
        assert socket.inet_ntoa(reply[-4:]) == sim.static_hosts[name]
