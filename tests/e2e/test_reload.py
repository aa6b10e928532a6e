"""SIGHUP reloads the runtime keys of the config file while the daemon crawls simweb.

ARCHITECTURE.md invariant 2: the operator blocklist wins over everything and takes effect at once; "Process family": SIGHUP
re-reads runtime config; a bad file keeps the old values. The module is also the driver: run as a
script (inside `unshare -n`, by the fixture) it starts simweb and `crawlerd run --config FILE`,
rewrites FILE and sends SIGHUP at chosen moments, and writes what happened as JSON:

A. ``sitemap``: as soon as simweb answered robots.txt of a host that announces sitemaps (the
   crawler reads them next, within that robots lease), FILE blocks that host.
B. ``block``: once h3.sim pages are being fetched, FILE blocks h3.sim too, and ``H5.Sim.`` (a
   host name written the way an operator might: upper case, trailing dot).
C. ``same``: SIGHUP again with FILE unchanged (as logrotate or a config manager would do).
D. ``cli``: ``crawlerd block add h9.sim`` at runtime, then SIGHUP with FILE unchanged.
E-G. ``syntax``, ``invalid``, ``missing``: FILE broken three ways; each SIGHUP must log one error
   line and change nothing.
H. ``restore``: FILE valid again with ``hosts = []``.

Then ``crawlerd stop``. A reload counts as *acknowledged* when its log line
(``config reloaded`` / ``reload failed``) appeared in the daemon's stderr.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.e2e.netns import NETNS_MARKS, run_driver

HOSTS, SEED = 30, 7
TOLERANCE_S = 0.25        # a transfer handed to curl just before the reload may reach the server a moment after
WAIT_S = 30.0             # bound on every wait in the driver
# A's SIGHUP must land between a host's robots.txt and its first sitemap request, which the crawler
# sends one politeness gap later: on a loaded 2-core box the signal has been seen ~4 s late.
MIN_DELAY_S = 8.0
UA = "crawlerd-test/0.1 (+e2e reload; operator: test@localhost)"


# == driver (runs inside the network namespace) =============================================
def _crawlerd(*args: str) -> list[str]:
    return [sys.executable, "-m", "crawlerd", *args]


def _toml_str(s: str) -> str:
    return json.dumps(s)        # a JSON string is a valid TOML basic string


class Daemon:
    def __init__(self, base: str, sim):
        self.base = base
        self.sim = sim
        self.data_dir = os.path.join(base, "data")
        self.config = os.path.join(base, "crawlerd.toml")
        self.err_path = os.path.join(base, "stderr.txt")
        self.reloads: list[dict] = []
        self.proc: subprocess.Popen | None = None

    def write_config(self, hosts: list[str]) -> None:
        table = ", ".join(f"{_toml_str(h)} = {_toml_str(ip)}" for h, ip in self.sim.static_hosts.items())
        text = (f"[crawl]\ndata_dir = {_toml_str(self.data_dir)}\nuser_agent = {_toml_str(UA)}\n\n"
                f"[network]\nallow = [\"127.0.0.0/8\"]\n\n[dns]\nstatic_hosts = {{{table}}}\n\n"
                f"[fetch]\nshutdown_grace_s = 2.0\n\n[politeness]\nmin_delay_s = {MIN_DELAY_S}\n\n"
                f"[blocklist]\nhosts = [{', '.join(_toml_str(h) for h in hosts)}]\n")
        self.replace_text(text)

    def replace_text(self, text: str) -> None:
        tmp = self.config + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, self.config)

    def start(self, seeds: str) -> None:
        self.err = open(self.err_path, "w")
        self.proc = subprocess.Popen(_crawlerd("run", "--config", self.config, "--seeds", seeds,
                                               "--duration", "120"),
                                     stdout=subprocess.DEVNULL, stderr=self.err)

    def log(self) -> str:
        with open(self.err_path) as f:
            return f.read()

    def ask(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(_crawlerd(*args, "--data-dir", self.data_dir), capture_output=True, text=True,
                              timeout=30)

    def wait_ready(self) -> bool:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and self.proc.poll() is None:
            if self.ask("status", "--json").returncode == 0:
                return True
            time.sleep(0.1)
        return False

    def blocked(self) -> list[str] | None:
        r = self.ask("block", "list")
        return r.stdout.split() if r.returncode == 0 else None

    def hup(self, name: str) -> dict:
        """SIGHUP; wait until the reload's log line appears; record both times and the block list."""
        marks = ("config reloaded", "reload failed")
        before = sum(self.log().count(m) for m in marks)
        rec = {"name": name, "t_hup": time.monotonic()}
        self.proc.send_signal(signal.SIGHUP)
        deadline = rec["t_hup"] + WAIT_S
        while time.monotonic() < deadline and self.proc.poll() is None:
            if sum(self.log().count(m) for m in marks) > before:
                rec["t_ack"] = time.monotonic()
                break
            time.sleep(0.02)
        rec["alive"] = self.proc.poll() is None
        st = self.ask("status", "--json")
        rec["state"] = json.loads(st.stdout)["state"] if st.returncode == 0 else None
        rec["blocked"] = self.blocked()
        self.reloads.append(rec)
        return rec


