/* Paged decode attention for the CPU: every decode row's queries attend its context read in
 * place from the paged KV pool, block by block through its block table. No gathered copy of
 * K/V is made: the pool is read once, which is what a paged GPU kernel does too.
 *
 * Layouts (float32, C-contiguous unless a stride is given):
 *   q             [n, heads, dim]        row stride q_row, head stride q_head (elements)
 *   k_pool/v_pool [blocks, block_size, kv_heads, dim]
 *   block_tables  [n, width] int64       block ids; entries past a row's context are never read
 *   context_lens  [n] int64              tokens each row attends (its new one included)
 *   out           [n, heads, dim]
 *
 * One task per row and span of KV heads (the whole row when there are enough rows to keep
 * every thread busy; a row's heads split into spans when rows alone would leave threads idle).
 * Each key and value vector is read once for all the query heads that share it. Two passes
 * over the context (scores, then the weighted sum of values) with the softmax between them,
 * all in float32; the scores (query heads x context floats) are a task's main scratch. Two
 * versions: attend_fixed, vectorised (AVX-512, or AVX2 + FMA) for the common head shapes, block
 * by block and within a block one KV head at a time, its queries and accumulators in registers,
 * the next block fetched meanwhile; attend_generic, plain loops, any shape.
 *
 * Returns 0, or -1 when a block id lies outside the pool or a row has fewer blocks than its
 * context needs (nothing is read then), -2 when scratch memory could not be had, or -3 when an
 * argument is impossible (a null pointer, a size below 1, heads not a multiple of kv_heads,
 * a negative query stride): nothing is read then either. Built and
 * loaded by minillm/fast/cpu_kernel.py; the vector type and exp are vec.h's. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "vec.h"

/* q . k over dim floats */
static inline float dot(const float *q, const float *k, int64_t dim)
{
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t d = 0; d < dim; d++)
        s += q[d] * k[d];
    return s;
}

/* s[t] = exp(s[t] - max(s)) for t < len; returns their sum */
static float softmax_numerators(float *s, int64_t len)
{
    float top = s[0], sum = 0.0f;
    for (int64_t t = 1; t < len; t++)
        top = s[t] > top ? s[t] : top;
    for (int64_t t = 0; t < len; t++) {
        s[t] = expf(s[t] - top);
        sum += s[t];
    }
    return sum;
}

/* The readable version: any head count and size. One (row, KV-head span) task; see the top. */
static int attend_generic(const float *q, int64_t q_head, const float *k_pool, const float *v_pool,
                          const int64_t *table, int64_t len, float *out, int64_t kh0, int64_t kh1,
                          int64_t group, int64_t kv_heads, int64_t dim, int64_t block_size,
                          float scale)
{
    const int64_t token_stride = kv_heads * dim, block_stride = block_size * token_stride;
    const int64_t nq = (kh1 - kh0) * group;            /* query heads of this task */
    const float *q0 = q + kh0 * group * q_head;
    float *o0 = out + kh0 * group * dim;
    memset(o0, 0, sizeof(float) * nq * dim);
    float *scores = malloc(sizeof(float) * (nq * len + nq));   /* [nq][len], then [nq] sums */
    if (scores == NULL)
        return -2;
    float *total = scores + nq * len;
    /* pass 1: scores[h][t] = scale * q_h . k_t */
    for (int64_t t = 0; t < len; t++) {
        const float *kt = k_pool + table[t / block_size] * block_stride
                          + (t % block_size) * token_stride + kh0 * dim;
        for (int64_t h = 0; h < nq; h++)
            scores[h * len + t] = scale * dot(q0 + h * q_head, kt + (h / group) * dim, dim);
    }
    for (int64_t h = 0; h < nq; h++)
        total[h] = softmax_numerators(scores + h * len, len);
    /* pass 2: o_h = sum_t p[h][t] * v_t */
    for (int64_t t = 0; t < len; t++) {
        const float *vt = v_pool + table[t / block_size] * block_stride
                          + (t % block_size) * token_stride + kh0 * dim;
        for (int64_t h = 0; h < nq; h++) {
            const float p = scores[h * len + t], *vh = vt + (h / group) * dim;
            float *oh = o0 + h * dim;
            for (int64_t d = 0; d < dim; d++)
                oh[d] += p * vh[d];
        }
    }
    for (int64_t h = 0; h < nq; h++)
        for (int64_t d = 0; d < dim; d++)
            o0[h * dim + d] /= total[h];
    free(scores);
    return 0;
}

