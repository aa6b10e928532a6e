"""Typed, strict configuration: every key, its default, unit and meaning, in one place.

The schema (:mod:`crawlerd.config_schema`) is the single source of defaults.
``config.toml`` at the repository root is generated from it (``crawlerd config
dump``) and a test checks the two agree. Loading is strict: an unknown section or key, a wrong
type or an out-of-range value raises :class:`ConfigError` whose message names
the file, the key, the value and what was expected; the CLI prints that one
line and exits 2.

Units are part of the key names (``_s`` seconds, ``_bytes`` bytes).
Keys marked ``runtime`` are re-read on SIGHUP; all others are fixed for the
life of the process.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import tomllib
from typing import Any

from crawlerd.config_schema import PLACEHOLDER_CONTACT, RETIRED, SCHEMA, GiB, Key


class ConfigError(Exception):
    """A bad config file or override; the message is one line and names the key."""


class Section:
    """Attribute access to one section's values (``cfg.fetch.timeout_s``)."""

    __slots__ = ("_name", "_values")

    def __init__(self, name: str, values: dict[str, Any]):
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_values", values)

    def __getattr__(self, key: str) -> Any:
        try:
            return self._values[key]
        except KeyError:
            raise AttributeError(f"config section [{self._name}] has no key {key!r}") from None

    def __setattr__(self, key, value):  # pragma: no cover - guard
        raise AttributeError("config is read-only")

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)


class Config:
    """A validated configuration: ``cfg.<section>.<key>``."""

    def __init__(self, values: dict[str, dict[str, Any]], source: str = "<defaults>"):
        self._values = values
        self.source = source
        for name, vals in values.items():
            setattr(self, name, Section(name, vals))

    def as_dict(self) -> dict[str, dict[str, Any]]:
        return {s: dict(v) for s, v in self._values.items()}

    # derived paths -------------------------------------------------------
    @property
    def control_socket(self) -> str:
        return self.control.socket or os.path.join(self.crawl.data_dir, "control.sock")

    def path(self, *parts: str) -> str:
        return os.path.join(self.crawl.data_dir, *parts)

    def contact_is_placeholder(self) -> bool:
        return PLACEHOLDER_CONTACT in self.crawl.user_agent

    def contact_problem(self) -> str | None:
        """Why ``crawl.user_agent`` cannot be sent on a real crawl, or None.

        Webmasters must be able to reach the operator: the agent has to carry a
        URL (``+https://...``) or an e-mail address, and not the shipped placeholder.
        """
        ua = self.crawl.user_agent
        if PLACEHOLDER_CONTACT in ua:
            return (f"crawl.user_agent still has the placeholder operator contact ({PLACEHOLDER_CONTACT}); "
                    "set a real contact before crawling")
        if not _CONTACT.search(ua):
            return (f"crawl.user_agent = {ua!r}: expected an operator contact in it, a URL (+https://...) "
                    "or an e-mail address")
        return None


def defaults() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for section, (_doc, keys) in SCHEMA.items():
        out[section] = {k.name: _copy(k.default) for k in keys}
    return out


def _copy(v):
    if isinstance(v, list):
        return list(v)
    if isinstance(v, dict):
        return dict(v)
    return v


def _type_name(t) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
             list: "a list", dict: "a table"}
    return names.get(t, t.__name__)


def _bound(key: Key, v: float) -> str:
    return str(int(v)) if key.type is int else f"{v:g}"


def _check(key: Key, where: str, value: Any) -> Any:
    """Return the value coerced to the key's type, or raise ConfigError naming the key."""
    def bad(expected: str):
        raise ConfigError(f"{where}: {key.name} = {value!r}: expected {expected}")

    t = key.type
    if t is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            bad(_type_name(float))
        value = float(value)
        if not math.isfinite(value):        # nan compares false with every bound: refuse it first
            bad("a finite number")
    elif t is int:
        if isinstance(value, bool) or not isinstance(value, int):
            bad(_type_name(int))
    elif t is bool:
        if not isinstance(value, bool):
            bad(_type_name(bool))
    elif t is str:
        if not isinstance(value, str):
            bad(_type_name(str))
    elif t is list:
        if not isinstance(value, list):
            bad(f"a list of {_type_name(key.item_type)}s" if key.item_type else "a list")
        if key.item_type and not all(isinstance(x, key.item_type) for x in value):
            bad(f"a list of {_type_name(key.item_type).split(' ', 1)[1]}s")
        value = list(value)
    elif t is dict:
        if not isinstance(value, dict):
            bad("a table")
        if key.item_type and not all(isinstance(x, key.item_type) for x in value.values()):
            bad(f"a table of {_type_name(key.item_type).split(' ', 1)[1]}s")
        value = dict(value)
    if key.min is not None and value < key.min:
        bad(f"a value >= {_bound(key, key.min)}")
    if key.max is not None and value > key.max:
        bad(f"a value <= {_bound(key, key.max)}")
    if key.choices is not None and value not in key.choices:
        bad("one of " + ", ".join(key.choices))
    _check_special(key, where, value)
    return value


