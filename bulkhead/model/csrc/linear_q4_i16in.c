/* y = x @ w.T for decode rows: x quantized to 16-bit integers per group of G
 * inputs, w the exact 4-bit grid weights (each group of G inputs of an
 * output: w = q * d + m, q in 0..15), every product and every group's sum of
 * products exact in int32, the scales and the output fp32. Reads linear_q4.c's
 * packing (4 bits a weight); the decode kernel of `--linear-kernel q4-i16in`
 * (bulkhead/model/q4_i16in_kernel.py), with linear_q4's signature, so that
 * decode_layers.c calls either.
 *
 * Why: at 16 rows linear_q4 runs at the two cores' fp32 FMA peak. AVX-512
 * VNNI's vpdpwssd does two 16-bit multiply-adds per 32-bit lane, twice an
 * fp32 FMA's. bf16 inputs (linear_q4_nibbles_bf16in) give the same rate but
 * keep 8 bits of each input; a 16-bit integer per input, scaled by its
 * group's largest |x|, keeps 16 bits of that largest one: each input lands
 * within 2^-16 of its group's max, against bf16's 2^-9 of itself.
 *
 * For a group g of G inputs of row r, with s_g = max |x_k| / 32767 and
 * i_k = round(x_k / s_g) (|i_k| <= 32767):
 *     sum_k x_k w_k  ~=  d_g * (s_g * sum_k i_k q_k) + m_g * S_g,
 * S_g = sum_k x_k, the exact inputs' own sum (fp32, in order). sum_k i_k q_k
 * is exact: at most 32 * 15 * 32767 < 2^24, so its conversion to fp32 is
 * exact too. The only approximation is x_k -> s_g i_k.
 *
 * Batch invariance by construction: every (row, output) is the same sequence
 * of operations whichever rows share the call and whichever thread runs it;
 * a row's quantization reads only that row. Threads split the outputs, never
 * a sum. NaN and inf in x reach y through S_g (m_g * NaN is NaN, m_g * inf
 * is inf or NaN), and a non-finite group max quantizes its group to zeros,
 * so no cast of a NaN to an integer is made.
 *
 * Built with -march=native: without AVX-512 VNNI (__AVX512VNNI__) every call
 * returns -1 and `available()` says 0, and the Python side keeps linear_q4.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef __AVX512VNNI__
#include <immintrin.h>
#endif

#define NB 32    /* outputs per block: two AVX-512 vectors of int32 / fp32 */
#define HALF (NB / 2)
#define G 32     /* inputs per scale/offset group, as GGUF's Q4_0 / Q4_1 */
#define RMAX 8   /* rows per pass over a block: 8 x 2 group sums in registers, the totals in y */
#define I16MAX 32767.0f

int uses_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

int available(void) {
#ifdef __AVX512VNNI__
    return 1;
#else
    return 0;
#endif
}

int block_outputs(void) { return NB; }
int group_inputs(void) { return G; }

/* Row r's group g: xi [G] its 16-bit integers, *scale s_g, *sum S_g. */
static void quantize_group(const float *x, int16_t *xi, float *scale, float *sum) {
    float amax = 0.0f, s = 0.0f;
    for (int k = 0; k < G; k++) {
        float a = fabsf(x[k]);
        amax = a > amax ? a : amax;  /* a NaN is never > amax: caught by S below */
        s += x[k];
    }
    *sum = s;
    if (!(amax > 0.0f) || !isfinite(amax) || !isfinite(s)) {  /* zeros, or S carries the NaN / inf to y */
        memset(xi, 0, sizeof(int16_t) * G);
        *scale = 0.0f;
        return;
    }
    float inv = I16MAX / amax;
    for (int k = 0; k < G; k++) {
        float v = rintf(x[k] * inv);  /* |v| <= 32767: x[k] * inv rounds to at most 32767 (1 + 2^-22) */
        xi[k] = (int16_t)(v > I16MAX ? I16MAX : v < -I16MAX ? -I16MAX : v);
    }
    *scale = amax / I16MAX;
}

static void quantize_rows(const float *x, int16_t *xi, float *scale, float *sum, int64_t M, int64_t K,
                          int threads) {
    int64_t groups = K / G;
    (void)threads;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads)
#endif
    for (int64_t r = 0; r < M; r++)
        for (int64_t g = 0; g < groups; g++)
            quantize_group(x + r * K + g * G, xi + r * K + g * G, scale + r * groups + g, sum + r * groups + g);
}

#ifdef __AVX512VNNI__
/* Rows [0, R) against one block: xi [R][K], sc and s [R][K / G], qs [K][HALF]
 * (linear_q4's bytes: output j's q in byte j's low nibble, output j + HALF's
 * in its high one), dm [K / G][2][NB]. A pair of inputs' bytes widen to one
 * 32-bit lane per output, its two 16-bit halves the two q: vpdpwssd's
 * operand as it stands. */
/* vpermb's index and zero mask that spread a pair of inputs' 2 x HALF bytes
 * (input 2p's, then 2p + 1's) to one 32-bit lane per output: lane j's bytes
 * 0 and 2 are byte j of each, bytes 1 and 3 zero. */
#define SPREAD_MASK 0x5555555555555555ULL
static inline __m512i spread_index(void) {
    uint8_t idx[64] = {0};
    for (int j = 0; j < HALF; j++) idx[4 * j] = (uint8_t)j, idx[4 * j + 2] = (uint8_t)(HALF + j);
    return _mm512_loadu_si512(idx);
}

