"""DUST end-to-end driver, run in a private network namespace by tests/e2e/test_dust_crawl.py.

simweb with URL variants on most hosts (small hosts, so the crawl reaches their deferred URLs),
one crawl with the learner on, then a second, short one on the same data dir (rules persist).
Writes the ledger, the site, both last-run.json files and the crawler's DUST events as JSON.
"""

import glob
import json
import os
import sys

from crawlerd.simweb import SimWebProcess
from tests.e2e.driver import run_crawl


def events(data_dir: str) -> list[dict]:
    out = []
    for path in sorted(glob.glob(os.path.join(data_dir, "events", "*.jsonl*"))):
        with open(path, errors="replace") as f:
            out += [json.loads(line) for line in f if line.strip().endswith("}")]
    return out


def main() -> int:
    out_path, data_dir, hosts, seconds, seconds2 = sys.argv[1], sys.argv[2], int(sys.argv[3]), \
        float(sys.argv[4]), float(sys.argv[5])
    extra = sys.argv[6:]
    with SimWebProcess(hosts=hosts, seed=11, bind="0.0.0.0", min_pages=12, max_pages=30,
                       extra_args=["--variants", "0.8"]) as sim:
        seeds = os.path.join(os.path.dirname(data_dir), "seeds.txt")
        with open(seeds, "w") as f:
            f.write("\n".join(sim.seeds) + "\n")
        first = run_crawl(sim, data_dir, seeds, seconds, extra)
        ledger = [e.to_dict() for e in sim.ledger()]
        evs = events(data_dir)
        second = run_crawl(sim, data_dir, seeds, seconds2, extra)
        report = {"port": sim.port, "site": sim.site(), "first": first, "second": second, "ledger": ledger,
                  "events": [e for e in evs if e.get("kind", "").startswith("dust")]}
    with open(out_path, "w") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
