/* A whole decoder layer of a decode step (at most MAX_ROWS rows) in one call from Python.
 *
 * An eager decode step ran each layer as ~10 ctypes calls and ~25 torch operations (norms,
 * projections, rotary, the KV write, attention, the residual adds), each paying Python's and
 * torch's per-call cost: on SmolLM2-135M (30 layers) ~5 of a ~28 ms step on one Zen 4 core.
 * This file does the layer's own elementwise work (rotary on the query and key heads, the KV
 * write, the last residual add) and calls the kernels the eager path already uses, through
 * pointers taken from their own libraries (gemv.c's projections and their worker pool,
 * small_ops.c's norms and SiLU.mul, paged_decode.c's attention), in the same order on the same
 * buffers: the results are the eager path's, bit for bit (tests/test_layer_step.py).
 *
 * Layouts (float32, C order): x and out [m, hidden]; the projections' weights [n, k] with row
 * stride ldw (int8 levels with a float32 scale per row when scale is not NULL); cos and
 * signed_sin [m, head_dim] (sin with its first half negated, as the model's rotary makes it);
 * the KV pools [blocks, block_size, kv_heads, head_dim]; slots [m], block tables [m, width]
 * and context lengths [m] int64. scratch holds layer_scratch_floats(...) floats.
 *
 * Rotary rounds as torch's `qk * cos` then `addcmul` do on a vector CPU: the first product
 * rounded, the second fused into the sum (fmaf; -ffp-contract=off keeps the compiler from fusing
 * anything else). Returns 0, or (before anything is written) -3 for an
 * impossible argument, -1 for a slot, block id or context outside the pool or its table; a
 * kernel's own nonzero status otherwise. Built and loaded by minillm/fast/layer_step.py. */

#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_ROWS 8
#define MAX_HEAD_DIM 512

typedef int (*gemv_f32_fn)(const float *x, int64_t m, int64_t ldx, const float *w, int64_t n, int64_t k,
                           int64_t ldw, const float *bias, float *y, int64_t ldy, int threads);
typedef int (*gemv_i8_fn)(const float *x, int64_t m, int64_t ldx, const int8_t *q, const float *scale, int64_t n,
                          int64_t k, int64_t ldw, const float *bias, float *y, int64_t ldy, int threads);
typedef int (*rms_norm_fn)(const float *x, const float *a, float *s, const float *w, float *y, int64_t rows,
                           int64_t dim, float eps, int num_threads);
typedef int (*silu_mul_fn)(const float *gu, float *out, int64_t rows, int64_t inter, int num_threads);
typedef int (*paged_decode_fn)(const float *q, int64_t q_row, int64_t q_head, const float *k_pool,
                               const float *v_pool, int64_t num_blocks, const int64_t *block_tables,
                               int64_t width, const int64_t *context_lens, float *out, int64_t n,
                               int64_t heads, int64_t kv_heads, int64_t dim, int64_t block_size,
                               float scale, int num_threads);

/* the kernels, from their own libraries */
struct layer_kernels {
    gemv_f32_fn gemv_f32;
    gemv_i8_fn gemv_i8;
    rms_norm_fn rms_norm;
    silu_mul_fn silu_mul;
    paged_decode_fn paged_decode;
};

/* one projection: y = x @ W.T (+ bias); W [n, k], float32 or (scale not NULL) int8 */
struct projection {
    const void *w;
    const float *scale;
    const float *bias;
    int64_t n, k, ldw;
};

/* what stays the same from step to step: a layer's weights and shape */
struct layer_weights {
    struct projection qkv, o, gate_up, down;
    const float *norm1, *norm2;
    float eps1, eps2, attn_scale;
    int64_t hidden, heads, kv_heads, head_dim, inter;
};

/* what every layer of one step shares */
struct decode_step {
    int64_t m;
    const int64_t *slots, *tables, *lens;
    int64_t width, num_blocks, block_size;
    float *scratch;
    int64_t scratch_floats;
    int gemv_threads, threads;
};

int64_t layer_scratch_floats(int64_t m, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim,
                             int64_t inter)
{
    const int64_t q = heads * head_dim, qkv = q + 2 * kv_heads * head_dim;
    return m * (3 * hidden + qkv + q + 3 * inter);
}

static int project(const struct layer_kernels *kern, const struct projection *p, const float *x, int64_t m,
                   float *y, int threads)
{
    if (p->scale != NULL)
        return kern->gemv_i8(x, m, p->k, (const int8_t *)p->w, p->scale, p->n, p->k, p->ldw, p->bias, y, p->n,
                             threads);
    return kern->gemv_f32(x, m, p->k, (const float *)p->w, p->n, p->k, p->ldw, p->bias, y, p->n, threads);
}

