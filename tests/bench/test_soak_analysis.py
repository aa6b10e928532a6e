"""The soak's fits (bench/soak_bench.py analyse) on synthetic samples: a fill after the first pages,
a seen-set that stops growing, the crawl process's heap numbers."""


from tests.bench.scripts import load_bench

MIB = 1 << 20


soak = load_bench("soak_bench.py")


def samples(n=300, fill_pages=20_000, fill_bytes=8 * MIB, leak_b_per_page=0.0, seen_stops_at=None):
    """Every host active from the start; pages rise 500 per sample; RssAnon fills by ``fill_bytes``
    over the first ``fill_pages`` pages, then grows by ``leak_b_per_page``."""
    out = []
    for i in range(n):
        pages = 500 * i
        seen = 10 * pages if seen_stops_at is None else min(10 * pages, seen_stops_at)
        fill = fill_bytes * min(pages, fill_pages) / fill_pages
        anon = int(100 * MIB + fill + leak_b_per_page * pages)
        mem = {"VmRSS": anon + 50 * MIB, "RssAnon": anon, "VmHWM": anon + 50 * MIB}
        kept = anon - 1 * MIB
        out.append({"t_s": 3.0 * i, "pages": pages, "seen": seen, "queued": pages, "hosts_active": 100,
                    "hosts_total": 100, "mem": {"crawl": mem, "worker-1": dict(mem)},
                    "malloc": {"heap": 60 * MIB, "mmap": 40 * MIB, "in_use": 50 * MIB, "free": MIB,
                               "anon_after_trim": kept}})
    return out


def test_a_fill_after_the_first_pages_is_left_out_of_the_late_fit():
    a = soak.analyse(samples(), 100, 0.02, 0.5)     # warm-up ends at 3,000 pages, in the fill
    crawl = a["procs"]["crawl"]
    assert crawl["anon_slope_b_per_page"] > 10             # the whole span still sees the fill
    assert abs(crawl["anon_late_slope_b_per_page"]) < 0.01
    assert abs(crawl["retained_floor_slope_b_per_page"]) < 0.01
    assert a["late_pages_range"][0] >= 0.5 * 500 * 299


def test_a_leak_shows_in_the_late_fit():
    a = soak.analyse(samples(leak_b_per_page=5.0), 100, 0.1, 0.5)
    crawl = a["procs"]["crawl"]
    assert abs(crawl["anon_late_slope_b_per_page"] - 5.0) < 0.01
    assert abs(crawl["retained_floor_slope_b_per_page"] - 5.0) < 0.5


def test_per_url_fit_keeps_the_whole_span_when_the_seen_set_stops_growing():
    a = soak.analyse(samples(fill_bytes=0, seen_stops_at=1_000_000), 100, 0.1, 0.5)
    assert a["seen_range"][1] - a["seen_range"][0] > 0      # URLs grew in the span that is fitted per URL
    assert a["procs"]["crawl"]["anon_slope_b_per_url"] is not None
    assert "heap_in_use_slope_b_per_page" in a["procs"]["crawl"]
    assert "heap_in_use_slope_b_per_page" not in a["procs"]["workers"]


def test_hosts_running_out_of_urls_late_in_the_run_do_not_empty_the_late_span():
    ss = samples()
    for s in ss[200:]:
        s["hosts_active"] = 70          # hosts done: below 95 % of the peak from the last third on
    a = soak.analyse(ss, 100, 0.1, 0.5)
    assert a["late_samples"] > 100
    assert "heap_in_use_slope_b_per_page" in a["procs"]["crawl"]


