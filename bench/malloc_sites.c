/* malloc_sites: which C call sites still hold heap bytes, counted live from a start time on.
 *
 * A diagnosis tool, off unless preloaded: bench/malloc_sites.py builds it (gcc) and reads what it
 * writes; `bench/soak_bench.py --malloc-sites` preloads it into the crawl process only.
 *
 *     LD_PRELOAD=malloc_sites.so MALLOC_SITES_OUT=DIR/sites MALLOC_SITES_START_S=300 \
 *         MALLOC_SITES_DUMP_S=60 MALLOC_SITES_DEPTH=8 program ...
 *
 * From MALLOC_SITES_START_S seconds after the process started, every malloc, calloc, realloc and
 * aligned allocation is recorded with its call chain (backtrace(3), MALLOC_SITES_DEPTH frames
 * above the allocator); a free of a recorded block subtracts it again. Blocks allocated before the
 * start are not seen (like tracemalloc's late start: the warm-up's caches are not counted, only
 * what was allocated after the start and is still live). Every MALLOC_SITES_DUMP_S seconds, and at
 * exit, a dump DIR/sites.<pid>.<seconds since start, 7 digits>[.exit].txt lists every chain still holding
 * bytes: "live_bytes live_blocks allocs heap main addr,addr,...", where heap is where glibc put the
 * blocks (b: the brk heap, glibc's main arena; t: a thread arena; m: mapped alone) and main is 1
 * for the process's main thread; after "## maps", /proc/self/maps, so the reader can resolve the
 * addresses offline (addr2line) without calling the dynamic loader from inside malloc.
 *
 * Only the process that loaded it is traced: its constructor takes the library out of LD_PRELOAD
 * (children that exec do not load it) and a fork's child stops recording. The tables are mapped
 * once and resident from the start (MAP_POPULATE, ~42 MiB: a fixed cost, so a soak's slope of
 * private memory is not the tables faulting in as blocks hash over them); when they are
 * three-quarters full new blocks are not recorded and the dump's header counts them as dropped.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

#define MAX_DEPTH 16
#define SKIP 2                      /* record() and the hook itself */
#define BLOCK_BITS 21               /* 2 M slots, 1.5 M blocks recorded at most (16 B each: 32 MiB) */
#define SITE_BITS 15                /* 32 k slots, 24 k call chains at most (~5 MiB) */
#define NO_SITE UINT32_MAX

typedef struct { uintptr_t ptr; uint32_t size; uint32_t site; } Block;
typedef struct {
    uint64_t key;
    int64_t live_bytes, live_blocks;
    uint64_t allocs;
    uint8_t depth, heap, main;
    uintptr_t frames[MAX_DEPTH];
} Site;

static Block *blocks;
static Site *sites, *snap;
static size_t block_used, site_used;
static uint64_t dropped;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t dump_lock = PTHREAD_MUTEX_INITIALIZER;
static volatile int active;         /* recording (set by the dump thread once the start passed) */
static int depth = 8;
static pid_t owner;
static double start_s, dump_s = 60.0, t_load;
static char prefix[1024];
static __thread int in_hook;        /* this thread is inside the tool: its allocations pass through */
static __thread pid_t tid;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline size_t block_slot(uintptr_t p) {
    return (size_t)(((uint64_t)(p >> 4) * 0x9E3779B97F4A7C15ull) >> (64 - BLOCK_BITS));
}

static uint32_t site_for(uintptr_t *frames, int n, int heap, int main_thread) {
    uint64_t key = 1469598103934665603ull ^ (uint64_t)(heap * 2 + main_thread);
    for (int i = 0; i < n; i++)
        key = (key ^ frames[i]) * 1099511628211ull;
    key |= 1;                                           /* 0 marks an empty slot */
    size_t mask = ((size_t)1 << SITE_BITS) - 1, i = (size_t)(key >> 17) & mask;
    while (sites[i].key && sites[i].key != key)
        i = (i + 1) & mask;
    if (!sites[i].key) {
        if (site_used >= (mask + 1) * 3 / 4)
            return NO_SITE;
        Site *s = &sites[i];
        s->key = key;
        s->depth = (uint8_t)n;
        s->heap = (uint8_t)heap;
        s->main = (uint8_t)main_thread;
        memcpy(s->frames, frames, n * sizeof(uintptr_t));
        site_used++;
    }
    return (uint32_t)i;
}

static void block_forget_at(size_t i) {
    size_t mask = ((size_t)1 << BLOCK_BITS) - 1, j = i;
    for (;;) {                      /* linear probing's deletion: shift back what probed past i */
        j = (j + 1) & mask;
        if (!blocks[j].ptr)
            break;
        size_t k = block_slot(blocks[j].ptr);
        if (i <= j ? (i < k && k <= j) : (i < k || k <= j))
            continue;
        blocks[i] = blocks[j];
        i = j;
    }
    blocks[i].ptr = 0;
    block_used--;
}

