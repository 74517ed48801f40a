/* y = x @ w.T for every packed weight format: one driver, a micro-kernel per
 * format (bulkhead/model/c_linear.py loads it; the kernel table,
 * bulkhead/model/kernel_table.py, says which format runs where).
 *
 *   format (micro-kernel file)        inputs             entry points
 *   4-bit grid, fp32 (linear_q4.h)     fp32               linear_q4
 *   4-bit / 8-bit grid (linear_i16in.h) 16-bit integers   linear_q4_i16in, linear_q8_i16in,
 *     (the 4-bit one's fp32, Q4_1 and Q4_0 scales)                  linear_q4_1_i16in, linear_q4_0_i16in
 *   8-bit, scale per 16 (linear_q8a.h)  16-bit integers   linear_q8a_i16in (Q6_K, Q5_K, Q5_1, mixed)
 *   any of the three above, by tag     16-bit integers   linear_coded (a GGUF file's per-group formats)
 *   bf16 pairs (linear_bf16.h)         bf16               linear_bf16in(_rounded, _silu_mul), linear_bf16_bf16in
 *   bf16, lm_head (linear_bf16w.h)     fp32               linear_bf16w
 *
 * The driver (drive) owns what the formats share: the shape rules (outputs
 * in blocks of NB, inputs in groups of G where a format has groups), the
 * threads, and the hand-out of (block, rows) tiles. Blocks go to the team's
 * threads as they free up (OpenMP's dynamic schedule), not in two fixed
 * halves: on a 2-core machine a thread is taken off its core whenever
 * another wakes (the HTTP server's, a link's, the other worker's), and with
 * fixed halves its partner then waited at the end of the call. Which thread
 * computes a block never changes its numbers: threads split the outputs,
 * never a sum, so every format is batch invariant by construction.
 *
 * A format that needs its rows prepared (rounded to bf16, quantized to
 * 16-bit integers) does so once per call, before the driver, into scratch.
 *
 * Built with -fopenmp where torch runs on libgomp (its work runs in torch's
 * own thread team), -march=native and -ffp-contract=off (the SiLU glue
 * rounds as torch's separate ops do; every other product is an explicit
 * fused multiply-add). A format whose instructions this CPU lacks is left
 * out: has_avx512_bf16() and has_avx512_vnni() say which are built, and its
 * entry points return -1. Every header is included here so that
 * decode_kernel._build folds it into the library's cache key.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512BF16__) || defined(__AVX512VNNI__)
#include <immintrin.h>
#endif
#include "bf16.h"
#include "glue.h"
#ifdef __AVX512BF16__
#include "dot_bf16.h"
#endif

#define NB 32    /* outputs per block: two AVX-512 vectors of fp32 */
#define HALF (NB / 2)
#define G 32     /* inputs per scale/offset group, as GGUF's Q4_0 / Q4_1 / Q8_0 */
#define RMAX 8   /* rows per tile where a format says no other: 8 x 2 sums stay in registers */

/* One call as its format's tile function reads it. */
struct linear_call {
    const void *x;        /* the rows as the micro-kernel reads them: fp32, bf16 or 16-bit integers */
    const float *sc, *s;  /* 16-bit integer rows: each group's scale and exact sum, [M][K / G] */
    const int32_t *is;    /* ... and the sum of its integers, [M][K / G] */
    const void *w, *w2;   /* the packed weight and its scales (NULL where a format has none) */
    void *y;              /* [M, N], row stride N */
    int64_t M, N, K;
};
typedef void (*tile_fn)(const struct linear_call *c, int64_t block, int64_t row, int rows);

#include "linear_q4.h"
#include "linear_bf16w.h"
#include "linear_i16in.h"
#include "linear_q8a.h"
#include "linear_bf16.h"

int uses_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

int has_avx512_bf16(void) {
#ifdef __AVX512BF16__
    return 1;
#else
    return 0;
#endif
}

int has_avx512_vnni(void) {
#ifdef __AVX512VNNI__
    return 1;
#else
    return 0;
#endif
}

int block_outputs(void) { return NB; }
int group_inputs(void) { return G; }

/* The shape rules every format shares: whole blocks of outputs, whole
 * groups (or pairs) of inputs, at least one row. */
static int takes(int64_t M, int64_t N, int64_t K, int64_t k_multiple) {
    return !(N % NB || K % k_multiple || M < 1 || K < 1);
}

/* Rows [0, M) in tiles of at most rmax against each block of NB outputs,
 * blocks handed out as threads free up (the top of this file says why). */
static void drive(const struct linear_call *c, int rmax, int nthreads, tile_fn tile) {
    int64_t blocks = c->N / NB;
    int threads = nthreads > 0 ? nthreads : 1;
    (void)threads; /* unused where OpenMP is not built in */
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic) num_threads(threads)
#endif
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t r = 0; r < c->M; r += rmax) tile(c, b, r, c->M - r < rmax ? (int)(c->M - r) : rmax);
}

/* Entry points: x [M, K] fp32 contiguous (or bf16 where named), y [M, N]
 * fp32 contiguous, the weights as each micro-kernel's file lays them out.
 * Each returns 0, or -1 for a shape it does not take, no memory for its
 * scratch, or a CPU without its instructions. */

