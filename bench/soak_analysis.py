"""The soak's analysis (``bench/soak_bench.py``): per process, the fitted growth of RSS and RssAnon
after the warm-up against URLs seen and pages fetched, with the per-page slope's interval and,
with ``--diag``, the crawl process's Python arena steps and C heap beside it."""

from __future__ import annotations

import random

MEM_FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem")


def fit(xs: list[float], ys: list[float]) -> dict:
    """Least-squares line y = slope * x + intercept, with r^2 (plain sums, no numpy needed)."""
    n = len(xs)
    if n < 3:
        return {"n": n, "slope": None, "intercept": None, "r2": None}
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    syy = sum((y - my) ** 2 for y in ys)
    if sxx == 0:
        return {"n": n, "slope": None, "intercept": None, "r2": None}
    slope = sxy / sxx
    r2 = (sxy * sxy) / (sxx * syy) if syy else 1.0
    return {"n": n, "slope": slope, "intercept": my - slope * mx, "r2": r2}


def residual_sd(xs: list[float], ys: list[float], f: dict) -> float | None:
    """Standard deviation of the samples about ``f``'s line (bytes)."""
    if f["slope"] is None:
        return None
    res = [y - (f["slope"] * x + f["intercept"]) for x, y in zip(xs, ys, strict=True)]
    return (sum(e * e for e in res) / len(res)) ** 0.5


FLOOR_WINDOWS = 10         # the fitted span cut into this many windows for the floor fit


def floor_points(xs: list[float], ys: list[float], windows: int = FLOOR_WINDOWS) -> tuple[list[float], list[float]]:
    """The lowest sample of each of ``windows`` consecutive runs of samples: the memory a process
    keeps, without what is only in flight at a sample (bodies, a DRUM answer batch, a burst after a
    loop stall). A fit through these says whether the floor rises; the plain fit also counts spikes."""
    n = len(xs)
    if n < 2 * windows:
        return xs, ys
    fx, fy = [], []
    for w in range(windows):
        lo, hi = w * n // windows, (w + 1) * n // windows
        i = min(range(lo, hi), key=lambda k: ys[k])
        fx.append(xs[i])
        fy.append(ys[i])
    return fx, fy


BOOT_BLOCK = 10            # samples per block of the moving-block bootstrap (30 s at the test's interval)
BOOT_DRAWS = 400


def slope_interval(xs: list[float], ys: list[float], block: int = BOOT_BLOCK, draws: int = BOOT_DRAWS,
                   seed: int = 1) -> tuple[float, float] | None:
    """95 % interval of ``fit``'s slope by a moving-block bootstrap of its residuals: the samples'
    noise is not independent (an answer batch or a heap swing lasts several samples), so the
    residuals are redrawn in runs of ``block`` consecutive samples and the line refitted. At a
    few bytes per page against MiB of noise, one soak's slope means little without it."""
    n = len(xs)
    f = fit(xs, ys)
    if f["slope"] is None or n < 3 * block:
        return None
    line = [f["slope"] * x + f["intercept"] for x in xs]
    res = [y - yl for y, yl in zip(ys, line, strict=True)]
    rng = random.Random(seed)
    slopes = []
    for _ in range(draws):
        rr: list[float] = []
        while len(rr) < n:
            i = rng.randrange(0, n - block + 1)
            rr += res[i:i + block]
        slopes.append(fit(xs, [yl + e for yl, e in zip(line, rr, strict=False)])["slope"])
    slopes.sort()
    return slopes[int(0.025 * draws)], slopes[int(0.975 * draws) - 1]


def arena_part(after: list[dict], pages: list[float]) -> dict:
    """With --diag: the crawl process's Python arenas (1 MiB each, mapped resident whole) in the fit:
    their count is a running maximum of live Python objects (an arena goes back only when empty),
    so it rises in steps, and a step's place against the fit's span moves the slope by MiB over
    the span's pages. Reported beside the slope (which counts it), not taken out of it."""
    counts = [s.get("malloc", {}).get("diag", {}).get("pymalloc", {}).get("arenas") for s in after]
    if not counts or any(c is None for c in counts):
        return {}
    steps = [(s["t_s"], b - a) for s, a, b in zip(after[1:], counts[:-1], counts[1:], strict=True) if b > a]
    return {"arenas_first": counts[0], "arenas_last": counts[-1], "arena_steps": steps,
            "arenas_slope_b_per_page": fit(pages, [float(c << 20) for c in counts])["slope"],
            "allocated_first": after[0]["malloc"]["diag"]["pymalloc"].get("allocated"),
            "allocated_range": [min(s["malloc"]["diag"]["pymalloc"].get("allocated", 0) for s in after),
                                max(s["malloc"]["diag"]["pymalloc"].get("allocated", 0) for s in after)]}


