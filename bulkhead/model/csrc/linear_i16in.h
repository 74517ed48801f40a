/* y = x @ w.T with x quantized to 16-bit integers per group of G inputs and
 * w integers times per-group scales, every product and every group's sum of
 * products exact in int32, the scales and the output fp32
 * (bulkhead/model/i16in_kernel.py). Two weight formats:
 *   linear_q4_i16in, linear_q4_1_i16in, linear_q4_0_i16in: the exact 4-bit
 *     grid weights (each group of G inputs of an output: w = q * d + m, q in
 *     0..15) as q4_scales.pack lays them out: 4 bits a weight in 64-byte
 *     runs of 4 inputs (DEFINE_I16_BLOCK says why), the scales fp32, or the
 *     file's own fp16 (Q4_1's d and m; Q4_0's d alone, m = -8 d), with
 *     linear_q4's signature, so that decode_layers.c calls any of them
 *     (through linear_coded, linear.c): decode rows under `--linear-kernel q4-i16in`;
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
 * Q8_0); for Q4_0's w = d_g (q_k - 8), d_g * (s_g * sum_k i_k (q_k - 8)),
 * the 8 taken off in int32 (Q4_GROUP_Q4_0). sum_k i_k q_k is exact in int32: 4-bit, at most 32 * 15 * 32767 <
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
/* Row r's group g: xi [G] its 16-bit integers, *scale s_g, *sum S_g, *isum
 * the integers' own sum (|isum| <= 32 * 32767: linear_q4_0_i16in's centring). */
static __attribute__((unused)) void quantize_group(const float *x, int16_t *xi, float *scale, float *sum,
                                                   int32_t *isum) {
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
        *isum = 0;
        return;
    }
    float inv = I16MAX / amax;
    if (!(amax > 0.0f) || !isfinite(inv)) {  /* all zeros, or below ~1e-34: no step to divide by; adds < 1e-33 */
        memset(xi, 0, sizeof(int16_t) * G);
        *scale = 0.0f;
        *isum = 0;
        return;
    }
    int32_t total = 0;
    for (int k = 0; k < G; k++) {
        float v = rintf(x[k] * inv);  /* |v| <= 32767: x[k] * inv rounds to at most 32767 (1 + 2^-22) */
        xi[k] = (int16_t)(v > I16MAX ? I16MAX : v < -I16MAX ? -I16MAX : v);
        total += xi[k];
    }
    *isum = total;
    *scale = amax / I16MAX;
}

static __attribute__((unused)) void quantize_rows(const float *x, int16_t *xi, float *scale, float *sum,
                                                  int32_t *isum, int64_t M, int64_t K, int threads) {
    int64_t groups = K / G;
    (void)threads;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads)
#endif
    for (int64_t r = 0; r < M; r++)
        for (int64_t g = 0; g < groups; g++)
            quantize_group(x + r * K + g * G, xi + r * K + g * G, scale + r * groups + g, sum + r * groups + g,
                           isum + r * groups + g);
}

#ifdef __AVX512VNNI__
/* Group g's scales d and offsets m of a block's outputs 0-15 (d0, m0) and
 * 16-31 (d1, m1), as each 4-bit layout stores them (`sd` the block's):
 *   F32:  fp32 d and m, [K / G][2][NB] (a Q4_K scale has up to 17 bits);
 *   Q4_1: fp16 d and m, [K / G][2][NB] (a GGUF Q4_1 block's own two halves);
 *   Q4_0: fp16 d, [K / G][NB], signed, the offset -8 d implied (a Q4_0 block's
 *     w = d * (q - 8): Q4_GROUP_Q4_0 below).
 * Widening an fp16 to fp32 is exact: the Q4_1 layout hands the epilogue the
 * numbers the fp32 one would hold, bit for bit. */
#define Q4_SCALES_F32(sd, g)                                                                      \
    const float *dp_ = (const float *)(sd) + (g) * 2 * NB;                                         \
    __m512 d0 = _mm512_loadu_ps(dp_), d1 = _mm512_loadu_ps(dp_ + 16);                              \
    __m512 m0 = _mm512_loadu_ps(dp_ + NB), m1 = _mm512_loadu_ps(dp_ + NB + 16);
