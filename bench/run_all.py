"""`make bench`: run every benchmark in bench/ with its default (bounded) size.

Each *_bench.py prints its own table; see bench/RESULTS.md for recorded results
and the exact command behind each number. Benchmarks that need a private
network namespace re-run themselves under `unshare -n` when they can.
"""

import glob
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    failed = []
    for path in sorted(glob.glob(os.path.join(HERE, "*_bench.py"))):
        name = os.path.basename(path)
        print(f"\n=== {name} ===", flush=True)
        t0 = time.monotonic()
        rc = subprocess.call([sys.executable, path], cwd=os.path.dirname(HERE))
        print(f"--- {name}: exit {rc} in {time.monotonic() - t0:.1f}s", flush=True)
        if rc != 0:
            failed.append(name)
    if failed:
        print("failed: " + ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