_THREAD_HEAP = 64 << 20     # glibc's thread arenas take their heaps 64 MiB-aligned


def parts_by_thirds(after: list[dict]) -> dict[str, list[float]]:
    """With --diag: the crawl process's anonymous memory split into its parts, each part's mean over
    the first and the last third of the fit, bytes (``[first, last]``): RssAnon; Python's arenas
    (count x 1 MiB) and its allocated blocks; each glibc arena's bytes in use (``malloc_info``:
    extent less free chunks; arena 0 is the brk heap) and its blocks mapped alone; the resident
    bytes of the brk heap and of each thread arena's heap from the block scan, named by the threads
    that allocate from it (``thread_heaps``: ``heap 0x7f.. (drum, crawlerd-sync)``). A part that
    grows from third to third is what the slope is made of; one that swings is noise."""
    n = len(after) // 3
    if n == 0 or not all(s.get("malloc", {}).get("diag") for s in after):
        return {}
    threads: dict[str, list[str]] = {}
    for name, heap in after[-1]["malloc"]["diag"].get("thread_heaps", {}).items():
        threads.setdefault(heap, []).append(name)

    def parts(s: dict) -> dict[str, float]:
        dg = s["malloc"]["diag"]
        out = {"RssAnon": float(s["mem"]["crawl"].get("RssAnon", 0))}
        pm = dg.get("pymalloc", {})
        if pm:
            out["Python arenas (count x 1 MiB)"] = float(pm.get("arenas", 0) << 20)
            out["Python allocated blocks"] = float(pm.get("allocated", 0))
        for a in dg.get("arenas", []):
            if "arena" in a:
                out[f"glibc arena {a['arena']} in use"] = float(a["system"] - a["free"])
            else:
                out["glibc blocks mapped alone"] = float(a.get("mmap", 0))
        for lo, size, rss, name in s.get("crawl_blocks", {}).get("rest", []):
            if name == "[heap]":
                key = "brk heap resident (" + ", ".join(threads.get("[heap]", [])) + ")"
            elif name == "other" and lo % _THREAD_HEAP == 0 and size <= _THREAD_HEAP:
                key = f"heap {lo:#x} resident (" + ", ".join(threads.get(hex(lo), [])) + ")"
            else:
                continue
            out[key] = out.get(key, 0.0) + rss
        return out
    ps = [parts(s) for s in after]
    keys = sorted(set().union(*ps))
    return {k: [sum(p.get(k, 0.0) for p in ps[:n]) / n, sum(p.get(k, 0.0) for p in ps[-n:]) / n] for k in keys}


def warmup_end(samples: list[dict], hosts: int, min_fraction: float, min_pages_fraction: float = 0.0) -> int:
    """Index of the first sample after the warm-up: every host taken up (hosts_total == hosts), the
    active-host count past its peak, the RAM caps that fill full (``caps_full``), at least ``min_fraction`` of the samples behind us (the caps
    fill with the first few hundred thousand URLs) and at least ``min_pages_fraction`` of the run's
    pages fetched. Pages start only after the robots.txt round (two minutes on a loaded box), and
    the processes' own fills (the LMDB stores' page buffers, a worker's parser and capture caches)
    follow the pages, not the clock: a fit that starts with the first pages reads those fills as a
    slope. A leak grows as fast in the second half of a run as in the first; a fill does not.

    The active hosts peak once every host has its first URLs and then fall while the crawl goes on:
    the domain budgets defer most new URLs of a host (ARCHITECTURE.md, "Budgets") and a host whose
    queue runs dry is inactive until they are readmitted. That frees little (a host's slot and its
    arrays are reused, not shrunk), and the analysis reports the active-host range beside the fit."""
    if not samples:
        return 0
    peak = max(s["hosts_active"] for s in samples)
    at_peak = next(i for i, s in enumerate(samples) if s["hosts_active"] >= 0.95 * peak)
    start = max(at_peak, int(len(samples) * min_fraction), caps_full(samples))
    min_pages = min_pages_fraction * samples[-1]["pages"]
    for i, s in enumerate(samples):
        if i >= start and s["hosts_total"] >= hosts and s["pages"] >= min_pages:
            return i
    return len(samples)


CAP_FULL = 0.9      # a bounded component holding this share of its cap is full


