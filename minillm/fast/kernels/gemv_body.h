/* The row-tile kernels of gemv.c, written once and included once per instruction set, under
 * that set's target pragma. A tile reads 4 weight rows (or 1, at the end) once and multiplies
 * them into G activation rows: a[g][r] += x[g][k..k+VW) * w[r][k..k+VW), the accumulators
 * named variables (not arrays) so that they stay in registers; G is a constant after inlining
 * and the unused rows' code is dropped.
 *
 * Needs: VW, GMAX, SUFFIX, VT (the vector type), VZERO, VLOADF(p), VLOADI8(p), VFMA(a, b, c)
 * (a * b + c), VHSUM(v) (the sum of the lanes). */

#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#define FN(name) CAT(name, SUFFIX)

#define LOADW(r) (ISINT8 ? VLOADI8(wq + (r) * rs + kk) : VLOADF(wf + (r) * rs + kk))

/* s plus x[t] * w[off + t] for the k % VW elements past the vectors, in order */
static inline __attribute__((always_inline)) float FN(tail)(float s, const float *x, const float *wf,
                                                            const int8_t *wq, int64_t off, int64_t kk, int64_t k,
                                                            const int ISINT8)
{
    for (int64_t t = kk; t < k; t++)
        s += x[t] * (ISINT8 ? (float)wq[off + t] : wf[off + t]);
    return s;
}

/* out[g * 4 + r] = x[g] . w[r * rs .. r * rs + k) for G activation rows and 4 weight rows, `rs`
 * elements apart (a row in each of 4 far-apart streams: see rows() below); the next tile's rows
 * are one row (ldw) further on in each stream. */
static inline __attribute__((always_inline)) void FN(tile4)(const float *x, int64_t ldx, const void *wv,
                                                            int64_t ldw, int64_t rs, int64_t k, float *out,
                                                            const int G, const int ISINT8)
{
    VT a00 = VZERO, a01 = VZERO, a02 = VZERO, a03 = VZERO;
    VT a10 = VZERO, a11 = VZERO, a12 = VZERO, a13 = VZERO;
    VT a20 = VZERO, a21 = VZERO, a22 = VZERO, a23 = VZERO;
    VT a30 = VZERO, a31 = VZERO, a32 = VZERO, a33 = VZERO;
    const float *wf = (const float *)wv;
    const int8_t *wq = (const int8_t *)wv;
    int64_t kk = 0;
    for (; kk + VW <= k; kk += VW) {
        const VT w0 = LOADW(0), w1 = LOADW(1), w2 = LOADW(2), w3 = LOADW(3);
        /* the next tile's rows, a cache line at a time (measured: int8 streams ~2x faster with
         * it on a Zen 3 core; float32: PREFETCH_F32, see gemv.c) */
        if ((ISINT8 || PREFETCH_F32) && (kk & (ISINT8 ? 63 : 15)) == 0) {
            const char *next = ISINT8 ? (const char *)(wq + ldw + kk) : (const char *)(wf + ldw + kk);
            const int64_t row = ISINT8 ? rs : 4 * rs;
            __builtin_prefetch(next, 0, 3), __builtin_prefetch(next + row, 0, 3);
            __builtin_prefetch(next + 2 * row, 0, 3), __builtin_prefetch(next + 3 * row, 0, 3);
        }
        const VT x0 = VLOADF(x + kk);
        a00 = VFMA(x0, w0, a00), a01 = VFMA(x0, w1, a01), a02 = VFMA(x0, w2, a02), a03 = VFMA(x0, w3, a03);
        if (G > 1) {
            const VT x1 = VLOADF(x + ldx + kk);
            a10 = VFMA(x1, w0, a10), a11 = VFMA(x1, w1, a11), a12 = VFMA(x1, w2, a12), a13 = VFMA(x1, w3, a13);
        }
        if (G > 2) {
            const VT x2 = VLOADF(x + 2 * ldx + kk);
            a20 = VFMA(x2, w0, a20), a21 = VFMA(x2, w1, a21), a22 = VFMA(x2, w2, a22), a23 = VFMA(x2, w3, a23);
        }
        if (G > 3) {
            const VT x3 = VLOADF(x + 3 * ldx + kk);
            a30 = VFMA(x3, w0, a30), a31 = VFMA(x3, w1, a31), a32 = VFMA(x3, w2, a32), a33 = VFMA(x3, w3, a33);
        }
    }
    /* each sum straight from its named register: an array of the accumulators made GCC spill all
     * 16 to the stack after every tile, and for k = 576 (4 rows of 2304 bytes a tile) that epilogue
     * cost ~12 % of the stream (29.3 against 33.4 GB/s, SmolLM2's weights, Zen 4) */
#define SUM(g, r, a) out[(g) * 4 + (r)] = FN(tail)(VHSUM(a), x + (g) * ldx, wf, wq, (r) * rs, kk, k, ISINT8)
    SUM(0, 0, a00), SUM(0, 1, a01), SUM(0, 2, a02), SUM(0, 3, a03);
    if (G > 1)
        SUM(1, 0, a10), SUM(1, 1, a11), SUM(1, 2, a12), SUM(1, 3, a13);
    if (G > 2)
        SUM(2, 0, a20), SUM(2, 1, a21), SUM(2, 2, a22), SUM(2, 3, a23);
    if (G > 3)
        SUM(3, 0, a30), SUM(3, 1, a31), SUM(3, 2, a32), SUM(3, 3, a33);
#undef SUM
}