#define HALVES(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define Q4_SCALES_Q4_1(sd, g)                                                                     \
    const uint16_t *dp_ = (const uint16_t *)(sd) + (g) * 2 * NB;                                   \
    __m512 d0 = HALVES(dp_), d1 = HALVES(dp_ + 16), m0 = HALVES(dp_ + NB), m1 = HALVES(dp_ + NB + 16);
#define Q4_SCALES_Q4_0(sd, g)                                                                     \
    const uint16_t *dp_ = (const uint16_t *)(sd) + (g) * NB;                                       \
    __m512 d0 = HALVES(dp_), d1 = HALVES(dp_ + 16);

/* A group's sums t (outputs 0-15, 16-31) into a0 and a1, `scale` its inputs' s_g:
 *   AFFINE (F32, Q4_1): fma(S_g, m, fma(s_g * T, d, y)), the top of this file's sum;
 *   Q4_0, centred: fma(s_g * (T - 8 isum), d, y): w = d * (q - 8) exactly, the
 *     offset taken off in exact integers (|T - 8 isum| <= 32 * 8 * 32767 < 2^23),
 *     not as m * S_g, which nearly cancels s_g * T * d and leaves its rounding. */
#define Q4_GROUP_AFFINE(t, isum, sum)                                                             \
    (void)(isum);                                                                                \
    __m512 sv = _mm512_set1_ps(sum);                                                             \
    a0 = _mm512_fmadd_ps(sv, m0, _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(t[0]), scale), d0, a0)); \
    a1 = _mm512_fmadd_ps(sv, m1, _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(t[1]), scale), d1, a1));
#define Q4_GROUP_F32(t, isum, sum) Q4_GROUP_AFFINE(t, isum, sum)
#define Q4_GROUP_Q4_1(t, isum, sum) Q4_GROUP_AFFINE(t, isum, sum)
#define Q4_GROUP_Q4_0(t, isum, sum)                                                               \
    (void)(sum);                                                                                 \
    __m512i off = _mm512_set1_epi32(8 * (isum));                                                 \
    a0 = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(t[0], off)), scale), d0, a0); \
    a1 = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(t[1], off)), scale), d1, a1);

/* Rows [0, R) against one block: xi [R][K], sc, s and is [R][K / G], qs
 * [K / 4][64] (q4_scales.pack_quads: for inputs 4u..4u+3, 32-bit lane j
 * holds in its low 16 bits, nibble by nibble from the bottom, output j's
 * and output j + 16's q of input 4u, then of input 4u + 2; in its high 16
 * bits the same of inputs 4u + 1 and 4u + 3), sd the block's scales in
 * LAYOUT (above). One 64-byte load gives, by a 16-bit shift and a mask
 * each, the four vpdpwssd operands of 4 inputs x 32 outputs (6 operations
 * where unpacking 32-bit lanes of bytes took 14): a one-row decode step is
 * bound by these operations as much as by memory. With few rows a second
 * set of sums takes the odd input pairs, so that no sum waits on the
 * vpdpwssd before it (a latency of several cycles); all are exact int32. */