def caps_full(samples: list[dict]) -> int:
    """Index of the first sample from which every bounded component that fills in this run (holds
    ``CAP_FULL`` of its cap at some sample: `crawlerd stats` memory) has filled: until then its
    growth is a cap filling, not growth without a cap. A component that never comes near its cap
    in the run (a sawtooth, a cache the crawl does not need whole) does not hold the warm-up back,
    nor does a bound on a transient (one that reports ``peak_bytes``: it swings, it never fills)."""
    firsts = []
    for name in {k for s in samples for k, c in s.get("components_full", {}).items() if "peak_bytes" not in c}:
        full = [i for i, s in enumerate(samples) if (c := s.get("components_full", {}).get(name))
                and c.get("cap_bytes") and c["bytes"] >= CAP_FULL * c["cap_bytes"]]
        if full:
            firsts.append(full[0])
    return max(firsts, default=0)


ANON_MAPS = ("heap", "anon")     # crawl_maps' anonymous kinds (smaps_groups in soak_bench.py)


def component_slopes(after: list[dict]) -> dict[str, dict[str, float]]:
    """Each part of the crawl's memory fitted against pages over the fit window, beside RssAnon:
    every bounded component `crawlerd stats` reports (memory.*: its estimated bytes, with its cap),
    the C heap in use and the resident anonymous mappings (``crawl_maps``: the brk heap, the other
    anonymous maps; RssAnon is their sum with the stacks). A component
    at its cap has a slope near 0; one that rises per page is the part of RssAnon's slope to read
    first. ``{name: {"slope": B/page, "first": bytes, "last": bytes, "cap": bytes (0: none)}}``."""
    pages = [float(s["pages"]) for s in after]
    if len(after) < 3 or pages[-1] <= pages[0]:
        return {}
    series: dict[str, list[float | None]] = {}
    caps: dict[str, int] = {}

    def add(name: str, i: int, v: float) -> None:
        series.setdefault(name, [None] * len(after))[i] = v
    for i, s in enumerate(after):
        for name, c in s.get("components_full", {}).items():
            add(name, i, float(c.get("bytes", 0)))
            caps[name] = max(caps.get(name, 0), int(c.get("cap_bytes", 0) or 0))
        m = s.get("malloc", {})
        if m.get("in_use") is not None:
            add("C heap in use (and mapped blocks)", i, float(m["in_use"] + m.get("mmap", 0)))
        for kind in ANON_MAPS:
            if kind in s.get("crawl_maps", {}):
                add(f"maps.{kind}", i, float(s["crawl_maps"][kind]))
    out = {}
    for name, ys in series.items():
        pts = [(x, y) for x, y in zip(pages, ys, strict=True) if y is not None]
        if len(pts) < 3:
            continue
        f = fit([x for x, _ in pts], [y for _, y in pts])
        out[name] = {"slope": f["slope"], "first": pts[0][1], "last": pts[-1][1], "cap": caps.get(name, 0)}
    return out


def heap_fits(after: list[dict], pages: list[float]) -> dict:
    """The crawl process's C heap (glibc mallinfo2 from `crawlerd stats`, when the daemon reports it)
    fitted against pages: bytes handed out (``in_use``: live, what a leak would grow) and the heaps'
    extent (``heap``: sbrk and thread heaps, resident or not). RssAnon minus live C heap and Python's
    own arenas is what the trims have not yet given back."""
    if len(after) != len(pages) or not all(s.get("malloc", {}).get("in_use") is not None for s in after):
        return {}
    in_use = fit(pages, [float(s["malloc"]["in_use"] + s["malloc"]["mmap"]) for s in after])
    extent = fit(pages, [float(s["malloc"]["heap"]) for s in after])
    # RssAnon read by the daemon right after its last trim, the lowest of each tenth of the run:
    # what the process keeps, without the churn a trim returns and the in-flight peaks
    kept = [(p, float(s["malloc"]["anon_after_trim"])) for p, s in zip(pages, after, strict=True)
            if s["malloc"].get("anon_after_trim")]
    retained = fit(*floor_points([p for p, _ in kept], [y for _, y in kept])) if kept else {"slope": None}
    return {"heap_in_use_slope_b_per_page": in_use["slope"], "heap_extent_slope_b_per_page": extent["slope"],
            "retained_floor_slope_b_per_page": retained["slope"],
            "heap_in_use_first": after[0]["malloc"]["in_use"], "heap_in_use_last": after[-1]["malloc"]["in_use"],
            "heap_extent_first": after[0]["malloc"]["heap"], "heap_extent_last": after[-1]["malloc"]["heap"],
            "trim_ms_max": max(s["malloc"].get("trim_ms_max", 0) for s in after)}


