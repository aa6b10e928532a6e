"""DUST's parts on the crawl loop, from a py-spy ``--format raw`` profile of the crawl process.

    .venv/bin/python bench/dust_parts.py PROFILE.txt [--loop-us 519]

Keeps the event-loop thread's stacks (those through ``Supervisor.run``) and counts, per part of
DUST, the samples with one of its frames on the stack: admission (``DustGate.admit``), the lease
check (``DustGate.lease_skip``), the evidence of an archived page (``DustGate.observe``, split into
the host state's load, ``learn``, the archived set, the probe's scan of the deferred level and the
rest) and the sliced write of changed hosts (``DustGate.commit_sliced``, split into encoding,
``put_host`` and the cache's charge). A part's share of the loop times ``--loop-us`` (the e2e
JSON's loop-thread µs per request) is its cost per request. Each sample is one in ``total``: the
shares of parts with few samples are rough (n samples: about ±√n).

Line numbers are not used, only function names, so the split holds across small code changes.
"""

from __future__ import annotations

import argparse
import sys

from pyspy_top import load

LOOP = "Supervisor.run ("
# (part, frame that marks it, sub-parts: (name, frame below it)); the first sub-part found counts
PARTS = (
    ("admit", "DustGate.admit (", ()),
    ("lease_skip", "DustGate.lease_skip (", ()),
    ("observe", "DustGate.observe (", (
        ("host state load", "DustHosts.state ("),
        ("learn", "HostState.learn ("),
        ("archived set", "DustStore.add_archived ("),
        ("probe scan", "Frontier.promote_deferred ("),
        ("canonical fed", "Intake.submit_links ("),
    )),
    ("commit_sliced", "DustGate.commit_sliced", (
        ("encode", "DustStore.encode ("),
        ("to_record", "HostState.to_record ("),
        ("put_host", "DustStore.put_host ("),
        ("charge", "DustHosts._charge ("),
        ("commit", "DustStore.commit ("),
    )),
)


def parts(stacks: list[tuple[list[str], int]]) -> tuple[int, dict[str, int]]:
    """(loop-thread samples, samples per part and per "part: sub-part")."""
    total, out = 0, {}
    for frames, c in stacks:
        if not any(LOOP in fr for fr in frames):
            continue
        total += c
        for name, mark, subs in PARTS:
            at = next((i for i, fr in enumerate(frames) if mark in fr), -1)
            if at < 0:
                continue
            out[name] = out.get(name, 0) + c
            below = frames[at + 1:]
            sub = next((s for s, m in subs if any(m in fr for fr in below)), "rest") if subs else None
            if sub is not None:
                key = f"{name}: {sub}"
                out[key] = out.get(key, 0) + c
            break
    return total, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile")
    ap.add_argument("--loop-us", type=float, default=0.0, help="the loop thread's µs per request (e2e JSON)")
    args = ap.parse_args(argv)
    total, out = parts(load(args.profile))
    if not total:
        print("no loop-thread samples", file=sys.stderr)
        return 1
    dust = sum(out.get(name, 0) for name, _m, _s in PARTS)
    print(f"{total} loop-thread samples; DUST {dust} ({100 * dust / total:.1f} %)\n")
    print(f"{'part':34} {'samples':>7} {'% loop':>7}" + (f" {'µs/req':>7}" if args.loop_us else ""))
    for name, _m, subs in PARTS:
        rows = [name] + [f"{name}: {s}" for s, _ in subs] + ([f"{name}: rest"] if subs else [])
        for key in rows:
            n = out.get(key, 0)
            if key != name and not n:
                continue
            line = f"{key:34} {n:7d} {100 * n / total:7.2f}"
            if args.loop_us:
                line += f" {args.loop_us * n / total:7.1f}"
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