/* The next row's keys and values, fetched into L2 a line at a time while this row is computed.
 * A row's blocks lie anywhere in the pool, so the hardware prefetcher sees each block as a new
 * stream and a prefetch one block ahead (below) is shorter than a read from memory takes: a
 * decode batch's attention read the pool at ~10 GB/s where the core streams 25-30. A whole row
 * ahead is long enough. Each token of this row fetches one head-vector's worth (dim / 16 lines)
 * of the next row, whose K and V blocks are about as many lines as this row has token-heads. */
struct ahead {
    const char *k_pool, *v_pool;
    const int64_t *table;          /* the next row's block ids (checked); NULL: nothing to fetch */
    int64_t block_bytes, blocks;   /* bytes of one block of K (or V), the row's blocks */
    int64_t j, line;               /* the next line to fetch: block j, line of its K then its V */
};

static inline void ahead_step(struct ahead *a, int n)
{
    const int64_t per = a->block_bytes / 64;
    for (; n > 0 && a->j < a->blocks; n--) {
        const int in_v = a->line >= per;
        __builtin_prefetch((in_v ? a->v_pool : a->k_pool) + a->table[a->j] * a->block_bytes
                           + (a->line - in_v * per) * 64, 0, 2);   /* into L2 */
        if (++a->line == 2 * per)
            a->line = 0, a->j++;
    }
}

#if defined(HAVE_VECTOR_PATH)
/* softmax_numerators, a vector at a time; the last partial vector goes through a padded copy,
 * so every score gets the same exp */
static float softmax_numerators_vec(float *s, int64_t len)
{
    int64_t t = 0;
    vec top = v_set1(s[0]);
    for (; t + LANES <= len; t += LANES)
        top = v_max(top, v_load(s + t));
    float m = v_top(top);
    for (; t < len; t++)
        m = s[t] > m ? s[t] : m;
    const vec mv = v_set1(m);
    vec sum = v_zero();
    for (t = 0; t + LANES <= len; t += LANES) {
        const vec e = v_exp(v_sub(v_load(s + t), mv));
        v_store(s + t, e);
        sum = v_add(sum, e);
    }
    float total = v_sum(sum);
    if (t < len) {
        float tail[LANES];
        for (int i = 0; i < LANES; i++)
            tail[i] = t + i < len ? s[t + i] : m;
        v_store(tail, v_exp(v_sub(v_load(tail), mv)));
        for (int i = 0; t + i < len; i++) {
            s[t + i] = tail[i];
            total += tail[i];
        }
    }
    return total;
}

/* One task, KV heads [kh0, kh1) of a row, each with G query heads of D floats (D a multiple of
 * 16), G and D constants after inlining. Block by block, and inside a block head by head: a
 * token's heads lie side by side in the pool, so a block's heads together are one contiguous
 * stretch. A head's G queries and G x D accumulators sit in registers while it walks a block (qr,
 * ar: arrays from FIXED below, sized there by constants: declared here they would be C99
 * variable-length arrays, which GCC keeps on the stack, a store-to-load chain per token), and in
 * the task's scratch between blocks. Every score, sum and accumulator sees the same operations in
 * the same order as walking one head over the whole context did: the same bits.
 *
 * The pool is far (a decode step streams the weights between two visits of a layer's blocks), and
 * a row's blocks lie anywhere in it, so the hardware prefetcher cannot guess the jump from one
 * block to the next. The kernel fetches, into L2 (a prefetch into L1 held the core's few L1 miss
 * buffers and the kernel read the pool at ~6 GB/s): the first block's keys before it starts; while
 * block j's keys are read, block j + 1's keys and block j's values (read again only in pass 2);
 * while block j's values are read, block j + 1's. On a Zen 4 core, SmolLM2's 30 layers of
 * attention at batch 1 took 0.58 ms at 128 tokens and 1.9 ms at 512, 0.85 and 2.9 ms head by
 * head with prefetches into L1 (benchmarks/attention_far.py; benchmarks/README.md, *Attention's
 * reads from far memory*). With
 * AHEAD, each token also fetches a piece of the next row (``struct ahead``), a copy without it
 * serving tasks that have no next row to fetch (its checks cost ~15 % on data in cache). */