static int projection_fits(const struct projection *p, int64_t n, int64_t k)
{
    return p->w != NULL && p->n == n && p->k == k && p->ldw >= k;
}

/* everything the layer will read or write, checked before anything is */
static int check(const struct layer_kernels *kern, const struct layer_weights *lw, const struct decode_step *st,
                 const float *x, const float *out, const float *k_pool, const float *v_pool, const float *cos,
                 const float *sin)
{
    if (!kern || !lw || !st || !x || !out || !k_pool || !v_pool || !cos || !sin || !st->slots || !st->tables ||
        !st->lens || !st->scratch || !kern->gemv_f32 || !kern->gemv_i8 || !kern->rms_norm || !kern->silu_mul ||
        !kern->paged_decode || !lw->norm1 || !lw->norm2)
        return -3;
    const int64_t hidden = lw->hidden, d = lw->head_dim, q = lw->heads * d, kv = lw->kv_heads * d;
    if (st->m < 1 || st->m > MAX_ROWS || hidden < 1 || d < 2 || d > MAX_HEAD_DIM || d % 2 || lw->kv_heads < 1 ||
        lw->heads < 1 || lw->heads % lw->kv_heads || lw->inter < 1 || st->width < 1 || st->num_blocks < 1 ||
        st->block_size < 1 ||
        st->scratch_floats < layer_scratch_floats(st->m, hidden, lw->heads, lw->kv_heads, d, lw->inter) ||
        !projection_fits(&lw->qkv, q + 2 * kv, hidden) || !projection_fits(&lw->o, hidden, q) ||
        !projection_fits(&lw->gate_up, 2 * lw->inter, hidden) || !projection_fits(&lw->down, hidden, lw->inter))
        return -3;
    const int64_t slots = st->num_blocks * st->block_size;
    for (int64_t r = 0; r < st->m; r++) {
        const int64_t len = st->lens[r];
        if (st->slots[r] < 0 || st->slots[r] >= slots || len < 1 || len > st->width * st->block_size)
            return -1;
        for (int64_t b = 0; b < (len + st->block_size - 1) / st->block_size; b++) {
            const int64_t id = st->tables[r * st->width + b];
            if (id < 0 || id >= st->num_blocks)
                return -1;
        }
    }
    return 0;
}

/* rotary on the query and key heads of one row, in place: v * cos + roll(v, half) * signed_sin */
static void rotate(float *heads, int64_t count, int64_t d, const float *cos, const float *sin)
{
    float v[MAX_HEAD_DIM];
    const int64_t half = d / 2;
    for (int64_t h = 0; h < count; h++) {
        float *o = heads + h * d;
        memcpy(v, o, sizeof(float) * d);
        for (int64_t i = 0; i < half; i++)
            o[i] = fmaf(v[i + half], sin[i], v[i] * cos[i]);
        for (int64_t i = half; i < d; i++)
            o[i] = fmaf(v[i - half], sin[i], v[i] * cos[i]);
    }
}

/* one layer, its arguments checked */
static int run_layer(const struct layer_kernels *kern, const struct layer_weights *lw, const struct decode_step *st,
                     const float *x, float *out, float *k_pool, float *v_pool, const float *cos, const float *sin)
{
    int rc;
    const int64_t m = st->m, hidden = lw->hidden, d = lw->head_dim, inter = lw->inter;
    const int64_t q = lw->heads * d, kv = lw->kv_heads * d, qkv_n = q + 2 * kv;
    float *h = st->scratch, *qkv = h + m * hidden, *att = qkv + m * qkv_n, *a = att + m * q;
    float *gu = a + m * hidden, *act = gu + m * 2 * inter, *down = act + m * inter;

    if ((rc = kern->rms_norm(x, NULL, NULL, lw->norm1, h, m, hidden, lw->eps1, st->threads)) ||
        (rc = project(kern, &lw->qkv, h, m, qkv, st->gemv_threads)))
        return rc;
    for (int64_t r = 0; r < m; r++) {
        float *row = qkv + r * qkv_n;
        rotate(row, lw->heads + lw->kv_heads, d, cos + r * d, sin + r * d);
        memcpy(k_pool + st->slots[r] * kv, row + q, sizeof(float) * kv);
        memcpy(v_pool + st->slots[r] * kv, row + q + kv, sizeof(float) * kv);
    }
    if ((rc = kern->paged_decode(qkv, qkv_n, d, k_pool, v_pool, st->num_blocks, st->tables, st->width, st->lens,
                                 att, m, lw->heads, lw->kv_heads, d, st->block_size, lw->attn_scale, st->threads)) ||
        (rc = project(kern, &lw->o, att, m, a, st->gemv_threads)) ||
        (rc = kern->rms_norm(x, a, out, lw->norm2, h, m, hidden, lw->eps2, st->threads)) ||
        (rc = project(kern, &lw->gate_up, h, m, gu, st->gemv_threads)) ||
        (rc = kern->silu_mul(gu, act, m, inter, st->threads)) ||
        (rc = project(kern, &lw->down, act, m, down, st->gemv_threads)))
        return rc;
    for (int64_t i = 0; i < m * hidden; i++)
        out[i] += down[i];
    return 0;
}

