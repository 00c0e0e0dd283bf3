/* One vector of LANES floats and the few operations the C kernels' fast paths need, so each
 * fast path is written once: 16 lanes with AVX-512, 8 with AVX2 + FMA, as -march=native
 * compiled the including file. HAVE_VECTOR_PATH is defined when there is a vector type; without
 * it the kernels use their plain C loops. Included by paged_decode.c and small_ops.c (gemv.c
 * picks its instruction set at run time instead, under target pragmas: see gemv_body.h).
 * Its text is part of each including library's cache key (cpu_kernel._compile). */

#ifndef MINILLM_VEC_H
#define MINILLM_VEC_H

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#define HAVE_VECTOR_PATH 1
#if defined(__AVX512F__)
#define LANES 16
typedef __m512 vec;
#define v_load _mm512_loadu_ps
#define v_store _mm512_storeu_ps
#define v_set1 _mm512_set1_ps
#define v_zero _mm512_setzero_ps
#define v_add _mm512_add_ps
#define v_sub _mm512_sub_ps
#define v_mul _mm512_mul_ps
#define v_div _mm512_div_ps
#define v_max _mm512_max_ps
#define v_min _mm512_min_ps
#define v_fmadd _mm512_fmadd_ps
#define v_fnmadd _mm512_fnmadd_ps
#define v_sum _mm512_reduce_add_ps
#define v_top _mm512_reduce_max_ps
#define v_round(x) _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define v_times_pow2 _mm512_scalef_ps                 /* p * 2^n, n integral */
#else
#define LANES 8
typedef __m256 vec;
#define v_load _mm256_loadu_ps
#define v_store _mm256_storeu_ps
#define v_set1 _mm256_set1_ps
#define v_zero _mm256_setzero_ps
#define v_add _mm256_add_ps
#define v_sub _mm256_sub_ps
#define v_mul _mm256_mul_ps
#define v_div _mm256_div_ps
#define v_max _mm256_max_ps
#define v_min _mm256_min_ps
#define v_fmadd _mm256_fmadd_ps
#define v_fnmadd _mm256_fnmadd_ps
#define v_round(x) _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
static inline float v_sum(__m256 x)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
static inline float v_top(__m256 x)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}
/* p * 2^n for integral n in [-126, 127]: n added to the float's exponent field */
static inline __m256 v_times_pow2(__m256 p, __m256 n)
{
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif

/* exp(x), a vector at a time, x clamped to [-87, 88] (float32's range: attention's x <= 0 never
 * meets the upper clamp): exp(x) = 2^n * exp(r), n = round(x / ln 2), |r| <= ln 2 / 2, exp(r) by
 * its Taylor polynomial to r^7 (relative error ~1e-7, float32's own rounding). */
static inline vec v_exp(vec x)
{
    x = v_min(v_max(x, v_set1(-87.0f)), v_set1(88.0f));
    const vec n = v_round(v_mul(x, v_set1(1.44269504089f)));
    vec r = v_fnmadd(n, v_set1(0.693145751953125f), x);   /* ln 2, split */
    r = v_fnmadd(n, v_set1(1.428606765330187e-06f), r);
    vec p = v_set1(1.0f / 5040);
    p = v_fmadd(p, r, v_set1(1.0f / 720));
    p = v_fmadd(p, r, v_set1(1.0f / 120));
    p = v_fmadd(p, r, v_set1(1.0f / 24));
    p = v_fmadd(p, r, v_set1(1.0f / 6));
    p = v_fmadd(p, r, v_set1(0.5f));
    p = v_fmadd(p, r, v_set1(1.0f));
    p = v_fmadd(p, r, v_set1(1.0f));
    return v_times_pow2(p, n);
}
#endif

#endif