def analyse(samples: list[dict], hosts: int, warmup_fraction: float = 0.3, warmup_pages_fraction: float = 0.5) -> dict:
    """Per process (the crawl process; the workers summed, as the pool may replace one), fitted slopes
    of RSS and RssAnon after the warm-up against URLs seen and against pages, bytes per URL / page;
    also per page over the part of the run after ``warmup_pages_fraction`` of its pages (the
    *late* span, see warmup_end: without the fills that follow the first pages) and, for the crawl
    process, its C heap and RssAnon right after its trims over that span. The seen-set's growth
    slows down and may stop before the end of a run (a web whose links are all known), so the
    per-URL fit keeps the whole span after the warm-up."""
    w = warmup_end(samples, hosts, warmup_fraction)
    after = samples[w:]
    # the late span: from the warm-up's end, once that share of the pages is fetched (hosts that ran
    # out of URLs by then do not end it again)
    min_pages = warmup_pages_fraction * samples[-1]["pages"] if samples else 0
    wl = next((i for i in range(w, len(samples)) if samples[i]["pages"] >= min_pages), len(samples))
    late = samples[wl:]
    out = {"warmup_samples": w, "fit_samples": len(after), "warmup_pages_fraction": warmup_pages_fraction,
           "late_samples": len(late), "procs": {}}
    if not after:
        return out
    if late:
        out["late_pages_range"] = [late[0]["pages"], late[-1]["pages"]]
    out["seen_range"] = [after[0]["seen"], after[-1]["seen"]]
    out["pages_range"] = [after[0]["pages"], after[-1]["pages"]]
    out["queued_range"] = [after[0]["queued"], after[-1]["queued"]]
    out["hosts_active_range"] = [min(s["hosts_active"] for s in after), max(s["hosts_active"] for s in after)]
    out["component_slopes"] = component_slopes(after)

    def series(s: dict) -> dict[str, dict[str, int]]:
        m = s["mem"]
        workers = [v for k, v in m.items() if k.startswith("worker-")]
        d = {}
        if "crawl" in m:
            d["crawl"] = m["crawl"]
        if workers:
            d["workers"] = {f: sum(v.get(f, 0) for v in workers) for f in MEM_FIELDS}
        return d

    first, last = after[0].get("crawl_maps", {}), after[-1].get("crawl_maps", {})
    out["crawl_maps_growth"] = {k: last.get(k, 0) - first.get(k, 0) for k in sorted(set(first) | set(last))
                                if abs(last.get(k, 0) - first.get(k, 0)) >= 1 << 20}
    for name in ("crawl", "workers"):
        pts = [(s["seen"], series(s)[name]) for s in after if name in series(s)]
        if not pts:
            continue
        xs = [float(x) for x, _ in pts]
        rss = fit(xs, [float(m["VmRSS"]) for _, m in pts])
        anon = fit(xs, [float(m.get("RssAnon", 0)) for _, m in pts])
        # the growth per page fetched, over the late span (pages and URLs seen rise together; this is
        # not a second regressor)
        late_pts = [(float(s["pages"]), series(s)[name]) for s in late if name in series(s)]
        pages = [x for x, _ in late_pts]
        anon_ys = [float(m.get("RssAnon", 0)) for _, m in late_pts]
        late_fit = fit(pages, anon_ys)
        late_floor = fit(*floor_points(pages, anon_ys))
        all_pages = [float(s["pages"]) for s in after if name in series(s)]
        all_anon = [float(m.get("RssAnon", 0)) for _, m in pts]
        per_page = fit(all_pages, all_anon)
        interval = slope_interval(all_pages, all_anon)
        floor = fit(*floor_points(all_pages, all_anon))
        out["procs"][name] = {
            "rss_slope_b_per_url": rss["slope"], "rss_r2": rss["r2"],
            "anon_slope_b_per_url": anon["slope"], "anon_r2": anon["r2"],
            "anon_slope_b_per_page": per_page["slope"],
            "anon_slope_ci95_b_per_page": interval,
            "anon_resid_sd": residual_sd(all_pages, all_anon, per_page),
            "anon_floor_slope_b_per_page": floor["slope"],
            "anon_late_slope_b_per_page": late_fit["slope"],
            "anon_late_floor_slope_b_per_page": late_floor["slope"],
            "rss_first": pts[0][1]["VmRSS"], "rss_last": pts[-1][1]["VmRSS"],
            "anon_first": pts[0][1].get("RssAnon", 0), "anon_last": pts[-1][1].get("RssAnon", 0),
            "hwm_max": max(m.get("VmHWM", 0) for _, m in pts),
            **(heap_fits([s for s in late if name in series(s)], pages) if name == "crawl" and late_pts else {}),
            **(arena_part(after, all_pages) if name == "crawl" else {}),
            **({"parts_by_thirds": parts_by_thirds(after)} if name == "crawl" and parts_by_thirds(after) else {}),
            "rss_max_all": max(series(s)[name]["VmRSS"] for s in samples if name in series(s)),
        }
    return out
