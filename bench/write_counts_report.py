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
    print("| table | puts | deletes | value B / put | key B | new keys | same value | again in group | absent deletes |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = sorted(doc["tables"].items(), key=lambda kv: -(kv[1].get("puts", 0) + kv[1].get("dels", 0)))
    tp = td = 0
    for name, c in rows:
        p, d = c.get("puts", 0), c.get("dels", 0)
        tp, td = tp + p, td + d
        print(f"| {name} | {p / pages:.2f} | {d / pages:.2f} | {c.get('value_bytes', 0) / max(p, 1):.0f} | "
              f"{c.get('key_bytes', 0) / max(p, 1):.0f} | {100 * c.get('puts_new', 0) / max(p, 1):.0f} % | "
              f"{100 * c.get('puts_same_value', 0) / max(p, 1):.1f} % | "
              f"{100 * c.get('again_in_group', 0) / max(p + d, 1):.1f} % | {c.get('dels_absent', 0)} |")
    print(f"| all | {tp / pages:.2f} | {td / pages:.2f} | | | | | | |")
    print("sink items per page:", {k: round(v / pages, 2) for k, v in sorted(doc["sinks"].items())})


if __name__ == "__main__":
    main()
