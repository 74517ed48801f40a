/* y = x @ w.T with x quantized to 16-bit integers per group of G inputs and
 * w integers times per-group scales, every product and every group's sum of
 * products exact in int32, the scales and the output fp32
 * (bulkhead/model/i16in_kernel.py). Two weight formats:
 *   linear_q4_i16in: the exact 4-bit grid weights (each group of G inputs of
 *     an output: w = q * d + m, q in 0..15) in linear_q4.c's packing (4 bits
 *     a weight), with linear_q4's signature, so that decode_layers.c calls
 *     either: decode rows under `--linear-kernel q4-i16in`;
 *   linear_q8_i16in: 8-bit weights w = q * d, q in -127..127 (a GGUF Q8_0
 *     tensor, as the bundled SmolLM2's tied embedding is), 1 byte a weight:
 *     the lm_head's `q8-i16in` kernel under q4-i16in.
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
 * S_g = sum_k x_k, the exact inputs' own sum (fp32, in order; m_g = 0 for
 * Q8_0). sum_k i_k q_k is exact in int32: 4-bit, at most 32 * 15 * 32767 <
 * 2^24, so its conversion to fp32 is exact too; 8-bit, at most
 * 32 * 127 * 32767 < 2^31, converted with one rounding (2^-24 of it). The
 * approximation is x_k -> s_g i_k.
 *
 * Batch invariance by construction: every (row, output) is the same sequence
 * of operations whichever rows share the call and whichever thread runs it;
 * a row's quantization reads only that row. Threads split the outputs, never
 * a sum. NaN and inf in x reach y: a group with either (or whose sum
 * overflows) is quantized to zeros with the scale NaN, so every output of
 * that row is NaN, and no NaN is cast to an integer.
 *
 * The micro-kernels of 16-bit integer inputs (4-bit and 8-bit weights):
 * linear.c quantizes a call's rows once, then its driver hands these (block,
 * rows) tiles. Built with -march=native: without AVX-512 VNNI
 * (__AVX512VNNI__) they are left out, linear.c's has_avx512_vnni() says 0
 * and the Python side keeps linear_q4.
 */
#ifndef BULKHEAD_LINEAR_I16IN_H
#define BULKHEAD_LINEAR_I16IN_H
#define I16MAX 32767.0f
/* Row r's group g: xi [G] its 16-bit integers, *scale s_g, *sum S_g. */
static __attribute__((unused)) void quantize_group(const float *x, int16_t *xi, float *scale, float *sum) {
    float amax = 0.0f, s = 0.0f;
    for (int k = 0; k < G; k++) {
        float a = fabsf(x[k]);
        amax = a > amax ? a : amax;
        s += x[k];
    }
    *sum = s;
    if (!isfinite(amax) || !isfinite(s)) {  /* a NaN is never > amax, but it makes s NaN */
        memset(xi, 0, sizeof(int16_t) * G);
        *scale = NAN;
        return;
    }
    float inv = I16MAX / amax;
    if (!(amax > 0.0f) || !isfinite(inv)) {  /* all zeros, or below ~1e-34: no step to divide by; adds < 1e-33 */
        memset(xi, 0, sizeof(int16_t) * G);
        *scale = 0.0f;
        return;
    }
    for (int k = 0; k < G; k++) {
        float v = rintf(x[k] * inv);  /* |v| <= 32767: x[k] * inv rounds to at most 32767 (1 + 2^-22) */
        xi[k] = (int16_t)(v > I16MAX ? I16MAX : v < -I16MAX ? -I16MAX : v);
    }
    *scale = amax / I16MAX;
}

