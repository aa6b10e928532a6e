import os
import shutil
import subprocess

import pytest

from tests.conftest import ROOT

UNIT = os.path.join(ROOT, "systemd", "crawlerd.service")


def _directives():
    out = {}
    for line in open(UNIT):
        line = line.strip()
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            out.setdefault(k, []).append(v)
    return out


def test_unit_has_required_directives():
    d = _directives()
    assert d["Type"] == ["notify"]
    assert "--config /etc/crawlerd/config.toml" in d["ExecStart"][0]
    assert d["Restart"] == ["on-failure"]
    assert d["RestartPreventExitStatus"] == ["2"]       # cannot start (exit 2): no restart loop
    assert int(d["LimitNOFILE"][0]) >= 65536
    assert d["StateDirectory"] == ["crawlerd"]
    for k, v in [("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"), ("ProtectHome", "yes"),
                 ("PrivateTmp", "yes")]:
        assert d[k] == [v]
    assert "ExecReload" in d


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify(tmp_path):
    exe = shutil.which("crawlerd") or os.path.join(os.path.dirname(os.sys.executable), "crawlerd")
    unit = tmp_path / "crawlerd.service"
    # verify needs ExecStart to point at an executable that exists on this machine
    unit.write_text(open(UNIT).read().replace("/usr/local/bin/crawlerd", exe))
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    problems = [ln for ln in (r.stdout + r.stderr).splitlines()
                if "crawlerd.service" in ln and "Failed to resolve user" not in ln
                and "not found" not in ln.lower()]
    assert r.returncode == 0 or not problems, r.stdout + r.stderr
    assert not problems, "\n".join(problems)
