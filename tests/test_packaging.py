"""A regular (non-editable) install ships every package under crawlerd/."""

from __future__ import annotations

import pathlib
import tomllib

from setuptools import find_packages

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_every_package_dir_is_installed():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "packages" not in cfg or isinstance(cfg["packages"], dict), "an explicit list goes stale"
    found = set(find_packages(str(ROOT), **cfg["packages"]["find"]))
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "crawlerd").rglob("__init__.py")}
    assert on_disk - found == set()
    assert found <= on_disk