int decoder_layer_f32(const struct layer_kernels *kern, const struct layer_weights *lw,
                      const struct decode_step *st, const float *x, float *out, float *k_pool, float *v_pool,
                      const float *cos, const float *sin)
{
    const int rc = check(kern, lw, st, x, out, k_pool, v_pool, cos, sin);
    return rc != 0 ? rc : run_layer(kern, lw, st, x, out, k_pool, v_pool, cos, sin);
}

/* Every layer of the step in turn (layer i's weights layers[i], its pools k_pools[i] and
 * v_pools[i]): x in, the last layer's output in out, the layers between alternating through out
 * and between ([m, hidden] floats). Every layer's arguments are checked before anything is
 * written. The same calls in the same order as decoder_layer_f32 layer by layer. */
int decoder_stack_f32(const struct layer_kernels *kern, const struct layer_weights *const *layers, int64_t n_layers,
                      const struct decode_step *st, const float *x, float *out, float *between,
                      float *const *k_pools, float *const *v_pools, const float *cos, const float *sin)
{
    if (!layers || !k_pools || !v_pools || !between || n_layers < 1)
        return -3;
    for (int64_t i = 0; i < n_layers; i++) {
        const int rc = check(kern, layers[i], st, x, out, k_pools[i], v_pools[i], cos, sin);
        if (rc != 0)
            return rc;
        if (layers[i]->hidden != layers[0]->hidden)
            return -3;
    }
    const float *in = x;
    for (int64_t i = 0; i < n_layers; i++) {
        float *dst = (n_layers - 1 - i) % 2 == 0 ? out : between;
        const int rc = run_layer(kern, layers[i], st, in, dst, k_pools[i], v_pools[i], cos, sin);
        if (rc != 0)
            return rc;
        in = dst;
    }
    return 0;
}

/* The model's head after the stack: its final RMSNorm and the lm head's projection. */
struct model_head {
    const float *norm;
    float eps;
    struct projection proj;
};

static int head_fits(const struct model_head *head, int64_t hidden, const float *logits)
{
    return head == NULL || (head->norm != NULL && logits != NULL && head->proj.n >= 1
                            && projection_fits(&head->proj, head->proj.n, hidden));
}

/* decoder_stack_f32 with the rotary rows gathered here from the model's tables ([table_rows,
 * head_dim] cos and sin, the sin unsigned) at the step's positions [m] int64, into rope (2 * m *
 * head_dim floats): cos as is, sin with its first half negated, the values the model's rotary
 * makes per step with torch's index, neg and cat (a copy and a sign: the same bits). With a head
 * (else NULL), the final norm and the lm head's product into logits [m, n] of the last layer's
 * rows in the order logits_rows [m] gives (NULL: as they are): the calls index_select,
 * FusedRMSNorm and StreamLinear make, with the same threads. A position outside the tables or a
 * row outside [0, m) returns -1 before anything is written. */