def test_the_warm_up_waits_for_the_caps_that_fill():
    ss = samples(fill_bytes=0)
    cap = 4 * MIB
    for i, s in enumerate(ss):
        # a cache filling until sample 150, one that never comes near its cap (a sawtooth)
        # and a bound on a transient (it reports its peak) at its bound once, late: it never fills
        s["components_full"] = {"reads": {"bytes": min(i, 150) * cap // 150, "cap_bytes": cap},
                                "delta": {"bytes": (i % 10) * cap // 20, "cap_bytes": cap},
                                "unlanded": {"bytes": cap if i == 250 else 0, "cap_bytes": cap,
                                             "peak_bytes": cap if i in (250, 251) else 0}}
    assert 0.85 * 150 < soak.caps_full(ss) <= 150                        # the filling one, once full
    a = soak.analyse(ss, 100, 0.1, 0.5)
    assert a["warmup_samples"] == soak.caps_full(ss)
    for s in ss:
        del s["components_full"]
    assert soak.analyse(ss, 100, 0.1, 0.5)["warmup_samples"] == 30      # the share of samples alone


def test_the_block_scan_finds_each_mapped_block_with_its_resident_pages():
    # --diag: glibc's blocks mapped alone, one by one (the kernel merges neighbouring maps, so
    # only the chunk headers tell them apart); a block written whole is resident whole, one
    # never written only the page of its header, and the scan itself faults nothing in
    import ctypes
    import os

    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    # above glibc's largest dynamic mmap threshold (32 MiB): mapped alone whatever ran before
    written = bytearray(b"\x01" * (34 * MIB))
    untouched = libc.malloc(40 * MIB)
    try:
        addr = ctypes.addressof((ctypes.c_char * len(written)).from_buffer(written))
        for _ in range(2):                      # a second scan reads the same: nothing faulted in
            got = soak.anon_blocks(os.getpid())
            by_start = {c[0] + 16: c for c in got["chunks"]}
            assert by_start[addr][1] >= 34 * MIB and by_start[addr][2] == by_start[addr][1]
            # its header page (a 2 MiB page where transparent huge pages are always on)
            assert by_start[untouched][1] >= 40 * MIB and 4096 <= by_start[untouched][2] <= 2 * MIB
            assert by_start[addr][3] == "01" * 24
    finally:
        libc.free(untouched)


def test_the_slope_comes_with_an_interval_that_holds_a_leak_under_noise():
    # a 5 B/page leak under a swing that lasts several samples (an answer batch, a heap swing):
    # the interval holds the leak, and excludes both no growth and the per-page bound's 2 B
    import random

    rng = random.Random(5)
    ss = samples(fill_bytes=0, leak_b_per_page=5.0)
    swing = 0.0
    for s in ss:
        swing = 0.8 * swing + rng.gauss(0, 0.05 * MIB)
        s["mem"]["crawl"]["RssAnon"] += int(swing)
    a = soak.analyse(ss, 100, 0.1, 0.5)
    crawl = a["procs"]["crawl"]
    lo, hi = crawl["anon_slope_ci95_b_per_page"]
    assert lo < crawl["anon_slope_b_per_page"] < hi
    assert 2.0 < lo < 5.0 < hi
    assert 0.02 * MIB < crawl["anon_resid_sd"] < 0.5 * MIB
    flat = soak.analyse(samples(fill_bytes=0), 100, 0.1, 0.5)["procs"]["crawl"]["anon_slope_ci95_b_per_page"]
    assert flat[0] == flat[1] == 0.0 or abs(flat[0]) < 1e-6


def test_python_arena_steps_in_the_fit_are_named_with_their_share_of_the_slope():
    # --diag: the arena count (a running maximum of live Python objects) steps by 2 MiB a third of
    # the way in; the slope counts it, and the analysis says how much of it that step is
    ss = samples(fill_bytes=0)
    for i, s in enumerate(ss):
        arenas = 70 + (2 if i >= 130 else 0)
        s["mem"]["crawl"]["RssAnon"] += (arenas - 70) * MIB
        s["malloc"]["diag"] = {"pymalloc": {"arenas": arenas, "allocated": 60 * MIB + (i % 7) * MIB}}
    a = soak.analyse(ss, 100, 0.1, 0.5)
    crawl = a["procs"]["crawl"]
    assert crawl["arena_steps"] == [(ss[130]["t_s"], 2)]
    assert (crawl["arenas_first"], crawl["arenas_last"]) == (70, 72)
    assert abs(crawl["arenas_slope_b_per_page"] - crawl["anon_slope_b_per_page"]) < 0.01
    assert crawl["anon_slope_b_per_page"] > 2.0
    assert crawl["allocated_range"] == [60 * MIB, 66 * MIB]
    assert "arena_steps" not in a["procs"]["workers"]
    lines = soak.summary_lines({"samples": ss, "disk_bytes": {}, "rc": 0, "wall_s": 1.0}, a)
    assert any("steps at 390 s (+2)" in line for line in lines), lines


def test_the_parts_name_which_thread_arena_grows():
    # --diag: a thread arena's heap (the DRUM thread's) gains 1 MiB resident and its glibc arena
    # 1 MiB in use over the fit while the brk heap only swings; the parts by thirds say so, with
    # the threads that allocate from each heap
    ss = samples(fill_bytes=0)
    base = 0x7F00_0000_0000
    for i, s in enumerate(ss):
        grow = MIB * i // len(ss)
        swing = (i % 5) * 64 * 1024
        s["malloc"]["diag"] = {
            "pymalloc": {"arenas": 70, "allocated": 60 * MIB},
            "arenas": [{"arena": 0, "system": 80 * MIB, "free": 8 * MIB - swing},
                       {"arena": 1, "system": 4 * MIB, "free": 3 * MIB - grow}, {"mmap_count": 3, "mmap": 9 * MIB}],
            "thread_heaps": {"MainThread": "[heap]", "crawlerd-intake": "[heap]", "drum": hex(base)}}
        s["crawl_blocks"] = {"rest": [[0x55_0000_0000, 80 * MIB, 70 * MIB + swing, "[heap]"],
                                      [base, 4 * MIB, MIB + grow, "other"],
                                      [base + 64 * MIB + 4096, MIB, MIB, "other"]]}
    a = soak.analyse(ss, 100, 0.1, 0.5)
    parts = a["procs"]["crawl"]["parts_by_thirds"]
    first, last = parts[f"heap {base:#x} resident (drum)"]
    assert 0.5 * MIB < last - first < MIB
    first, last = parts["glibc arena 1 in use"]
    assert 0.5 * MIB < last - first < MIB
    first, last = parts["brk heap resident (MainThread, crawlerd-intake)"]
    assert abs(last - first) < 0.1 * MIB
    assert parts["Python arenas (count x 1 MiB)"] == [70 * MIB, 70 * MIB]
    assert not [k for k in parts if k.startswith(f"heap {base + 64 * MIB + 4096:#x}")]    # not a heap's start
    assert "parts_by_thirds" not in a["procs"]["workers"]
    lines = soak.summary_lines({"samples": ss, "disk_bytes": {}, "rc": 0, "wall_s": 1.0}, a)
    assert any(f"heap {base:#x} resident (drum)" in line and "first -> last third" in line for line in lines)


def test_each_memory_component_gets_its_own_slope_per_page_beside_rssanon():
    """The fit window's parts: a component still growing shows its B/page, one at its cap ~0, and
    the summary names them, the steepest first."""
    ss = samples(fill_bytes=0, leak_b_per_page=3.0)
    cap = 4 * MIB
    for s in ss:
        s["components_full"] = {"grows": {"bytes": 1 * MIB + 2 * s["pages"], "cap_bytes": 64 * MIB},
                                "full": {"bytes": cap, "cap_bytes": cap}}
        s["crawl_maps"] = {"anon": 80 * MIB + 3 * s["pages"], "heap": 20 * MIB, "libs": 9 * s["pages"]}
    a = soak.analyse(ss, 100, 0.1, 0.5)
    parts = a["component_slopes"]
    assert abs(parts["grows"]["slope"] - 2.0) < 1e-6 and parts["grows"]["cap"] == 64 * MIB
    assert abs(parts["full"]["slope"]) < 1e-9
    assert abs(parts["maps.anon"]["slope"] - 3.0) < 1e-6 and abs(parts["maps.heap"]["slope"]) < 1e-9
    assert "maps.libs" not in parts                      # file-backed: not part of RssAnon
    assert abs(parts["C heap in use (and mapped blocks)"]["slope"]) < 1e-9
    line = next(x for x in soak.summary_lines({"samples": ss, "disk_bytes": {}, "rc": 0, "wall_s": 1.0}, a)
                if "parts over the fit" in x)
    assert line.index("maps.anon +3.00") < line.index("grows +2.00") < line.index("full +0.00")
