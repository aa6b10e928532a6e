"""The writer's puts per page by table, from a counting run (``bench/write_counts/sitecustomize.py``).

    .venv/bin/python bench/write_counts_report.py RUN.json COUNTS.json...

RUN.json: the e2e bench's ``--json`` of that run (pages over the whole run); COUNTS: the counter
files of its processes (only the crawl process writes through overlays).
"""

import json
import sys


def main() -> None:
    run = json.load(open(sys.argv[1]))
    pages = next(iter(run["summary"].values()))["pages"]
    docs = [json.load(open(f)) for f in sys.argv[2:]]
    doc = max(docs, key=lambda d: len(d["tables"]))
    print(f"pages {pages}; per page:")
    print("| table | puts | deletes | value B / put | key B | new keys | same value | again in group "
          "| put then deleted, new | absent deletes | writes merged (last wins / and new deletes dropped) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    rows = sorted(doc["tables"].items(), key=lambda kv: -(kv[1].get("puts", 0) + kv[1].get("dels", 0)))
    tp = td = tk = tm = 0
    for name, c in rows:
        p, d = c.get("puts", 0), c.get("dels", 0)
        k, m = c.get("distinct_keys", p + d), c.get("merged_writes", p + d)
        tp, td, tk, tm = tp + p, td + d, tk + k, tm + m
        print(f"| {name} | {p / pages:.2f} | {d / pages:.2f} | {c.get('value_bytes', 0) / max(p, 1):.0f} | "
              f"{c.get('key_bytes', 0) / max(p, 1):.0f} | {100 * c.get('puts_new', 0) / max(p, 1):.0f} % | "
              f"{100 * c.get('puts_same_value', 0) / max(p, 1):.1f} % | "
              f"{100 * c.get('again_in_group', 0) / max(p + d, 1):.1f} % | "
              f"{c.get('put_then_del_new', 0) / pages:.2f} | {c.get('dels_absent', 0) / pages:.2f} | "
              f"{k / pages:.2f} / {m / pages:.2f} |")
    print(f"| all | {tp / pages:.2f} | {td / pages:.2f} | | | | | | | | {tk / pages:.2f} / {tm / pages:.2f} |")
    items = {k: v for k, v in doc["sinks"].items() if not isinstance(v, dict)}
    print("sink items per page:", {k: round(v / pages, 2) for k, v in sorted(items.items())})
    for k, v in sorted(doc["sinks"].items()):
        if isinstance(v, dict):
            print(f"{k}: per page {v['groups'] / pages:.3f} groups, {v['layers'] / pages:.3f} layers, "
                  f"{v['txns'] / pages:.3f} transactions; {v['layers'] / max(v['groups'], 1):.2f} layers "
                  f"and {v['txns'] / max(v['groups'], 1):.2f} transactions a group")


if __name__ == "__main__":
    main()