static inline __attribute__((always_inline)) int
attend_fixed(const float *q, int64_t q_head, const float *k_pool, const float *v_pool,
             const int64_t *table, int64_t len, float *o, int64_t kh0, int64_t kh1, int64_t kv_heads,
             int64_t block_size, float scale, vec *restrict qr, vec *restrict ar, vec *restrict v,
             const int G, const int D, struct ahead *restrict ah, const int AHEAD)
{
    const int C = D / LANES;                            /* vectors per head */
    const int64_t nh = kh1 - kh0, token_stride = kv_heads * D, block_stride = block_size * token_stride;
    void *mem = NULL;                                  /* [nh][G*C] queries, accumulators; scores; sums */
    const size_t vecs = (size_t)nh * G * C;
    if (posix_memalign(&mem, 64, sizeof(vec) * 2 * vecs + sizeof(float) * (nh * G * len + nh * G)) != 0)
        return -2;
    vec *qs = mem, *accs = qs + vecs;
    float *scores = (float *)(accs + vecs), *inv = scores + nh * G * len;   /* [nh][G][len], [nh][G] */
    for (int64_t h = 0; h < nh; h++)
        for (int g = 0; g < G; g++)
            for (int c = 0; c < C; c++)
                qs[(h * G + g) * C + c] = v_mul(v_load(q + ((kh0 + h) * G + g) * q_head + LANES * c), v_set1(scale));
    const int64_t lines = nh * D / 16;                  /* 64-byte lines of the task's heads in one token */
    const char *k0 = (const char *)(k_pool + table[0] * block_stride + kh0 * D);
    for (int64_t i = 0; i < (len < block_size ? len : block_size); i++)   /* the first block's keys */
        for (int64_t c = 0; c < lines; c++)
            _mm_prefetch(k0 + i * token_stride * 4 + 64 * c, _MM_HINT_T1);
    for (int64_t t0 = 0, j = 0; t0 < len; t0 += block_size, j++) {   /* pass 1: scores */
        const int64_t ntok = t0 + block_size <= len ? block_size : len - t0;
        const float *kb = k_pool + table[j] * block_stride;
        const float *kn = t0 + block_size < len ? k_pool + table[j + 1] * block_stride : kb;
        const float *vb = v_pool + table[j] * block_stride;
        for (int64_t h = 0; h < nh; h++) {
            const int64_t off = (kh0 + h) * D;
            float *sh = scores + h * G * len + t0;
            for (int c = 0; c < G * C; c++)
                qr[c] = qs[h * G * C + c];
            for (int64_t i = 0; i < ntok; i++) {
                const float *kt = kb + i * token_stride + off;
                if (AHEAD)
                    ahead_step(ah, D / 16);
                for (int c = 0; c < D / 16; c++) {        /* one prefetch per 64-byte line */
                    _mm_prefetch((const char *)(kn + i * token_stride + off + 16 * c), _MM_HINT_T1);
                    _mm_prefetch((const char *)(vb + i * token_stride + off + 16 * c), _MM_HINT_T1);
                }
                for (int g = 0; g < G; g++) {
                    vec a = v_mul(qr[g * C], v_load(kt));
                    for (int c = 1; c < C; c++)
                        a = v_fmadd(qr[g * C + c], v_load(kt + LANES * c), a);
                    sh[g * len + i] = v_sum(a);
                }
            }
        }
    }
    for (int64_t hg = 0; hg < nh * G; hg++)
        inv[hg] = 1.0f / softmax_numerators_vec(scores + hg * len, len);
    for (size_t c = 0; c < vecs; c++)
        accs[c] = v_zero();
    for (int64_t t0 = 0, j = 0; t0 < len; t0 += block_size, j++) {   /* pass 2: weighted values */
        const int64_t ntok = t0 + block_size <= len ? block_size : len - t0;
        const float *vb = v_pool + table[j] * block_stride;
        const float *vn = t0 + block_size < len ? v_pool + table[j + 1] * block_stride : vb;
        for (int64_t h = 0; h < nh; h++) {
            const int64_t off = (kh0 + h) * D;
            const float *ph = scores + h * G * len + t0;
            for (int c = 0; c < G * C; c++)
                ar[c] = accs[h * G * C + c];
            for (int64_t i = 0; i < ntok; i++) {
                const float *vt = vb + i * token_stride + off;
                if (AHEAD)
                    ahead_step(ah, D / 16);
                for (int c = 0; c < D / 16; c++)
                    _mm_prefetch((const char *)(vn + i * token_stride + off + 16 * c), _MM_HINT_T1);
                for (int c = 0; c < C; c++)
                    v[c] = v_load(vt + LANES * c);
                for (int g = 0; g < G; g++) {
                    const vec p = v_set1(ph[g * len + i]);
                    for (int c = 0; c < C; c++)
                        ar[g * C + c] = v_fmadd(p, v[c], ar[g * C + c]);
                }
            }
            for (int c = 0; c < G * C; c++)
                accs[h * G * C + c] = ar[c];
        }
    }
    for (int64_t h = 0; h < nh; h++)
        for (int g = 0; g < G; g++)
            for (int c = 0; c < C; c++)
                v_store(o + ((kh0 + h) * G + g) * D + LANES * c,
                        v_mul(accs[(h * G + g) * C + c], v_set1(inv[h * G + g])));
    free(mem);
    return 0;
}

