"""The crawl report as one self-contained HTML page: inline CSS and SVG, no script, no external resource.

Sections follow what an operator asks after a crawl: how fast, what came back,
was it polite, what robots.txt said, where the pages came from, how much was
duplicate, what was archived.
"""

from __future__ import annotations

import html
import time
from datetime import UTC, datetime

from crawlerd import __version__
from crawlerd.report import charts
from crawlerd.report.aggregate import FETCH_EDGES_MS, GAP_EDGES_S, CrawlAggregate, HostGaps

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:0;color:#1d1d1f;
background:#f6f7f9}
header{background:#1f2a44;color:#fff;padding:18px 28px}
header h1{margin:0 0 4px;font-size:22px}
header p{margin:0;opacity:.85}
main{max-width:1180px;margin:0 auto;padding:12px 28px 40px}
section{background:#fff;border:1px solid #e3e5e8;border-radius:8px;padding:14px 18px;margin:16px 0}
h2{font-size:17px;margin:0 0 8px}
h3{font-size:14px;margin:14px 0 6px;color:#444}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(165px,1fr));gap:10px}
.card{border:1px solid #e3e5e8;border-radius:6px;padding:8px 10px;background:#fbfbfc}
.card b{display:block;font-size:19px}
.card span{color:#666;font-size:12px}
.cols{display:grid;grid-template-columns:1fr 1fr;gap:18px}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{text-align:left;padding:3px 8px;border-bottom:1px solid #eee}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
svg.chart{width:100%;height:auto;display:block}
.note{color:#666;font-size:12px}
.bad{color:#c0392b;font-weight:600}
.good{color:#2e7d32;font-weight:600}
"""

OTHER = "other"


def _e(x) -> str:
    return html.escape(str(x), quote=True)


def _utc(t: float | None) -> str:
    return "-" if t is None else datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _table(head: list[str], rows: list[list], numeric: set[int] = frozenset()) -> str:
    th = "".join(f'<th class="n">{_e(h)}</th>' if i in numeric else f"<th>{_e(h)}</th>" for i, h in enumerate(head))
    body = "".join("<tr>" + "".join(
        f'<td class="n">{_e(f"{c:,}" if isinstance(c, int) else c)}</td>' if i in numeric else f"<td>{_e(c)}</td>"
        for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body or '<tr><td>none</td></tr>'}</tbody></table>"


def _cards(items: list[tuple[str, str]]) -> str:
    return '<div class="cards">' + "".join(f'<div class="card"><b>{_e(v)}</b><span>{_e(k)}</span></div>'
                                           for k, v in items) + "</div>"


def _top_series(series: dict[str, list[float]], prefix: str, keep: int) -> dict[str, list[float]]:
    """The ``keep`` largest series named ``prefix...`` (prefix dropped), the rest summed as "other"."""
    mine = {k[len(prefix):]: v for k, v in series.items() if k.startswith(prefix)}
    ranked = sorted(mine, key=lambda k: -sum(mine[k]))
    out = {k: mine[k] for k in ranked[:keep]}
    rest = ranked[keep:]
    if rest:
        out[OTHER] = [sum(vals) for vals in zip(*(mine[k] for k in rest), strict=True)]
    return out


def render_page(agg: CrawlAggregate, *, data_dir: str, last_run: dict | None, warc_files: list[tuple[str, int]],
                min_delay_s: float) -> str:
    last = last_run or {}
    times, series = agg.time.series()
    span = (agg.last_at - agg.first_at) if agg.first_at is not None else 0.0
    parts = [_header(data_dir, agg, span), _summary(agg, last, span, warc_files),
             _throughput(agg, times, series), _outcomes(agg, times, series),
             _politeness(agg, min_delay_s), _robots(agg), _domains(agg, last), _content(agg),
             _warc(warc_files), _dropped(agg, last), _footer(agg)]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>crawlerd report: {_e(data_dir)}</title><style>{CSS}</style></head><body>"
            + parts[0] + "<main>" + "".join(parts[1:]) + "</main></body></html>\n")


def _header(data_dir: str, agg: CrawlAggregate, span: float) -> str:
    return (f"<header><h1>crawlerd crawl report</h1><p>{_e(data_dir)} · events from {_e(_utc(agg.first_at))} "
            f"to {_e(_utc(agg.last_at))} ({span:,.0f} s) · generated {_e(_utc(time.time()))}</p></header>")


def _summary(agg: CrawlAggregate, last: dict, span: float, warc_files: list[tuple[str, int]]) -> str:
    errors = sum(v for k, v in agg.outcomes.items() if k not in ("ok", "not_modified", "robots_denied"))
    a = agg.audit
    items = [("pages (responses kept)", f"{agg.pages:,}"),
             ("requests (pages, robots, sitemaps)", f"{a.gaps + a.unmeasured:,}"),
             ("pages/s over the crawl", f"{agg.pages / span:,.1f}" if span > 0 else "-"),
             ("body bytes received", _bytes(agg.bytes)),
             ("fetch errors", f"{errors:,} ({100 * errors / max(1, sum(agg.outcomes.values())):.1f}%)"),
             ("hosts fetched", f"{len(a.hosts) + a.evicted:,}"),
             ("WARC on disk", f"{_bytes(sum(s for _, s in warc_files))} in {len(warc_files)} files")]
    if last:
        items += [("daemon CPU (all processes)", f"{last.get('cpu_s', 0):,.0f} s"),
                  ("URLs still queued", f"{last.get('queued', 0):,}"),
                  ("last run uptime", f"{last.get('uptime_s', 0):,.0f} s")]
    return "<section><h2>Summary</h2>" + _cards(items) + "</section>"


def _throughput(agg, times, series) -> str:
    pages = charts.line_chart("pages-rate", times, {"pages/s": series.get("pages", []),
                                                    "requests/s": series.get("requests", [])}, "per second")
    mib = [v / 2**20 for v in series.get("bytes", [])]
    nbytes = charts.line_chart("bytes-rate", times, {"MiB/s": mib}, "MiB/s received")
    return (f"<section><h2>Throughput</h2><p class=\"note\">Per {agg.time.width_s:g} s bucket.</p>"
            f"<h3>Pages and requests per second</h3>{pages}<h3>Bytes received per second</h3>{nbytes}</section>")


def _outcomes(agg, times, series) -> str:
    outcomes = charts.stacked_chart("outcomes-time", times, _top_series(series, "outcome:", 7), "URLs/s")
    classes = {k: v for k, v in _top_series(series, "status:", 8).items()}
    statuses = charts.stacked_chart("status-time", times, dict(sorted(classes.items())), "responses/s",
                                    charts.STATUS_COLOURS)
    total = sum(agg.outcomes.values()) or 1
    otab = _table(["outcome", "URLs", "share"], [[k, v, f"{100 * v / total:.2f}%"]
                                                for k, v in agg.outcomes.most_common()], {1, 2})
    stot = sum(agg.statuses.values()) or 1
    stab = _table(["HTTP status", "responses", "share"], [[k, v, f"{100 * v / stot:.2f}%"]
                                                         for k, v in agg.statuses.most_common()], {1, 2})
    return (f"<section><h2>Outcomes and HTTP statuses</h2><h3>Outcomes over time</h3>{outcomes}"
            f"<h3>HTTP status classes over time</h3>{statuses}<div class=\"cols\"><div>{otab}</div>"
            f"<div>{stab}</div></div></section>")


def _politeness(agg: CrawlAggregate, min_delay_s: float) -> str:
    a = agg.audit
    hist = charts.histogram_chart("gaps-all", GAP_EDGES_S, a.all_gaps, "gap between requests to one host (s)",
                                  mark=min_delay_s, mark_label=f"politeness.min_delay_s = {min_delay_s:g} s",
                                  seconds=True)
    busiest = a.busiest(20)
    ranges = [(h, st.min_gap, st.quantile(0.1), st.quantile(0.5), st.quantile(0.9), st.max_gap)
              for h, st in busiest if st.ngaps]
    heat = charts.gap_ranges_chart("gaps-hosts", ranges, "gap between requests to the host (s)", mark=min_delay_s)
    below = [(h, g, t) for h, g, t in a.smallest() if g < min_delay_s]
    verdict = (f'<span class="bad">{len(below)}{"+" if len(below) == a.keep_smallest else ""} gaps below '
               f"{min_delay_s:g} s</span>" if below else
               f'<span class="good">no gap below {min_delay_s:g} s</span>')
    rows = [[h, f"{g:.3f}", _utc(t)] for h, g, t in a.smallest()]
    per_host = [[h, s.requests, "-" if s.min_gap == float("inf") else f"{s.min_gap:.3f}"] for h, s in busiest]
    return (f"<section><h2>Politeness audit</h2><p>Gap = start of a request minus the end of the previous "
            f"request to the same host (fetched_at and fetch_ms of the events). {verdict}; {a.gaps:,} gaps "
            f"measured, {a.overlaps:,} overlapping requests (allowed only for hosts in "
            f"politeness.host_concurrency).</p><h3>Gap distribution, all hosts</h3>{hist}"
            f"<h3>Gap distribution of the {len(ranges)} busiest hosts</h3><p class=\"note\">Per host: tick at the "
            f"smallest gap, thin line to the largest, bar from p10 to p90, dot at the median (quantiles from a "
            f"sample of {HostGaps.SAMPLE} gaps per host); dashed line: "
            f"politeness.min_delay_s.</p>{heat}"
            f"<div class=\"cols\"><div><h3>Smallest gaps</h3>{_table(['host', 'gap (s)', 'at'], rows, {1})}</div>"
            f"<div><h3>Busiest hosts</h3>{_table(['host', 'requests', 'smallest gap (s)'], per_host, {1, 2})}"
            f"</div></div></section>")


def _robots(agg: CrawlAggregate) -> str:
    chart = charts.bar_chart("robots", agg.robots.most_common(), "robots.txt fetches", colour=charts.PALETTE[3])
    denied = agg.outcomes.get("robots_denied", 0)
    deferred = agg.outcomes.get("robots_unavailable", 0)
    return (f"<section><h2>robots.txt</h2><p>{sum(agg.robots.values()):,} robots.txt answers (RFC 9309 §2.3.1); "
            f"{denied:,} URLs not fetched because robots.txt disallows them, {deferred:,} held back while "
            f"robots.txt was unavailable.</p>{chart}</section>")


def _domains(agg: CrawlAggregate, last: dict) -> str:
    top = agg.domains.top(15)
    chart = charts.bar_chart("domains", top, "pages", colour=charts.PALETTE[0])
    spenders = (last.get("budgets") or {}).get("top_spenders") or []
    rows = [[d.get("domain", ""), d.get("spent", 0), d.get("budget", 0), d.get("indegree", 0), d.get("deferred", 0)]
            for d in spenders]
    note = " (approximate: the long tail was trimmed)" if agg.domains.trimmed else ""
    return (f"<section><h2>Top registered domains</h2><h3>By pages{note}</h3>{chart}"
            f"<h3>By budget (STAR/BEAST, from last-run.json)</h3>"
            f"{_table(['domain', 'URLs admitted', 'budget', 'linking domains', 'deferred'], rows, {1, 2, 3, 4})}"
            f"</section>")


def _content(agg: CrawlAggregate) -> str:
    dup = charts.share_chart("duplicates", [("unique", agg.unique_200), ("exact duplicate", agg.dup_exact),
                                            ("near duplicate", agg.dup_near)], "200 responses")
    fetch = charts.histogram_chart("fetch-time", tuple(e / 1000 for e in FETCH_EDGES_MS), agg.fetch_ms,
                                   "transfer time per request", seconds=True)
    ct = _table(["content type", "pages"], [[k, v] for k, v in agg.content_types.top(12)], {1})
    return (f"<section><h2>Content</h2><h3>Duplicate and near-duplicate share</h3>{dup}"
            f"<h3>Transfer time per request</h3>{fetch}<h3>Content types</h3>{ct}</section>")


def _warc(files: list[tuple[str, int]]) -> str:
    rows = [[name, _bytes(size), size] for name, size in files]
    total = sum(s for _, s in files)
    return (f"<section><h2>WARC files</h2><p>{len(files)} files, {_bytes(total)}.</p>"
            f"{_table(['file', 'size', 'bytes'], rows, {1, 2})}</section>")


def _dropped(agg: CrawlAggregate, last: dict) -> str:
    reasons = dict(agg.dropped)
    for k, v in (last.get("dropped") or {}).items():
        reasons[k] = max(reasons.get(k, 0), v)
    rows = [[k, v] for k, v in sorted(reasons.items(), key=lambda kv: -kv[1]) if v]
    return (f"<section><h2>URLs dropped</h2><p class=\"note\">From drop events and last-run.json counters "
            f"(filters, traps, blocklist, dead letters).</p>{_table(['reason', 'URLs'], rows, {1})}</section>")


def _footer(agg: CrawlAggregate) -> str:
    a = agg.audit
    notes = [f"{agg.events:,} events read"]
    if agg.bad_lines:
        notes.append(f"{agg.bad_lines:,} damaged lines skipped")
    if a.evicted:
        notes.append(f"per-host gap state kept for {a.max_hosts:,} hosts at a time ({a.evicted:,} evictions; "
                     "each evicted host's next gap is not measured)")
    return f'<p class="note">crawlerd {_e(__version__)} · ' + " · ".join(_e(n) for n in notes) + "</p>"
