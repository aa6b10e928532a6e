"""The Prometheus endpoint and `crawlerd stats --prometheus`, parsed with prometheus_client's own parser."""

import asyncio
import json
import os
import re
import subprocess
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from crawlerd.config import ConfigError, load
from crawlerd.exposition import families, render, render_text
from crawlerd.metrics_server import MetricsServer
from tests.conftest import ROOT
from tests.idle_daemon import crawlerd

EXPECTED = {   # name (without _total) -> type
    "crawlerd_pages": "counter", "crawlerd_requests": "counter", "crawlerd_bytes": "counter",
    "crawlerd_fetch_outcomes": "counter", "crawlerd_http_status": "counter", "crawlerd_dropped": "counter",
    "crawlerd_in_flight": "gauge", "crawlerd_queued_urls": "gauge", "crawlerd_hosts_active": "gauge",
    "crawlerd_seen_pending_keys": "gauge", "crawlerd_seen_disk_bytes": "gauge",
    "crawlerd_dedup_digests": "gauge", "crawlerd_dedup_simhashes": "gauge",
    "crawlerd_budget_deferred_urls": "gauge", "crawlerd_budget_admitted": "counter",
    "crawlerd_loop_lag_seconds": "histogram", "crawlerd_loop_own_lag_seconds": "histogram",
    "crawlerd_process_cpu_seconds": "counter",
    "crawlerd_process_resident_memory_bytes": "gauge", "crawlerd_state": "gauge", "crawlerd_uptime_seconds": "gauge",
}


def parse(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


@pytest.fixture(scope="module")
def daemon(idle_crawlerd):
    return idle_crawlerd


def scrape(url: str, accept: str = "") -> tuple[str, str]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=10) as r:      # loopback only: the daemon bound 127.0.0.1
        return r.read().decode(), r.headers["Content-Type"]


def test_endpoint_serves_every_family_with_help_and_type(daemon):
    _data, status = daemon
    assert status["metrics_url"].startswith("http://127.0.0.1:")
    text, ctype = scrape(status["metrics_url"])
    assert ctype.startswith("text/plain")
    fams = parse(text)
    for name, kind in EXPECTED.items():
        assert name in fams, name
        assert fams[name].type == kind, name
        assert fams[name].documentation, name
    assert text.count("# HELP ") == text.count("# TYPE ") >= len(EXPECTED)
    state = {s.labels["state"]: s.value for s in fams["crawlerd_state"].samples}
    assert state["running"] == 1 and sum(state.values()) == 1


def test_loop_lag_histogram_and_processes_are_real(daemon):
    _data, status = daemon
    fams = parse(scrape(status["metrics_url"])[0])
    buckets = [s for s in fams["crawlerd_loop_lag_seconds"].samples if s.name.endswith("_bucket")]
    counts = [s.value for s in buckets]
    assert counts == sorted(counts) and buckets[-1].labels["le"] == "+Inf" and counts[-1] > 0
    count = next(s.value for s in fams["crawlerd_loop_lag_seconds"].samples if s.name.endswith("_count"))
    assert count == counts[-1]
    roles = {s.labels["role"]: s for s in fams["crawlerd_process_resident_memory_bytes"].samples}
    assert set(roles) == {"shard", "worker"}
    assert int(roles["shard"].labels["pid"]) == status["pid"] and roles["shard"].value > 10 << 20


def test_openmetrics_when_asked_and_http_errors(daemon):
    _data, status = daemon
    text, ctype = scrape(status["metrics_url"], accept="application/openmetrics-text; version=1.0.0")
    assert ctype.startswith("application/openmetrics-text") and text.rstrip().endswith("# EOF")
    base = status["metrics_url"].rsplit("/", 1)[0]
    with pytest.raises(urllib.error.HTTPError) as e:
        scrape(base + "/nothing")
    assert e.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(urllib.request.Request(status["metrics_url"], data=b"x"), timeout=10)
    assert e.value.code == 405