#define FIXED(G, D)                                                                             \
    ({                                                                                          \
        vec qr_[(G) * ((D) / LANES)], ar_[(G) * ((D) / LANES)], v_[(D) / LANES];                \
        ah->table != NULL                                                                       \
            ? attend_fixed(q, q_head, k_pool, v_pool, table, len, o, kh0, kh1, kv_heads,        \
                           block_size, scale, qr_, ar_, v_, G, D, ah, 1)                        \
            : attend_fixed(q, q_head, k_pool, v_pool, table, len, o, kh0, kh1, kv_heads,        \
                           block_size, scale, qr_, ar_, v_, G, D, ah, 0);                       \
    })
#define FIXED_G(D)                                                                              \
    switch (group) {                                                                            \
    case 1: return FIXED(1, D);                                                                 \
    case 2: return FIXED(2, D);                                                                 \
    case 3: return FIXED(3, D);                                                                 \
    case 4: return FIXED(4, D);                                                                 \
    case 5: return FIXED(5, D);                                                                 \
    case 6: return FIXED(6, D);                                                                 \
    case 7: return FIXED(7, D);                                                                 \
    case 8: return FIXED(8, D);                                                                 \
    }

/* The fast path where it is compiled for the shape (returns 1 when it is not). */
static int attend_fast(const float *q, int64_t q_head, const float *k_pool, const float *v_pool,
                       const int64_t *table, int64_t len, float *o, int64_t kh0, int64_t kh1, int64_t group,
                       int64_t kv_heads, int64_t dim, int64_t block_size, float scale, struct ahead *ah)
{
    if (dim == 64) { FIXED_G(64) }
    if (dim == 128) { FIXED_G(128) }
    return 1;
}
#endif

/* The blocks a context of len tokens needs, or -1 when its table has fewer or one lies outside
 * the pool (checked before anything is read). */
static int64_t blocks_held(const int64_t *table, int64_t len, int64_t width, int64_t num_blocks, int64_t block_size)
{
    const int64_t blocks = (len + block_size - 1) / block_size;
    if (blocks > width)
        return -1;
    for (int64_t j = 0; j < blocks; j++)
        if (table[j] < 0 || table[j] >= num_blocks)
            return -1;
    return blocks;
}

/* One task: row b's KV heads [kh0, kh1). */
static int attend_row(const float *q, int64_t q_head, const float *k_pool, const float *v_pool,
                      int64_t num_blocks, const int64_t *table, int64_t width, int64_t len,
                      float *out, int64_t kh0, int64_t kh1, int64_t group, int64_t kv_heads,
                      int64_t dim, int64_t block_size, float scale, struct ahead *ah)
{
    (void)ah; /* (used by the vector path only) */
    if (len <= 0) {
        memset(out + kh0 * group * dim, 0, sizeof(float) * (kh1 - kh0) * group * dim);
        return 0;
    }
    if (blocks_held(table, len, width, num_blocks, block_size) < 0)
        return -1;
#if defined(HAVE_VECTOR_PATH)
    const int rc = attend_fast(q, q_head, k_pool, v_pool, table, len, out, kh0, kh1, group, kv_heads,
                               dim, block_size, scale, ah);
    if (rc != 1)
        return rc;
#endif
    return attend_generic(q, q_head, k_pool, v_pool, table, len, out, kh0, kh1, group, kv_heads,
                          dim, block_size, scale);
}

