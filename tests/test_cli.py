"""The command line, end to end as a user runs it: exit codes and one-line errors."""

import json
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT

UA = "crawlerd-test/0.1 (operator: test@localhost)"


def cli(*args, timeout=60, **kw):
    return subprocess.run([sys.executable, "-m", "crawlerd", *args], capture_output=True, text=True,
                          timeout=timeout, **kw)


def one_line_error(r):
    assert "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_help_lists_every_verb():
    r = cli("--help")
    assert r.returncode == 0
    for verb in ("run", "demo", "status", "stats", "seed", "block", "pause", "resume", "checkpoint", "stop",
                 "robots", "url", "warc", "config", "top", "report", "cluster"):
        assert verb in r.stdout


def test_run_help_shows_defaults():
    r = cli("demo", "--help")
    assert "(default: 60.0)" in r.stdout


def test_url_normalize():
    r = cli("url", "normalize", "HTTP://Example.COM:80/a/./b/../c?q=1#frag", "http://x.org")
    assert r.returncode == 0
    assert r.stdout.splitlines() == ["http://example.com/a/c?q=1", "http://x.org/"]
    bad = cli("url", "normalize", "javascript:alert(1)")
    assert bad.returncode == 2 and "not a valid http(s) URL" in one_line_error(bad)


def test_status_without_daemon_exits_3(tmp_path):
    for verb in ("status", "stats", "stop", "pause"):
        r = cli(verb, "--data-dir", str(tmp_path))
        assert r.returncode == 3, (verb, r.stderr)
        assert "no crawlerd is running" in one_line_error(r)


def test_run_refuses_placeholder_contact(tmp_path):
    r = cli("run", "--data-dir", str(tmp_path), "--duration", "1")
    assert r.returncode == 2
    assert "placeholder operator contact" in one_line_error(r)


@pytest.mark.parametrize("args, fragment", [
    (["-s", "fetch.timeout_s=fast"], "fetch: timeout_s = 'fast': expected a number"),
    (["-s", "crawl.nope=1"], "unknown key crawl.nope"),
    (["--config", "/nonexistent/c.toml"], "config file not found"),
])
def test_bad_config_one_line_exit_2(tmp_path, args, fragment):
    r = cli("run", "--data-dir", str(tmp_path), *args)
    assert r.returncode == 2
    assert fragment in one_line_error(r)


@pytest.mark.parametrize("args, fragment", [
    (["-s", "politeness.min_delay_s=nan"], "politeness: min_delay_s = nan: expected a finite number"),
    (["-s", "fetch.timeout_s=nan"], "fetch: timeout_s = nan: expected a finite number"),
    (["-s", "fetch.connect_timeout_s=inf"], "fetch: connect_timeout_s = inf: expected a finite number"),
    (["-s", "frontier.map_size_bytes=9223372036854775807"], "frontier: map_size_bytes = 9223372036854775807"),
    (["-s", "frontier.map_size_bytes=70368744177664", "-s", "recrawl.map_size_bytes=70368744177664"],
     "frontier.map_size_bytes = 70368744177664: the LMDB maps need"),
    (["-s", 'crawl.user_agent=""'], "user_agent = '': expected printable ASCII text"),
    (["-s", "crawl.user_agent=mybot/1.0"], "crawl.user_agent = 'mybot/1.0': expected an operator contact"),
    (["--duration=0"], "--duration '0': expected a number of seconds > 0"),
    (["--duration=-5"], "--duration '-5': expected a number of seconds > 0"),
    (["--duration=nan"], "--duration 'nan'"),
    (["--duration=inf"], "--duration 'inf'"),
    (["--cluster", "nats://127.0.0.1:4222"], "crawl.shards = 0: a cluster crawl (cluster.servers set) needs"),
    (["--own", "0-1", "--shards", "4"], "cluster.own = '0-1': only a node of a cluster owns a share"),
    (["--cluster", "nats://127.0.0.1:4222", "--shards", "4", "--own", "3-5"], "shard 5 in '3-5': crawl.shards is 4"),
    (["--cluster", "http://127.0.0.1:4222", "--shards", "2"], "is not \"nats://HOST:PORT\""),
])
def test_bad_values_refused_before_crawling(tmp_path, args, fragment):
    ua = [] if any("user_agent" in a for a in args) else ["-s", f"crawl.user_agent={UA}"]
    r = cli("run", "--data-dir", str(tmp_path / "d"), *ua, *args)
    assert r.returncode == 2
    assert fragment in one_line_error(r)
    assert not (tmp_path / "d").exists()            # refused before touching the data dir