def _wait_ledger(sim, pred, since: int = 0) -> int | None:
    """Poll simweb's ledger until an entry matches ``pred``; return its seq (None on timeout)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for e in sim.ledger(since):
            if pred(e):
                return e.seq
        time.sleep(0.05)
    return None


def drive(out_path: str, base: str) -> int:
    from crawlerd.simweb import SimWebProcess
    with SimWebProcess(hosts=HOSTS, seed=SEED, bind="0.0.0.0") as sim:
        site = sim.site()
        sitemap_host = sorted((h for h, d in site["hosts"].items() if d["robots"]["variant"] == "allow_all"),
                              key=lambda h: int(h[1:].split(".")[0]))[0]
        seeds = os.path.join(base, "seeds.txt")
        with open(seeds, "w") as f:
            f.write("\n".join(sim.seeds) + "\n")
        d = Daemon(base, sim)
        d.write_config([])
        d.start(seeds)
        try:
            report = _exercise(d, sim, site, sitemap_host)
        finally:
            if d.proc.poll() is None:       # a driver failure must not leave a daemon crawling
                d.proc.kill()
                d.proc.wait()
    with open(out_path, "w") as f:
        json.dump(report, f)
    return 0


def _exercise(d: Daemon, sim, site: dict, sitemap_host: str) -> dict:
    """Reloads A-H (module doc), then `crawlerd stop`; returns the report."""
    report = {"port": sim.port, "site": site, "sitemap_host": sitemap_host, "ready": d.wait_ready()}

    # A: the sitemap host, right after its robots.txt was answered
    _wait_ledger(sim, lambda e: e.host == sitemap_host and e.target == "/robots.txt" and e.status == 200)
    d.write_config([sitemap_host])
    d.hup("sitemap")
    # B: h3.sim while its pages are being fetched
    pages: set[int] = set()

    def h3_page(e):
        if e.host == "h3.sim" and e.status == 200 and e.target != "/robots.txt":
            pages.add(e.seq)
        return len(pages) >= 2
    _wait_ledger(sim, h3_page)
    d.write_config([sitemap_host, "h3.sim", "H5.Sim."])
    d.hup("block")
    d.hup("same")                                   # C
    report["cli_add"] = d.ask("block", "add", "h9.sim").returncode
    report["blocked_after_cli_add"] = d.blocked()
    d.hup("cli")                                    # D
    with open(d.config) as f:
        good = f.read()
    d.replace_text(good.replace("[blocklist]", "[blocklist"))      # E: not TOML
    d.hup("syntax")
    d.replace_text(good.replace("hosts = [", "hosts = 7 # ["))     # F: TOML, wrong type
    d.hup("invalid")
    os.remove(d.config)                                         # G: gone
    d.hup("missing")
    d.write_config([])                                          # H
    d.hup("restore")
    stop = d.ask("stop")
    report["stop_rc"], report["stop_out"] = stop.returncode, stop.stdout + stop.stderr
    try:
        report["rc"] = d.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        d.proc.kill()
        report["rc"] = d.proc.wait()
        report["timed_out"] = True
    d.err.close()
    report["t_exit"] = time.monotonic()
    report["reloads"] = d.reloads
    report["stderr"] = d.log()
    report["ledger"] = [e.to_dict() for e in sim.ledger()]
    return report


# == tests ===================================================================================
pytestmark = NETNS_MARKS


@pytest.fixture(scope="module")
def reload_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("reload")
    out = str(base / "report.json")
    report = run_driver(os.path.abspath(__file__), out, str(base))
    report["by_name"] = {rec["name"]: rec for rec in report["reloads"]}
    return report


def _started_after(report, host: str, t: float) -> list[dict]:
    return [e for e in report["ledger"] if e["host"] == host and e["t_start"] > t + TOLERANCE_S]


def test_daemon_survives_every_reload_and_stops_cleanly(reload_run):
    assert reload_run["ready"], reload_run["stderr"][-3000:]
    for rec in reload_run["reloads"]:
        assert rec.get("t_ack"), f"reload {rec['name']}: no log line: {reload_run['stderr'][-2000:]}"
        assert rec["alive"] and rec["state"] == "running", rec
    assert reload_run["stop_rc"] == 0, reload_run["stop_out"]
    assert reload_run["rc"] == 0 and not reload_run.get("timed_out"), reload_run["stderr"][-3000:]
    assert "Traceback" not in reload_run["stderr"]


def _silent(report, host: str, start: str, end: str) -> list[tuple[str, float]]:
    """Requests to ``host`` started between reload ``start``'s acknowledgement and reload ``end``'s SIGHUP."""
    t0, t1 = report["by_name"][start]["t_ack"], report["by_name"][end]["t_hup"]
    return [(e["target"], round(e["t_start"] - t0, 3)) for e in _started_after(report, host, t0)
            if e["t_start"] < t1]


def test_reload_blocks_host_being_crawled(reload_run):
    rec = reload_run["by_name"]["block"]
    assert "h3.sim" in rec["blocked"], rec
    before = [e for e in reload_run["ledger"] if e["host"] == "h3.sim" and e["t_start"] < rec["t_hup"]
              and e["target"] != "/robots.txt"]
    assert before, "h3.sim was not being crawled when it was blocked"
    # in-flight requests finish; nothing starts after the reload until the file unblocks it
    assert _silent(reload_run, "h3.sim", "block", "restore") == []


def test_block_list_takes_names_as_an_operator_writes_them(reload_run):
    # "H5.Sim." names h5.sim: blocked at once, and no request to it after the reload
    rec = reload_run["by_name"]["block"]
    assert "h5.sim" in rec["blocked"], rec
    assert _silent(reload_run, "h5.sim", "block", "same") == []


def test_reload_blocks_host_in_its_sitemap_phase(reload_run):
    # the blocklist wins over everything (ARCHITECTURE.md invariant 2): sitemaps read within a robots lease too
    host = reload_run["sitemap_host"]
    rec = reload_run["by_name"]["sitemap"]
    assert host in rec["blocked"], rec
    before = [e["target"] for e in reload_run["ledger"] if e["host"] == host and e["t_start"] < rec["t_hup"]]
    assert before == ["/robots.txt"], f"the reload did not land between robots.txt and the sitemaps: {before}"
    assert _silent(reload_run, host, "sitemap", "restore") == []


def test_second_sighup_with_same_file_changes_nothing(reload_run):
    block, same = reload_run["by_name"]["block"], reload_run["by_name"]["same"]
    assert same["blocked"] == block["blocked"], (block["blocked"], same["blocked"])
    assert _silent(reload_run, "h5.sim", "block", "restore") == []


def test_runtime_block_survives_sighup(reload_run):
    assert reload_run["cli_add"] == 0
    assert "h9.sim" in reload_run["blocked_after_cli_add"]
    assert "h9.sim" in reload_run["by_name"]["cli"]["blocked"], reload_run["by_name"]["cli"]


@pytest.mark.parametrize("name", ["syntax", "invalid", "missing"])
def test_bad_file_keeps_old_values_with_one_line_error(reload_run, name):
    recs = reload_run["reloads"]
    i = next(n for n, r in enumerate(recs) if r["name"] == name)
    assert recs[i]["blocked"] == recs[i - 1]["blocked"], (recs[i - 1], recs[i])
    errors = [ln for ln in reload_run["stderr"].splitlines() if "reload failed" in ln]
    assert len(errors) == 3, errors
    line = errors[["syntax", "invalid", "missing"].index(name)]
    assert re.match(r"^\S+ error crawlerd reload failed, keeping current config: \S", line), line
    # every stderr line is one log event (no traceback, no continuation lines)
    for ln in reload_run["stderr"].splitlines():
        assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \w+ ", ln), ln


def test_restore_unblocks_config_hosts(reload_run):
    rec = reload_run["by_name"]["restore"]
    for host in ("h3.sim", "h5.sim", reload_run["sitemap_host"]):
        assert host not in rec["blocked"], rec


if __name__ == "__main__":
    raise SystemExit(drive(sys.argv[1], sys.argv[2]))
