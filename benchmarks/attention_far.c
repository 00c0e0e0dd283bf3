/* Batch-1 decode attention as a decode step meets it: SmolLM2-135M's shape (9 query heads, 3 KV
 * heads of 64 floats, blocks of 16 tokens), 30 layers, each with its own K and V pools in 2 MB
 * pages and its own random block table, and 17 MB of "weights" read between two layers' calls,
 * as the step's projections read them, so a layer's blocks come from memory, not cache. Only
 * the attention calls are timed. Built and run by attention_far.py against a paged_decode.c.
 *
 *     attention_far LEN ROUNDS THREADS ROWS   ->   one line: LEN ROWS median_ms min_ms checksum */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

int paged_decode_f32(const float *q, int64_t q_row, int64_t q_head, const float *k_pool, const float *v_pool,
                     int64_t num_blocks, const int64_t *block_tables, int64_t width, const int64_t *context_lens,
                     float *out, int64_t n, int64_t heads, int64_t kv_heads, int64_t dim, int64_t block_size,
                     float scale, int num_threads);

enum { LAYERS = 30, HEADS = 9, KV_HEADS = 3, DIM = 64, BLOCK = 16, BLOCKS = 2048 };

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static float *pages(size_t floats)       /* zeroed memory in 2 MB pages where the system gives them */
{
    size_t bytes = (floats * sizeof(float) + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        exit(2);
    madvise(p, bytes, MADV_HUGEPAGE);
    memset(p, 0, bytes);
    return p;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc != 5)
        return 2;
    const int len = atoi(argv[1]), rounds = atoi(argv[2]), threads = atoi(argv[3]), rows = atoi(argv[4]);
    if (len < 1 || rounds < 1 || rounds > 1000 || threads < 1 || rows < 1 || (len + BLOCK - 1) / BLOCK * rows > BLOCKS)
        return 2;
    const size_t pool = (size_t)BLOCKS * BLOCK * KV_HEADS * DIM, width = (len + BLOCK - 1) / BLOCK;
    const size_t weights = (size_t)17 << 20;                  /* bytes read between two layers */
    float *k[LAYERS], *v[LAYERS], *w = pages(weights / 4 * LAYERS);
    int64_t *table[LAYERS];
    srand(1);
    for (int l = 0; l < LAYERS; l++) {
        k[l] = pages(pool), v[l] = pages(pool);
        for (size_t i = 0; i < pool; i++)
            k[l][i] = rand() / (float)RAND_MAX - 0.5f, v[l][i] = rand() / (float)RAND_MAX - 0.5f;
        table[l] = malloc(sizeof(int64_t) * width * rows);
        for (size_t j = 0; j < width * rows; j++)
            table[l][j] = rand() % BLOCKS;
    }
    for (size_t i = 0; i < weights / 4 * LAYERS; i++)
        w[i] = 1.0f;
    float *q = malloc(sizeof(float) * rows * HEADS * DIM), *out = malloc(sizeof(float) * rows * HEADS * DIM);
    int64_t *lens = malloc(sizeof(int64_t) * rows);
    for (int i = 0; i < rows * HEADS * DIM; i++)
        q[i] = rand() / (float)RAND_MAX;
    for (int i = 0; i < rows; i++)
        lens[i] = len;
    double *took = malloc(sizeof(double) * rounds), check = 0;
    volatile float sink = 0;
    for (int r = 0; r < rounds; r++) {
        took[r] = 0;
        for (int l = 0; l < LAYERS; l++) {
            float s = 0;
            const float *wl = w + (size_t)l * (weights / 4);
            for (size_t i = 0; i < weights / 4; i += 16)     /* one float a line: the line is read */
                s += wl[i];
            sink += s;
            const double t0 = now();
            const int rc = paged_decode_f32(q, HEADS * DIM, DIM, k[l], v[l], BLOCKS, table[l], width, lens, out, rows,
                                            HEADS, KV_HEADS, DIM, BLOCK, 0.125f, threads);
            took[r] += now() - t0;
            if (rc != 0)
                return 3;
            check += out[0] + out[rows * HEADS * DIM - 1];
        }
    }
    qsort(took, rounds, sizeof(double), by_value);
    printf("%d %d %.6f %.6f %.9g\n", len, rows, took[rounds / 2] * 1e3, took[0] * 1e3, check / rounds);
    return 0;
}