def test_unreadable_seeds_and_bad_data_dir(tmp_path):
    r = cli("run", "--data-dir", str(tmp_path), "--seeds", str(tmp_path / "missing.txt"), "-s", f"crawl.user_agent={UA}")
    assert r.returncode == 2 and "cannot read seeds file" in one_line_error(r)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = cli("run", "--data-dir", str(blocker / "sub"), "-s", f"crawl.user_agent={UA}")
    assert r.returncode == 2 and "cannot create data dir" in one_line_error(r)


def test_config_dump_is_shipped_file():
    r = cli("config", "dump")
    assert r.returncode == 0
    assert r.stdout == open(os.path.join(ROOT, "config.toml")).read()
    assert cli("config", "check", "--config", os.path.join(ROOT, "config.toml")).returncode == 0


def test_robots_check_file(tmp_path):
    p = tmp_path / "robots.txt"
    p.write_bytes(b"User-agent: *\nDisallow: /private/\nAllow: /private/ok$\n")
    r = cli("robots", "check", "--robots", str(p), "--agent", "crawlerd",
            "http://a.example/x", "http://a.example/private/y", "http://a.example/private/ok")
    assert r.returncode == 0
    assert r.stdout.splitlines() == ["allow http://a.example/x", "disallow http://a.example/private/y",
                                     "allow http://a.example/private/ok"]
    r = cli("robots", "check", "--robots", str(tmp_path / "nope"), "http://a.example/")
    assert r.returncode == 2 and "cannot read robots file" in one_line_error(r)


def test_robots_check_online_through_fetch_path():
    from crawlerd.simweb import SimWebProcess
    with SimWebProcess(hosts=12, seed=3, bind="127.0.0.1") as sim:
        site = sim.site()
        table = ", ".join(f'"{h}" = "{ip}"' for h, ip in sim.static_hosts.items())
        sets = ["-s", 'network.allow=["127.0.0.0/8"]', "-s", f"dns.static_hosts={{{table}}}"]
        base = f"http://h0.sim:{sim.port}"
        r = cli("robots", "check", "--robots-url", base + "/robots.txt", *sets,
                base + "/p/1.html", base + "/private/1.html")
        assert r.returncode == 0, r.stderr
        lines = [ln for ln in r.stdout.splitlines() if not ln.startswith("#")]
        assert lines == [f"allow {base}/p/1.html", f"disallow {base}/private/1.html"]
        # without the loopback allowance the address guard refuses: robots unreachable -> disallow all
        r = cli("robots", "check", "--robots-url", base + "/robots.txt", "-s", f"dns.static_hosts={{{table}}}",
                base + "/p/1.html")
        assert r.returncode == 0, r.stderr
        assert "blocked_address" in r.stdout
        assert r.stdout.splitlines()[-1] == f"disallow {base}/p/1.html"
        # 5xx robots.txt: disallow all (RFC 9309 §2.3.1.4)
        five = [h for h, d in site["hosts"].items() if d.get("robots", {}).get("status") in (500, 503)]
        if five:
            url = f"http://{five[0]}:{sim.port}"
            r = cli("robots", "check", "--robots-url", url + "/robots.txt", *sets, url + "/p/1.html")
            assert r.stdout.splitlines()[-1] == f"disallow {url}/p/1.html"


