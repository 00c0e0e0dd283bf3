/* Few-row matrix products for decode, streaming each weight once: y = x @ W.T (+ bias).
 *
 * A decode step of one to a few requests multiplies m = 1..8 activation rows by every weight
 * matrix of the model. Its time is the weight bytes over the read bandwidth a core gets, so
 * the kernel is built to read each weight exactly once, in order, with nothing else in the
 * way: tiles of 4 weight rows x up to GMAX activation rows, the activations and accumulators
 * in registers, the weights streamed from memory: a tile's 4 rows come from the 4 quarters of
 * the rows being computed, 4 far-apart streams that keep more reads in flight than one.
 *
 * Layouts (C order): x [m, k] (row stride ldx), W [n, k] (row stride ldw) float32 or int8
 * (int8: w[o, :] * scale[o] is the float weight, scale float32 [n]), bias float32 [n] or NULL,
 * y [m, n] (row stride ldy). Every output element is a dot product over k computed the same
 * way whichever thread computes it, so a result does not depend on the thread count.
 *
 * Instruction sets, chosen at run time (__builtin_cpu_supports): AVX-512 (16-wide, 4 rows of
 * activations a tile) where the CPU has it, else AVX2 + FMA (8-wide, 2 rows), else plain C.
 * The file is built without -march=native: one binary runs on any x86-64, each copy of the
 * tile code compiled for its own set (gemv_body.h, included once per set), and each copy is
 * checked against the plain C loop on small problems before it is used (the AVX-512 copy has
 * not run on this project's own machines, which have none).
 *
 * Threads: output rows are cut into chunks that the calling thread and persistent workers
 * claim one at a time (a compare-and-swap on a ticket holding the call's number and the next
 * chunk), so a worker that wakes late takes fewer chunks and the caller never waits for a
 * worker that has not started; it waits only for chunks a worker has claimed (spinning, then
 * yielding its core). When that waiting costs more than a quarter of the caller's own work over
 * 64 split calls (workers descheduled by other processes), the next 2048 calls run alone. Workers spin for a short while after a call (decode calls come every few
 * tens of microseconds; 100 us, MINILLM_GEMV_SPIN_US), then sleep on a futex. Built and loaded by minillm/fast/gemv.py. */

#define _GNU_SOURCE
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