/* under lock: drop p's record, if it has one */
static void forget_locked(uintptr_t p) {
    size_t mask = ((size_t)1 << BLOCK_BITS) - 1, i = block_slot(p);
    while (blocks[i].ptr && blocks[i].ptr != p)
        i = (i + 1) & mask;
    if (!blocks[i].ptr)
        return;
    Site *s = &sites[blocks[i].site];
    s->live_bytes -= blocks[i].size;
    s->live_blocks--;
    block_forget_at(i);
}

static void forget(void *p) {
    if (!p || !active || in_hook)
        return;
    in_hook = 1;
    pthread_mutex_lock(&lock);
    forget_locked((uintptr_t)p);
    pthread_mutex_unlock(&lock);
    in_hook = 0;
}

static void *__attribute__((noinline)) record(void *p, size_t size) {
    if (!p || !active || in_hook)
        return p;
    in_hook = 1;
    void *raw[MAX_DEPTH + SKIP];
    int n = backtrace(raw, depth + SKIP) - SKIP;
    if (n < 0)
        n = 0;
    size_t head = ((size_t *)p)[-1];                    /* glibc's chunk header: size | flags */
    int heap = (head & 2) ? 'm' : (head & 4) ? 't' : 'b';
    if (!tid)
        tid = (pid_t)syscall(SYS_gettid);
    pthread_mutex_lock(&lock);
    uint32_t s = site_for((uintptr_t *)raw + SKIP, n, heap, tid == owner);
    size_t mask = ((size_t)1 << BLOCK_BITS) - 1;
    if (s == NO_SITE || block_used >= (mask + 1) * 3 / 4) {
        dropped++;
    } else {
        uintptr_t key = (uintptr_t)p;
        size_t i = block_slot(key);
        while (blocks[i].ptr && blocks[i].ptr != key)
            i = (i + 1) & mask;
        if (blocks[i].ptr)                              /* a free we did not see: replace */
            forget_locked(key), i = block_slot(key);
        while (blocks[i].ptr)
            i = (i + 1) & mask;
        blocks[i].ptr = key;
        blocks[i].size = size > UINT32_MAX ? UINT32_MAX : (uint32_t)size;
        blocks[i].site = s;
        block_used++;
        sites[s].live_bytes += blocks[i].size;
        sites[s].live_blocks++;
        sites[s].allocs++;
    }
    pthread_mutex_unlock(&lock);
    in_hook = 0;
    return p;
}

void *malloc(size_t n) { return record(__libc_malloc(n), n); }

void *calloc(size_t k, size_t n) { return record(__libc_calloc(k, n), k * n); }

void free(void *p) {
    forget(p);
    __libc_free(p);
}

void *realloc(void *p, size_t n) {
    forget(p);                      /* p is still ours until realloc returns: no one else can get it */
    return record(__libc_realloc(p, n), n);
}

void *memalign(size_t align, size_t n) { return record(__libc_memalign(align, n), n); }

void *aligned_alloc(size_t align, size_t n) { return record(__libc_memalign(align, n), n); }

void *valloc(size_t n) { return record(__libc_memalign(sysconf(_SC_PAGESIZE), n), n); }

int posix_memalign(void **out, size_t align, size_t n) {
    if (align % sizeof(void *) || (align & (align - 1)))
        return EINVAL;
    void *p = __libc_memalign(align, n);
    if (!p)
        return ENOMEM;
    *out = record(p, n);
    return 0;
}

/* --- dumps ---------------------------------------------------------------------------------- */

typedef struct { int fd; size_t len; char buf[1 << 16]; } Out;
static Out out;