static __attribute__((unused)) void quantize_rows(const float *x, int16_t *xi, float *scale, float *sum, int64_t M, int64_t K,
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
#define DEFINE_I16_BLOCK(R)                                                                               \
    static void i16_block_##R(const int16_t *restrict xi, const float *restrict sc, const float *restrict s, \
                          int64_t K, const uint8_t *restrict qs, const float *restrict dm,             \
                          float *restrict y, int64_t ldy) {                                            \
        const __m512i low = _mm512_set1_epi32(0x000F000F);                                             \
        for (int64_t g = 0; g < K / G; g++) {                                                          \
            __m512i t[R][2];                                                                           \
            for (int r = 0; r < R; r++) t[r][0] = t[r][1] = _mm512_setzero_si512();                    \
            for (int64_t p = g * (G / 2); p < (g + 1) * (G / 2); p++) {                                \
                const uint8_t *b = qs + 2 * p * HALF;                                                  \
                __m512i even = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)b));               \
                __m512i odd = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + HALF)));       \
                __m512i pair = _mm512_or_si512(even, _mm512_slli_epi32(odd, 16));                      \
                __m512i w0 = _mm512_and_si512(pair, low);                                              \
                __m512i w1 = _mm512_and_si512(_mm512_srli_epi32(pair, 4), low);                        \
                for (int r = 0; r < R; r++) {                                                          \
                    int32_t input_pair;                                                                \
                    memcpy(&input_pair, xi + r * K + 2 * p, 4);                                        \
                    __m512i xv = _mm512_set1_epi32(input_pair);                                        \
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

DEFINE_I16_BLOCK(1)
DEFINE_I16_BLOCK(2)
DEFINE_I16_BLOCK(3)
DEFINE_I16_BLOCK(4)
DEFINE_I16_BLOCK(5)
DEFINE_I16_BLOCK(6)
DEFINE_I16_BLOCK(7)
DEFINE_I16_BLOCK(8)

typedef void (*i16_block_fn)(const int16_t *, const float *, const float *, int64_t, const uint8_t *, const float *,
                             float *, int64_t);
static const i16_block_fn I16_BLOCK[RMAX + 1] = {0, i16_block_1, i16_block_2, i16_block_3, i16_block_4, i16_block_5,
                                                 i16_block_6, i16_block_7, i16_block_8};

/* Rows [0, R) against one block of 8-bit weights: xi [R][K], sc [R][K / G],
 * qb [K / 2][2][HALF][2] (for input pair p, outputs 0-15's (q[2p], q[2p + 1])
 * then outputs 16-31's: vpmovsxbw widens 32 of them to vpdpwssd's operand),
 * d [K / G][NB]. */
#define DEFINE_Q8_BLOCK(R)                                                                            \
    static void q8_block_##R(const int16_t *restrict xi, const float *restrict sc, int64_t K,       \
                             const int8_t *restrict qb, const float *restrict d, float *restrict y, \
                             int64_t ldy) {                                                          \
        for (int64_t g = 0; g < K / G; g++) {                                                         \
            __m512i t[R][2];                                                                          \
            for (int r = 0; r < R; r++) t[r][0] = t[r][1] = _mm512_setzero_si512();                   \
            for (int64_t p = g * (G / 2); p < (g + 1) * (G / 2); p++) {                               \
                const int8_t *b = qb + p * 2 * NB;                                                    \
                __m512i w0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)b));             \
                __m512i w1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(b + NB)));      \
                for (int r = 0; r < R; r++) {                                                         \
                    int32_t input_pair;                                                               \
                    memcpy(&input_pair, xi + r * K + 2 * p, 4);                                       \
                    __m512i xv = _mm512_set1_epi32(input_pair);                                       \
                    t[r][0] = _mm512_dpwssd_epi32(t[r][0], xv, w0);                                   \
                    t[r][1] = _mm512_dpwssd_epi32(t[r][1], xv, w1);                                   \
                }                                                                                     \
            }                                                                                         \
            __m512 d0 = _mm512_loadu_ps(d + g * NB), d1 = _mm512_loadu_ps(d + g * NB + 16);           \
            for (int r = 0; r < R; r++) {                                                             \
                __m512 scale = _mm512_set1_ps(sc[r * (K / G) + g]);                                   \
                __m512 q0 = _mm512_mul_ps(_mm512_cvtepi32_ps(t[r][0]), scale);                        \
                __m512 q1 = _mm512_mul_ps(_mm512_cvtepi32_ps(t[r][1]), scale);                        \
                __m512 a0 = g ? _mm512_loadu_ps(y + r * ldy) : _mm512_setzero_ps();                   \
                __m512 a1 = g ? _mm512_loadu_ps(y + r * ldy + 16) : _mm512_setzero_ps();              \
                _mm512_storeu_ps(y + r * ldy, _mm512_fmadd_ps(q0, d0, a0));                           \
                _mm512_storeu_ps(y + r * ldy + 16, _mm512_fmadd_ps(q1, d1, a1));                      \
            }                                                                                         \
        }                                                                                             \
    }

DEFINE_Q8_BLOCK(1)
DEFINE_Q8_BLOCK(2)
DEFINE_Q8_BLOCK(3)
DEFINE_Q8_BLOCK(4)
DEFINE_Q8_BLOCK(5)
DEFINE_Q8_BLOCK(6)
DEFINE_Q8_BLOCK(7)
DEFINE_Q8_BLOCK(8)

typedef void (*q8_block_fn)(const int16_t *, const float *, int64_t, const int8_t *, const float *, float *, int64_t);
static const q8_block_fn Q8_BLOCK[RMAX + 1] = {0, q8_block_1, q8_block_2, q8_block_3, q8_block_4, q8_block_5,
                                               q8_block_6, q8_block_7, q8_block_8};
/* Tile (b, r) of linear_q4_i16in: x the quantized rows (xi, sc, s), w qs
 * and w2 dm as linear_q4 takes them. */
static void i16_q4_tile(const struct linear_call *c, int64_t b, int64_t r, int rows) {
    int64_t K = c->K, groups = K / G;
    I16_BLOCK[rows]((const int16_t *)c->x + r * K, c->sc + r * groups, c->s + r * groups, K,
                    (const uint8_t *)c->w + b * K * HALF, (const float *)c->w2 + b * groups * 2 * NB,
                    (float *)c->y + r * c->N + b * NB, c->N);
}

/* Tile (b, r) of linear_q8_i16in: w qb [N / NB][K / 2][2][HALF][2], w2 d [N / NB][K / G][NB]. */
static void i16_q8_tile(const struct linear_call *c, int64_t b, int64_t r, int rows) {
    int64_t K = c->K, groups = K / G;
    Q8_BLOCK[rows]((const int16_t *)c->x + r * K, c->sc + r * groups, K, (const int8_t *)c->w + b * K * NB,
                   (const float *)c->w2 + b * groups * NB, (float *)c->y + r * c->N + b * NB, c->N);
}
#endif

/* The rows quantized into scratch of their own (malloc's, small beside a
 * matmul): *xi [M][K], *sc and *s [M][K / G]. Returns 0, or -1 without memory. */
static __attribute__((unused)) int quantized_rows(const float *x, int64_t M, int64_t K, int threads, int16_t **xi, float **sc, float **s) {
    int64_t groups = K / G;
    *xi = malloc(sizeof(int16_t) * (size_t)(M * K));
    *sc = malloc(sizeof(float) * (size_t)(M * groups));
    *s = malloc(sizeof(float) * (size_t)(M * groups));
    if (!*xi || !*sc || !*s) {
        free(*xi);
        free(*sc);
        free(*s);
        return -1;
    }
    quantize_rows(x, *xi, *sc, *s, M, K, threads);
    return 0;
}

#endif