#ifndef PREFETCH_F32
#define PREFETCH_F32 0 /* software prefetch of the next tile for float32 weights too: off, since with
                        * the 4 far-apart streams the hardware prefetcher alone streamed float32
                        * faster (19.5 against 16.1 GB/s, medians, SmolLM2-135M's weights, Zen 3) */
#endif

struct gemv_job {
    const float *x;
    int64_t m, ldx;
    const void *w;
    int64_t ldw, n, k;
    const float *scale; /* NULL: float32 weights */
    const float *bias;  /* NULL: none */
    float *y;
    int64_t ldy;
};

/* ---- the tile code, once per instruction set ---------------------------------------------- */

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma")
#define VW 16
#define GMAX 4
#define SUFFIX _avx512
#define VT __m512
#define VZERO _mm512_setzero_ps()
#define VLOADF(p) _mm512_loadu_ps(p)
#define VLOADI8(p) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p))))
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VHSUM(v) _mm512_reduce_add_ps(v)
#include "gemv_body.h"
#undef VW
#undef GMAX
#undef SUFFIX
#undef VT
#undef VZERO
#undef VLOADF
#undef VLOADI8
#undef VFMA
#undef VHSUM
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
static inline float hsum_avx2(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#define VW 8
#define GMAX 2
#define SUFFIX _avx2
#define VT __m256
#define VZERO _mm256_setzero_ps()
#define VLOADF(p) _mm256_loadu_ps(p)
#define VLOADI8(p) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p))))
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VHSUM(v) hsum_avx2(v)
#include "gemv_body.h"
#undef VW
#undef GMAX
#undef SUFFIX
#undef VT
#undef VZERO
#undef VLOADF
#undef VLOADI8
#undef VFMA
#undef VHSUM
#pragma GCC pop_options
#define HAVE_X86_COPIES 1
#endif

/* Plain C: any CPU. */
static void rows_plain(const struct gemv_job *j, int64_t r0, int64_t r1)
{
    const int isint8 = j->scale != NULL;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t g = 0; g < j->m; g++) {
            const float *x = j->x + g * j->ldx;
            float s = 0.0f;
            if (isint8) {
                const int8_t *w = (const int8_t *)j->w + r * j->ldw;
                for (int64_t t = 0; t < j->k; t++)
                    s += x[t] * (float)w[t];
                s *= j->scale[r];
            } else {
                const float *w = (const float *)j->w + r * j->ldw;
                for (int64_t t = 0; t < j->k; t++)
                    s += x[t] * w[t];
            }
            j->y[g * j->ldy + r] = s + (j->bias != NULL ? j->bias[r] : 0.0f);
        }
}

typedef void (*rows_fn)(const struct gemv_job *, int64_t, int64_t);
static rows_fn rows_impl;
static const char *isa_name = "plain";

/* Whether `fn` computes what the plain C loop does on small problems that reach every tile
 * shape and tail (rows 1..8, out % 4 != 0, in % 16 != 0), float32 and int8: a copy compiled for
 * an instruction set this project's machines could not run is checked before it is trusted. */
static int agrees_with_plain(rows_fn fn)
{
    enum { N = 11, K = 37, M = 8 };
    float x[M * K], w[N * K], scale[N], bias[N], y0[M * N], y1[M * N];
    int8_t q[N * K];
    uint32_t seed = 12345u;
    for (int i = 0; i < M * K; i++)
        x[i] = (float)((seed = seed * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f;
    for (int i = 0; i < N * K; i++) {
        w[i] = (float)((seed = seed * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f;
        q[i] = (int8_t)((int)((seed >> 9) % 255u) - 127);
    }
    for (int i = 0; i < N; i++)
        scale[i] = 0.01f * (float)(i + 1), bias[i] = 0.1f * (float)i;
    for (int m = 1; m <= M; m++)
        for (int isint8 = 0; isint8 < 2; isint8++) {
            const struct gemv_job j = {x, m, K, isint8 ? (const void *)q : (const void *)w, K, N, K,
                                       isint8 ? scale : NULL, bias, NULL, N};
            struct gemv_job a = j, b = j;
            a.y = y0, b.y = y1;
            rows_plain(&a, 0, N);
            fn(&b, 0, N);
            for (int i = 0; i < m * N; i++) {
                const float d = y0[i] - y1[i], tol = 1e-4f * (1.0f + (y0[i] < 0 ? -y0[i] : y0[i]));
                if (d > tol || d < -tol || y1[i] != y1[i])
                    return 0;
            }
        }
    return 1;
}

static void pick_isa(void)
{
    rows_fn fn = rows_plain;
    const char *name = "plain";
#ifdef HAVE_X86_COPIES
    __builtin_cpu_init();
    const char *force = getenv("MINILLM_GEMV_ISA"); /* "avx2" / "plain": to test the others */
    const int want512 = !(force && (!strcmp(force, "avx2") || !strcmp(force, "plain")));
    const int want256 = !(force && !strcmp(force, "plain"));
    if (want512 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && agrees_with_plain(rows_avx512)) {
        fn = rows_avx512, name = "avx512";
    } else if (want256 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               agrees_with_plain(rows_avx2)) {
        fn = rows_avx2, name = "avx2";
    }
#endif
    rows_impl = fn;
    isa_name = name;
}

static pthread_once_t isa_once = PTHREAD_ONCE_INIT;

const char *minillm_gemv_isa(void)
{
    pthread_once(&isa_once, pick_isa);
    return isa_name;
}

/* ---- the worker pool -------------------------------------------------------------------- */

#define MAX_WORKERS 63
#define CHUNK_BYTES (96 * 1024)   /* a chunk's weight bytes: small enough to balance, big to stream */
#define SPLIT_BYTES (64 * 1024)   /* calls with fewer weight bytes run on the caller alone */
#define WINDOW_CALLS 64            /* split calls per look at what waiting cost */
#define SOLO_CALLS 2048            /* calls run alone after a window where waiting cost > 1/4 */

static struct {
    pthread_mutex_t lock;                  /* starting workers, one call at a time */
    int started;                           /* workers running */
    _Atomic uint64_t ticket;               /* call number << 32 | next chunk */
    _Atomic int64_t done;                  /* chunks finished in this call */
    _Atomic uint32_t wake;                 /* futex word: bumped on every call */
    _Atomic int sleepers;                  /* workers in (or about to enter) futex wait */
    _Atomic int active;                    /* workers that may take part in this call */
    struct gemv_job job;
    int64_t nchunks, chunk_rows;
    long spin_ns;                          /* how long an idle worker spins before sleeping */
    /* whether sharing pays here: over a window of split calls, the caller's time waiting for
     * workers' chunks against its own work; when waiting costs too much (a worker keeps being
     * descheduled: a machine busier than its cores), the next SOLO_CALLS calls run alone */
    long own_ns, wait_ns;
    int window, solo_left;
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .spin_ns = 100000};

static void futex_wait(_Atomic uint32_t *addr, uint32_t val)
{
#if defined(__linux__)
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
#else
    (void)addr, (void)val;
    usleep(50);
#endif
}

static void futex_wake_all(_Atomic uint32_t *addr)
{
#if defined(__linux__)
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#else
    (void)addr;
#endif
}

static long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* Claim and run chunks of call `call` until none is left (or the call is over). */
static void take_chunks(uint64_t call)
{
    for (;;) {
        uint64_t t = atomic_load(&pool.ticket);
        if ((t >> 32) != call || (int64_t)(t & 0xffffffffu) >= pool.nchunks)
            return;
        if (!atomic_compare_exchange_weak(&pool.ticket, &t, t + 1))
            continue;
        /* claimed: the call cannot end before this chunk is done, so the job is stable */
        const int64_t c = (int64_t)(t & 0xffffffffu);
        const int64_t r0 = c * pool.chunk_rows;
        const int64_t r1 = r0 + pool.chunk_rows < pool.job.n ? r0 + pool.chunk_rows : pool.job.n;
        rows_impl(&pool.job, r0, r1);
        atomic_fetch_add(&pool.done, 1);
    }
}

static void *worker(void *arg)
{
    const int id = (int)(intptr_t)arg;
    uint32_t seen = atomic_load(&pool.wake);
    for (;;) {
        uint32_t w = atomic_load(&pool.wake);
        if (w == seen) {
            const long until = now_ns() + pool.spin_ns;
            int spins = 0;
            while ((w = atomic_load(&pool.wake)) == seen) {
                CPU_RELAX();
                if (++spins % 64 == 0 && now_ns() > until) {
                    atomic_fetch_add(&pool.sleepers, 1);
                    if (atomic_load(&pool.wake) == seen)
                        futex_wait(&pool.wake, seen);
                    atomic_fetch_sub(&pool.sleepers, 1);
                }
            }
        }
        seen = w;
        if (id < atomic_load(&pool.active))
            take_chunks(atomic_load(&pool.ticket) >> 32);
    }
    return NULL;
}

static void forget_workers_after_fork(void)
{
    pool.started = 0; /* the child has none of the parent's threads */
    pthread_mutex_init(&pool.lock, NULL);
}

static int ensure_workers(int want)
{
    static int atfork_done;
    const char *spin = getenv("MINILLM_GEMV_SPIN_US"); /* read when the first worker starts */
    if (spin != NULL && pool.started == 0 && atoi(spin) >= 0)
        pool.spin_ns = (long)atoi(spin) * 1000;
    if (want > MAX_WORKERS)
        want = MAX_WORKERS;
    while (pool.started < want) {
        if (!atfork_done) {
            pthread_atfork(NULL, NULL, forget_workers_after_fork);
            atfork_done = 1;
        }
        pthread_t th;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 256 * 1024);
        const int rc = pthread_create(&th, &attr, worker, (void *)(intptr_t)pool.started);
        pthread_attr_destroy(&attr);
        if (rc != 0)
            break;
        pool.started++;
    }
    return pool.started;
}

/* Run the job over all its rows with up to `threads` threads (this one included). */
static void run(const struct gemv_job *job, int threads)
{
    pthread_once(&isa_once, pick_isa);
    const int64_t esize = job->scale != NULL ? 1 : 4;
    const int64_t bytes = job->n * job->k * esize;
    if (threads <= 1 || bytes < SPLIT_BYTES || job->n < 8 || pthread_mutex_trylock(&pool.lock) != 0) {
        rows_impl(job, 0, job->n); /* alone (also when another thread's call holds the pool) */
        return;
    }
    if (pool.solo_left > 0) {
        pool.solo_left--;
        pthread_mutex_unlock(&pool.lock);
        rows_impl(job, 0, job->n);
        return;
    }
    const int helpers = ensure_workers(threads - 1);
    if (helpers == 0) {
        pthread_mutex_unlock(&pool.lock);
        rows_impl(job, 0, job->n);
        return;
    }
    int64_t rows = CHUNK_BYTES / (job->k * esize > 0 ? job->k * esize : 1);
    const int64_t most = job->n / (4 * (int64_t)(helpers + 1)); /* >= 4 chunks a thread */
    if (rows > most)
        rows = most;
    rows = rows < 4 ? 4 : rows & ~(int64_t)3;
    pool.job = *job;
    pool.chunk_rows = rows;
    pool.nchunks = (job->n + rows - 1) / rows;
    atomic_store(&pool.done, 0);
    atomic_store(&pool.active, helpers);
    const uint64_t call = (atomic_load(&pool.ticket) >> 32) + 1;
    atomic_store(&pool.ticket, call << 32);
    atomic_fetch_add(&pool.wake, 1);
    if (atomic_load(&pool.sleepers) > 0)
        futex_wake_all(&pool.wake);
    const long t0 = now_ns();
    take_chunks(call);
    const long t1 = now_ns();
    /* wait for the chunks workers claimed; on a machine busier than its cores a worker may be
     * descheduled holding one: after a short spin, give the core away until it is done */
    for (int spins = 0; atomic_load(&pool.done) < pool.nchunks; spins++) {
        if (spins < 4096)
            CPU_RELAX();
        else
            sched_yield();
    }
    pool.own_ns += t1 - t0;
    pool.wait_ns += now_ns() - t1;
    if (++pool.window >= WINDOW_CALLS) {
        if (pool.wait_ns * 4 > pool.own_ns)
            pool.solo_left = SOLO_CALLS;
        pool.window = 0, pool.own_ns = 0, pool.wait_ns = 0;
    }
    pthread_mutex_unlock(&pool.lock);
}

static int check(const float *x, int64_t m, int64_t ldx, const void *w, int64_t n, int64_t k, int64_t ldw,
                 const float *y, int64_t ldy)
{
    if (x == NULL || w == NULL || y == NULL || m < 1 || n < 1 || k < 1 || ldx < k || ldw < k || ldy < n ||
        n > ((int64_t)1 << 40) / (k > 0 ? k : 1))
        return -3;
    return 0;
}

/* y[m, n] = x[m, k] @ W[n, k].T + bias, float32 weights. 0, or -3 for impossible arguments. */
int minillm_gemv_f32(const float *x, int64_t m, int64_t ldx, const float *w, int64_t n, int64_t k, int64_t ldw,
                     const float *bias, float *y, int64_t ldy, int threads)
{
    if (check(x, m, ldx, w, n, k, ldw, y, ldy))
        return -3;
    const struct gemv_job job = {x, m, ldx, w, ldw, n, k, NULL, bias, y, ldy};
    run(&job, threads);
    return 0;
}

/* The same with int8 weights q[n, k] and float32 scale[n]: y = x @ (scale * q).T + bias. */
int minillm_gemv_i8(const float *x, int64_t m, int64_t ldx, const int8_t *q, const float *scale, int64_t n,
                    int64_t k, int64_t ldw, const float *bias, float *y, int64_t ldy, int threads)
{
    if (check(x, m, ldx, q, n, k, ldw, y, ldy) || scale == NULL)
        return -3;
    const struct gemv_job job = {x, m, ldx, q, ldw, n, k, scale, bias, y, ldy};
    run(&job, threads);
    return 0;
}

/* How long (microseconds) an idle worker spins before it sleeps; returns the old value. */
int minillm_gemv_set_spin_us(int us)
{
    const int old = (int)(pool.spin_ns / 1000);
    if (us >= 0)
        pool.spin_ns = (long)us * 1000;
    return old;
}

/* The thread count the torch operators of gemv_op.cpp pass (0: torch's intra-op count). A compiled
 * decode graph on the CPU runs torch's own kernels on one thread, since their OpenMP regions
 * competed with this pool's workers for the cores (the shipped model's graph step went from 0.95
 * to 1.33 ms on two threads), while the projections keep several. Returns the old value. */
static _Atomic int op_threads = 0;

int minillm_gemv_set_op_threads(int n)
{
    return atomic_exchange(&op_threads, n > 0 ? n : 0);
}

int minillm_gemv_op_threads(void)
{
    return atomic_load(&op_threads);
}

/* Workers started so far (for tests and benchmarks). */
int minillm_gemv_workers(void)
{
    return pool.started;
}

/* The sum of p[0..n): a read probe for the benchmarks' floor. It reads the buffer as 4 streams a
 * quarter of it apart, the way the tiles read weights, because one stream under-reports what a
 * core can read (measured on a Zen 3 core: ~1.5x more with 4 far-apart streams), and a floor
 * taken from one stream would let the kernel look faster than the memory. */
float minillm_gemv_read_probe(const float *p, int64_t n)
{
    typedef float v4 __attribute__((vector_size(16)));
    const int64_t q = n / 4 / 8 * 8;
    v4 acc[8];
    memset(acc, 0, sizeof acc);
    for (int64_t i = 0; i < q; i += 8)
        for (int s = 0; s < 4; s++) {
            v4 u, v;
            memcpy(&u, p + s * q + i, sizeof u);
            memcpy(&v, p + s * q + i + 4, sizeof v);
            acc[2 * s] += u, acc[2 * s + 1] += v;
        }
    float total = 0.0f;
    for (int a = 0; a < 8; a++)
        total += acc[a][0] + acc[a][1] + acc[a][2] + acc[a][3];
    for (int64_t i = 4 * q; i < n; i++)
        total += p[i];
    return total;
}
