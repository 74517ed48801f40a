/* 8-bit codes with a scale per 16 inputs and an offset per 32, inputs as
 * 16-bit integers per group of 32 (linear_i16in.h's quantization), exact
 * int32 sums: the home of every GGUF format whose codes fit in int8 but
 * not one scale per 32 (bulkhead/model/format_linear.py):
 *   Q6_K: w = (d * sc_16) * (q - 32), q - 32 in -32..31, a scale per 16, no offset;
 *   Q5_K, Q5_1: w = q * d + m, q 0..31, a scale and an offset per 32;
 *   a fused layer whose parts are stored in different formats (Q4_K's
 *     q, k beside Q6_K's v): each part's codes as they are, its per-32
 *     scale written twice.
 * and Q8_0 with its file's fp16 scales (linear_q8_0_i16in, below: the
 * lm_head's kernel).
 *
 * For input group g of row r (s_g its scale, S_g its exact sum, as
 * linear_i16in.h quantizes it) and output j:
 *     y = fma(S_g, m_g, fma(s_g * T_hi, d_{2g+1}, fma(s_g * T_lo, d_{2g}, y))),
 * T_lo, T_hi the int32 sums of i_k q_k over the group's first and second
 * 16 inputs: |T| <= 16 * 127 * 32767 < 2^26, and for codes within -32..32
 * (Q6_K's, Q5's, Q4's) under 2^24, so its conversion to fp32 is exact.
 *
 * Layout: qb [N / NB][K / 2][2][HALF][2] int8 (linear_q8_i16in's), dm
 * [N / NB][K / G][3][NB] fp32: per group the low half's scale, the high
 * half's scale and the offset of each of the block's outputs.
 * Batch invariant by construction (linear.c's driver splits outputs only).
 */
#ifndef BULKHEAD_LINEAR_Q8A_H
#define BULKHEAD_LINEAR_Q8A_H
#ifdef __AVX512VNNI__
/* Per half of a group (16 inputs) the sums stay in registers (R x 2, as
 * linear_i16in.h's blocks), then land in y, which stays in L1. */
#define DEFINE_Q8A_BLOCK(R)                                                                           \
    static void q8a_block_##R(const int16_t *restrict xi, const float *restrict sc,                 \
                              const float *restrict s, int64_t K, const int8_t *restrict qb,        \
                              const float *restrict dm, float *restrict y, int64_t ldy) {           \
        for (int64_t g = 0; g < K / G; g++)                                                           \
            for (int h = 0; h < 2; h++) {                                                             \
                __m512i t[R][2];                                                                      \
                for (int r = 0; r < R; r++) t[r][0] = t[r][1] = _mm512_setzero_si512();               \
                for (int64_t p = g * (G / 2) + h * (G / 4); p < g * (G / 2) + (h + 1) * (G / 4); p++) { \
                    const int8_t *b = qb + p * 2 * NB;                                                \
                    __m512i w0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)b));         \
                    __m512i w1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(b + NB)));  \
                    for (int r = 0; r < R; r++) {                                                     \
                        int32_t input_pair;                                                           \
                        memcpy(&input_pair, xi + r * K + 2 * p, 4);                                   \
                        __m512i xv = _mm512_set1_epi32(input_pair);                                   \
                        t[r][0] = _mm512_dpwssd_epi32(t[r][0], xv, w0);                               \
                        t[r][1] = _mm512_dpwssd_epi32(t[r][1], xv, w1);                               \
                    }                                                                                 \
                }                                                                                     \
                const float *d = dm + g * 3 * NB + h * NB, *m = dm + g * 3 * NB + 2 * NB;             \
                __m512 d0 = _mm512_loadu_ps(d), d1 = _mm512_loadu_ps(d + 16);                         \
                __m512 m0 = _mm512_loadu_ps(m), m1 = _mm512_loadu_ps(m + 16);                         \
                for (int r = 0; r < R; r++) {                                                         \
                    __m512 scale = _mm512_set1_ps(sc[r * (K / G) + g]);                               \
                    __m512 a0 = g || h ? _mm512_loadu_ps(y + r * ldy) : _mm512_setzero_ps();          \
                    __m512 a1 = g || h ? _mm512_loadu_ps(y + r * ldy + 16) : _mm512_setzero_ps();     \
                    a0 = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(t[r][0]), scale), d0, a0);  \
                    a1 = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(t[r][1]), scale), d1, a1);  \
                    if (h) {                                                                          \
                        __m512 sv = _mm512_set1_ps(s[r * (K / G) + g]);                               \
                        a0 = _mm512_fmadd_ps(sv, m0, a0);                                             \
                        a1 = _mm512_fmadd_ps(sv, m1, a1);                                             \
                    }                                                                                 \
                    _mm512_storeu_ps(y + r * ldy, a0);                                                \
                    _mm512_storeu_ps(y + r * ldy + 16, a1);                                           \
                }                                                                                     \
            }                                                                                         \
    }

