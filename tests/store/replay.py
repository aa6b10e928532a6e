"""Helpers to replay our segments with pywb (in its own venv, see the Makefile's ``pywb`` target)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from datetime import UTC, datetime
from email.utils import format_datetime

import pytest

from tests.conftest import ROOT

PYWB_PYTHON = os.path.join(ROOT, ".venv-pywb", "bin", "python")
SCRIPT = os.path.join(os.path.dirname(__file__), "pywb_replay.py")


def need_pywb() -> None:
    if not os.path.exists(PYWB_PYTHON):
        pytest.skip("pywb's venv is missing: `make pywb` (part of `make test`) creates .venv-pywb")


def collection(root: str, segments: list[str], index_files: list[str]) -> str:
    """A pywb collection ``c`` under ``root`` with our segments and our CDXJ files (not pywb's)."""
    archive = os.path.join(root, "collections", "c", "archive")
    indexes = os.path.join(root, "collections", "c", "indexes")
    os.makedirs(archive, exist_ok=True)
    os.makedirs(indexes, exist_ok=True)
    for seg in segments:
        shutil.copy(seg, archive)
    for idx in index_files:
        shutil.copy(idx, indexes)
    return root


def replay(root: str, requests: list[tuple[str, str]]) -> list[dict]:
    """pywb's answers (status, memento datetime, body) for (timestamp14, url) requests."""
    need_pywb()
    out = subprocess.run([PYWB_PYTHON, SCRIPT, root], input=json.dumps(requests), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    answers = json.loads(out.stdout)
    for a in answers:
        a["body"] = base64.b64decode(a.pop("body_b64"))
    return answers


def http_date(warc_date: str) -> str:
    """The Memento-Datetime pywb sends for a capture's WARC-Date (whole seconds)."""
    d = datetime.strptime(warc_date[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    return format_datetime(d, usegmt=True)