_TOKEN = re.compile(r"[A-Za-z_-]+")              # RFC 9309 §2.2.1 product token
_FILE_WORD = re.compile(r"[A-Za-z0-9._-]+")
_PRINTABLE = re.compile(r"[\x20-\x7e]*")          # an HTTP header value we send as is
_CONTACT = re.compile(r"https?://[^\s/()<>;]+|[^\s@()<>;:]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*")
UNIX_SOCKET_MAX_BYTES = 107                      # sun_path is 108 bytes with its NUL (Linux)


def _check_special(key: Key, where: str, value: Any) -> None:
    name = f"{where}: {key.name} = {value!r}"
    if key.name == "user_agent":
        if not value.strip() or not _PRINTABLE.fullmatch(value):
            raise ConfigError(f"{name}: expected printable ASCII text (it is sent as the User-Agent header)")
    elif key.name == "agent_token":
        if not _TOKEN.fullmatch(value):
            raise ConfigError(f"{name}: expected a product token of letters, '_' and '-' (RFC 9309 §2.2.1)")
    elif key.name == "data_dir":
        if not value.strip() or "\0" in value:
            raise ConfigError(f"{name}: expected a directory path")
    elif key.name == "prefix":
        if not _FILE_WORD.fullmatch(value):
            raise ConfigError(f"{name}: expected a file name part of letters, digits, '.', '_' and '-'")
    elif key.name == "socket":
        if "\0" in value or len(os.fsencode(value)) > UNIX_SOCKET_MAX_BYTES:
            raise ConfigError(f"{name}: expected a path of at most {UNIX_SOCKET_MAX_BYTES} bytes "
                              "(the limit of a Unix socket address)")
    elif key.name == "urls":
        for u in value:
            if not u.startswith(("http://", "https://")):
                raise ConfigError(f"{name}: {u!r} is not an http(s) URL")
    elif key.name == "allow":
        for net in value:
            try:
                ipaddress.ip_network(net, strict=False)
            except ValueError:
                raise ConfigError(f"{name}: {net!r} is not a network in CIDR form (e.g. \"127.0.0.0/8\")") from None
    elif key.name == "nameservers":
        for ns in value:
            host, _, port = ns.rpartition(":") if ns.count(":") == 1 else (ns, "", "")
            try:
                ipaddress.ip_address(host or ns)
                if port and not (0 < int(port) < 65536):
                    raise ValueError
            except ValueError:
                raise ConfigError(f"{name}: {ns!r} is not \"IP\" or \"IP:PORT\"") from None
    elif key.name == "host_concurrency":
        for host, n in value.items():
            if "://" not in host or not 1 <= n <= 255:
                raise ConfigError(f"{name}: {host!r} = {n!r}: expected \"scheme://host[:port]\" = 1..255")
    elif key.name == "ca_file" and value:
        if not os.path.isfile(value) or not os.access(value, os.R_OK):
            raise ConfigError(f"{name}: not a readable file (expected a PEM file of CA certificates)")
    elif key.name == "servers":
        for u in value:
            rest = u.split("://", 1)[1] if u.startswith(("nats://", "tls://")) else ""
            host, _, port = rest.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError(f"{name}: {u!r} is not \"nats://HOST:PORT\"")
    elif key.name == "own" and value:
        parse_shard_set(value, where=f"{where}: {key.name}")
    elif key.name == "crawl" and not re.match(r"^[A-Za-z0-9_-]{1,64}$", value):
        raise ConfigError(f"{name}: use 1-64 letters, digits, '_' or '-'")
    elif key.name == "listen" and value:
        try:
            parse_listen(value)
        except ValueError as e:
            raise ConfigError(f"{name}: {e}") from None
    elif key.name == "static_hosts":
        for host, ip in value.items():
            try:
                ipaddress.ip_address(ip)
            except ValueError:
                raise ConfigError(f"{name}: {host!r} maps to {ip!r}, which is not an IP address") from None


