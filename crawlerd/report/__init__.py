"""`crawlerd report`: a self-contained HTML crawl report from a data dir's event logs and last-run.json.

Public API: :func:`write_report` (and :func:`build_report` for the HTML as a
string). The event files are read once, line by line, into bounded aggregates
(:mod:`crawlerd.report.aggregate`); charts are matplotlib figures inlined as
SVG (:mod:`crawlerd.report.charts`); the page has no script and fetches
nothing when opened (:mod:`crawlerd.report.page`). It works on a running
crawl too (the open event file is read up to its last complete line).
"""

from __future__ import annotations

import json
import os

from crawlerd.report.aggregate import CrawlAggregate, event_files


def warc_files(warc_dir: str) -> list[tuple[str, int]]:
    """(name, bytes) of the WARC segments in ``warc_dir``, by name (an open segment included)."""
    try:
        names = sorted(n for n in os.listdir(warc_dir) if ".warc" in n)
    except FileNotFoundError:
        return []
    out = []
    for n in names:
        try:
            out.append((n, os.path.getsize(os.path.join(warc_dir, n))))
        except FileNotFoundError:        # renamed from .open while listed
            continue
    return out


def load_last_run(data_dir: str) -> dict | None:
    try:
        with open(os.path.join(data_dir, "last-run.json")) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def build_report(data_dir: str, *, min_delay_s: float = 1.0, max_hosts: int = 20000) -> str:
    """The report page for ``data_dir`` as HTML text."""
    from crawlerd.report.page import render_page  # matplotlib is imported only when a report is made
    if not os.path.isdir(data_dir):
        raise FileNotFoundError(f"no crawl data dir at {data_dir}")
    agg = CrawlAggregate(max_hosts=max_hosts)
    agg.add_files(event_files(os.path.join(data_dir, "events")))
    return render_page(agg, data_dir=data_dir, last_run=load_last_run(data_dir),
                       warc_files=warc_files(os.path.join(data_dir, "warc")), min_delay_s=min_delay_s)


def write_report(data_dir: str, out_path: str, *, min_delay_s: float = 1.0) -> str:
    """Write the report to ``out_path`` (temp name, then rename); returns its absolute path."""
    page = build_report(data_dir, min_delay_s=min_delay_s)
    out_path = os.path.abspath(out_path)
    tmp = out_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(page)
    os.replace(tmp, out_path)
    return out_path
