"""The config loader: any file or -s override is loaded or refused with one ConfigError line."""

from __future__ import annotations

import math
import os
import tempfile

from hypothesis import example, given
from hypothesis import strategies as st

from crawlerd import config, config_schema
from tests.fuzz.conftest import budget

KEYS = [(s, k.name) for s, (_d, keys) in config_schema.SCHEMA.items() for k in keys]
_SCALAR = st.one_of(st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=True, allow_infinity=True),
                    st.booleans(), st.text(max_size=20),
                    st.sampled_from(["nan", "inf", "-inf", "1e309", "0", "-0.0", "\"\"", "[]", "{}"]))
_VALUE = st.one_of(_SCALAR, st.lists(_SCALAR, max_size=3), st.dictionaries(st.text(max_size=8), _SCALAR, max_size=3))


def _toml(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return '"' + v.encode("unicode_escape").decode("ascii").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return "{" + ", ".join(f"{_toml(k)} = {_toml(x)}" for k, x in v.items()) + "}"


def _assert_one_line_error(fn):
    try:
        return fn()
    except config.ConfigError as e:
        assert "\n" not in str(e) and str(e)
        return None


@budget()
@given(st.lists(st.tuples(st.sampled_from(KEYS), _VALUE), max_size=6))
def test_schema_keys_with_any_value(pairs):
    by_section: dict[str, dict[str, object]] = {}
    for (section, key), value in pairs:
        by_section.setdefault(section, {})[key] = value
    text = "".join(f"[{s}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in kv.items()) for s, kv in by_section.items())
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "c.toml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        cfg = _assert_one_line_error(lambda: config.load(path))
    if cfg is not None:
        for section, kv in by_section.items():
            for key in kv:
                v = getattr(getattr(cfg, section), key)
                assert not (isinstance(v, float) and not math.isfinite(v)), (section, key, v)


@budget()
@given(st.one_of(st.text(max_size=200).map(str.encode), st.binary(max_size=200)))
@example(b'[crawl]\nuser_agent = "\xff\xfe"\n')          # not UTF-8: was a UnicodeDecodeError traceback
def test_any_file_bytes(data):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "c.toml")
        with open(path, "wb") as f:
            f.write(data)
        _assert_one_line_error(lambda: config.load(path))


@budget()
@given(st.lists(st.one_of(st.text(max_size=40),
                          st.builds(lambda k, v: f"{k[0]}.{k[1]}={_toml(v)}", st.sampled_from(KEYS), _VALUE)),
                max_size=4))
def test_any_overrides(overrides):
    _assert_one_line_error(lambda: config.load(None, overrides))