#define I16_SPLIT(R) ((R) <= 4 ? 1 : 0)
#define DEFINE_I16_BLOCK(LAYOUT, R)                                                                       \
    static void i16_block_##LAYOUT##_##R(const int16_t *restrict xi, const float *restrict sc,            \
                          const float *restrict s, const int32_t *restrict is, int64_t K,              \
                          const uint8_t *restrict qs, const void *restrict sd, float *restrict y,      \
                          int64_t ldy) {                                                               \
        const __m512i low = _mm512_set1_epi16(0x000F);                                                 \
        for (int64_t g = 0; g < K / G; g++) {                                                          \
            __m512i t[R][2][2];                                                                        \
            for (int r = 0; r < R; r++)                                                                \
                t[r][0][0] = t[r][1][0] = t[r][0][1] = t[r][1][1] = _mm512_setzero_si512();            \
            for (int64_t u = g * (G / 4); u < (g + 1) * (G / 4); u++) {                                \
                __m512i v = _mm512_loadu_si512((const void *)(qs + u * 64));                           \
                __m512i wa = _mm512_and_si512(v, low);                                                 \
                __m512i wb = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);                           \
                __m512i wc = _mm512_and_si512(_mm512_srli_epi16(v, 8), low);                           \
                __m512i wd = _mm512_srli_epi16(v, 12);                                                 \
                for (int r = 0; r < R; r++) {                                                          \
                    int32_t p0, p1;                                                                    \
                    memcpy(&p0, xi + r * K + 4 * u, 4);                                                \
                    memcpy(&p1, xi + r * K + 4 * u + 2, 4);                                            \
                    __m512i x0 = _mm512_set1_epi32(p0), x1 = _mm512_set1_epi32(p1);                    \
                    t[r][0][0] = _mm512_dpwssd_epi32(t[r][0][0], x0, wa);                              \
                    t[r][1][0] = _mm512_dpwssd_epi32(t[r][1][0], x0, wb);                              \
                    t[r][0][I16_SPLIT(R)] = _mm512_dpwssd_epi32(t[r][0][I16_SPLIT(R)], x1, wc);        \
                    t[r][1][I16_SPLIT(R)] = _mm512_dpwssd_epi32(t[r][1][I16_SPLIT(R)], x1, wd);        \
                }                                                                                      \
            }                                                                                          \
            Q4_SCALES_##LAYOUT(sd, g)                                                                  \
            for (int r = 0; r < R; r++) {                                                              \
                int64_t rg = r * (K / G) + g;                                                          \
                __m512 scale = _mm512_set1_ps(sc[rg]);                                                 \
                __m512i sums[2] = {_mm512_add_epi32(t[r][0][0], t[r][0][1]),                           \
                                   _mm512_add_epi32(t[r][1][0], t[r][1][1])};                          \
                __m512 a0 = g ? _mm512_loadu_ps(y + r * ldy) : _mm512_setzero_ps();                    \
                __m512 a1 = g ? _mm512_loadu_ps(y + r * ldy + 16) : _mm512_setzero_ps();               \
                Q4_GROUP_##LAYOUT(sums, is[rg], s[rg])                                                 \
                _mm512_storeu_ps(y + r * ldy, a0);                                                     \
                _mm512_storeu_ps(y + r * ldy + 16, a1);                                                \
            }                                                                                          \
        }                                                                                              \
    }

typedef void (*i16_block_fn)(const int16_t *, const float *, const float *, const int32_t *, int64_t,
                             const uint8_t *, const void *, float *, int64_t);
#define DEFINE_I16_LAYOUT(LAYOUT)                                                                         \
    DEFINE_I16_BLOCK(LAYOUT, 1) DEFINE_I16_BLOCK(LAYOUT, 2) DEFINE_I16_BLOCK(LAYOUT, 3)                    \
    DEFINE_I16_BLOCK(LAYOUT, 4) DEFINE_I16_BLOCK(LAYOUT, 5) DEFINE_I16_BLOCK(LAYOUT, 6)                    \
    DEFINE_I16_BLOCK(LAYOUT, 7) DEFINE_I16_BLOCK(LAYOUT, 8)                                                \
    static const i16_block_fn I16_BLOCK_##LAYOUT[RMAX + 1] = {                                             \
        0, i16_block_##LAYOUT##_1, i16_block_##LAYOUT##_2, i16_block_##LAYOUT##_3, i16_block_##LAYOUT##_4, \
        i16_block_##LAYOUT##_5, i16_block_##LAYOUT##_6, i16_block_##LAYOUT##_7, i16_block_##LAYOUT##_8};
DEFINE_I16_LAYOUT(F32)
DEFINE_I16_LAYOUT(Q4_1)
DEFINE_I16_LAYOUT(Q4_0)

