/* y = x @ w.T for decode rows under the opt-in `--linear-kernel
 * q4-bf16in-all` (bulkhead/model/q4_bf16in_kernel.py): x rounded to bf16, w
 * the exact 4-bit grid weights (each group of G inputs of an output:
 * w = q * d + m, q in 0..15) read from the 4-bit packing of linear_q4.c,
 * every product exact and every sum and the output fp32.
 *
 * Why: a 16-row decode step is bound by its matmuls' arithmetic, and AVX-512
 * BF16's dot-product instruction does twice the multiply-adds of an fp32 FMA.
 * A 4-bit q is exact in bf16, so x rounded to bf16 is the only operand
 * rounded: each group's product sum is scaled by its fp32 d, and m times the
 * group's sum of x is added (the fp32 model's sum, regrouped):
 *     sum_k x_k w_k = d_g * sum_k x_k q_k + m_g * S_g,  S_g = sum_k x_k.
 * vdpbf16ps sums pairs of x_k * q_k into fp32 lanes (one output per lane).
 * It treats bf16 denormals as zero (they are below 1e-38). Prompts take
 * csrc/linear_bf16in.c (bf16 weights), whichever decode kernel runs.
 *
 * Batch invariance by construction: every (row, output) is the same sequence
 * of operations whichever rows share the call and whichever thread runs it.
 * Threads split the outputs, never a sum. NaN and inf in x reach y.
 *
 * Built with -march=native: without AVX-512 BF16 (__AVX512BF16__) every call
 * returns -1 and `available()` says 0, and `q4-bf16in-all` is refused.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "bf16.h"
#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef __AVX512BF16__
#include <immintrin.h>
#include "dot_bf16.h"
#endif

#define NB 32   /* outputs per block: two AVX-512 vectors of fp32 */
#define G 32    /* inputs per scale/offset group, as GGUF's Q4_0 / Q4_1 */

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
/* Group g's scales d and offsets m of a block's NB outputs, as two vectors each. */
static inline __attribute__((always_inline)) void load_scales(const float *dm, int64_t g, __m512 *d0, __m512 *d1,
                                                              __m512 *m0, __m512 *m1) {
    const float *d = dm + g * 2 * NB, *m = d + NB;
    *d0 = _mm512_loadu_ps(d), *d1 = _mm512_loadu_ps(d + 16);
    *m0 = _mm512_loadu_ps(m), *m1 = _mm512_loadu_ps(m + 16);
}

/* The weights come from q4's own packing (linear_q4.c: for block b and input
 * k, HALF bytes, byte j holding output j's q in its low nibble and output
 * j + HALF's in its high one), so decode rows need no second copy of the
 * weights and read 4 bits a weight. A pair of inputs' bytes widen to one
 * 32-bit lane per output, and each nibble becomes the bf16 128 + q
 * (0x4300 | q: bf16 steps by 1 between 128 and 256), one AND-OR. So the
 * group's dot product is sum x_k (128 + q_k), every product exact (8 bits
 * times 8), and 128 S_g comes off it before the scale:
 *     sum_k x_k w_k = d_g * (sum_k x_k (128 + q_k) - 128 S_g) + m_g * S_g.
 * The subtraction loses what the larger partial sums rounded away: up to
 * G roundings of 2^-24 of 128 sum |x_k|, far below the inputs' own bf16
 * rounding (2^-9 of each). The factor 128 also leaves 2^7 less headroom: an
 * |x| above ~2.6e36 makes inf - inf, a NaN the runner's finite check fails
 * closed. The group's dot product accumulates in registers, the running sum
 * in y. */
#define NMAX 8  /* rows per pass over a block: 8 x 2 group sums in registers, the totals in y */