int linear_q4(const float *x, const uint8_t *qs, const float *dm, float *y, int64_t M, int64_t N, int64_t K,
              int nthreads) {
    if (!takes(M, N, K, G)) return -1;
    struct linear_call c = {.x = x, .w = qs, .w2 = dm, .y = y, .M = M, .N = N, .K = K};
    drive(&c, RMAX, nthreads, q4_tile);
    return 0;
}

int linear_bf16w(const float *x, const uint16_t *wp, float *y, int64_t M, int64_t N, int64_t K, int nthreads) {
    if (!takes(M, N, K, 1)) return -1;
    struct linear_call c = {.x = x, .w = wp, .y = y, .M = M, .N = N, .K = K};
    drive(&c, RMAX, nthreads, bf16w_tile);
    return 0;
}

/* x's rows quantized once (linear_i16in.h), then q and its scales through `tile`. */
static int run_i16in(const float *x, const void *q, const float *scales, float *y, int64_t M, int64_t N, int64_t K,
                     int nthreads, tile_fn tile) {
#ifdef __AVX512VNNI__
    if (!takes(M, N, K, G)) return -1;
    int16_t *xi;
    float *sc, *s;
    int32_t *is;
    if (quantized_rows(x, M, K, nthreads > 0 ? nthreads : 1, &xi, &sc, &s, &is)) return -1;
    struct linear_call c = {.x = xi, .sc = sc, .s = s, .is = is, .w = q, .w2 = scales, .y = y, .M = M, .N = N,
                            .K = K};
    drive(&c, RMAX, nthreads, tile);
    free(xi);
    free(sc);
    free(s);
    free(is);
    return 0;
#else
    (void)x; (void)q; (void)scales; (void)y; (void)M; (void)N; (void)K; (void)nthreads; (void)tile;
    return -1;
#endif
}

#ifndef __AVX512VNNI__
#define i16_q4_tile NULL
#define i16_q4_1_tile NULL
#define i16_q4_0_tile NULL
#define i16_q8_tile NULL
#define i16_q8a_tile NULL
#define i16_q8_0_tile NULL
#endif

/* qs, dm as linear_q4 takes them (q4_kernel.pack). */
int linear_q4_i16in(const float *x, const uint8_t *qs, const float *dm, float *y, int64_t M, int64_t N, int64_t K,
                    int nthreads) {
    return run_i16in(x, qs, dm, y, M, N, K, nthreads, i16_q4_tile);
}

/* qs as linear_q4 takes it, dm fp16 [N / NB][K / G][2][NB]: a Q4_1 file's
 * own fp16 d and m (q4_scales.pack): 0.625 bytes a weight, against 0.75. */
int linear_q4_1_i16in(const float *x, const uint8_t *qs, const uint16_t *dm, float *y, int64_t M, int64_t N,
                      int64_t K, int nthreads) {
    return run_i16in(x, qs, (const float *)dm, y, M, N, K, nthreads, i16_q4_1_tile);
}

/* qs as linear_q4 takes it, d fp16 [N / NB][K / G][NB]: a Q4_0 file's own
 * signed fp16 d, its offset -8 d implied (q4_scales.pack): 0.5625 bytes a
 * weight, what the file itself holds. */
int linear_q4_0_i16in(const float *x, const uint8_t *qs, const uint16_t *d, float *y, int64_t M, int64_t N,
                      int64_t K, int nthreads) {
    return run_i16in(x, qs, (const float *)d, y, M, N, K, nthreads, i16_q4_0_tile);
}

/* qb [N / NB][K / 2][2][HALF][2] int8, d [N / NB][K / G][NB] (i16in_kernel.pack_q8). */
int linear_q8_i16in(const float *x, const int8_t *qb, const float *d, float *y, int64_t M, int64_t N, int64_t K,
                    int nthreads) {
    return run_i16in(x, qb, d, y, M, N, K, nthreads, i16_q8_tile);
}

/* qb as linear_q8_i16in takes it, d fp16 [N / NB][K / G][NB]: a Q8_0 file's own scales (linear_q8a.h). */
int linear_q8_0_i16in(const float *x, const int8_t *qb, const uint16_t *d, float *y, int64_t M, int64_t N,
                      int64_t K, int nthreads) {
    return run_i16in(x, qb, (const float *)d, y, M, N, K, nthreads, i16_q8_0_tile);
}

/* qb as linear_q8_i16in takes it, dm [N / NB][K / G][3][NB] (format_linear.pack_q8a). */
int linear_q8a_i16in(const float *x, const int8_t *qb, const float *dm, float *y, int64_t M, int64_t N, int64_t K,
                     int nthreads) {
    return run_i16in(x, qb, dm, y, M, N, K, nthreads, i16_q8a_tile);
}

/* One signature for a model whose layers are stored in different formats,
 * so that decode_layers.c calls one function for every layer: desc int64
 * [3] = {format tag (CODED_*), the weight's codes, its scales}. */
