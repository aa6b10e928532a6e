"""Top frames of a py-spy ``--format raw`` profile (collapsed stacks: ``frame;frame;... count``).

    .venv/bin/python bench/pyspy_top.py PROFILE.txt [--top 25]

Prints, per frame, the share of samples in which it is the innermost frame (self) and in which it
is on the stack at all (total), the way a flame graph's widths would read.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter

_ADDR = re.compile(r" \(0x[0-9a-f]+\)|\+0x[0-9a-f]+")


def load(path: str) -> list[tuple[list[str], int]]:
    stacks = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            stack, _, n = line.rpartition(" ")
            if not n.isdigit():
                continue
            stacks.append(([_ADDR.sub("", fr) for fr in stack.split(";")], int(n)))
    return stacks


def top(stacks: list[tuple[list[str], int]], n: int) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
    total = sum(c for _, c in stacks)
    own: Counter[str] = Counter()
    on: Counter[str] = Counter()
    for frames, c in stacks:
        if frames:
            own[frames[-1]] += c
        for fr in set(frames):
            on[fr] += c
    return total, own.most_common(n), on.most_common(n)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--only", metavar="FRAME", help="keep stacks with a frame containing this text "
                    "(e.g. Supervisor.run: the event-loop thread)")
    ap.add_argument("--python", action="store_true", help="innermost Python frame instead of innermost frame")
    args = ap.parse_args(argv)
    stacks = load(args.profile)
    if args.only:
        stacks = [(f, c) for f, c in stacks if any(args.only in fr for fr in f)]
    if args.python:
        stacks = [([fr for fr in f if ".py:" in fr] or f, c) for f, c in stacks]
    total, own, on = top(stacks, args.top)
    if not total:
        print("no samples", file=sys.stderr)
        return 1
    print(f"{total} samples\n\nself %  frame")
    for fr, c in own:
        print(f"{100 * c / total:6.1f}  {fr}")
    print("\ntotal %  frame")
    for fr, c in on:
        print(f"{100 * c / total:6.1f}  {fr}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