def parse_shard_set(text: str, n: int | None = None, where: str = "cluster.own") -> list[int]:
    """``"0-3"``, ``"0,2,4"``, ``"1-2,5"`` -> sorted shard indexes (each < ``n`` when given)."""
    out: set[int] = set()
    for part in text.replace(" ", "").split(","):
        m = re.match(r"^(\d+)(?:-(\d+))?$", part)
        if not m or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
            raise ConfigError(f"{where}: {part!r} in {text!r}: expected I or I-J (e.g. \"0-3\" or \"0,2,4\")")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if n is not None and hi >= n:
            raise ConfigError(f"{where}: shard {hi} in {text!r}: crawl.shards is {n} (shards 0-{n - 1})")
        out.update(range(lo, hi + 1))
    return sorted(out)


def parse_listen(text: str) -> tuple[str, int]:
    """``"IP:PORT"`` or ``"[IPv6]:PORT"`` -> (ip, port); ValueError naming the expected form otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep:
        raise ValueError('expected "IP:PORT" (e.g. "127.0.0.1:9464" or "[::1]:9464")')
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f'an IPv6 address goes in brackets: "[{host}]:{port}"')
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f'{host!r} is not an IP address (expected "IP:PORT", e.g. "127.0.0.1:9464")') from None
    if not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"port {port!r} is not 0..65535")
    return str(ip), int(port)


_KEYS = {section: {k.name: k for k in keys} for section, (_d, keys) in SCHEMA.items()}


def _apply(values: dict, data: dict, source: str) -> None:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a table of sections")
    for section, table in data.items():
        if section not in _KEYS:
            raise ConfigError(f"{source}: unknown section [{section}]: expected one of "
                              + ", ".join(_KEYS))
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: [{section}] must be a table, got {table!r}")
        for key, value in table.items():
            spec = _KEYS[section].get(key)
            if spec is None and (section, key) in RETIRED:
                raise ConfigError(f"{source}: {section}.{key} is no longer a key: {RETIRED[section, key]}")
            if spec is None:
                raise ConfigError(f"{source}: unknown key {section}.{key}: [{section}] has "
                                  + ", ".join(_KEYS[section]))
            values[section][key] = _check(spec, f"{source}: {section}", value)


def parse_override(text: str) -> tuple[str, str, Any]:
    """Parse ``section.key=VALUE`` (VALUE as TOML, else a plain string)."""
    if "=" not in text:
        raise ConfigError(f"-s {text!r}: expected section.key=VALUE")
    dotted, raw = text.split("=", 1)
    dotted = dotted.strip()
    if dotted.count(".") != 1:
        raise ConfigError(f"-s {text!r}: expected section.key=VALUE (e.g. fetch.timeout_s=30)")
    section, key = dotted.split(".")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return section, key, value


def load(path: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Load defaults, then the TOML file (if any), then ``-s`` overrides; validate all."""
    values = defaults()
    source = "<defaults>"
    if path:
        source = path
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError(f"{path}: config file not found") from None
        except OSError as e:
            raise ConfigError(f"{path}: cannot read config file: {e.strerror}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: not valid TOML: {e}") from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"{path}: not valid TOML: not UTF-8 at byte {e.start}") from None
        _apply(values, data, path)
    for text in overrides:
        section, key, value = parse_override(text)
        _apply(values, {section: {key: value}}, "-s")
    cross = values["politeness"]
    if cross["min_delay_s"] > cross["max_delay_s"]:
        raise ConfigError(f"{source}: politeness.min_delay_s = {cross['min_delay_s']!r}: expected a value "
                          f"<= politeness.max_delay_s ({cross['max_delay_s']!r})")
    b = values["budgets"]
    if b["max_budget"] < b["base_budget"]:
        raise ConfigError(f"{source}: budgets.max_budget = {b['max_budget']!r}: expected a value >= "
                          f"budgets.base_budget ({b['base_budget']!r})")
    if b["max_spread"] & (b["max_spread"] - 1):
        raise ConfigError(f"{source}: budgets.max_spread = {b['max_spread']!r}: expected a power of two")
    r = values["recrawl"]
    if not r["min_interval_s"] <= r["initial_interval_s"] <= r["max_interval_s"]:
        raise ConfigError(f"{source}: recrawl.initial_interval_s = {r['initial_interval_s']!r}: expected "
                          f"min_interval_s ({r['min_interval_s']!r}) <= it <= max_interval_s ({r['max_interval_s']!r})")
    n = values["politeness"]["shared_ip_slots"]
    if n & (n - 1):
        raise ConfigError(f"{source}: politeness.shared_ip_slots = {n!r}: expected a power of two")
    c = values["cluster"]
    if not c["lease_renew_interval_s"] < c["lease_fence_s"] < c["lease_ttl_s"]:
        raise ConfigError(f"{source}: cluster.lease_fence_s = {c['lease_fence_s']!r}: expected "
                          f"lease_renew_interval_s ({c['lease_renew_interval_s']!r}) < it < lease_ttl_s "
                          f"({c['lease_ttl_s']!r})")
    if c["own"] and not c["servers"]:
        raise ConfigError(f"{source}: cluster.own = {c['own']!r}: only a node of a cluster owns a share of the "
                          "shards; name the NATS servers too (cluster.servers, --cluster)")
    if c["own"] and values["crawl"]["shards"] >= 1:
        parse_shard_set(c["own"], values["crawl"]["shards"])
    f = values["fetch"]
    if f["connect_timeout_s"] > f["timeout_s"]:
        raise ConfigError(f"{source}: fetch.connect_timeout_s = {f['connect_timeout_s']!r}: expected a value "
                          f"<= fetch.timeout_s ({f['timeout_s']!r})")
    if cross["backoff_base_s"] > cross["backoff_max_s"]:
        raise ConfigError(f"{source}: politeness.backoff_base_s = {cross['backoff_base_s']!r}: expected a value "
                          f"<= politeness.backoff_max_s ({cross['backoff_max_s']!r})")
    if r["priority"] >= values["frontier"]["priority_levels"]:
        raise ConfigError(f"{source}: recrawl.priority = {r['priority']!r}: expected a value < "
                          f"frontier.priority_levels ({values['frontier']['priority_levels']!r})")
    d = values["dns"]
    if d["min_ttl_s"] > d["max_ttl_s"]:
        raise ConfigError(f"{source}: dns.min_ttl_s = {d['min_ttl_s']!r}: expected a value <= dns.max_ttl_s")
    return Config(values, source)