int decoder_stack_rope_f32(const struct layer_kernels *kern, const struct layer_weights *const *layers,
                           int64_t n_layers, const struct decode_step *st, const float *x, float *out,
                           float *between, float *const *k_pools, float *const *v_pools, const float *cos_tab,
                           const float *sin_tab, int64_t table_rows, const int64_t *positions, float *rope,
                           const struct model_head *head, const int64_t *logits_rows, float *logits)
{
    if (!layers || n_layers < 1 || !layers[0] || !st || !cos_tab || !sin_tab || !positions || !rope
        || st->m < 1 || st->m > MAX_ROWS || layers[0]->head_dim < 2 || layers[0]->head_dim > MAX_HEAD_DIM
        || layers[0]->head_dim % 2 != 0 || !head_fits(head, layers[0]->hidden, logits))
        return -3;
    const int64_t m = st->m, d = layers[0]->head_dim, half = d / 2;
    for (int64_t r = 0; r < m; r++)
        if (positions[r] < 0 || positions[r] >= table_rows || (logits_rows && (logits_rows[r] < 0 || logits_rows[r] >= m)))
            return -1;
    float *cos = rope, *sin = rope + m * d;
    for (int64_t r = 0; r < m; r++) {
        const float *c = cos_tab + positions[r] * d, *s = sin_tab + positions[r] * d;
        memcpy(cos + r * d, c, (size_t)d * sizeof(float));
        for (int64_t j = 0; j < half; j++)
            sin[r * d + j] = -s[j];
        memcpy(sin + r * d + half, s + half, (size_t)(d - half) * sizeof(float));
    }
    int rc = decoder_stack_f32(kern, layers, n_layers, st, x, out, between, k_pools, v_pools, cos, sin);
    if (rc != 0 || head == NULL)
        return rc;
    const int64_t hidden = layers[0]->hidden;
    const float *last = out;
    float *normed = between;
    if (logits_rows) { /* the rows in the order asked for (index_select), normed back into out */
        for (int64_t r = 0; r < m; r++)
            memcpy(between + r * hidden, out + logits_rows[r] * hidden, (size_t)hidden * sizeof(float));
        last = between;
        normed = out;
    }
    if ((rc = kern->rms_norm(last, NULL, NULL, head->norm, normed, m, hidden, head->eps, st->threads)))
        return rc;
    return project(kern, &head->proj, normed, m, logits, st->gemv_threads);
}

/* Each of m rows of n floats: the index of its largest value, as torch.argmax gives it (the first
 * of equal largest values; a NaN counts as the largest, the first one wins). */
void rows_argmax_f32(const float *x, int64_t m, int64_t n, int64_t *out)
{
    for (int64_t r = 0; r < m; r++) {
        const float *row = x + r * n;
        int64_t best = 0;
        float top = row[0];
        for (int64_t j = 1; j < n && !isnan(top); j++) {
            if (isnan(row[j]) || row[j] > top) {
                top = row[j];
                best = j;
            }
        }
        out[r] = best;
    }
}

/* The model around the layers: the embedding table [vocab, dim] the step's ids are rows of, the
 * rotary's tables (as decoder_stack_rope_f32 reads them) and the head. */
struct model_ends {
    const float *embed;
    int64_t vocab, dim;
    const float *cos_tab, *sin_tab;
    int64_t table_rows;
    struct model_head head;
};

/* floats a row of a step's scratch that decoder_model_f32 uses besides the layers' */
int64_t model_scratch_floats(int64_t hidden, int64_t head_dim)
{
    return 3 * hidden + 2 * head_dim;
}

/* A decode step of the whole model in one call: the rows of the embedding at the step's ids [m]
 * (torch's embedding: a row copy), then decoder_stack_rope_f32 with the head, the logits [m, n] in
 * the rows' order; with argmax (else NULL) each row's argmax of them too (rows_argmax_f32: the
 * greedy token, saving the sampler's pass). The hidden states and rotary rows live in the first
 * m * model_scratch_floats of st->scratch, the layers' scratch after them. An id outside the
 * embedding returns -1 before anything is written. */
int decoder_model_f32(const struct layer_kernels *kern, const struct layer_weights *const *layers, int64_t n_layers,
                      const struct decode_step *st, float *const *k_pools, float *const *v_pools,
                      const struct model_ends *ends, const int64_t *ids, const int64_t *positions, float *logits,
                      int64_t *argmax)
{
    if (!layers || n_layers < 1 || !layers[0] || !st || !st->scratch || !ends || !ends->embed || !ids || !logits)
        return -3;
    const int64_t m = st->m, hidden = layers[0]->hidden, own = m * model_scratch_floats(hidden, layers[0]->head_dim);
    if (m < 1 || m > MAX_ROWS || hidden < 1 || ends->dim != hidden || layers[0]->head_dim < 1 ||
        st->scratch_floats < own)
        return -3;
    for (int64_t r = 0; r < m; r++)
        if (ids[r] < 0 || ids[r] >= ends->vocab)
            return -1;
    struct decode_step rest = *st;
    rest.scratch = st->scratch + own;
    rest.scratch_floats = st->scratch_floats - own;
    float *x = st->scratch, *out = x + m * hidden, *between = out + m * hidden, *rope = between + m * hidden;
    for (int64_t r = 0; r < m; r++)
        memcpy(x + r * hidden, ends->embed + ids[r] * hidden, (size_t)hidden * sizeof(float));
    const int rc = decoder_stack_rope_f32(kern, layers, n_layers, &rest, x, out, between, k_pools, v_pools,
                                          ends->cos_tab, ends->sin_tab, ends->table_rows, positions, rope,
                                          &ends->head, NULL, logits);
    if (rc == 0 && argmax != NULL)
        rows_argmax_f32(logits, m, ends->head.proj.n, argmax);
    return rc;
}
