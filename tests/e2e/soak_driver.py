"""kill -9 soak driver, run inside a private network namespace by tests/e2e/test_kill_soak.py.

One data dir, ``kills`` runs of `crawlerd run` with the shipped settings (only the operator
contact, loopback allowance and the synthetic web's DNS are set), each ended by SIGKILL at a
random moment ``min_s``..``max_s`` after it is up (READY=1; seeded): every other kill takes the processing
workers with it, the others leave them orphaned. Then one clean run of ``final_s`` seconds.
The report holds every run's timings and the server's ledger; WARC and events stay in the data dir.
"""

from __future__ import annotations

import json
import os
import random
import sys

from crawlerd.simweb import SimWebProcess
from tests.e2e.crash_driver import Run


def main() -> int:
    out, data_dir = sys.argv[1], sys.argv[2]
    hosts, kills = int(sys.argv[3]), int(sys.argv[4])
    min_s, max_s, final_s, seed = float(sys.argv[5]), float(sys.argv[6]), float(sys.argv[7]), int(sys.argv[8])
    rng = random.Random(seed)
    runs = []
    try:
        with SimWebProcess(hosts=hosts, seed=seed, bind="0.0.0.0") as sim:
            seeds = os.path.join(os.path.dirname(data_dir), "seeds.txt")
            with open(seeds, "w") as f:
                f.write("\n".join(sim.seeds) + "\n")
            for i in range(kills):
                r = Run(sim, data_dir, seeds, f"kill{i}", max_s + 60.0)
                r.report["planned_s"] = rng.uniform(min_s, max_s)
                ready = r.wait_notify_ready() or r.t_launch
                r.sleep_until(ready + r.report["planned_s"])
                r.kill(workers_too=i % 2 == 1, ask=False)
                runs.append(r.report)
            r = Run(sim, data_dir, seeds, "final", final_s)
            r.wait_ready()
            r.finish(final_s + 90.0)
            runs.append(r.report)
            report = {"port": sim.port, "site": sim.site(), "runs": runs,
                      "ledger": [e.to_dict() for e in sim.ledger()]}
    finally:
        for run in Run.started:
            if run.proc.poll() is None:
                run.proc.kill()
                run.proc.wait()
    with open(out, "w") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
