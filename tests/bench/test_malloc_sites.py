"""bench/malloc_sites: the preloaded malloc counter names the C call sites that still hold bytes."""

import os
import shutil
import subprocess
import sys

import pytest

from tests.bench.scripts import load_bench

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("gcc") is None,
                                reason="needs Linux, glibc and gcc")

PROGRAM = r"""
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__attribute__((noinline)) void *early_site(size_t n) { void *p = malloc(n); memset(p, 1, n); return p; }
__attribute__((noinline)) void *leaky_site(size_t n) { void *p = malloc(n); memset(p, 1, n); return p; }
__attribute__((noinline)) void *grown_site(size_t n) { void *p = calloc(1, 16); return realloc(p, n); }
__attribute__((noinline)) void balanced_site(void **held, int k, size_t n) {
    for (int i = 0; i < k; i++)
        held[i] = malloc(n);
    for (int i = 0; i < k; i++)
        free(held[i]);
}

static int dumped(const char *dir) {    /* the first dump is written once recording has started */
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d)))
        n += strncmp(e->d_name, "sites.", 6) == 0;
    if (d)
        closedir(d);
    return n;
}

int main(int argc, char **argv) {
    static void *keep[2000];
    const char *preload = getenv("LD_PRELOAD");
    printf("LD_PRELOAD=%s\n", preload ? preload : "");
    usleep(100000);                     /* 0.1 s in: before the recording starts (0.3 s) */
    for (int i = 0; i < 100; i++)
        keep[i] = early_site(700);
    for (int i = 0; i < 3000 && !dumped(argv[1]); i++)
        usleep(10000);
    for (int i = 0; i < 1000; i++)
        keep[100 + i] = leaky_site(1000);
    for (int i = 0; i < 10; i++)
        keep[1100 + i] = grown_site(4000);
    balanced_site(keep + 1200, 50, 3000);     /* last: nothing reuses the freed blocks after it */
    return keep[0] == NULL;
}
"""


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """The program run under the counter (recording from 0.3 s, a dump every second and at exit);
    built at -O0, so that gcc does not elide the malloc/free pair of ``balanced_site``."""
    ms = load_bench("malloc_sites.py")
    d = tmp_path_factory.mktemp("malloc_sites")
    src = d / "leak.c"
    src.write_text(PROGRAM)
    exe = str(d / "leak")
    subprocess.run(["gcc", "-O0", "-g", "-o", exe, str(src)], check=True)
    lib = ms.build(str(d))
    out = d / "dumps"
    env = dict(os.environ, **ms.preload_env(lib, str(out), start_s=0.3, every_s=1.0))
    run = subprocess.run([exe, str(out)], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    dumps = ms.dumps_in(str(out), with_exit=True)
    return ms, run, dumps, ms.report([dumps[-1]], top=10, depth=2)


def _site_rows(report):
    start = next(i for i, line in enumerate(report) if line.startswith("--- by call site"))
    end = next(i for i, line in enumerate(report) if i > start and line.startswith("---"))
    return report[start + 1:end]


def test_the_leaking_call_site_is_named_first_with_its_bytes(traced):
    ms, run, dumps, report = traced
    assert dumps[-1]["head"]["why"] == "exit"
    rows = _site_rows(report)
    assert "leaky_site (leak.c:" in rows[0], report
    assert " b main C " in rows[0]                     # the brk heap, the main thread, not Python's
    assert float(rows[0].split("now")[1].split()[0]) == pytest.approx(1000 * 1000 / 1024, rel=0.01)


def test_a_block_freed_again_is_not_held_and_a_realloc_holds_its_new_size(traced):
    ms, run, dumps, report = traced
    rows = _site_rows(report)
    assert not any("balanced_site" in r for r in rows), report
    grown = [r for r in rows if "grown_site (leak.c:" in r]
    assert len(grown) == 1, report
    assert float(grown[0].split("now")[1].split()[0]) == pytest.approx(10 * 4000 / 1024, rel=0.01)


def test_what_was_allocated_before_the_start_is_not_counted(traced):
    ms, run, dumps, report = traced
    assert not any("early_site" in r for r in report), report


def test_the_processes_it_starts_do_not_inherit_it(traced):
    ms, run, dumps, report = traced
    assert "LD_PRELOAD=\n" in run.stdout