# -- limits of this machine, checked when a crawl starts --------------------------------

# The content-dedup LMDB maps (exact digests, near-duplicate index) are not configurable: 64 GiB each.
FIXED_MAP_BYTES = 2 * 64 * GiB


def map_size_keys(cfg: Config) -> list[tuple[str, int]]:
    """Every configured LMDB map size the crawl opens, as (dotted key, bytes)."""
    keys = [("frontier.map_size_bytes", cfg.frontier.map_size_bytes),
            ("recrawl.map_size_bytes", cfg.recrawl.map_size_bytes)]
    if cfg.budgets.enabled:
        keys.append(("budgets.map_size_bytes", cfg.budgets.map_size_bytes))
    return keys


def check_map_sizes(cfg: Config) -> None:
    """Raise ConfigError when the LMDB maps do not fit in the address space this process may map.

    An LMDB environment maps its whole ``map_size`` at open, so all maps together must fit
    under RLIMIT_AS and the kernel's user address space. The second is probed by reserving
    the total as one inaccessible, unbacked mapping (no memory is committed).
    """
    import mmap
    import resource
    keys = map_size_keys(cfg)
    total = sum(n for _k, n in keys) + FIXED_MAP_BYTES
    name, biggest = max(keys, key=lambda kv: kv[1])
    head = f"{cfg.source}: {name} = {biggest}: the LMDB maps need {total} bytes of address space in all"
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY and total > soft:
        raise ConfigError(f"{head}, more than the RLIMIT_AS of {soft} bytes; lower the map sizes")
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0x4000)
    try:
        mmap.mmap(-1, total, flags=flags, prot=0).close()
    except (OSError, OverflowError, ValueError):
        raise ConfigError(f"{head}, more than this machine lets a process map; lower the map sizes") from None


# -- the shipped config.toml ------------------------------------------------

def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_value(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def _wrap(text: str, width: int = 88) -> list[str]:
    words, lines, cur = text.split(), [], ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > width:
            lines.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}" if cur else w
    if cur:
        lines.append(cur)
    return lines


def render_toml() -> str:
    """The documented config file: every key with its default, unit and meaning."""
    out = ["# crawlerd configuration. Every key is listed with its default value.",
           "# Units are in the key names: _s = seconds, _bytes = bytes.",
           "# Keys marked (runtime) are re-read on SIGHUP / `systemctl reload crawlerd`;",
           "# all others are fixed when the daemon starts.",
           "# Generated by `crawlerd config dump`; a test checks it matches the code.", ""]
    for section, (doc, keys) in SCHEMA.items():
        out.append(f"# {doc}")
        out.append(f"[{section}]")
        for k in keys:
            text = k.doc + (" (runtime)" if k.runtime else "")
            if k.min is not None or k.max is not None:
                lo = "" if k.min is None else _bound(k, k.min)
                hi = "" if k.max is None else _bound(k, k.max)
                text += f" Range: [{lo}, {hi}]."
            out.extend("# " + line for line in _wrap(text))
            out.append(f"{k.name} = {_toml_value(k.default)}")
        out.append("")
    return "\n".join(out)
