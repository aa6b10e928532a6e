"""Running an end-to-end driver inside a private network namespace (only `lo`, nothing else reachable)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest


def can_unshare() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        return False
    return subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0


# every end-to-end module marks itself with these
NETNS_MARKS = [pytest.mark.netns, pytest.mark.skipif(not can_unshare(), reason="needs root and unshare -n")]


def run_driver(driver: str, out: str, *args: str, timeout: float = 300, mounts: bool = False) -> dict:
    """Run ``python driver out args...`` in a fresh network namespace; return the JSON it wrote to ``out``.

    ``mounts``: in a private mount namespace too, so the driver may mount (a small tmpfs, a
    read-only bind) without touching the machine's mounts."""
    ns = ["unshare", "-n", "-m", "--propagation", "private"] if mounts else ["unshare", "-n"]
    cmd = [*ns, "sh", "-c", 'ip link set lo up && exec "$@"', "sh", sys.executable, driver, out, *args]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    # output to files, not pipes: a process the driver left behind (a server it restarted, a child
    # it stopped) would hold a pipe open and keep the run waiting after the driver has exited
    with tempfile.TemporaryFile() as so, tempfile.TemporaryFile() as se:
        rc = subprocess.run(cmd, stdout=so, stderr=se, timeout=timeout, env=env).returncode
        so.seek(0)
        se.seek(0)
        stdout, stderr = so.read().decode(errors="replace"), se.read().decode(errors="replace")
    assert rc == 0, stdout[-3000:] + stderr[-3000:]
    with open(out) as f:
        return json.load(f)