DEFINE_Q8A_BLOCK(1)
DEFINE_Q8A_BLOCK(2)
DEFINE_Q8A_BLOCK(3)
DEFINE_Q8A_BLOCK(4)
DEFINE_Q8A_BLOCK(5)
DEFINE_Q8A_BLOCK(6)
DEFINE_Q8A_BLOCK(7)
DEFINE_Q8A_BLOCK(8)

typedef void (*q8a_block_fn)(const int16_t *, const float *, const float *, int64_t, const int8_t *, const float *,
                             float *, int64_t);
static const q8a_block_fn Q8A_BLOCK[RMAX + 1] = {0, q8a_block_1, q8a_block_2, q8a_block_3, q8a_block_4, q8a_block_5,
                                                 q8a_block_6, q8a_block_7, q8a_block_8};

/* Q8_0 as a GGUF file stores it (w = q * d per group of 32, q int8, d
 * fp16): linear_q8_0_i16in, the lm_head's `q8-i16in` kernel. qb as above,
 * d fp16 [N / NB][K / G][NB]: 1.0625 bytes a weight, what the file holds,
 * against 1.125 with fp32 scales (a one-row step reads the whole lm_head,
 * 49152 x 2048 for the 1B shape: 6 MB less a token). Widening an fp16 to
 * fp32 is exact, so the numbers are linear_q8_i16in's (linear_i16in.h)
 * over the same d widened, bit for bit. Measured on that lm_head, one row,
 * one thread: 0.89x linear_q8_i16in's time (27 GB/s, this machine's
 * streaming read); splitting each sum in two chains, or prefetching
 * further ahead, did not help: the read bounds it. The block is
 * linear_i16in.h's DEFINE_Q8_SCALED_BLOCK with fp16 scales' load. */
#define DEFINE_Q8_0_BLOCK(R) DEFINE_Q8_SCALED_BLOCK(q8_0_block, R, uint16_t, HALVES)

DEFINE_Q8_0_BLOCK(1)
DEFINE_Q8_0_BLOCK(2)
DEFINE_Q8_0_BLOCK(3)
DEFINE_Q8_0_BLOCK(4)
DEFINE_Q8_0_BLOCK(5)
DEFINE_Q8_0_BLOCK(6)
DEFINE_Q8_0_BLOCK(7)
DEFINE_Q8_0_BLOCK(8)

typedef void (*q8_0_block_fn)(const int16_t *, const float *, int64_t, const int8_t *, const uint16_t *, float *,
                              int64_t);
static const q8_0_block_fn Q8_0_BLOCK[RMAX + 1] = {0, q8_0_block_1, q8_0_block_2, q8_0_block_3, q8_0_block_4,
                                                   q8_0_block_5, q8_0_block_6, q8_0_block_7, q8_0_block_8};

/* Tile (b, r) of linear_q8_0_i16in: w qb, w2 d fp16 [N / NB][K / G][NB]. */
static void i16_q8_0_tile(const struct linear_call *c, int64_t b, int64_t r, int rows) {
    int64_t K = c->K, groups = K / G;
    Q8_0_BLOCK[rows]((const int16_t *)c->x + r * K, c->sc + r * groups, K, (const int8_t *)c->w + b * K * NB,
                     (const uint16_t *)c->w2 + b * groups * NB, (float *)c->y + r * c->N + b * NB, c->N);
}

/* Tile (b, r) of linear_q8a_i16in: w qb, w2 dm as the top of this file lays them out. */
static void i16_q8a_tile(const struct linear_call *c, int64_t b, int64_t r, int rows) {
    int64_t K = c->K, groups = K / G;
    Q8A_BLOCK[rows]((const int16_t *)c->x + r * K, c->sc + r * groups, c->s + r * groups, K,
                    (const int8_t *)c->w + b * K * NB, (const float *)c->w2 + b * groups * 3 * NB,
                    (float *)c->y + r * c->N + b * NB, c->N);
}
#endif
#endif
