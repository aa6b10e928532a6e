import os
import tomllib

import pytest

from crawlerd import config, config_schema
from tests.conftest import ROOT

SHIPPED = os.path.join(ROOT, "config.toml")


def test_shipped_file_matches_code_defaults():
    with open(SHIPPED, "rb") as f:
        data = tomllib.load(f)
    assert data == config.defaults()


def test_shipped_file_is_the_rendered_schema():
    with open(SHIPPED) as f:
        assert f.read() == config.render_toml(), "regenerate with: crawlerd config dump > config.toml"


def test_every_key_is_commented_in_shipped_file():
    lines = open(SHIPPED).read().splitlines()
    for i, line in enumerate(lines):
        if "=" in line and not line.startswith("#") and not line.startswith("["):
            assert lines[i - 1].startswith("#"), f"key without a comment: {line}"


@pytest.mark.parametrize("override, fragment", [
    ("fetch.timeout_s=-1", "fetch: timeout_s = -1.0: expected a value >= 0.1"),
    ("fetch.nope=1", "unknown key fetch.nope"),
    ("nosuch.key=1", "unknown section [nosuch]"),
    ("fetch.verify_tls=3", "verify_tls = 3: expected true or false"),
    ("fetch.max_in_flight=1.5", "max_in_flight = 1.5: expected an integer"),
    ("network.allow=[\"10.0.0.0/33\"]", "is not a network in CIDR form"),
    ("network.allow=[1, 2]", "expected a list of strings"),
    ("log.level=loud", "expected one of debug, info, warning, error"),
    ("dns.nameservers=[\"1.2.3\"]", "is not \"IP\" or \"IP:PORT\""),
    ("politeness.min_delay_s=100", "min_delay_s = 100.0: expected a value <= politeness.max_delay_s"),
    ("fetchtimeout", "expected section.key=VALUE"),
])
def test_bad_override_names_key_and_expectation(override, fragment):
    with pytest.raises(config.ConfigError) as e:
        config.load(None, [override])
    msg = str(e.value)
    assert fragment in msg
    assert "\n" not in msg


