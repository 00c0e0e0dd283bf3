/* The small elementwise steps of a decoder layer, fused: each a single pass over its rows
 * instead of torch's 3-7 separate ops (each a dispatch and a pass over memory). float32,
 * C-contiguous rows. Built and loaded by minillm/fast/small_ops.py.
 *
 *   rms_norm_f32:  s = x + a (when a is not NULL; s may be x itself), then
 *                  y = w * (s * (1 / sqrt(mean(s^2) + eps)))   (s is x when a is NULL)
 *   silu_mul_f32:  out[r, j] = silu(gu[r, j]) * gu[r, inter + j]   (gate and up packed in gu)
 *
 * Products are rounded in the reference's order (x * r first, then w times that); the sum of
 * squares is accumulated in 8 partial sums and exp is vec.h's polynomial (relative error ~1e-7), so
 * results agree with torch's to float32 rounding, not bit for bit. Rows are shared among
 * OpenMP threads only when there are enough of them to pay for a parallel region. Returns 0,
 * or -3 for an impossible argument (nothing is written then). */

#include <math.h>
#include <stdint.h>

#include "vec.h"

/* parallel regions only from this many floats (a decode batch's rows run on one thread) */
#define PARALLEL_MIN 65536

int rms_norm_f32(const float *x, const float *a, float *s, const float *w, float *y, int64_t rows,
                 int64_t dim, float eps, int num_threads)
{
    if (!x || !w || !y || rows < 0 || dim < 1 || (a && !s))
        return -3;
    if (num_threads < 1)
        num_threads = 1;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (rows * dim >= PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * dim;
        float *yr = y + r * dim;
        if (a) {
            const float *ar = a + r * dim;
            float *sr = s + r * dim;
#pragma omp simd
            for (int64_t d = 0; d < dim; d++)
                sr[d] = xr[d] + ar[d];
            xr = sr;
        }
        float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int64_t d = 0;
        for (; d + 8 <= dim; d += 8)
            for (int i = 0; i < 8; i++)
                part[i] += xr[d + i] * xr[d + i];
        float ss = ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
        for (; d < dim; d++)
            ss += xr[d] * xr[d];
        const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
#pragma omp simd
        for (d = 0; d < dim; d++)
            yr[d] = w[d] * (xr[d] * inv);
    }
    return 0;
}

int silu_mul_f32(const float *gu, float *out, int64_t rows, int64_t inter, int num_threads)
{
    if (!gu || !out || rows < 0 || inter < 1)
        return -3;
    if (num_threads < 1)
        num_threads = 1;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (rows * inter >= PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *g = gu + r * 2 * inter, *u = g + inter;
        float *o = out + r * inter;
        int64_t j = 0;
#if defined(HAVE_VECTOR_PATH)
        const vec one = v_set1(1.0f), zero = v_zero();
        for (; j + LANES <= inter; j += LANES) {
            const vec gv = v_load(g + j);
            const vec e = v_exp(v_sub(zero, gv));
            v_store(o + j, v_mul(v_div(gv, v_add(one, e)), v_load(u + j)));
        }
#endif
        for (; j < inter; j++)
            o[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
    }
    return 0;
}