/* out[g] = x[g] . w over k, for G <= 2 activation rows and one weight row */
static inline __attribute__((always_inline)) void FN(tile1)(const float *x, int64_t ldx, const void *wv,
                                                            int64_t rs, int64_t k, float *out, const int G,
                                                            const int ISINT8)
{
    VT a0 = VZERO, a1 = VZERO;
    const float *wf = (const float *)wv;
    const int8_t *wq = (const int8_t *)wv;
    int64_t kk = 0;
    for (; kk + VW <= k; kk += VW) {
        const VT w0 = LOADW(0);
        a0 = VFMA(VLOADF(x + kk), w0, a0);
        if (G > 1)
            a1 = VFMA(VLOADF(x + ldx + kk), w0, a1);
    }
    out[0] = FN(tail)(VHSUM(a0), x, wf, wq, 0, kk, k, ISINT8);
    if (G > 1)
        out[1] = FN(tail)(VHSUM(a1), x + ldx, wf, wq, 0, kk, k, ISINT8);
}

/* Output rows r, r + rs, .., r + (R - 1) * rs (R = 4 or 1) of y = x @ W.T (+ bias), times
 * scale[row] for int8, for all m activation rows. */
static inline void FN(tile_rows)(const struct gemv_job *j, int64_t r, const int R, int64_t rstep)
{
    const int isint8 = j->scale != NULL;
    const int64_t esize = isint8 ? 1 : 4;
    const void *w = (const char *)j->w + r * j->ldw * esize;
    const int64_t ldx = j->ldx, ldw = j->ldw, k = j->k, rs = rstep * ldw;
    float out[4 * 4];
    for (int64_t g = 0; g < j->m;) {
        const int64_t left = j->m - g;
        const int G = R == 4 && left >= GMAX ? GMAX : (left >= 2 ? 2 : 1);
        const float *x = j->x + g * ldx;
        if (R == 4 && G == GMAX)
            isint8 ? FN(tile4)(x, ldx, w, ldw, rs, k, out, GMAX, 1) : FN(tile4)(x, ldx, w, ldw, rs, k, out, GMAX, 0);
        else if (R == 4 && G == 2)
            isint8 ? FN(tile4)(x, ldx, w, ldw, rs, k, out, 2, 1) : FN(tile4)(x, ldx, w, ldw, rs, k, out, 2, 0);
        else if (R == 4)
            isint8 ? FN(tile4)(x, ldx, w, ldw, rs, k, out, 1, 1) : FN(tile4)(x, ldx, w, ldw, rs, k, out, 1, 0);
        else if (G == 2)
            isint8 ? FN(tile1)(x, ldx, w, rs, k, out, 2, 1) : FN(tile1)(x, ldx, w, rs, k, out, 2, 0);
        else
            isint8 ? FN(tile1)(x, ldx, w, rs, k, out, 1, 1) : FN(tile1)(x, ldx, w, rs, k, out, 1, 0);
        for (int gg = 0; gg < G; gg++)
            for (int rr = 0; rr < R; rr++) {
                const int64_t o = r + rr * rstep;
                float s = out[gg * R + rr];
                if (isint8)
                    s *= j->scale[o];
                if (j->bias != NULL)
                    s += j->bias[o];
                j->y[(g + gg) * j->ldy + o] = s;
            }
        g += G;
    }
}

/* Output rows [r0, r1). A tile's 4 rows come from the 4 quarters of the range, so the core reads
 * 4 streams a quarter of the range apart instead of one: measured on a Zen 3 core, a model's
 * worth of float32 weights streamed at 17-21 GB/s this way against 11-12 GB/s with adjacent
 * rows (one stream; the hardware prefetcher keeps more misses in flight over several). Each
 * output is the same dot product either way. */
static void FN(rows)(const struct gemv_job *j, int64_t r0, int64_t r1)
{
    const int64_t q = (r1 - r0) / 4;
    for (int64_t i = 0; i < q; i++)
        FN(tile_rows)(j, r0 + i, 4, q);
    for (int64_t r = r0 + 4 * q; r < r1; r++)
        FN(tile_rows)(j, r, 1, 1);
}

#undef LOADW
#undef FN
#undef CAT
#undef CAT2
