"""The operator's view of a real crawl, run inside a private network namespace by test_operator_view.py.

Runs `crawlerd demo` (the bundled synthetic web, crawled by the real daemon) with the metrics
endpoint on; while it crawls, runs `crawlerd top` on a pseudo-terminal until it has drawn three
frames, then presses q, and scrapes /metrics twice; then `crawlerd stop` (the demo's --seconds is
only an upper bound, so a slow machine cannot end the crawl before the checks ran), and opens the
report the demo wrote in headless Chromium. Writes everything the test judges as JSON.
"""

import json
import os
import re
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from tests.pty_terminal import Terminal  # noqa: E402
from tests.report import browser  # noqa: E402

METRICS = "http://127.0.0.1:9464/metrics"       # this namespace's own loopback


def crawlerd(*args: str) -> list[str]:
    return [sys.executable, "-m", "crawlerd", *args]


def status(data_dir: str) -> dict | None:
    r = subprocess.run(crawlerd("status", "--json", "--data-dir", data_dir), capture_output=True, text=True)
    return json.loads(r.stdout) if r.returncode == 0 else None


def main() -> int:
    out_path, data_dir, max_seconds, hosts = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    shot = os.path.join(os.path.dirname(out_path), "report.png")
    demo = subprocess.Popen(crawlerd("demo", "--seconds", max_seconds, "--hosts", hosts, "--data-dir", data_dir,
                                     "-s", 'metrics.listen="127.0.0.1:9464"'),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    result: dict = {"scrapes": [], "during": None}
    deadline = time.monotonic() + float(max_seconds)
    while time.monotonic() < deadline and demo.poll() is None:
        st = status(data_dir)
        if st and st["pages"] >= 20:
            result["during"] = st
            break
        time.sleep(0.3)
    if result["during"] is not None:
        term = Terminal(["top", "--data-dir", data_dir])
        try:
            term.read_until(lambda t: t.text().count("q quit") >= 3)
            result["top_screen"] = re.sub(r" {3,}", "  ", term.text())[-20000:]
            term.send(b"q")
            result["top_rc"] = term.wait()
        finally:
            term.close()
        for _ in range(2):
            with urllib.request.urlopen(METRICS, timeout=10) as r:
                result["scrapes"].append(r.read().decode())
            time.sleep(1.5)
    result["stop"] = subprocess.run(crawlerd("stop", "--data-dir", data_dir), capture_output=True,
                                    text=True).stdout.strip()
    stdout, stderr = demo.communicate(timeout=float(max_seconds) + 180)
    result.update(demo_rc=demo.returncode, demo_stdout=stdout[-6000:], demo_stderr=stderr[-6000:])
    m = re.search(r"^report\s+(\S+)$", stdout, re.M)
    result["report"] = m.group(1) if m else None
    if result["report"]:
        result["browser"] = browser.render(result["report"], shot)
        with open(result["report"], encoding="utf-8") as f:
            result["report_html"] = f.read()
    with open(os.path.join(data_dir, "last-run.json")) as f:
        result["last_run"] = json.load(f)
    with open(out_path, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
