"""``crawlerd stats`` of a two-shard daemon: the top-level figures cover both shards."""

from __future__ import annotations

import json
import subprocess
import time

from tests.idle_daemon import crawlerd, idle_daemon


def stats_of_both(data_dir: str, timeout_s: float = 60.0) -> dict:
    """The first ``stats --json`` in which both shards answered with their workers running."""
    deadline = time.monotonic() + timeout_s
    while True:
        r = subprocess.run(crawlerd("stats", "--json", "--data-dir", data_dir), capture_output=True, text=True)
        if r.returncode == 0:
            st = json.loads(r.stdout)
            shards = st.get("shards", [])
            if len(shards) == 2 and all(s.get("memory") and s.get("worker_cpu_s") for s in shards):
                return st
        assert time.monotonic() < deadline, f"both shards never answered stats: {r.stdout[-2000:]}"
        time.sleep(0.3)


def test_two_shards_stats_sum_bytes_take_maxima_and_list_every_worker(tmp_path):
    data = str(tmp_path / "data")
    with idle_daemon(data, "--shards", "2", "-s", "process.workers=2", timeout_s=60.0):
        st = stats_of_both(data)
    a, b = st["shards"]
    assert a["pid"] != b["pid"]
    for name, top in st["memory"].items():          # bytes and caps: the sum over the shards
        assert top["bytes"] == a["memory"][name]["bytes"] + b["memory"][name]["bytes"], name
        assert top["cap_bytes"] == a["memory"][name]["cap_bytes"] + b["memory"][name]["cap_bytes"], name
    assert st["memory"]["dns_cache"]["cap_bytes"] > a["memory"]["dns_cache"]["cap_bytes"] > 0
    for name, top in st["unlanded"].items():        # a high-water mark: the larger shard's, not a sum
        assert top["high_water_bytes"] == max(a["unlanded"][name]["high_water_bytes"],
                                              b["unlanded"][name]["high_water_bytes"]), name
    assert st["budgets"]["base_budget"] == a["budgets"]["base_budget"] == b["budgets"]["base_budget"]   # a setting
    assert st["malloc"]["heap"] == a["malloc"]["heap"] + b["malloc"]["heap"]
    assert st["seen_pending"] == a["seen_pending"] + b["seen_pending"]
    # worker CPU: every worker of every shard, by pid
    workers = {int(k.removeprefix("worker-")) for k in st["cpu_by_process_s"] if k.startswith("worker-")}
    shard_workers = [{int(pid) for pid in s["worker_cpu_s"]} for s in (a, b)]
    assert all(len(w) == 1 for w in shard_workers) and shard_workers[0] != shard_workers[1]
    assert workers == shard_workers[0] | shard_workers[1]
