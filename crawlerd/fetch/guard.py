"""Address guard: which IP addresses the fetcher may connect to (ARCHITECTURE.md invariant 5).

Only public unicast addresses are allowed by default. Loopback, private,
link-local, CGNAT, multicast, documentation, reserved and cloud-metadata
addresses are refused unless a network listed in ``network.allow`` covers
them. IPv6 forms that carry an IPv4 address (mapped ``::ffff:a.b.c.d``,
compatible ``::a.b.c.d``, SIIT ``::ffff:0:a.b.c.d``, NAT64 ``64:ff9b::/96``
and 6to4 ``2002::/16``) are judged by the IPv4 address they lead to, so
``::ffff:127.0.0.1`` is loopback, not "public IPv6".

The guard is consulted twice per connection: by the shard before a request is
queued (on the address DNS returned) and by curl's open-socket callback on the
address actually connected to (no DNS rebinding: the address is pinned).
"""

from __future__ import annotations

import ipaddress
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

_V4 = IPv4Network
_V6 = IPv6Network

# Ordered: the first matching network names the class. Sources: IANA IPv4/IPv6
# Special-Purpose Address Registries (RFC 6890 and updates).
_V4_TABLE: tuple[tuple[IPv4Network, str], ...] = (
    (_V4("0.0.0.0/32"), "unspecified"),
    (_V4("0.0.0.0/8"), "reserved"),             # "this network", RFC 791
    (_V4("127.0.0.0/8"), "loopback"),
    (_V4("10.0.0.0/8"), "private"),              # RFC 1918
    (_V4("172.16.0.0/12"), "private"),
    (_V4("192.168.0.0/16"), "private"),
    (_V4("169.254.169.254/32"), "metadata"),     # AWS/GCP/Azure/OpenStack instance metadata
    (_V4("169.254.0.0/16"), "link_local"),       # RFC 3927
    (_V4("100.100.100.200/32"), "metadata"),     # Alibaba Cloud metadata (inside CGNAT space)
    (_V4("100.64.0.0/10"), "cgnat"),             # RFC 6598 shared address space
    (_V4("192.0.0.0/24"), "reserved"),           # IETF protocol assignments, RFC 6890
    (_V4("192.0.2.0/24"), "documentation"),      # TEST-NET-1, RFC 5737
    (_V4("198.51.100.0/24"), "documentation"),   # TEST-NET-2
    (_V4("203.0.113.0/24"), "documentation"),    # TEST-NET-3
    (_V4("192.88.99.0/24"), "reserved"),         # deprecated 6to4 relay anycast, RFC 7526
    (_V4("198.18.0.0/15"), "benchmark"),         # RFC 2544
    (_V4("224.0.0.0/4"), "multicast"),
    (_V4("255.255.255.255/32"), "broadcast"),
    (_V4("240.0.0.0/4"), "reserved"),            # class E, RFC 1112
)

_V6_TABLE: tuple[tuple[IPv6Network, str], ...] = (
    (_V6("::/128"), "unspecified"),
    (_V6("::1/128"), "loopback"),
    (_V6("fd00:ec2::254/128"), "metadata"),      # AWS instance metadata over IPv6
    (_V6("fc00::/7"), "private"),                # unique local, RFC 4193
    (_V6("fe80::/10"), "link_local"),
    (_V6("fec0::/10"), "private"),               # deprecated site-local, RFC 3879
    (_V6("ff00::/8"), "multicast"),
    (_V6("64:ff9b:1::/48"), "private"),          # local-use NAT64, RFC 8215
    (_V6("100::/64"), "reserved"),               # discard-only, RFC 6666
    (_V6("2001:db8::/32"), "documentation"),     # RFC 3849
    (_V6("3fff::/20"), "documentation"),         # RFC 9637
    (_V6("2001::/32"), "tunnel"),                # Teredo: the real peer is hidden, RFC 4380
    (_V6("2001::/23"), "reserved"),              # IETF protocol assignments, RFC 2928
    (_V6("5f00::/16"), "reserved"),              # SRv6 SIDs, RFC 9602
)
_GLOBAL_UNICAST_V6 = _V6("2000::/3")
_NAT64 = _V6("64:ff9b::/96")
_SIIT = _V6("::ffff:0:0:0/96")
_COMPAT = _V6("::/96")
_6TO4 = _V6("2002::/16")

