/* The small elementwise steps of a decoder layer, fused: each a single pass over its rows
 * instead of torch's 3-7 separate ops (each a dispatch and a pass over memory). float32,
 * C-contiguous rows. Built and loaded by minillm/fast/small_ops.py.
 *
 *   rms_norm_f32:  x += a (when a is not NULL), then y = w * (x * (1 / sqrt(mean(x^2) + eps)))
 *   silu_mul_f32:  out[r, j] = silu(gu[r, j]) * gu[r, inter + j]   (gate and up packed in gu)
 *
 * Products are rounded in the reference's order (x * r first, then w times that); the sum of
 * squares is accumulated in 8 partial sums and exp is a polynomial (relative error ~1e-7), so
 * results agree with torch's to float32 rounding, not bit for bit. Rows are shared among
 * OpenMP threads only when there are enough of them to pay for a parallel region. Returns 0,
 * or -3 for an impossible argument (nothing is written then). */

#include <math.h>
#include <stdint.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

/* parallel regions only from this many floats (a decode batch's rows run on one thread) */
#define PARALLEL_MIN 65536

int rms_norm_f32(float *x, const float *a, const float *w, float *y, int64_t rows, int64_t dim,
                 float eps, int num_threads)
{
    if (!x || !w || !y || rows < 0 || dim < 1)
        return -3;
    if (num_threads < 1)
        num_threads = 1;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (rows * dim >= PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) {
        float *xr = x + r * dim, *yr = y + r * dim;
        if (a) {
            const float *ar = a + r * dim;
#pragma omp simd
            for (int64_t d = 0; d < dim; d++)
                xr[d] += ar[d];
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

#if defined(__AVX2__) && defined(__FMA__)
/* exp(x), 8 at a time, x clamped to [-87, 88]: 2^n * exp(r), n = round(x / ln 2), exp(r) by its
 * Taylor polynomial to r^7 (the paged attention kernel's, extended to positive x) */
static inline __m256 exp8(__m256 x)
{
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504089f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif

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
#if defined(__AVX2__) && defined(__FMA__)
        const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
        for (; j + 8 <= inter; j += 8) {
            const __m256 gv = _mm256_loadu_ps(g + j);
            const __m256 e = exp8(_mm256_sub_ps(zero, gv));
            _mm256_storeu_ps(o + j, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + j)));
        }
#endif
        for (; j < inter; j++)
            o[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
    }
    return 0;
}