/* Rows [0, R) against one block of 8-bit weights: xi [R][K], sc [R][K / G],
 * qb [K / 2][2][HALF][2] (for input pair p, outputs 0-15's (q[2p], q[2p + 1])
 * then outputs 16-31's: vpmovsxbw widens 32 of them to vpdpwssd's operand),
 * d [K / G][NB]. */
#define DEFINE_Q8_SCALED_BLOCK(NAME, R, SCALE_T, LOAD_SCALES)                                          \
    static void NAME##_##R(const int16_t *restrict xi, const float *restrict sc, int64_t K,            \
                           const int8_t *restrict qb, const SCALE_T *restrict d, float *restrict y,    \
                           int64_t ldy) {                                                              \
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
            __m512 d0 = LOAD_SCALES(d + g * NB), d1 = LOAD_SCALES(d + g * NB + 16);                    \
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

#define F32_SCALES(p) _mm512_loadu_ps(p)
#define DEFINE_Q8_BLOCK(R) DEFINE_Q8_SCALED_BLOCK(q8_block, R, float, F32_SCALES)

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
/* Tiles (b, r) of linear_q4_i16in, linear_q4_1_i16in and linear_q4_0_i16in:
 * x the quantized rows (xi, sc, s), w qs as linear_q4 takes it, w2 the
 * scales in the entry's layout (`bytes`: a block's scales, per group). */
#define DEFINE_I16_Q4_TILE(name, LAYOUT, bytes)                                                          \
    static void name(const struct linear_call *c, int64_t b, int64_t r, int rows) {                      \
        int64_t K = c->K, groups = K / G;                                                                 \
        I16_BLOCK_##LAYOUT[rows]((const int16_t *)c->x + r * K, c->sc + r * groups, c->s + r * groups,     \
                                 c->is + r * groups, K,                                                   \
                                 (const uint8_t *)c->w + b * (K / 4) * 64,                                \
                                 (const uint8_t *)c->w2 + b * groups * (bytes), (float *)c->y + r * c->N + b * NB, \
                                 c->N);                                                                   \
    }
DEFINE_I16_Q4_TILE(i16_q4_tile, F32, 2 * NB * sizeof(float))
DEFINE_I16_Q4_TILE(i16_q4_1_tile, Q4_1, 2 * NB * sizeof(uint16_t))
DEFINE_I16_Q4_TILE(i16_q4_0_tile, Q4_0, NB * sizeof(uint16_t))

/* Tile (b, r) of linear_q8_i16in: w qb [N / NB][K / 2][2][HALF][2], w2 d [N / NB][K / G][NB]. */
static void i16_q8_tile(const struct linear_call *c, int64_t b, int64_t r, int rows) {
    int64_t K = c->K, groups = K / G;
    Q8_BLOCK[rows]((const int16_t *)c->x + r * K, c->sc + r * groups, K, (const int8_t *)c->w + b * K * NB,
                   (const float *)c->w2 + b * groups * NB, (float *)c->y + r * c->N + b * NB, c->N);
}
#endif

/* The rows quantized into scratch of their own (malloc's, small beside a
 * matmul): *xi [M][K], *sc, *s and *is [M][K / G]. Returns 0, or -1 without memory. */
static __attribute__((unused)) int quantized_rows(const float *x, int64_t M, int64_t K, int threads, int16_t **xi,
                                                  float **sc, float **s, int32_t **is) {
    int64_t groups = K / G;
    *xi = malloc(sizeof(int16_t) * (size_t)(M * K));
    *sc = malloc(sizeof(float) * (size_t)(M * groups));
    *s = malloc(sizeof(float) * (size_t)(M * groups));
    *is = malloc(sizeof(int32_t) * (size_t)(M * groups));
    if (!*xi || !*sc || !*s || !*is) {
        free(*xi);
        free(*sc);
        free(*s);
        free(*is);
        return -1;
    }
    quantize_rows(x, *xi, *sc, *s, *is, M, K, threads);
    return 0;
}

#endif