static void out_flush(Out *o) {
    size_t off = 0;
    while (off < o->len) {
        ssize_t w = write(o->fd, o->buf + off, o->len - off);
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    o->len = 0;
}

static void out_put(Out *o, const char *s, size_t n) {
    if (o->len + n > sizeof(o->buf))
        out_flush(o);
    if (n > sizeof(o->buf))
        n = sizeof(o->buf);
    memcpy(o->buf + o->len, s, n);
    o->len += n;
}

static void dump(const char *why) {
    int was = in_hook;
    in_hook = 1;
    pthread_mutex_lock(&dump_lock);
    size_t n = 0, mask = ((size_t)1 << SITE_BITS) - 1;
    int64_t live = 0, live_blocks = 0;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i <= mask; i++)
        if (sites[i].key && sites[i].live_blocks) {
            snap[n++] = sites[i];
            live += sites[i].live_bytes;
            live_blocks += sites[i].live_blocks;
        }
    uint64_t lost = dropped, used = site_used;
    pthread_mutex_unlock(&lock);
    char path[1200], line[512];
    snprintf(path, sizeof(path), "%s.%d.%07d%s.txt", prefix, (int)owner, (int)(now_s() - t_load),
             strcmp(why, "exit") ? "" : ".exit");     /* not over an interval dump of the same second */
    out.fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out.fd >= 0) {
        out.len = 0;
        int k = snprintf(line, sizeof(line),
                         "# malloc_sites pid %d t_s %.1f start_s %.1f why %s active %d live_bytes %lld "
                         "live_blocks %lld chains %llu dropped %llu\n", (int)owner, now_s() - t_load,
                         start_s, why, active, (long long)live, (long long)live_blocks,
                         (unsigned long long)used, (unsigned long long)lost);
        out_put(&out, line, (size_t)k);
        for (size_t i = 0; i < n; i++) {
            Site *s = &snap[i];
            k = snprintf(line, sizeof(line), "%lld %lld %llu %c %d ", (long long)s->live_bytes,
                         (long long)s->live_blocks, (unsigned long long)s->allocs, s->heap, s->main);
            out_put(&out, line, (size_t)k);
            for (int f = 0; f < s->depth; f++) {
                k = snprintf(line, sizeof(line), f ? ",%lx" : "%lx", (unsigned long)s->frames[f]);
                out_put(&out, line, (size_t)k);
            }
            out_put(&out, "\n", 1);
        }
        out_put(&out, "## maps\n", 8);
        int maps = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
        if (maps >= 0) {
            ssize_t r;
            out_flush(&out);
            while ((r = read(maps, out.buf, sizeof(out.buf))) > 0) {
                out.len = (size_t)r;
                out_flush(&out);
            }
            close(maps);
        }
        out_flush(&out);
        close(out.fd);
    }
    pthread_mutex_unlock(&dump_lock);
    in_hook = was;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) && errno == EINTR)
        ;
}

static void *dumper(void *arg) {
    (void)arg;
    in_hook = 1;
    double wait = start_s - (now_s() - t_load);
    if (wait > 0)
        sleep_s(wait);
    active = 1;
    for (;;) {
        sleep_s(dump_s);
        dump("interval");
    }
    return NULL;
}

static void child_after_fork(void) { active = 0; }

static double env_number(const char *name, double dflt) {
    const char *v = getenv(name);
    return v && *v ? strtod(v, NULL) : dflt;
}

/* take this library out of LD_PRELOAD, so that the processes this one starts run without it */
static void unpreload(void) {
    char *v = getenv("LD_PRELOAD");
    if (!v || !strstr(v, "malloc_sites"))
        return;
    char keep[4096];
    size_t k = 0;
    for (char *p = v; *p;) {
        size_t len = strcspn(p, ": ");
        if (len && !memmem(p, len, "malloc_sites", 12) && k + len + 1 < sizeof(keep)) {
            if (k)
                keep[k++] = ':';
            memcpy(keep + k, p, len);
            k += len;
        }
        p += len;
        if (*p)
            p++;
    }
    keep[k] = 0;
    if (k)
        setenv("LD_PRELOAD", keep, 1);
    else
        unsetenv("LD_PRELOAD");
}

__attribute__((constructor)) static void init(void) {
    const char *o = getenv("MALLOC_SITES_OUT");
    unpreload();
    if (!o || !*o)
        return;
    snprintf(prefix, sizeof(prefix), "%s", o);
    t_load = now_s();
    start_s = env_number("MALLOC_SITES_START_S", 0);
    dump_s = env_number("MALLOC_SITES_DUMP_S", 60);
    if (dump_s < 1)
        dump_s = 1;
    depth = (int)env_number("MALLOC_SITES_DEPTH", 8);
    if (depth < 1 || depth > MAX_DEPTH)
        depth = depth < 1 ? 1 : MAX_DEPTH;
    owner = getpid();
    in_hook = 1;
    blocks = mmap(NULL, sizeof(Block) << BLOCK_BITS, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    sites = mmap(NULL, sizeof(Site) << SITE_BITS, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    snap = mmap(NULL, sizeof(Site) << SITE_BITS, PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (blocks == MAP_FAILED || sites == MAP_FAILED || snap == MAP_FAILED) {
        in_hook = 0;
        return;
    }
    void *warm[4];
    backtrace(warm, 4);             /* loads libgcc_s's unwinder now, not inside a traced malloc */
    pthread_atfork(NULL, NULL, child_after_fork);
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_create(&t, &attr, dumper, NULL);
    pthread_attr_destroy(&attr);
    in_hook = 0;
}

__attribute__((destructor)) static void fini(void) {
    if (prefix[0] && active)
        dump("exit");
}
