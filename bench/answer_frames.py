"""The answer path's frames in a py-spy profile of the crawl process (``e2e_bench.py --py-spy``).

Each frame's inclusive share of the loop thread's samples (stacks under ``Supervisor.run``) and,
given the run's loop µs per request, µs per request. "Answers.process own" is ``Answers.process``
less the stacks under DUST's ``DustGate.observe`` and ``Intake.submit_links`` (other components);
the hand-over is ``AnswerReader.data_received`` (the worker's frames read, the near-duplicate answers
given, the futures resolved) and ``WorkerPool._flush_out`` (the job frames written). Since the
twentieth pass a frame's answers are handled in ``Answers.answer_frame``, called from
``AnswerReader.data_received``: it counts with ``Answers.process`` ("own", "Answers.process +
answer_frame") and not in the hand-over, so the rows add up as on a tree before it.

    python3 bench/answer_frames.py RUN-crawlerd-http-crawl.txt LOOP_US_PER_REQUEST
"""

from __future__ import annotations

import sys
from collections import Counter

OWN = "Answers.process own (less DUST, submit_links)"
HANDOVER = "hand-over (data_received + _flush_out)"
BOTH = "Answers.process + answer_frame (incl.)"
FRAMES = ["Answers.process", "Answers.answer_frame", "Recrawl.record_many", "DigestSet.record_many",
          "Answers.record_visit", "WorkerPool.process", "FetchEvents.fetched", "DigestSet.record",
          "AnswerReader.data_received", "WorkerPool._on_answer", "unpack_result", "WorkerPool._answer_near",
          "Answers.near_duplicates", "WorkerPool._flush_out", "GcPacer.step", "DustGate.observe",
          "Intake.submit_links"]
ROWS = [BOTH, OWN, "Answers.answer_frame", "Recrawl.record_many", "DigestSet.record_many", "Answers.record_visit", "WorkerPool.process", "FetchEvents.fetched", "DigestSet.record", HANDOVER,
        "AnswerReader.data_received", "WorkerPool._on_answer", "unpack_result", "WorkerPool._answer_near",
        "Answers.near_duplicates", "WorkerPool._flush_out", "GcPacer.step", "DustGate.observe", "Intake.submit_links"]


def shares(path: str) -> tuple[int, Counter]:
    total, counts = 0, Counter()
    with open(path) as f:
        for line in f:
            stack, _, n = line.rstrip().rpartition(" ")
            frames = [fr.split(" (")[0] for fr in stack.split(";")]
            if "Supervisor.run" not in frames:
                continue
            samples = int(n)
            total += samples
            present = set(frames)
            for name in FRAMES:
                if name in present:
                    counts[name] += samples
            answer = [i for i, fr in enumerate(frames) if fr in ("Answers.process", "Answers.answer_frame")]
            if answer:
                counts[BOTH] += samples
                if not set(frames[answer[0] + 1:]) & {"DustGate.observe", "Intake.submit_links"}:
                    counts[OWN] += samples
            elif "AnswerReader.data_received" in present or "WorkerPool._flush_out" in present:
                counts[HANDOVER] += samples
    return total, counts


def main() -> None:
    path = sys.argv[1]
    loop_us = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    total, counts = shares(path)
    print(f"loop samples {total}")
    for name in ROWS:
        print(f"{name:50s} {100 * counts[name] / total:5.1f} %  {counts[name] / total * loop_us:6.1f} us")
    path_samples = counts[OWN] + counts[HANDOVER] + counts["GcPacer.step"]
    print(f"{'answer path (own + hand-over + GcPacer.step)':50s} {100 * path_samples / total:5.1f} %  "
          f"{path_samples / total * loop_us:6.1f} us")


if __name__ == "__main__":
    main()