_CACHE_MAX = 1 << 16


def _parse(ip: str) -> IPv4Address | IPv6Address | None:
    text = ip.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(addr, IPv6Address) and addr.scope_id:
        addr = IPv6Address(text.split("%", 1)[0])
    return addr


def embedded_v4(addr: IPv6Address) -> IPv4Address | None:
    """The IPv4 address an IPv6 address leads to, if it is one of the v4-carrying forms."""
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr in _SIIT or addr in _NAT64:
        return IPv4Address(int(addr) & 0xFFFFFFFF)
    if addr in _6TO4:
        return addr.sixtofour
    if addr in _COMPAT and int(addr) > 1:   # :: and ::1 are not compatible addresses
        return IPv4Address(int(addr) & 0xFFFFFFFF)
    return None


def _classify_v4(addr: IPv4Address) -> str:
    for net, name in _V4_TABLE:
        if addr in net:
            return name
    return "public"


def _classify(addr: IPv4Address | IPv6Address) -> str:
    if isinstance(addr, IPv4Address):
        return _classify_v4(addr)
    v4 = embedded_v4(addr)
    if v4 is not None:
        cls = _classify_v4(v4)
        # The deprecated compatible form (RFC 4291 §2.5.5.1) has no legitimate public use.
        if cls == "public" and addr in _COMPAT:
            return "reserved"
        return cls
    for net, name in _V6_TABLE:
        if addr in net:
            return name
    if addr not in _GLOBAL_UNICAST_V6:
        return "reserved"
    return "public"


def classify(ip: str) -> str:
    """Class of an IP address string.

    One of: public, loopback, private, link_local, metadata, cgnat, multicast,
    broadcast, documentation, benchmark, tunnel, reserved, unspecified, invalid.
    IPv6 forms carrying an IPv4 address take the class of that IPv4 address.
    """
    addr = _parse(ip)
    if addr is None:
        return "invalid"
    return _classify(addr)


class AddressGuard:
    """Decides whether the fetcher may connect to an IP address.

    Key: the IP address string, as DNS or curl reports it. Invariant: an
    address is allowed iff it parses and either its class is ``public`` or a
    network in the allow list contains the address or the IPv4 address it
    embeds. A forbidden address is never connected to: the fetcher asks again
    when the socket opens. Verdicts are memoised per string (bounded); the memo
    is cleared on :meth:`reload`.
    """

    __slots__ = ("_allow_v4", "_allow_v6", "_memo")

    def __init__(self, allow: list[str]):
        self._allow_v4: tuple[IPv4Network, ...] = ()
        self._allow_v6: tuple[IPv6Network, ...] = ()
        self._memo: dict[str, bool] = {}
        self.reload(allow)

    def reload(self, allow: list[str]) -> None:
        """Replace the allow list (CIDR strings); raises ValueError on a bad network."""
        nets = [ipaddress.ip_network(n.strip(), strict=False) for n in allow]
        self._allow_v4 = tuple(n for n in nets if isinstance(n, IPv4Network))
        self._allow_v6 = tuple(n for n in nets if isinstance(n, IPv6Network))
        self._memo = {}

    def _listed(self, addr: IPv4Address | IPv6Address) -> bool:
        nets = self._allow_v4 if isinstance(addr, IPv4Address) else self._allow_v6
        return any(addr in n for n in nets)

    def _decide(self, ip: str) -> bool:
        addr = _parse(ip)
        if addr is None:
            return False
        if _classify(addr) == "public":
            return True
        if self._listed(addr):
            return True
        if isinstance(addr, IPv6Address):
            v4 = embedded_v4(addr)
            if v4 is not None and self._listed(v4):
                return True
        return False

    def allowed(self, ip: str) -> bool:
        """True if the fetcher may connect to ``ip``."""
        verdict = self._memo.get(ip)
        if verdict is None:
            verdict = self._decide(ip)
            if len(self._memo) >= _CACHE_MAX:
                self._memo.clear()
            self._memo[ip] = verdict
        return verdict

    def reason(self, ip: str) -> str:
        """Why ``ip`` is refused (its class), or ``"allowed"``."""
        return "allowed" if self.allowed(ip) else classify(ip)