def test_stats_prometheus_prints_the_same_families(daemon):
    data, status = daemon
    r = subprocess.run(crawlerd("stats", "--prometheus", "--data-dir", data), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    cli = parse(r.stdout)
    http = parse(scrape(status["metrics_url"])[0])
    assert set(cli) == set(http)
    assert {n: f.type for n, f in cli.items()} == {n: f.type for n, f in http.items()}


def _stats_with_two_shards(data: str) -> dict:
    r = subprocess.run(crawlerd("stats", "--json", "--data-dir", data), capture_output=True, text=True)
    s = json.loads(r.stdout)
    one = s["shards"][0]
    s["shards"] = [dict(one, shard="0", in_flight=3), dict(one, shard="1", in_flight=5, queued=7)]
    s["outcomes"] = {"ok": 10, "timeout": 2}
    s["statuses"] = {"200": 9, "503": 1}
    return s


def test_per_shard_series_carry_the_shard_label(daemon):
    data, _status = daemon
    fams = parse(render_text(_stats_with_two_shards(data)))
    inflight = {s.labels["shard"]: s.value for s in fams["crawlerd_in_flight"].samples}
    assert inflight == {"0": 3, "1": 5}
    assert {s.labels["shard"] for s in fams["crawlerd_loop_lag_seconds"].samples} == {"0", "1"}
    out = {s.labels["outcome"]: s.value for s in fams["crawlerd_fetch_outcomes"].samples}
    assert out == {"ok": 10, "timeout": 2}
    names = [f.name for f in families(_stats_with_two_shards(data))]
    assert len(names) == len(set(names))


def test_render_without_a_crawl_state_is_still_valid():
    body, ctype = render({"state": "starting"})
    fams = parse(body.decode())
    assert fams["crawlerd_pages"].samples[0].value == 0 and ctype.startswith("text/plain")


def test_listen_key_is_validated():
    for bad, why in (("localhost:9464", "not an IP address"), ("127.0.0.1", "IP:PORT"),
                     ("127.0.0.1:70000", "not 0..65535"), ("::1:9464", "in brackets")):
        with pytest.raises(ConfigError, match="listen") as e:
            load(None, [f'metrics.listen="{bad}"'])
        assert why in str(e.value)
    assert load(None, ['metrics.listen="[::1]:9464"']).metrics.listen == "[::1]:9464"


def test_port_in_use_is_a_startup_error_naming_the_key(daemon, tmp_path):
    _data, status = daemon
    port = status["metrics_url"].rsplit(":", 1)[1].split("/")[0]
    r = subprocess.run(crawlerd("run", "--data-dir", str(tmp_path / "d"), "--duration", "5", "-s",
                                "crawl.user_agent=t (operator: test@localhost)", "-s",
                                f'metrics.listen="127.0.0.1:{port}"'), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "metrics.listen" in r.stderr and "cannot listen" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_render_failure_answers_503_and_the_server_goes_on():
    calls = []

    def flaky(accept):
        calls.append(accept)
        if len(calls) == 1:
            raise RuntimeError("store closing")
        return b"crawlerd_up 1\n", "text/plain"

    async def main():
        srv = MetricsServer("127.0.0.1:0", flaky)
        await srv.start()
        out = []
        for _ in range(2):
            r, w = await asyncio.open_connection("127.0.0.1", srv.port)
            w.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            out.append(await r.read())
            w.close()
        await srv.close()
        return out

    first, second = asyncio.run(main())
    assert first.startswith(b"HTTP/1.1 503") and second.startswith(b"HTTP/1.1 200")
    assert second.endswith(b"crawlerd_up 1\n")


def test_grafana_dashboard_uses_only_names_the_endpoint_serves(daemon):
    _data, status = daemon
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    served = {f.name + sfx for f in parse(scrape(status["metrics_url"])[0]).values() for sfx in suffixes[f.type]}
    with open(os.path.join(ROOT, "contrib", "grafana-crawlerd.json")) as f:
        dash = json.load(f)
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 25
    used = {n for e in exprs for n in re.findall(r"\bcrawlerd_[a-z_]+", e)}
    assert used - served == set()
    for n in ("crawlerd_pages_total", "crawlerd_loop_lag_seconds_bucket", "crawlerd_process_cpu_seconds_total",
              "crawlerd_seen_pending_keys", "crawlerd_budget_deferred_urls", "crawlerd_fetch_outcomes_total"):
        assert n in used
