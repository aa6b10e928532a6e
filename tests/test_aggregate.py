"""The family's status: every shard's answer added up, a shard's earlier lives kept in the counters."""

from crawlerd import aggregate


def view(shard, pages, rate, outcomes, cpu):
    return {"shard": shard, "pid": 100 + shard, "state": "running", "pages": pages, "pages_per_s_10s": rate,
            "queued": 10 * pages, "outcomes": outcomes, "frontier": {"queued": pages, "paused": False},
            "top_hosts": [["http://a.test", pages], [f"http://s{shard}.test", 1]],
            "cpu_by_process_s": {"crawl": cpu, f"worker-{200 + shard}": 2 * cpu}, "recent_errors": [f"e{shard}"]}


def test_numbers_add_up_tables_merge_and_own_fields_are_the_familys():
    views = [view(0, 5, 1.5, {"ok": 4, "timeout": 1}, 1.0), view(1, 7, 2.25, {"ok": 7}, 3.0), None]
    retired = aggregate.Retired()
    retired.add({"pages": 100, "outcomes": {"ok": 90, "reset": 10}, "queued": 999})
    v = aggregate.family_view(views, kind="stats", state="running", pid=1, data_dir="/d", uptime_s=9.0,
                              summaries=[{"shard": 0}, {"shard": 1}, {"shard": 2}], retired=retired, own_cpu_s=0.5)
    assert v["pages"] == 112                          # 5 + 7 + a restarted shard's earlier life
    assert v["outcomes"] == {"ok": 101, "timeout": 1, "reset": 10}
    assert v["queued"] == 120                         # a gauge of the live shards only
    assert v["pages_per_s_10s"] == 3.75 and v["pid"] == 1 and v["state"] == "running"
    assert v["frontier"] == {"queued": 12, "paused": False}
    assert v["top_hosts"][0] == ["http://a.test", 12]
    assert v["cpu_by_process_s"] == {"crawl": 0.5, "shard-0": 1.0, "worker-200": 2.0, "shard-1": 3.0,
                                     "worker-201": 6.0}
    assert v["cpu_s"] == 12.5 and v["recent_errors"] == ["e0", "e1"] and len(v["shards"]) == 3


def test_maxima_are_the_largest_settings_are_stated_once_and_the_next_due_time_is_the_earliest():
    def shard(high, used, due):
        return {"memory": {"body_pool": {"bytes": used, "cap_bytes": 100, "high_water_bytes": high}},
                "budgets": {"base_budget": 2, "deferred_now": used, "graph": {"lag_max_s": high / 10}},
                "recrawl": {"next_due_at": due}}
    v = aggregate.merge([shard(40, 5, None), shard(70, 6, 9.0), shard(10, 7, 3.0)])
    assert v["memory"]["body_pool"] == {"bytes": 18, "cap_bytes": 300, "high_water_bytes": 70}
    assert v["budgets"] == {"base_budget": 2, "deferred_now": 18, "graph": {"lag_max_s": 7.0}}
    assert v["recrawl"]["next_due_at"] == 3.0
    assert aggregate.merge([shard(1, 1, None), shard(1, 1, None)])["recrawl"]["next_due_at"] is None