enum { CODED_Q4 = 0, CODED_Q8 = 1, CODED_Q8A = 2, CODED_Q4_1 = 3, CODED_Q4_0 = 4 };
int linear_coded(const float *x, const int64_t *desc, const void *unused, float *y, int64_t M, int64_t N,
                 int64_t K, int nthreads) {
    (void)unused;
    const void *w = (const void *)(intptr_t)desc[1];
    const float *w2 = (const float *)(intptr_t)desc[2];
    switch (desc[0]) {
    case CODED_Q4: return linear_q4_i16in(x, w, w2, y, M, N, K, nthreads);
    case CODED_Q8: return linear_q8_i16in(x, w, w2, y, M, N, K, nthreads);
    case CODED_Q8A: return linear_q8a_i16in(x, w, w2, y, M, N, K, nthreads);
    case CODED_Q4_1: return linear_q4_1_i16in(x, w, (const uint16_t *)w2, y, M, N, K, nthreads);
    case CODED_Q4_0: return linear_q4_0_i16in(x, w, (const uint16_t *)w2, y, M, N, K, nthreads);
    default: return -1;
    }
}

/* xb [M, K] bf16 rows already rounded (what linear_bf16in_silu_mul writes);
 * wb [N / NB][K / 2][NB][2] bf16 (bf16in_kernel.pack). */
int linear_bf16in_rounded(const uint16_t *xb, const uint16_t *wb, float *y, int64_t M, int64_t N, int64_t K,
                          int nthreads) {
#ifdef __AVX512BF16__
    if (!takes(M, N, K, 2)) return -1;
    struct linear_call c = {.x = xb, .w = wb, .y = y, .M = M, .N = N, .K = K};
    drive(&c, BF16IN_RMAX, nthreads, bf16in_tile);
    return 0;
#else
    (void)xb; (void)wb; (void)y; (void)M; (void)N; (void)K; (void)nthreads;
    return -1;
#endif
}

/* x fp32, rounded into scratch xb [M, K] once (not once per block). */
int linear_bf16in(const float *x, const uint16_t *wb, uint16_t *xb, float *y, int64_t M, int64_t N, int64_t K,
                  int nthreads) {
#ifdef __AVX512BF16__
    if (!takes(M, N, K, 2)) return -1;
    round_rows(x, xb, M, K, nthreads > 0 ? nthreads : 1);
    return linear_bf16in_rounded(xb, wb, y, M, N, K, nthreads);
#else
    (void)x; (void)wb; (void)xb; (void)y; (void)M; (void)N; (void)K; (void)nthreads;
    return -1;
#endif
}

/* act [M, I] bf16 = silu(x @ w[:I].T) * (x @ w[I:].T) for a gate_up weight
 * packed as linear_bf16in takes it (N = 2 I outputs: gate, then up),
 * rounded for the down projection (linear_bf16in_rounded): the same numbers
 * as linear_bf16in, silu_mul_row and the down call's own rounding, without
 * writing the [M, 2 I] gate_up output and reading it back (a prompt's
 * biggest tensor, 3 MB a layer at 256 rows) or rounding act in a pass of
 * its own. I a multiple of NB. */
int linear_bf16in_silu_mul(const float *x, const uint16_t *wb, uint16_t *xb, uint16_t *act, int64_t M, int64_t I,
                           int64_t K, int nthreads) {
#ifdef __AVX512BF16__
    if (!takes(M, I, K, 2)) return -1;
    round_rows(x, xb, M, K, nthreads > 0 ? nthreads : 1);
    struct linear_call c = {.x = xb, .w = wb, .y = act, .M = M, .N = I, .K = K};
    drive(&c, SILU_RMAX, nthreads, bf16in_silu_tile);
    return 0;
#else
    (void)x; (void)wb; (void)xb; (void)act; (void)M; (void)I; (void)K; (void)nthreads;
    return -1;
#endif
}

/* A bf16 checkpoint's decode rows with bf16 inputs: x fp32, rounded once
 * into scratch, then the prompt kernel's arithmetic in passes of up to
 * BF16_DECODE_RMAX rows (linear_bf16.h says why). linear_q4's signature
 * (x, weight, second weight tensor, y, ...), so that the C decode layers
 * call it as they call the 4-bit kernels; `unused` is the second weight
 * tensor bf16 lacks. */
int linear_bf16_bf16in(const float *x, const uint16_t *wb, const void *unused, float *y, int64_t M, int64_t N,
                       int64_t K, int nthreads) {
    (void)unused;
#ifdef __AVX512BF16__
    if (!takes(M, N, K, 2)) return -1;
    uint16_t *xb = malloc((size_t)M * (size_t)K * sizeof(uint16_t));
    if (!xb) return -1;
    round_rows(x, xb, M, K, 1); /* a decode step's few rows: not worth waking the team */
    struct linear_call c = {.x = xb, .w = wb, .y = y, .M = M, .N = N, .K = K};
    drive(&c, BF16_DECODE_RMAX, nthreads, bf16_decode_tile);
    free(xb);
    return 0;
#else
    (void)x; (void)wb; (void)y; (void)M; (void)N; (void)K; (void)nthreads;
    return -1;
#endif
}