#define DEFINE_NIBBLE_BLOCK(R)                                                                        \
    static void nibble_block_##R(const uint16_t *restrict xb, const float *restrict s, int64_t K,    \
                                 const uint8_t *restrict qs, const float *restrict dm,              \
                                 float *restrict y, int64_t ldy) {                                   \
        const __m512i low = _mm512_set1_epi32(0x000F000F), biased = _mm512_set1_epi32(0x43004300);   \
        const __m512 bias = _mm512_set1_ps(128.0f);                                                  \
        for (int64_t g = 0; g < K / G; g++) {                                                         \
            __m512 t[R][2];                                                                           \
            for (int r = 0; r < R; r++) t[r][0] = t[r][1] = _mm512_setzero_ps();                      \
            for (int64_t p = g * (G / 2); p < (g + 1) * (G / 2); p++) {                               \
                const uint8_t *b = qs + 2 * p * (NB / 2);                                             \
                __m512i even = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)b));              \
                __m512i odd = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + NB / 2)));    \
                __m512i pair = _mm512_or_si512(even, _mm512_slli_epi32(odd, 16));                     \
                /* (pair & low) | biased: 0xEA is A & B | C */                                        \
                __m512bh w0 = (__m512bh)_mm512_ternarylogic_epi32(pair, low, biased, 0xEA);           \
                __m512bh w1 = (__m512bh)_mm512_ternarylogic_epi32(_mm512_srli_epi32(pair, 4), low, biased, 0xEA); \
                dot_pair(t, R, xb, K, p, w0, w1);                                                     \
            }                                                                                         \
            __m512 d0, d1, m0, m1;                                                                    \
            load_scales(dm, g, &d0, &d1, &m0, &m1);                                                   \
            for (int r = 0; r < R; r++) {                                                             \
                __m512 sv = _mm512_set1_ps(s[r * (K / G) + g]);                                       \
                __m512 q0 = _mm512_fnmadd_ps(sv, bias, t[r][0]), q1 = _mm512_fnmadd_ps(sv, bias, t[r][1]); \
                __m512 a0 = g ? _mm512_loadu_ps(y + r * ldy) : _mm512_setzero_ps();                   \
                __m512 a1 = g ? _mm512_loadu_ps(y + r * ldy + 16) : _mm512_setzero_ps();              \
                _mm512_storeu_ps(y + r * ldy, _mm512_fmadd_ps(sv, m0, _mm512_fmadd_ps(q0, d0, a0)));  \
                _mm512_storeu_ps(y + r * ldy + 16, _mm512_fmadd_ps(sv, m1, _mm512_fmadd_ps(q1, d1, a1))); \
            }                                                                                         \
        }                                                                                             \
    }

DEFINE_NIBBLE_BLOCK(1)
DEFINE_NIBBLE_BLOCK(2)
DEFINE_NIBBLE_BLOCK(3)
DEFINE_NIBBLE_BLOCK(4)
DEFINE_NIBBLE_BLOCK(5)
DEFINE_NIBBLE_BLOCK(6)
DEFINE_NIBBLE_BLOCK(7)
DEFINE_NIBBLE_BLOCK(8)

typedef void (*nibble_block_fn)(const uint16_t *, const float *, int64_t, const uint8_t *, const float *, float *,
                                int64_t);
static const nibble_block_fn NIBBLE_BLOCK[NMAX + 1] = {0, nibble_block_1, nibble_block_2, nibble_block_3,
                                                       nibble_block_4, nibble_block_5, nibble_block_6,
                                                       nibble_block_7, nibble_block_8};
#endif

/* Round each row of x [M, K] to bf16 once into xb, and sum each group of the
 * rounded row in order into s [M, K / G] (the m_g * S_g term must see the x
 * the products saw). */
static void round_rows(const float *x, uint16_t *xb, float *s, int64_t M, int64_t K, int threads) {
    int64_t groups = K / G;
    (void)threads;
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
}

/* x [M, K] fp32 contiguous; qs [N / NB][K][NB / 2], dm [N / NB][K / G][2][NB]
 * (q4_kernel.pack, as linear_q4 takes them); y [M, N] fp32 contiguous. The
 * signature of linear_q4, so that decode_layers.c calls either; scratch is
 * its own (malloc's, small beside a matmul). Returns 0, or -1 for a shape it
 * does not take, no memory for the scratch, or a CPU without AVX-512 BF16. */
int linear_q4_nibbles_bf16in(const float *x, const uint8_t *qs, const float *dm, float *y, int64_t M, int64_t N,
                             int64_t K, int nthreads) {
#ifdef __AVX512BF16__
    if (N % NB || K % G || M < 1 || K < 1) return -1;
    int64_t groups = K / G, blocks = N / NB;
    int threads = nthreads > 0 ? nthreads : 1;
    uint16_t *xb = malloc(sizeof(uint16_t) * (size_t)(M * K));
    float *s = malloc(sizeof(float) * (size_t)(M * groups));
    if (!xb || !s) {
        free(xb);
        free(s);
        return -1;
    }
    round_rows(x, xb, s, M, K, threads);
    /* Blocks handed out as threads free up (bulkhead/model/c_linear.py says why). */
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic) num_threads(threads)
#endif
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t r = 0; r < M; r += NMAX) {
            int rows = M - r < NMAX ? (int)(M - r) : NMAX;
            NIBBLE_BLOCK[rows](xb + r * K, s + r * groups, K, qs + b * K * (NB / 2), dm + b * groups * 2 * NB,
                               y + r * N + b * NB, N);
        }
    free(xb);
    free(s);
    return 0;
#else
    (void)x; (void)qs; (void)dm; (void)y; (void)M; (void)N; (void)K; (void)nthreads;
    return -1;
#endif
}