/* 1 when this build has the vectorised path for heads of dim floats, group query heads per KV
 * head (what "auto" asks before choosing the kernel: the generic loop was not measured faster
 * than gathering and SDPA), else 0. */
int paged_decode_fast_path(int64_t dim, int64_t group)
{
#if defined(HAVE_VECTOR_PATH)
    return (dim == 64 || dim == 128) && group >= 1 && group <= 8;
#else
    (void)dim;
    (void)group;
    return 0;
#endif
}

/* What to fetch ahead for row r: nothing when r is past the batch or its block table does not
 * hold (that row reports the error on its own turn). */
static struct ahead row_ahead(const float *k_pool, const float *v_pool, int64_t num_blocks,
                              const int64_t *block_tables, int64_t width, const int64_t *context_lens,
                              int64_t r, int64_t n, int64_t block_size, int64_t token_floats)
{
    struct ahead a = {(const char *)k_pool, (const char *)v_pool, NULL, block_size * token_floats * 4, 0, 0, 0};
    if (r >= n || context_lens[r] <= 0 || a.block_bytes % 64 != 0)
        return a;
    const int64_t *table = block_tables + r * width;
    const int64_t blocks = blocks_held(table, context_lens[r], width, num_blocks, block_size);
    if (blocks > 0)
        a.table = table, a.blocks = blocks;
    return a;
}

/* The next task number from the shared counter. */
static inline int64_t claim(int64_t *ticket)
{
    int64_t t;
#pragma omp atomic capture
    t = (*ticket)++;
    return t;
}

int paged_decode_f32(const float *q, int64_t q_row, int64_t q_head,
                     const float *k_pool, const float *v_pool, int64_t num_blocks,
                     const int64_t *block_tables, int64_t width, const int64_t *context_lens,
                     float *out, int64_t n, int64_t heads, int64_t kv_heads, int64_t dim,
                     int64_t block_size, float scale, int num_threads)
{
    if (n < 0 || heads < 1 || kv_heads < 1 || dim < 1 || block_size < 1 || num_blocks < 1 || width < 0 ||
        heads % kv_heads != 0 || q_head < 0 || q_row < 0 ||
        (n > 0 && (!q || !k_pool || !v_pool || !block_tables || !context_lens || !out)))
        return -3;
    if (num_threads < 1)
        num_threads = 1;
    const int64_t group = heads / kv_heads;
    /* split each row's KV heads into spans only when rows alone leave threads idle (one thread
     * takes a row whole: its heads are read as one stretch, block by block) */
    int64_t spans = 1;
    while (num_threads > 1 && spans < kv_heads && n * spans < 2 * (int64_t)num_threads)
        spans++;
    const int64_t per_span = (kv_heads + spans - 1) / spans;
    spans = (kv_heads + per_span - 1) / per_span;
    int status = 0;

    /* Tasks (row, span of KV heads) are claimed in order from one counter. While more tasks are
     * left than threads, a thread claims its next task before it computes the current one, so it
     * knows which row comes next and fetches that row's blocks meanwhile (when a task is a whole
     * row: with spans, rows are few); the last ones are claimed one at a time, so no thread holds
     * a task another could have started. */
    int64_t ticket = 0;
    const int64_t tasks = n * spans;
#pragma omp parallel num_threads(num_threads)
    {
        int64_t task = claim(&ticket);
        while (task < tasks) {
            int64_t left;
#pragma omp atomic read
            left = ticket;
            const int64_t next = spans == 1 && tasks - left > num_threads ? claim(&ticket) : -1;
            const int64_t b = task / spans, sp = task % spans;
            const int64_t kh0 = sp * per_span;
            const int64_t kh1 = kh0 + per_span < kv_heads ? kh0 + per_span : kv_heads;
            struct ahead ah = row_ahead(k_pool, v_pool, num_blocks, block_tables, width, context_lens,
                                        next >= 0 ? next : n, n, block_size, kv_heads * dim);
            int rc = attend_row(q + b * q_row, q_head, k_pool, v_pool, num_blocks,
                                block_tables + b * width, width, context_lens[b],
                                out + b * heads * dim, kh0, kh1, group, kv_heads, dim,
                                block_size, scale, &ah);
            if (rc != 0) {
#pragma omp atomic write
                status = rc;
            }
            task = next >= 0 ? next : claim(&ticket);
        }
    }
    return status;
}
