"""Charts of the crawl report: matplotlib figures rendered to inline SVG strings.

Figures are built with the object API (no pyplot, no global backend state), text
is kept as SVG text (``svg.fonttype = none``: small files, the browser's own
font) and every id in a figure is prefixed with its chart's name, so many SVGs
share one HTML document without their clip paths and markers colliding.
"""

from __future__ import annotations

import functools
import io
import re
from bisect import bisect_right
from datetime import UTC, datetime

import matplotlib
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter, PercentFormatter

PALETTE = ("#4269d0", "#efb118", "#ff725c", "#6cc5b0", "#3ca951", "#ff8ab7", "#a463f2", "#97bbf5",
           "#9c6b4e", "#9498a0")
STATUS_COLOURS = {"2xx": "#3ca951", "3xx": "#4269d0", "4xx": "#efb118", "5xx": "#ff725c"}
STYLE = {"svg.fonttype": "none", "svg.hashsalt": "crawlerd", "font.size": 9, "axes.spines.top": False,
         "axes.spines.right": False, "axes.grid": True, "grid.color": "#e6e6e6", "grid.linewidth": 0.6,
         "axes.axisbelow": True, "font.family": ["DejaVu Sans", "sans-serif"]}
_ID = re.compile(r'id="([^"]+)"')
WIDTH_IN = 11.0


def _styled(fn):
    """Build the figure under the report's style (rcParams are read when axes are made and drawn)."""
    @functools.wraps(fn)
    def wrapper(*args, **kw):
        with matplotlib.rc_context(STYLE):
            return fn(*args, **kw)
    return wrapper


def figure(width_in: float = WIDTH_IN, height_in: float = 2.8) -> Figure:
    return Figure(figsize=(width_in, height_in), layout="constrained")