def test_bad_file_names_file_key_value(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("[fetch]\ntimeout_s = \"soon\"\n")
    with pytest.raises(config.ConfigError) as e:
        config.load(str(p))
    assert str(e.value) == f"{p}: fetch: timeout_s = 'soon': expected a number"


def test_unknown_key_in_file(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("[crawl]\ndatadir = \"/x\"\n")
    with pytest.raises(config.ConfigError, match=r"unknown key crawl.datadir"):
        config.load(str(p))


def test_not_toml_and_missing(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("[crawl\n")
    with pytest.raises(config.ConfigError, match="not valid TOML"):
        config.load(str(p))
    with pytest.raises(config.ConfigError, match="config file not found"):
        config.load(str(tmp_path / "missing.toml"))


def test_overrides_parse_toml_else_string():
    cfg = config.load(None, ['network.allow=["127.0.0.0/8"]', "crawl.data_dir=/tmp/x y",
                             "fetch.timeout_s=30", "dns.static_hosts={\"a.sim\" = \"127.0.0.2\"}"])
    assert cfg.network.allow == ["127.0.0.0/8"]
    assert cfg.crawl.data_dir == "/tmp/x y"
    assert cfg.fetch.timeout_s == 30.0 and isinstance(cfg.fetch.timeout_s, float)
    assert cfg.dns.static_hosts == {"a.sim": "127.0.0.2"}
    assert cfg.control_socket == "/tmp/x y/control.sock"


def test_placeholder_contact_detected():
    assert config.load().contact_is_placeholder()
    assert not config.load(None, ["crawl.user_agent=bot/1 (ops@example.net)"]).contact_is_placeholder()


def test_defaults_are_independent_copies():
    a = config.load()
    a.network.allow.append("10.0.0.0/8")
    assert config.load().network.allow == []


FLOAT_KEYS = [(s, k.name) for s, (_d, keys) in config_schema.SCHEMA.items() for k in keys if k.type is float]


@pytest.mark.parametrize("section, key", FLOAT_KEYS)
@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
def test_every_float_key_refuses_nan_and_inf(section, key, bad):
    with pytest.raises(config.ConfigError) as e:
        config.load(None, [f"{section}.{key}={bad}"])
    msg = str(e.value)
    assert f"{section}: {key} = " in msg and "expected a finite number" in msg and "\n" not in msg


def test_every_number_key_has_a_range_holding_its_default():
    for section, (_d, keys) in config_schema.SCHEMA.items():
        for k in keys:
            if k.type in (int, float):
                assert k.min is not None and k.max is not None, f"{section}.{k.name} has no range"
                assert k.min <= k.default <= k.max, f"{section}.{k.name}"


@pytest.mark.parametrize("override, fragment", [
    ("frontier.map_size_bytes=9223372036854775807", "map_size_bytes = 9223372036854775807: expected a value <= "),
    ("fetch.timeout_s=1e9", "timeout_s = 1000000000.0: expected a value <= 3600"),
    ("fetch.connect_timeout_s=90", "fetch.connect_timeout_s = 90.0: expected a value <= fetch.timeout_s"),
    ("politeness.backoff_base_s=7200", "backoff_base_s = 7200.0: expected a value <= politeness.backoff_max_s"),
    ("recrawl.priority=4", "recrawl.priority = 4: expected a value < frontier.priority_levels"),
    ('crawl.user_agent=""', "user_agent = '': expected printable ASCII text"),
    ('crawl.user_agent="bot\\r\\nX-Evil: 1 (a@b.c)"', "expected printable ASCII text"),
    ('robots.agent_token="my bot"', "expected a product token"),
    ('crawl.data_dir=""', "data_dir = '': expected a directory path"),
    ('warc.prefix="a/b"', "prefix = 'a/b': expected a file name part"),
    ('control.socket="/' + "x" * 120 + '"', "expected a path of at most 107 bytes"),
    ('sitemaps.urls=["ftp://x/s.xml"]', "'ftp://x/s.xml' is not an http(s) URL"),
])
def test_bad_ranges_and_values(override, fragment):
    with pytest.raises(config.ConfigError) as e:
        config.load(None, [override])
    assert fragment in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("ua, ok", [
    ("crawlerd/0.1 (+https://example.org/bot)", True),
    ("crawlerd/0.1 (operator: ops@example.net)", True),
    ("crawlerd-test/0.1 (operator: test@localhost)", True),
    ("crawlerd/0.1 (+https://example.org/crawlerd; operator: CHANGE-ME@example.org)", False),
    ("crawlerd/0.1", False),
    ("crawlerd/0.1 (@handle)", False),
    ("crawlerd/0.1 (https:// nothing)", False),
])
def test_user_agent_needs_an_operator_contact(ua, ok):
    problem = config.load(None, [f"crawl.user_agent={ua!r}"]).contact_problem()
    assert (problem is None) == ok, problem


def test_map_sizes_beyond_the_address_space_are_refused():
    big = config_schema.MAX_MAP_BYTES
    cfg = config.load(None, [f"frontier.map_size_bytes={big}", f"recrawl.map_size_bytes={big}"])
    with pytest.raises(config.ConfigError, match=r"frontier.map_size_bytes = \d+: the LMDB maps need \d+ bytes"):
        config.check_map_sizes(cfg)
    config.check_map_sizes(config.load())       # the defaults fit


@pytest.mark.parametrize("overrides, fragment", [
    (['cluster.servers=["http://127.0.0.1:4222"]'], "is not \"nats://HOST:PORT\""),
    (['cluster.servers=["nats://127.0.0.1"]'], "is not \"nats://HOST:PORT\""),
    (['cluster.crawl="a b"'], "use 1-64 letters, digits"),
    (['cluster.servers=["nats://127.0.0.1:4222"]', 'cluster.own="3-1"'], "expected I or I-J"),
    (['cluster.servers=["nats://127.0.0.1:4222"]', "crawl.shards=4", 'cluster.own="2-4"'],
     "shard 4 in '2-4': crawl.shards is 4"),
    (['cluster.own="0-1"'], "only a node of a cluster owns a share"),
    (["cluster.lease_fence_s=20"], "cluster.lease_fence_s = 20.0: expected lease_renew_interval_s"),
])
def test_bad_cluster_keys_name_the_key(overrides, fragment):
    with pytest.raises(config.ConfigError) as e:
        config.load(None, overrides)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_shard_sets():
    assert config.parse_shard_set("0-3") == [0, 1, 2, 3]
    assert config.parse_shard_set("1-2,5, 0") == [0, 1, 2, 5]
    assert config.parse_shard_set("4", 5) == [4]


def test_retired_key_names_its_replacement(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("[fetch]\nmax_connections = 2000\n")
    with pytest.raises(config.ConfigError, match=r"fetch.max_connections is no longer a key.*connection_cache_bytes"):
        config.load(str(p))