#define DEFINE_BLOCK(R)                                                                               \
    static void block_##R(const int16_t *restrict xi, const float *restrict sc, const float *restrict s, \
                          int64_t K, const uint8_t *restrict qs, const float *restrict dm,             \
                          float *restrict y, int64_t ldy) {                                            \
        const __m512i low = _mm512_set1_epi32(0x000F000F), spread = spread_index();                   \
        for (int64_t g = 0; g < K / G; g++) {                                                          \
            __m512i t[R][2];                                                                           \
            for (int r = 0; r < R; r++) t[r][0] = t[r][1] = _mm512_setzero_si512();                    \
            for (int64_t p = g * (G / 2); p < (g + 1) * (G / 2); p++) {                                \
                __m512i bytes = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(qs + 2 * p * HALF))); \
                __m512i pair = _mm512_maskz_permutexvar_epi8(SPREAD_MASK, spread, bytes);              \
                __m512i w0 = _mm512_and_si512(pair, low);                                              \
                __m512i w1 = _mm512_and_si512(_mm512_srli_epi32(pair, 4), low);                        \
                for (int r = 0; r < R; r++) {                                                          \
                    int32_t two;                                                                       \
                    memcpy(&two, xi + r * K + 2 * p, 4);                                               \
                    __m512i xv = _mm512_set1_epi32(two);                                               \
                    t[r][0] = _mm512_dpwssd_epi32(t[r][0], xv, w0);                                    \
                    t[r][1] = _mm512_dpwssd_epi32(t[r][1], xv, w1);                                    \
                }                                                                                      \
            }                                                                                          \
            const float *d = dm + g * 2 * NB, *m = d + NB;                                             \
            __m512 d0 = _mm512_loadu_ps(d), d1 = _mm512_loadu_ps(d + 16);                              \
            __m512 m0 = _mm512_loadu_ps(m), m1 = _mm512_loadu_ps(m + 16);                              \
            for (int r = 0; r < R; r++) {                                                              \
                __m512 scale = _mm512_set1_ps(sc[r * (K / G) + g]), sv = _mm512_set1_ps(s[r * (K / G) + g]); \
                __m512 q0 = _mm512_mul_ps(_mm512_cvtepi32_ps(t[r][0]), scale);                         \
                __m512 q1 = _mm512_mul_ps(_mm512_cvtepi32_ps(t[r][1]), scale);                         \
                __m512 a0 = g ? _mm512_loadu_ps(y + r * ldy) : _mm512_setzero_ps();                    \
                __m512 a1 = g ? _mm512_loadu_ps(y + r * ldy + 16) : _mm512_setzero_ps();               \
                _mm512_storeu_ps(y + r * ldy, _mm512_fmadd_ps(sv, m0, _mm512_fmadd_ps(q0, d0, a0)));   \
                _mm512_storeu_ps(y + r * ldy + 16, _mm512_fmadd_ps(sv, m1, _mm512_fmadd_ps(q1, d1, a1))); \
            }                                                                                          \
        }                                                                                              \
    }

DEFINE_BLOCK(1)
DEFINE_BLOCK(2)
DEFINE_BLOCK(3)
DEFINE_BLOCK(4)
DEFINE_BLOCK(5)
DEFINE_BLOCK(6)
DEFINE_BLOCK(7)
DEFINE_BLOCK(8)

typedef void (*block_fn)(const int16_t *, const float *, const float *, int64_t, const uint8_t *, const float *,
                         float *, int64_t);
static const block_fn BLOCK[RMAX + 1] = {0, block_1, block_2, block_3, block_4, block_5, block_6, block_7, block_8};
#endif

/* x [M, K] fp32 contiguous; qs [N / NB][K][HALF], dm [N / NB][K / G][2][NB]
 * (q4_kernel.pack, as linear_q4 takes them); y [M, N] fp32 contiguous.
 * Scratch is its own (malloc's, small beside a matmul). Returns 0, or -1 for a
 * shape it does not take, no memory for the scratch, or a CPU without AVX-512
 * VNNI. */
int linear_q4_i16in(const float *x, const uint8_t *qs, const float *dm, float *y, int64_t M, int64_t N, int64_t K,
                    int nthreads) {
#ifdef __AVX512VNNI__
    if (N % NB || K % G || M < 1 || K < 1) return -1;
    int64_t groups = K / G, blocks = N / NB;
    int threads = nthreads > 0 ? nthreads : 1;
    int16_t *xi = malloc(sizeof(int16_t) * (size_t)(M * K));
    float *sc = malloc(sizeof(float) * (size_t)(M * groups)), *s = malloc(sizeof(float) * (size_t)(M * groups));
    if (!xi || !sc || !s) {
        free(xi);
        free(sc);
        free(s);
        return -1;
    }
    quantize_rows(x, xi, sc, s, M, K, threads);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads)
#endif
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t r = 0; r < M; r += RMAX) {
            int rows = M - r < RMAX ? (int)(M - r) : RMAX;
            BLOCK[rows](xi + r * K, sc + r * groups, s + r * groups, K, qs + b * K * HALF, dm + b * groups * 2 * NB,
                        y + r * N + b * NB, N);
        }
    free(xi);
    free(sc);
    free(s);
    return 0;
#else
    (void)x; (void)qs; (void)dm; (void)y; (void)M; (void)N; (void)K; (void)nthreads;
    return -1;
#endif
}
