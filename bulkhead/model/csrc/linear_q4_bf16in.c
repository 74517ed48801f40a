/* y = x @ w.T for a prompt's rows: x rounded to bf16, w the exact 4-bit grid
 * weights (each group of G inputs of an output: w = q * d + m, q in 0..15),
 * every product exact and every sum and the output fp32. The prompt kernel
 * of `--linear-kernel q4-bf16in` (bulkhead/model/q4_bf16in_kernel.py).
 *
 * Why: a prompt's pass is bound by arithmetic (oneDNN's fp32 GEMM runs at
 * the cores' fp32 peak), and AVX-512 BF16's dot-product instruction does
 * twice the multiply-adds of an fp32 FMA. A 4-bit q is exact in bf16, so
 * x rounded to bf16 is the only operand rounded: the weights are rebuilt
 * exactly (the product sum of a group is scaled by its fp32 d, and m times
 * the group's sum of x is added: the fp32 model's sum, regrouped) and
 * nothing is summed or returned in bf16. oneDNN's bf16 GEMM also rounds the
 * weights and its output, which measured 1.5x this kernel's distance from
 * the exact model (docs/performance.md, Quality).
 *
 * For a group g of G inputs:  sum_k x_k w_k = d_g * sum_k x_k q_k + m_g * S_g,
 * S_g = sum_k x_k. vdpbf16ps sums pairs of x_k * q_k into fp32 lanes (one
 * output per lane); each product is exact (8 bits of x times 4 of q).
 * vdpbf16ps treats bf16 denormals as zero (they are below 1e-38).
 *
 * Batch invariance by construction: every (row, output) is the same sequence
 * of operations whichever rows share the call and whichever thread runs it.
 * Threads split the outputs, never a sum. NaN and inf in x reach y.
 *
 * Packing (q4_bf16in_kernel.pack): outputs in blocks of NB; for block b and
 * input pair p, NB pairs of bf16 q values, (q[2p], q[2p + 1]) of output j at
 * [j][0..1]; the scales and offsets dm are q4's ([K / G][2][NB] a block).
 *
 * Built with -march=native: without AVX-512 BF16 (__AVX512BF16__) every call
 * returns -1 and `available()` says 0, and the Python side keeps the fp32
 * prompt kernel.
 */
#include <stdint.h>
#include <string.h>
#include "bf16.h"
#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef __AVX512BF16__
#include <immintrin.h>
#endif

#define NB 32   /* outputs per block: two AVX-512 vectors of fp32 */
#define G 32    /* inputs per scale/offset group, as GGUF's Q4_0 / Q4_1 */
#define RMAX 6  /* rows per pass over a block: 6 x 2 group sums + 6 x 2 totals stay in registers */

int uses_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

int available(void) {
#ifdef __AVX512BF16__
    return 1;
#else
    return 0;
#endif
}

int block_outputs(void) { return NB; }
int group_inputs(void) { return G; }

#ifdef __AVX512BF16__
/* Rows [0, R) against one block: xb [R][K] bf16, s [R][K / G] (each group's
 * sum of xb), qb [K / 2][NB][2] bf16, dm [K / G][2][NB]. */
