"""A real `crawlerd run` with no seeds (so it fetches nothing), for tests of the operator's view."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time

UA = "crawlerd-test/0.1 (operator: test@localhost)"


def crawlerd(*args: str) -> list[str]:
    return [sys.executable, "-m", "crawlerd", *args]


@contextlib.contextmanager
def idle_daemon(data_dir: str, *extra: str, timeout_s: float = 30.0):
    """Run the daemon until the block ends; yields its first ``status --json`` answer."""
    proc = subprocess.Popen(crawlerd("run", "--data-dir", data_dir, "--duration", "120", "-s", f"crawl.user_agent={UA}",
                                     *extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            r = subprocess.run(crawlerd("status", "--json", "--data-dir", data_dir), capture_output=True, text=True)
            if r.returncode == 0:
                break
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the daemon never answered status"
            time.sleep(0.2)
        yield json.loads(r.stdout)
    finally:
        if proc.poll() is None:
            subprocess.run(crawlerd("stop", "--data-dir", data_dir), capture_output=True)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == 0


def socket_of(data_dir: str) -> str:
    return os.path.join(data_dir, "control.sock")
