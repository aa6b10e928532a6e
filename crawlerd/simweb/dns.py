"""A small authoritative DNS responder on loopback UDP, for tests and benchmarks.

It answers A and AAAA questions (RFC 1035 §4 wire format) from a records
table, and can be told to misbehave per name: NXDOMAIN, SERVFAIL, no answer
at all (the resolver times out) or a garbage datagram. Names are matched
case-insensitively, without the trailing dot.

    server = DnsServer(records={"a.test": (["127.0.0.2"], 60)}, nxdomain={"gone.test"})
    host, port = await server.start()          # 127.0.0.1, a free port
    ...                                        # nameserver "127.0.0.1:<port>"
    server.close()

``lookup`` (optional) answers names missing from the table, so a synthetic
web with many hosts need not list them all.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import struct
from collections import Counter
from collections.abc import Callable, Iterable

QTYPE_A = 1
QTYPE_AAAA = 28
RCODE_OK = 0
RCODE_FORMERR = 1
RCODE_SERVFAIL = 2
RCODE_NXDOMAIN = 3
RCODE_NOTIMP = 4

Records = dict[str, tuple[list[str], int]]          # name -> (IPs, TTL seconds)
Lookup = Callable[[str], "tuple[list[str], int] | None"]


def _norm(name: str) -> str:
    return name.rstrip(".").lower()


def parse_question(packet: bytes) -> tuple[int, int, str, int, int, int]:
    """(id, flags, qname, qtype, qclass, end offset of the question) of a query; ValueError if malformed."""
    if len(packet) < 12:
        raise ValueError("short header")
    qid, flags, qdcount = struct.unpack_from("!HHH", packet, 0)
    if qdcount < 1:
        raise ValueError("no question")
    pos = 12
    labels = []
    while True:
        if pos >= len(packet):
            raise ValueError("truncated name")
        n = packet[pos]
        pos += 1
        if n == 0:
            break
        if n & 0xC0:
            raise ValueError("compression in question")
        labels.append(packet[pos:pos + n].decode("ascii", "replace"))
        pos += n
    if pos + 4 > len(packet):
        raise ValueError("truncated question")
    qtype, qclass = struct.unpack_from("!HH", packet, pos)
    return qid, flags, ".".join(labels), qtype, qclass, pos + 4


def build_response(query: bytes, rcode: int, answers: Iterable[tuple[int, int, bytes]] = ()) -> bytes:
    """A response echoing the query's question; answers are (type, ttl, rdata)."""
    qid, flags, _name, _qtype, _qclass, qend = parse_question(query)
    answers = list(answers)
    rd = flags & 0x0100
    out_flags = 0x8000 | (flags & 0x7800) | 0x0400 | rd | 0x0080 | rcode   # QR, opcode, AA, RD, RA
    parts = [struct.pack("!HHHHHH", qid, out_flags, 1, len(answers), 0, 0), query[12:qend]]
    for rtype, ttl, rdata in answers:
        # 0xC00C: compression pointer to the question name at offset 12
        parts.append(struct.pack("!HHHIH", 0xC00C, rtype, 1, ttl, len(rdata)))
        parts.append(rdata)
    return b"".join(parts)


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, server: DnsServer):
        self.server = server
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport):
        self.transport = transport

    def datagram_received(self, data, addr):
        reply = self.server.answer(data)
        if reply is not None and self.transport is not None:
            self.transport.sendto(reply, addr)


class DnsServer:
    """Loopback UDP DNS responder.

    Key: lower-case name without trailing dot. Invariant: a name is answered
    from exactly one behaviour, checked in this order: ``silent`` (never
    answered), ``garbage``, ``servfail``, ``nxdomain``, ``records``,
    ``lookup``; any other name is NXDOMAIN. ``queries`` counts questions
    received per name (every datagram, answered or not).
    """

    def __init__(self, records: Records | None = None, *, nxdomain: Iterable[str] = (),
                 servfail: Iterable[str] = (), silent: Iterable[str] = (), garbage: Iterable[str] = (),
                 lookup: Lookup | None = None, default_ttl_s: int = 300):
        self.records: Records = {_norm(k): (list(v[0]), int(v[1])) for k, v in (records or {}).items()}
        self.nxdomain = {_norm(n) for n in nxdomain}
        self.servfail = {_norm(n) for n in servfail}
        self.silent = {_norm(n) for n in silent}
        self.garbage = {_norm(n) for n in garbage}
        self.lookup = lookup
        self.default_ttl_s = default_ttl_s
        self.queries: Counter[str] = Counter()
        self._transport: asyncio.DatagramTransport | None = None
        self.address: tuple[str, int] | None = None

    def set_record(self, name: str, ips: list[str], ttl_s: int | None = None) -> None:
        """Add or replace a name's addresses (e.g. to rebind a name in a test)."""
        self.records[_norm(name)] = (list(ips), self.default_ttl_s if ttl_s is None else int(ttl_s))

    def answer(self, packet: bytes) -> bytes | None:
        """The reply datagram for one query, or None to stay silent."""
        try:
            _qid, flags, qname, qtype, _qclass, _end = parse_question(packet)
        except ValueError:
            if len(packet) < 12:
                return None
            return packet[:2] + struct.pack("!HHHHH", 0x8000 | RCODE_FORMERR, 0, 0, 0, 0)
        name = _norm(qname)
        self.queries[name] += 1
        if flags & 0x8000:
            return None                          # a response, not a query
        if name in self.silent:
            return None
        if name in self.garbage:
            # right id so the resolver reads it, then a header that promises records that are not there
            return packet[:2] + b"\x81\x80\x00\x01\x00\x05\x00\x00\x00\x00\xff\xfe"
        if name in self.servfail:
            return build_response(packet, RCODE_SERVFAIL)
        if name in self.nxdomain:
            return build_response(packet, RCODE_NXDOMAIN)
        entry = self.records.get(name)
        if entry is None and self.lookup is not None:
            entry = self.lookup(name)
        if entry is None:
            return build_response(packet, RCODE_NXDOMAIN)
        if qtype not in (QTYPE_A, QTYPE_AAAA):
            return build_response(packet, RCODE_OK)    # NODATA
        ips, ttl = entry
        answers = []
        for ip in ips:
            addr = ipaddress.ip_address(ip)
            if addr.version == 4 and qtype == QTYPE_A:
                answers.append((QTYPE_A, ttl, addr.packed))
            elif addr.version == 6 and qtype == QTYPE_AAAA:
                answers.append((QTYPE_AAAA, ttl, addr.packed))
        return build_response(packet, RCODE_OK, answers)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> tuple[str, int]:
        """Bind the UDP socket and start answering; returns the bound (host, port)."""
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: _Protocol(self), local_addr=(host, port))
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:   # a burst of queries must not overflow the socket while Python answers them
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            except OSError:
                pass
        sockname = transport.get_extra_info("sockname")
        self.address = (sockname[0], sockname[1])
        return self.address

    @property
    def nameserver(self) -> str:
        """The "IP:PORT" string a resolver is configured with."""
        if self.address is None:
            raise RuntimeError("DnsServer not started")
        return f"{self.address[0]}:{self.address[1]}"

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None