#define DEFINE_BLOCK(R)                                                                               \
    static void block_##R(const uint16_t *restrict xb, const float *restrict s, int64_t K,           \
                          const uint16_t *restrict qb, const float *restrict dm, float *restrict y,  \
                          int64_t ldy) {                                                              \
        __m512 acc[R][2];                                                                             \
        for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();                      \
        for (int64_t g = 0; g < K / G; g++) {                                                         \
            __m512 t[R][2];                                                                           \
            for (int r = 0; r < R; r++) t[r][0] = t[r][1] = _mm512_setzero_ps();                      \
            for (int64_t p = g * (G / 2); p < (g + 1) * (G / 2); p++) {                               \
                const uint16_t *w = qb + p * 2 * NB;                                                  \
                __m512bh w0 = (__m512bh)_mm512_loadu_si512(w), w1 = (__m512bh)_mm512_loadu_si512(w + NB); \
                for (int r = 0; r < R; r++) {                                                         \
                    int32_t pair;                                                                     \
                    memcpy(&pair, xb + r * K + 2 * p, 4);                                             \
                    __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);                                  \
                    t[r][0] = _mm512_dpbf16_ps(t[r][0], xv, w0);                                      \
                    t[r][1] = _mm512_dpbf16_ps(t[r][1], xv, w1);                                      \
                }                                                                                     \
            }                                                                                         \
            const float *d = dm + g * 2 * NB, *m = d + NB;                                            \
            __m512 d0 = _mm512_loadu_ps(d), d1 = _mm512_loadu_ps(d + 16);                             \
            __m512 m0 = _mm512_loadu_ps(m), m1 = _mm512_loadu_ps(m + 16);                             \
            for (int r = 0; r < R; r++) {                                                             \
                __m512 sv = _mm512_set1_ps(s[r * (K / G) + g]);                                       \
                acc[r][0] = _mm512_fmadd_ps(sv, m0, _mm512_fmadd_ps(t[r][0], d0, acc[r][0]));         \
                acc[r][1] = _mm512_fmadd_ps(sv, m1, _mm512_fmadd_ps(t[r][1], d1, acc[r][1]));         \
            }                                                                                         \
        }                                                                                             \
        for (int r = 0; r < R; r++) {                                                                 \
            _mm512_storeu_ps(y + r * ldy, acc[r][0]);                                                 \
            _mm512_storeu_ps(y + r * ldy + 16, acc[r][1]);                                            \
        }                                                                                             \
    }

DEFINE_BLOCK(1)
DEFINE_BLOCK(2)
DEFINE_BLOCK(3)
DEFINE_BLOCK(4)
DEFINE_BLOCK(5)
DEFINE_BLOCK(6)

typedef void (*block_fn)(const uint16_t *, const float *, int64_t, const uint16_t *, const float *, float *,
                         int64_t);
static const block_fn BLOCK[RMAX + 1] = {0, block_1, block_2, block_3, block_4, block_5, block_6};
#endif

/* x [M, K] fp32 contiguous; qb [N / NB][K / 2][NB][2] bf16; dm [N / NB][K / G][2][NB];
 * scratch: xb [M, K] bf16, s [M, K / G] fp32; y [M, N] fp32 contiguous.
 * Returns 0, or -1 for a shape it does not take (or a CPU without AVX-512 BF16). */
int linear_q4_bf16in(const float *x, const uint16_t *qb, const float *dm, uint16_t *xb, float *s, float *y,
                     int64_t M, int64_t N, int64_t K, int nthreads) {
#ifdef __AVX512BF16__
    if (N % NB || K % G || M < 1 || K < 1) return -1;
    int64_t groups = K / G, blocks = N / NB;
    int threads = nthreads > 0 ? nthreads : 1;
    (void)threads;
    /* Round each row once, and sum each group of the rounded row in order
     * (the m_g * S_g term must see the x the products saw). */
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads)
#endif
    for (int64_t r = 0; r < M; r++)
        for (int64_t g = 0; g < groups; g++) {
            float sum = 0.0f;
            for (int64_t k = g * G; k < (g + 1) * G; k++) {
                uint16_t h = to_bf16(x[r * K + k]);
                xb[r * K + k] = h;
                sum += from_bf16(h);
            }
            s[r * groups + g] = sum;
        }
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads)
#endif
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t r = 0; r < M; r += RMAX) {
            int rows = M - r < RMAX ? (int)(M - r) : RMAX;
            BLOCK[rows](xb + r * K, s + r * groups, K, qb + b * K * NB, dm + b * groups * 2 * NB, y + r * N + b * NB,
                        N);
        }
    return 0;
#else
    (void)x; (void)qb; (void)dm; (void)xb; (void)s; (void)y; (void)M; (void)N; (void)K; (void)nthreads;
    return -1;
#endif
}
