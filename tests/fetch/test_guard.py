"""Address classifier and guard, on a table of addresses: no socket is opened here."""

import pytest

from crawlerd.fetch.guard import AddressGuard, classify

TABLE = [
    # IPv4
    ("8.8.8.8", "public"),
    ("93.184.216.34", "public"),
    ("0.0.0.0", "unspecified"),
    ("0.1.2.3", "reserved"),
    ("127.0.0.1", "loopback"),
    ("127.255.255.254", "loopback"),
    ("10.1.2.3", "private"),
    ("172.16.0.1", "private"),
    ("172.31.255.255", "private"),
    ("172.32.0.1", "public"),
    ("192.168.1.1", "private"),
    ("169.254.169.254", "metadata"),
    ("169.254.1.1", "link_local"),
    ("100.64.0.1", "cgnat"),
    ("100.127.255.255", "cgnat"),
    ("100.128.0.1", "public"),
    ("100.100.100.200", "metadata"),
    ("192.0.0.8", "reserved"),
    ("192.0.2.1", "documentation"),
    ("198.51.100.7", "documentation"),
    ("203.0.113.9", "documentation"),
    ("198.18.0.1", "benchmark"),
    ("192.88.99.1", "reserved"),
    ("224.0.0.1", "multicast"),
    ("239.255.255.250", "multicast"),
    ("240.0.0.1", "reserved"),
    ("255.255.255.254", "reserved"),
    ("255.255.255.255", "broadcast"),
    # IPv6
    ("2606:4700:4700::1111", "public"),
    ("::", "unspecified"),
    ("::1", "loopback"),
    ("[::1]", "loopback"),
    ("fd00::1", "private"),
    ("fc00::1", "private"),
    ("fd00:ec2::254", "metadata"),
    ("fe80::1", "link_local"),
    ("fe80::1%eth0", "link_local"),
    ("febf::1", "link_local"),
    ("fec0::1", "private"),
    ("ff02::1", "multicast"),
    ("2001:db8::1", "documentation"),
    ("3fff::1", "documentation"),
    ("2001::1", "tunnel"),
    ("2001:2::1", "reserved"),
    ("100::1", "reserved"),
    ("64:ff9b:1::1", "private"),
    ("4000::1", "reserved"),           # outside global unicast 2000::/3
    ("5f00::1", "reserved"),
    # IPv6 forms that carry an IPv4 address take its class
    ("::ffff:127.0.0.1", "loopback"),
    ("::ffff:7f00:1", "loopback"),
    ("::ffff:10.0.0.1", "private"),
    ("::ffff:169.254.169.254", "metadata"),
    ("::ffff:8.8.8.8", "public"),
    ("::127.0.0.1", "loopback"),       # IPv4-compatible (deprecated)
    ("::8.8.8.8", "reserved"),         # compatible form of a public address: no legitimate use
    ("::ffff:0:127.0.0.1", "loopback"),  # SIIT
    ("64:ff9b::7f00:1", "loopback"),   # NAT64 of 127.0.0.1
    ("64:ff9b::808:808", "public"),
    ("2002:7f00:1::1", "loopback"),    # 6to4 of 127.0.0.1
    ("2002:a9fe:a9fe::1", "metadata"),
    ("2002:808:808::1", "public"),
    # not addresses
    ("", "invalid"),
    ("example.org", "invalid"),
    ("1.2.3", "invalid"),
    ("256.1.1.1", "invalid"),
]


@pytest.mark.parametrize(("ip", "expected"), TABLE)
def test_classify_table(ip, expected):
    assert classify(ip) == expected


@pytest.mark.parametrize(("ip", "expected"), TABLE)
def test_default_guard_allows_exactly_public(ip, expected):
    assert AddressGuard([]).allowed(ip) is (expected == "public")


def test_allow_list_opens_only_the_listed_network():
    g = AddressGuard(["127.0.0.0/16"])
    assert g.allowed("127.0.0.1")
    assert g.allowed("127.0.255.255")
    assert not g.allowed("127.200.0.1")
    assert not g.allowed("10.0.0.1")
    assert g.allowed("8.8.8.8")


def test_allow_list_covers_v4_carried_in_v6_forms():
    g = AddressGuard(["127.0.0.0/16"])
    assert g.allowed("::ffff:127.0.0.1")
    assert g.allowed("2002:7f00:1::1")
    assert not g.allowed("::ffff:127.200.0.1")
    assert not g.allowed("64:ff9b::7fc8:1")        # NAT64 of 127.200.0.1
    assert not g.allowed("::1")                     # v6 loopback is not in a v4 allowance


def test_allow_list_v6_network():
    g = AddressGuard(["::1/128", "fd00::/8"])
    assert g.allowed("::1")
    assert g.allowed("fd12::5")
    assert not g.allowed("fe80::1")
    assert not g.allowed("127.0.0.1")


def test_reload_replaces_allowance_and_forgets_memo():
    g = AddressGuard(["127.0.0.0/8"])
    assert g.allowed("127.0.0.1")
    g.reload([])
    assert not g.allowed("127.0.0.1")
    g.reload(["127.0.0.1/32"])
    assert g.allowed("127.0.0.1")
    assert not g.allowed("127.0.0.2")


def test_reload_rejects_bad_network_and_keeps_old():
    g = AddressGuard(["127.0.0.0/8"])
    with pytest.raises(ValueError):
        g.reload(["not-a-network"])
    assert g.allowed("127.0.0.1")


def test_metadata_inside_cgnat_is_refused_unless_cgnat_is_allowed():
    # 100.100.100.200 sits inside 100.64/10; allowing CGNAT allows it too (the operator chose so)
    g = AddressGuard([])
    assert not g.allowed("100.100.100.200")
    assert AddressGuard(["100.64.0.0/10"]).allowed("100.100.100.200")


def test_reason_names_the_class():
    g = AddressGuard([])
    assert g.reason("169.254.169.254") == "metadata"
    assert g.reason("8.8.8.8") == "allowed"
    assert g.reason("bogus") == "invalid"


def test_memo_is_bounded():
    g = AddressGuard([])
    for i in range(70000):
        g.allowed(f"8.{i >> 16}.{(i >> 8) & 255}.{i & 255}")
    assert len(g._memo) <= 1 << 16
