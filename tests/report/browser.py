"""Open an HTML file in headless Chromium and report what the page did, over the DevTools protocol.

Run it only inside a private network namespace (tests/e2e/netns.py): the browser then cannot reach
anything but loopback, and the DevTools socket is on that loopback. Usage as a script:
``python browser.py PAGE.html OUT.json [SCREENSHOT.png]``.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
         "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", "--remote-allow-origins=*",
         "--hide-scrollbars", "--window-size=1280,900"]

# what each chart looks like once drawn: its box and how many shapes and labels it holds
CHARTS_JS = """JSON.stringify([...document.querySelectorAll('svg.chart')].map(s => {
  const r = s.getBoundingClientRect();
  return {name: s.getAttribute('aria-label'), width: r.width, height: r.height,
          shapes: s.querySelectorAll('path, rect, line, polyline, polygon, use').length,
          texts: s.querySelectorAll('text').length, empty: s.textContent.includes('in the event logs')};
}))"""


class DevTools:
    """One page target: send commands, collect the events that arrive meanwhile."""

    def __init__(self, ws):
        self.ws = ws
        self.next_id = 0
        self.events: list[dict] = []

    def call(self, method: str, timeout_s: float = 30.0, **params) -> dict:
        self.next_id += 1
        mid = self.next_id
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params}))
        deadline = time.monotonic() + timeout_s
        while True:
            msg = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if msg.get("id") == mid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def wait_event(self, method: str, timeout_s: float = 30.0) -> dict:
        for ev in self.events:
            if ev.get("method") == method:
                return ev
        deadline = time.monotonic() + timeout_s
        while True:
            msg = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            self.events.append(msg)
            if msg.get("method") == method:
                return msg


def _devtools_port(profile: str, proc: subprocess.Popen, timeout_s: float = 30.0) -> int:
    path = os.path.join(profile, "DevToolsActivePort")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"chromium exited with {proc.returncode}")
        try:
            with open(path) as f:
                first = f.readline().strip()
            if first:
                return int(first)
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(0.1)
    raise RuntimeError("chromium never opened its DevTools port")


def _inspect(dt: DevTools, page: str, screenshot: str | None) -> dict:
    for domain in ("Page", "Runtime", "Log", "Network"):
        dt.call(f"{domain}.enable")
    url = "file://" + os.path.abspath(page)
    dt.call("Page.navigate", url=url)
    dt.wait_event("Page.loadEventFired")
    charts = json.loads(dt.call("Runtime.evaluate", expression=CHARTS_JS, returnByValue=True)["result"]["value"])
    title = dt.call("Runtime.evaluate", expression="document.title", returnByValue=True)["result"]["value"]
    if screenshot:
        size = dt.call("Page.getLayoutMetrics")["cssContentSize"]
        shot = dt.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                       clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1})
        with open(screenshot, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
    ev = dt.events
    out = {
        "url": url, "title": title, "charts": charts,
        "console": [e["params"] for e in ev if e.get("method") == "Runtime.consoleAPICalled"],
        "exceptions": [e["params"] for e in ev if e.get("method") == "Runtime.exceptionThrown"],
        "log_errors": [e["params"]["entry"] for e in ev if e.get("method") == "Log.entryAdded"
                       and e["params"]["entry"].get("level") == "error"],
        "requests": [e["params"]["request"]["url"] for e in ev if e.get("method") == "Network.requestWillBeSent"],
    }
    try:
        dt.call("Browser.close", timeout_s=5)
    except Exception:       # the browser may hang up before answering
        pass
    return out


def render(page: str, screenshot: str | None = None) -> dict:
    """Load ``page``; return console errors, exceptions, every URL requested, and each chart's box."""
    from websockets.sync.client import connect
    profile = tempfile.mkdtemp(prefix="crawlerd-chromium-")
    proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port = _devtools_port(profile, proc)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:   # loopback
            target = next(t for t in json.load(r) if t["type"] == "page")
        with connect(target["webSocketDebuggerUrl"], max_size=None, proxy=None, open_timeout=20) as ws:
            return _inspect(DevTools(ws), page, screenshot)
    finally:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    result = render(sys.argv[1], sys.argv[3] if len(sys.argv) > 3 else None)
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)
