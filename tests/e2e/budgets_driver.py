"""End-to-end budgets driver, run in a private network namespace by tests/e2e/test_budgets_crawl.py.

Starts simweb with a small link farm and two big legitimate domains, runs `crawlerd run` with the
default budgets, and while it crawls asks `crawlerd stats` (JSON and text) and `crawlerd url why`
about a seed, a URL nothing links to, a malformed URL, and the links of farm pages it fetched
(links of pages fetched are known offline: simweb is a pure function of its arguments). Writes
the answers, the ledger and the final stats as JSON.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

from crawlerd.simweb import SimWebProcess
from crawlerd.simweb.farm import FarmShape
from crawlerd.simweb.handler import Handler
from crawlerd.simweb.site import Site

SHAPE = FarmShape(domains=8, hosts_per_domain=2, in_rate=0.05, giants=2, giant_hosts=3)
HOSTS, SEED = 60, 7
HREF = re.compile(r'href="(http://[^"]+)"')


def crawlerd(*args: str) -> list[str]:
    return [sys.executable, "-m", "crawlerd", *args]


def ask(*args: str) -> dict:
    r = subprocess.run(crawlerd(*args), capture_output=True, text=True, timeout=60)
    return {"rc": r.returncode, "out": r.stdout, "err": r.stderr}


def main() -> int:
    out_path, data_dir, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    shape_args = ["--farm-domains", str(SHAPE.domains), "--farm-hosts", str(SHAPE.hosts_per_domain),
                  "--farm-in-rate", str(SHAPE.in_rate), "--giants", str(SHAPE.giants),
                  "--giant-hosts", str(SHAPE.giant_hosts)]
    with SimWebProcess(hosts=HOSTS, seed=SEED, bind="0.0.0.0", extra_args=shape_args) as sim:
        site = sim.site()
        seeds = [s for s in sim.seeds if ".giant" not in s]
        seeds_path = os.path.join(os.path.dirname(data_dir), "seeds.txt")
        with open(seeds_path, "w") as f:
            f.write("\n".join(seeds) + "\n")
        table = ", ".join(f'"{h}" = "{ip}"' for h, ip in sim.static_hosts.items())
        common = ["--data-dir", data_dir]
        # the crawl ends when the questions are answered (SIGTERM, an ordered stop), at the latest
        # after twice its time: a question never races the daemon's own end
        proc = subprocess.Popen(crawlerd("run", "--seeds", seeds_path, "--duration", str(2 * seconds), *common,
                                         "-s", "crawl.user_agent=crawlerd-test/0.1 (+e2e; operator: test@localhost)",
                                         "-s", 'network.allow=["127.0.0.0/8"]', "-s", f"dns.static_hosts={{{table}}}",
                                         "-s", "fetch.shutdown_grace_s=2.0",
                                         # a small web is politeness-bound: only an idle fetcher moves the reader
                                         "-s", "budgets.min_ready_hosts=1",
                                         # links are answered within a second, so the farm links
                                         # picked below have passed the seen-set when asked about
                                         "-s", "drum.max_age_s=1"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # ask once farm pages were fetched and URLs wait in BEAST (a loaded box starts slowly),
        # at the latest at 60% of the crawl (the questions below need the daemon still up; farm
        # domains nobody vouches for wait for the reader to move on, so their pages come later)
        t0 = time.monotonic()
        time.sleep(seconds * 0.3)
        while time.monotonic() - t0 < seconds * 0.6:
            farm_done = sum(1 for e in sim.ledger()
                            if e.status == 200 and site["hosts"].get(e.host, {}).get("role") == "farm")
            st = ask("stats", "--json", *common)
            waiting = st["rc"] == 0 and (json.loads(st["out"]).get("budgets") or {}).get("deferred_now", 0) > 0
            if farm_done >= 20 and waiting:
                break
            time.sleep(1.0)
        stats_json = ask("stats", "--json", *common)
        stats_text = ask("stats", *common)
        offline = Handler(Site(HOSTS, SEED, shape=SHAPE), sim.port)
        farm_links = []           # links of the farm pages fetched last: the newest in their domains' FIFOs
        for e in reversed(sim.ledger()):
            if site["hosts"].get(e.host, {}).get("role") == "farm" and e.status == 200 and len(farm_links) < 200:
                body = offline.handle(f"{e.host}:{sim.port}", e.target)[1].body.decode()
                farm_links += [u for u in HREF.findall(body) if ".spam" in u]
        urls = [seeds[0], f"http://h1.sim:{sim.port}/p/987654.html"] + farm_links[:1000]
        time.sleep(3.0)           # the last pages' links through the seen-set's next merge
        why = ask("url", "why", "--json", *common, *urls)
        why_text = ask("url", "why", *common, seeds[0])
        why_bad = ask("url", "why", *common, "not a url")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=2 * seconds + 60)
        ledger = [e.to_dict() for e in sim.ledger()]
    with open(os.path.join(data_dir, "last-run.json")) as f:
        last = json.load(f)
    answers, text, dec = [], why["out"], json.JSONDecoder()
    pos = 0
    while text[pos:].strip():                    # one JSON document per URL, one after another
        doc, end = dec.raw_decode(text, pos + len(text[pos:]) - len(text[pos:].lstrip()))
        answers.append(doc)
        pos = end
    with open(out_path, "w") as f:
        json.dump({"rc": proc.returncode, "stderr": err[-3000:], "site": site, "ledger": ledger, "last_run": last,
                   "stats_json": stats_json, "stats_text": stats_text, "why": why, "answers": answers,
                   "urls": urls, "why_text": why_text, "why_bad": why_bad}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
