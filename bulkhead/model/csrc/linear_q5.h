/* 5-bit codes, inputs as 16-bit integers per group of 32 (linear_i16in.h's
 * quantization), exact int32 sums: GGUF's Q5_0 (w = d * (q - 16), taken as
 * q * d + m with m = -16 d, exact) and Q5_1 (w = q * d + m), the types a
 * Q4_K_M file holds where a row is not whole super-blocks (SmolLM2-135M's
 * 576 inputs: most of its weights). 5 bits a weight and two fp32 per 32
 * (0.875 bytes), against 1.125 for the same codes as int8 (linear_q8_i16in).
 *
 * Layout (format_linear.pack_q5): per block of NB outputs, linear_q4's qs
 * [K][HALF] (the low four bits of each code) then qh [K / 2][2] uint32: for
 * input pair p, word 0 holds outputs 0-15's fifth bits (output j's of input
 * 2p at bit j, of input 2p + 1 at bit 16 + j), word 1 outputs 16-31's; dm
 * as linear_q4's. A pair of inputs' nibbles widen to one 32-bit lane per
 * output (linear_i16in.h's i16_block); a word broadcast and rotated right by
 * j - 4 in lane j puts both fifth bits at bits 4 and 20, and one ternary
 * logic op ORs them in.
 *
 * For input group g of row r: y = fma(S_g, m_g, fma(s_g * T, d_g, y)), T the
 * int32 sum of i_k q_k, |T| <= 32 * 31 * 32767 < 2^25: its conversion to
 * fp32 rounds by at most 2^-24 of it (linear_q8_i16in's rounds likewise).
 * Batch invariant by construction (linear.c's driver splits outputs only).
 */
#ifndef BULKHEAD_LINEAR_Q5_H
#define BULKHEAD_LINEAR_Q5_H
#ifdef __AVX512VNNI__
#define DEFINE_Q5_BLOCK(R)                                                                            \
    static void q5_block_##R(const int16_t *restrict xi, const float *restrict sc, const float *restrict s, \
                             int64_t K, const uint8_t *restrict qs, const uint32_t *restrict qh,    \
                             const float *restrict dm, float *restrict y, int64_t ldy) {            \
        const __m512i low = _mm512_set1_epi32(0x000F000F);                                            \
        const __m512i fifth = _mm512_set1_epi32(0x00100010);                                          \
        const __m512i rot = _mm512_setr_epi32(28, 29, 30, 31, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11);    \
        for (int64_t g = 0; g < K / G; g++) {                                                         \
            __m512i t[R][2];                                                                          \
            for (int r = 0; r < R; r++) t[r][0] = t[r][1] = _mm512_setzero_si512();                   \
            for (int64_t p = g * (G / 2); p < (g + 1) * (G / 2); p++) {                               \
                const uint8_t *b = qs + 2 * p * HALF;                                                 \
                __m512i even = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)b));              \
                __m512i odd = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + HALF)));      \
                __m512i pair = _mm512_or_si512(even, _mm512_slli_epi32(odd, 16));                     \
                __m512i w0 = _mm512_and_si512(pair, low);                                             \
                __m512i w1 = _mm512_and_si512(_mm512_srli_epi32(pair, 4), low);                       \
                __m512i ha = _mm512_rorv_epi32(_mm512_set1_epi32((int)qh[2 * p]), rot);               \
                __m512i hb = _mm512_rorv_epi32(_mm512_set1_epi32((int)qh[2 * p + 1]), rot);           \
                w0 = _mm512_ternarylogic_epi32(w0, ha, fifth, 0xF8); /* w0 | (ha & fifth) */          \
                w1 = _mm512_ternarylogic_epi32(w1, hb, fifth, 0xF8);                                  \
                for (int r = 0; r < R; r++) {                                                         \
                    int32_t input_pair;                                                               \
                    memcpy(&input_pair, xi + r * K + 2 * p, 4);                                       \
                    __m512i xv = _mm512_set1_epi32(input_pair);                                       \
                    t[r][0] = _mm512_dpwssd_epi32(t[r][0], xv, w0);                                   \
                    t[r][1] = _mm512_dpwssd_epi32(t[r][1], xv, w1);                                   \
                }                                                                                     \
            }                                                                                         \
            const float *d = dm + g * 2 * NB, *m = d + NB;                                            \
            __m512 d0 = _mm512_loadu_ps(d), d1 = _mm512_loadu_ps(d + 16);                             \
            __m512 m0 = _mm512_loadu_ps(m), m1 = _mm512_loadu_ps(m + 16);                             \
            for (int r = 0; r < R; r++) {                                                             \
                __m512 scale = _mm512_set1_ps(sc[r * (K / G) + g]), sv = _mm512_set1_ps(s[r * (K / G) + g]); \
                __m512 q0 = _mm512_mul_ps(_mm512_cvtepi32_ps(t[r][0]), scale);                        \
                __m512 q1 = _mm512_mul_ps(_mm512_cvtepi32_ps(t[r][1]), scale);                        \
                __m512 a0 = g ? _mm512_loadu_ps(y + r * ldy) : _mm512_setzero_ps();                   \
                __m512 a1 = g ? _mm512_loadu_ps(y + r * ldy + 16) : _mm512_setzero_ps();              \
                _mm512_storeu_ps(y + r * ldy, _mm512_fmadd_ps(sv, m0, _mm512_fmadd_ps(q0, d0, a0)));  \
                _mm512_storeu_ps(y + r * ldy + 16, _mm512_fmadd_ps(sv, m1, _mm512_fmadd_ps(q1, d1, a1))); \
            }                                                                                         \
        }                                                                                             \
    }

DEFINE_Q5_BLOCK(1)
DEFINE_Q5_BLOCK(2)
DEFINE_Q5_BLOCK(3)
DEFINE_Q5_BLOCK(4)
DEFINE_Q5_BLOCK(5)
DEFINE_Q5_BLOCK(6)
DEFINE_Q5_BLOCK(7)
DEFINE_Q5_BLOCK(8)

typedef void (*q5_block_fn)(const int16_t *, const float *, const float *, int64_t, const uint8_t *,
                            const uint32_t *, const float *, float *, int64_t);
static const q5_block_fn Q5_BLOCK[RMAX + 1] = {0, q5_block_1, q5_block_2, q5_block_3, q5_block_4, q5_block_5,
                                               q5_block_6, q5_block_7, q5_block_8};

/* Tile (b, r) of linear_q5_i16in: w the blocks' qs and qh, w2 dm (linear_q4's). */
static void i16_q5_tile(const struct linear_call *c, int64_t b, int64_t r, int rows) {
    int64_t K = c->K, groups = K / G;
    const uint8_t *block = (const uint8_t *)c->w + b * K * (HALF + 4);
    Q5_BLOCK[rows]((const int16_t *)c->x + r * K, c->sc + r * groups, c->s + r * groups, K, block,
                   (const uint32_t *)(block + K * HALF),
                   (const float *)c->w2 + b * groups * 2 * NB, (float *)c->y + r * c->N + b * NB, c->N);
}
#endif
#endif