def test_warc_verify_and_index(tmp_path):
    from crawlerd.store.warc import WarcWriter
    with WarcWriter(str(tmp_path), prefix="t") as w:
        w.write_fetch(url="http://a.example/", fetched_at=1.7e9, ip="127.0.0.2",
                      request_head=b"GET / HTTP/1.1\r\nHost: a.example\r\n\r\n",
                      response_head=b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 5\r\n\r\n",
                      body=b"hello")
    seg = [os.path.join(tmp_path, n) for n in os.listdir(tmp_path) if n.endswith(".warc.gz")]
    assert len(seg) == 1
    r = cli("warc", "verify", seg[0])
    assert r.returncode == 0, r.stdout + r.stderr
    r = cli("warc", "index", "--stdout", seg[0])
    line = r.stdout.strip().splitlines()[0]
    key, ts, js = line.split(" ", 2)
    assert json.loads(js)["url"] == "http://a.example/"
    with open(seg[0], "r+b") as f:          # corrupt a byte inside the response record
        f.seek(os.path.getsize(seg[0]) - 30)
        f.write(b"\x00\x00\x00\x00")
    assert cli("warc", "verify", seg[0]).returncode == 1


def test_daemon_control_verbs_and_socket_in_use(tmp_path):
    data = str(tmp_path / "d")
    proc = subprocess.Popen([sys.executable, "-m", "crawlerd", "run", "--data-dir", data, "--duration", "60",
                             "-s", f"crawl.user_agent={UA}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            r = cli("status", "--json", "--data-dir", data)
            if r.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["state"] == "running"
        second = cli("run", "--data-dir", data, "--duration", "1", "-s", f"crawl.user_agent={UA}")
        assert second.returncode == 2 and "is in use by another crawlerd" in one_line_error(second)
        other = cli("run", "--data-dir", str(tmp_path / "e"), "--duration", "1", "-s", f"crawl.user_agent={UA}",
                    "-s", f"control.socket={data}/control.sock")
        assert other.returncode == 2 and "in use by a running crawlerd" in one_line_error(other)
        assert cli("pause", "--data-dir", data).stdout.strip() == "paused"
        assert json.loads(cli("status", "--json", "--data-dir", data).stdout)["state"] == "paused"
        assert cli("resume", "--data-dir", data).stdout.strip() == "running"
        assert cli("block", "add", "evil.example", "--data-dir", data).stdout.split() == ["evil.example"]
        assert cli("block", "list", "--data-dir", data).stdout.split() == ["evil.example"]
        assert cli("block", "remove", "evil.example", "--data-dir", data).stdout.split() == []
        r = cli("seed", "add", "http://127.0.0.1:9/", "not-a-url://", "--data-dir", data)
        assert r.returncode == 0 and "submitted 1 seeds, 1 invalid" in r.stdout
        st = json.loads(cli("stats", "--json", "--data-dir", data).stdout)
        assert "outcomes" in st and "dropped" in st and "top_hosts" in st
        assert st["dust"]["enabled"] and st["dust"]["rules_trusted"] == 0
        assert "dust rules:" in cli("stats", "--data-dir", data).stdout
        prom = cli("stats", "--prometheus", "--data-dir", data).stdout
        assert "# TYPE crawlerd_pages_total counter" in prom and "crawlerd_queued_urls{shard=\"0\"}" in prom
        assert cli("checkpoint", "--data-dir", data).returncode == 0
        assert cli("stop", "--data-dir", data).stdout.strip() == "stopping"
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_stats_prints_the_top_dust_rules_per_host(capsys):
    from crawlerd.readout import print_dust
    print_dust({"enabled": True, "rules_trusted": 1, "hosts_with_rules": 1, "rules_learned_total": 2,
                 "rules_retired_total": 1, "sample_mismatches_total": 1, "skipped_total": 40,
                 "top": [{"host": "http://a.example", "rules": [
                     {"rule": "?utm_source", "state": "trusted", "confirmations": 5, "skips": 40, "samples": 2,
                      "sample_mismatches": 0},
                     {"rule": "?sort", "state": "retired", "confirmations": 3, "skips": 0, "samples": 1,
                      "sample_mismatches": 1}]}]})
    out = capsys.readouterr().out.splitlines()
    assert "1 trusted on 1 hosts" in out[0] and "sample mismatches 1" in out[0]
    assert out[1].strip() == "http://a.example"
    assert out[2].split()[:2] == ["?utm_source", "trusted"] and "skips 40" in out[2]
    assert out[3].split()[:2] == ["?sort", "retired"] and out[3].endswith("sample mismatches 1")
    print_dust({"enabled": False})
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("args, fragment", [
    (["demo", "--seconds=nan", "--no-netns"], "--seconds 'nan': expected a number of seconds > 0"),
    (["demo", "--seconds=0", "--no-netns"], "--seconds '0.0': expected a number of seconds > 0"),
    (["demo", "--hosts=0", "--no-netns"], "--hosts 0: expected 1..1000000"),
    (["stats", "--interval=inf"], "--interval 'inf': expected a number of seconds > 0"),
])
def test_other_durations_refused(tmp_path, args, fragment):
    r = cli(*args, "--data-dir", str(tmp_path / "d"))
    assert r.returncode == 2
    assert fragment in one_line_error(r)


def test_stats_prints_the_body_pool_in_use_its_high_water_and_what_went_inline(capsys):
    from crawlerd.readout import print_memory
    mib = 1 << 20
    print_memory({"memory": {"body_pool": {"bytes": 2 * mib, "cap_bytes": 64 * mib, "entries": 3,
                                           "high_water_bytes": 12 * mib}},
                  "body_pool_fallbacks": {"pooled": 90, "fetched": 4, "inline": 7}})
    out = capsys.readouterr().out.splitlines()
    assert "body_pool 2.0/64.0" in out[0]
    assert out[1].startswith("body pool:") and "90 bodies pooled, 4 fell back to the heap, 7 sent" in out[1]
    assert out[1].endswith("in use 2.0 MiB, high-water 12.0 MiB of 64.0 MiB"), out[1]


def test_status_names_where_the_loop_stalled(capsys):
    from crawlerd.metrics import LAG_BUCKETS_S
    from crawlerd.readout import print_status

    lag = {"cumulative": [100] * len(LAG_BUCKETS_S), "count": 100, "max_s": 0.31,
           "stall_sites": [{"where": "put:127 < put:84 < fetch_robots:133", "stalls": 4, "worst_s": 0.31},
                           {"where": "_on_ready:393", "stalls": 2, "worst_s": 0.08}]}
    print_status({"state": "running", "pid": 1, "uptime_s": 5, "data_dir": "/d", "pages": 9, "pages_per_s_10s": 1.0,
                  "pages_per_s_60s": 1.0, "queued": 3, "hosts_active": 2, "in_flight": 1, "outcomes": {},
                  "statuses": {}, "shards": [{"shard": 0, "loop_lag": lag}]})
    out = capsys.readouterr().out
    assert "stalled x4 (worst 310 ms) in put:127 < put:84 < fetch_robots:133" in out
    assert "stalled x2 (worst 80 ms) in _on_ready:393" in out


def test_state_written_by_a_newer_crawlerd_is_refused_by_name_with_exit_2(tmp_path):
    """A data dir whose BEAST FIFOs are of a format this crawlerd does not know (a downgrade after a
    newer one ran on it): the daemon does not start, says which directory and why, exits 2 (the
    unit's RestartPreventExitStatus: no restart loop)."""
    import asyncio

    import lmdb

    from crawlerd.frontier.budgets import Budgets

    data = tmp_path / "d"
    (data / "shards" / "0").mkdir(parents=True)
    (data / "crawl.json").write_text(json.dumps({"shards": 1, "layout": 1}))
    b = Budgets(str(data / "shards" / "0" / "budgets"), base_budget=2, per_inlink=2, max_budget=100)
    asyncio.run(b.close())
    env = lmdb.open(str(data / "shards" / "0" / "budgets" / "state"), max_dbs=8)
    meta = env.open_db(b"meta")
    with env.begin(write=True) as txn:
        beast = json.loads(txn.get(b"beast", db=meta))
        beast["fifo"] = 99
        txn.put(b"beast", json.dumps(beast).encode(), db=meta)
    env.close()
    r = cli("run", "--data-dir", str(data), "-s", f"crawl.user_agent={UA}", "--duration", "1")
    line = one_line_error(r)
    assert r.returncode == 2
    assert "budgets/state" in line and "format 99, written by a newer crawlerd" in line