def to_svg(fig: Figure, name: str) -> str:
    """The figure as one ``<svg>`` element, ids prefixed with ``name``, sized to its container."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]
    for ident in set(_ID.findall(svg)):
        new = f"{name}-{ident}"
        svg = svg.replace(f'id="{ident}"', f'id="{new}"').replace(f"#{ident})", f"#{new})") \
                 .replace(f'href="#{ident}"', f'href="#{new}"')
    svg = re.sub(r'<svg ([^>]*?)width="[^"]*" height="[^"]*"', r'<svg \1', svg, count=1)
    return svg.replace("<svg ", f'<svg class="chart" role="img" aria-label="{name}" ', 1)


def _closed(times: list[float]) -> list[float]:
    """Bucket starts plus the end of the last bucket, so a step drawing shows the last bucket too."""
    return [*times, times[-1] + (times[-1] - times[-2] if len(times) > 1 else 1.0)]


def _dates(times: list[float]) -> list[datetime]:
    return [datetime.fromtimestamp(t, UTC).replace(tzinfo=None) for t in times]


def _time_axis(ax) -> None:
    loc = AutoDateLocator()
    ax.xaxis.set_major_locator(loc)
    ax.xaxis.set_major_formatter(ConciseDateFormatter(loc))
    ax.set_xlabel("UTC")


def _empty(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} in the event logs", ha="center", va="center", transform=ax.transAxes,
            color="#777")
    ax.set_xticks([])
    ax.set_yticks([])


@_styled
def line_chart(name: str, times: list[float], lines: dict[str, list[float]], ylabel: str) -> str:
    fig = figure()
    ax = fig.subplots()
    if not times:
        _empty(ax, ylabel)
    else:
        x = _dates(_closed(times))
        for i, (label, ys) in enumerate(lines.items()):
            ys = ys or [0.0] * len(times)
            ax.plot(x, [*ys, ys[-1]], label=label, color=PALETTE[i % len(PALETTE)], linewidth=1.4, drawstyle="steps-post")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        _time_axis(ax)
        if len(lines) > 1:
            ax.legend(loc="lower left", bbox_to_anchor=(0, 1), frameon=False, ncols=min(4, len(lines)))
    return to_svg(fig, name)


@_styled
def stacked_chart(name: str, times: list[float], series: dict[str, list[float]], ylabel: str,
                  colours: dict[str, str] | None = None) -> str:
    fig = figure()
    ax = fig.subplots()
    if not times or not series:
        _empty(ax, ylabel)
    else:
        labels = list(series)
        cols = [(colours or {}).get(k, PALETTE[i % len(PALETTE)]) for i, k in enumerate(labels)]
        ax.stackplot(_dates(_closed(times)), *([*v, v[-1]] for v in series.values()), labels=labels, colors=cols, step="post", linewidth=0)
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        _time_axis(ax)
        ax.legend(loc="lower left", bbox_to_anchor=(0, 1), frameon=False, ncols=min(8, len(labels)), fontsize=8)
    return to_svg(fig, name)


@_styled
def bar_chart(name: str, items: list[tuple[str, float]], xlabel: str, *, colour: str = PALETTE[0],
              height_in: float | None = None) -> str:
    """Horizontal bars, largest on top; the value printed at the end of each bar."""
    fig = figure(WIDTH_IN, height_in or max(1.6, 0.22 * len(items) + 0.8))
    ax = fig.subplots()
    if not items:
        _empty(ax, xlabel)
    else:
        labels = [k for k, _ in items][::-1]
        values = [v for _, v in items][::-1]
        bars = ax.barh(labels, values, color=colour)
        ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], padding=3, fontsize=8)
        ax.set_xlabel(xlabel)
        ax.grid(axis="y", visible=False)
        ax.margins(x=0.12)
    return to_svg(fig, name)


@_styled
def histogram_chart(name: str, edges: tuple[float, ...], counts: list[int], xlabel: str, *,
                    mark: float | None = None, mark_label: str = "", seconds: bool = False) -> str:
    """Counts over log-spaced bins, drawn over the occupied bins only (one step outline, filled); the
    first bin (from 0) is drawn from half the second edge."""
    fig = figure(WIDTH_IN, 2.8)
    ax = fig.subplots()
    if not any(counts):
        _empty(ax, xlabel)
    else:
        pos = [edges[1] / 2 if e == 0 else e for e in edges]
        pos.append(pos[-1] * (pos[-1] / pos[-2]))
        used = [i for i, c in enumerate(counts) if c]
        lo, hi = max(0, used[0] - 1), min(len(counts), used[-1] + 2)
        if mark:
            lo = min(lo, max(0, bisect_right(pos, mark) - 2))
            hi = max(hi, min(len(counts), bisect_right(pos, mark) + 1))
        ax.stairs(counts[lo:hi], pos[lo:hi + 1], fill=True, color=PALETTE[0])
        if seconds:
            _seconds_axis(ax, pos[lo], pos[hi])
        else:
            ax.set_xscale("log")
        ax.set_xlim(pos[lo], pos[hi])
        ax.set_xlabel(xlabel)
        ax.set_ylabel("count")
        if mark:
            ax.axvline(mark, color=PALETTE[2], linewidth=1.5, linestyle="--")
            ax.text(mark, 0.97, f" {mark_label}", color=PALETTE[2], transform=ax.get_xaxis_transform(),
                    va="top", fontsize=8)
    return to_svg(fig, name)


@_styled
def gap_ranges_chart(name: str, hosts: list[tuple[str, float, float, float, float, float]], xlabel: str, *,
                     mark: float | None = None) -> str:
    """One row per host: (host, min, p10, median, p90, max) of its gaps on a log axis; the thin line
    runs from the smallest gap to the largest, the thick bar from p10 to p90, the dot is the median."""
    fig = figure(WIDTH_IN, max(1.8, 0.24 * len(hosts) + 1.0))
    ax = fig.subplots()
    if not hosts:
        _empty(ax, xlabel)
        return to_svg(fig, name)
    floor = min((h[1] for h in hosts if h[1] > 0), default=1e-3) / 2
    y = list(range(len(hosts)))[::-1]
    lo = [max(h[1], floor) for h in hosts]
    ax.hlines(y, lo, [max(h[5], floor) for h in hosts], color="#9498a0", linewidth=1)
    ax.hlines(y, [max(h[2], floor) for h in hosts], [max(h[4], floor) for h in hosts], color=PALETTE[0],
              linewidth=6)
    ax.scatter([max(h[3], floor) for h in hosts], y, color="white", edgecolor=PALETTE[0], zorder=3, s=22)
    ax.scatter(lo, y, marker="|", color="#1d1d1f", s=60, zorder=3)
    ax.set_yticks(y, [h[0] for h in hosts], fontsize=7.5)
    ax.set_ylim(-0.7, len(hosts) - 0.3)
    _seconds_axis(ax, min(lo + ([mark] if mark else [])), max(max(h[5] for h in hosts), mark or 0))
    ax.set_xlabel(xlabel)
    if mark:
        ax.axvline(mark, color=PALETTE[2], linewidth=1.5, linestyle="--")
    return to_svg(fig, name)


def _seconds_axis(ax, lo: float, hi: float) -> None:
    """Log x axis labelled in ms / s; over less than ~1.3 decades the minor ticks get labels too."""
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: _fmt_s(v)))
    narrow = hi / max(lo, 1e-9) < 20
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _pos: _fmt_s(v)) if narrow else NullFormatter())


def _fmt_s(s: float) -> str:
    if s == 0:
        return "0"
    if s < 1:
        return f"{s * 1000:.3g} ms"
    return f"{s:.4g} s" if s < 100 else f"{s:,.0f} s"


@_styled
def share_chart(name: str, parts: list[tuple[str, int]], title: str) -> str:
    """One stacked horizontal bar of shares (e.g. unique / exact duplicate / near duplicate)."""
    fig = figure(WIDTH_IN, 1.5)
    ax = fig.subplots()
    total = sum(v for _, v in parts)
    if not total:
        _empty(ax, title)
        return to_svg(fig, name)
    left = 0.0
    for i, (label, v) in enumerate(parts):
        share = v / total
        ax.barh([0], [share], left=left, color=PALETTE[i % len(PALETTE)], label=f"{label} {100 * share:.1f}%")
        left += share
    ax.set_xlim(0, 1)
    ax.set_yticks([])
    ax.xaxis.set_major_formatter(PercentFormatter(1.0))
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), frameon=False, ncols=len(parts))
    ax.set_title(title, loc="left", fontsize=9)
    return to_svg(fig, name)
