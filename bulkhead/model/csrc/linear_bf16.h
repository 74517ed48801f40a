/* y = x @ w.T for a prompt's rows: x rounded to bf16, w in bf16 (the 4-bit
 * grid weight rounded once, at load), every product exact and every sum and
 * the output fp32. The prompt kernel of `--linear-kernel q4-i16in`,
 * `gguf-i16in` and `bf16` (bulkhead/model/bf16in_kernel.py); below it, the
 * decode rows of `bf16` on the same packing and arithmetic.
 *
 * Why: a prompt's pass is bound by arithmetic, and AVX-512 BF16's dot
 * product does twice the multiply-adds of an fp32 FMA. Its first form kept
 * the weights exact (the 4-bit q in bf16, each group's sum scaled by its fp32
 * scale and offset): that scaling took two multiply-adds per output vector and
 * group beside 16 dot products, on the same pipes, and each row's group sums
 * needed a pass of their own over x. With the weight itself in bf16 a row's
 * sum runs over all of K in one register, and the kernel does 1.2-1.3x the
 * multiply-adds a second (docs/performance.md, "Prompts on bf16 weights").
 * The output is never rounded to bf16 (oneDNN's bf16 GEMM does that), but
 * for linear_bf16in_silu_mul's, which is rounded only as the down
 * projection would round its input anyway; the distance from the exact
 * model is measured in docs/performance.md "Quality".
 *
 * vdpbf16ps adds the products of a pair of bf16 inputs and weights into one
 * fp32 lane (one output per lane); each product is exact (8 bits times 8).
 * It treats bf16 denormals as zero and flushes denormal sums to zero (they
 * are below 1e-38).
 *
 * Batch invariance by construction: every (row, output) is the same sequence
 * of operations whichever rows share the call and whichever thread runs it.
 * Threads split the outputs, never a sum. NaN and inf in x reach y.
 *
 * Packing (bf16in_kernel.pack): outputs in blocks of NB; for block b and
 * input pair p, NB pairs of bf16 weights, (w[2p], w[2p + 1]) of output j at
 * [j][0..1].
 *
 * The micro-kernels of bf16 weights in pairs: linear.c rounds a call's rows
 * once, then its driver hands these (block, rows) tiles. Built with
 * -march=native: without AVX-512 BF16 (__AVX512BF16__) they are left out,
 * linear.c's has_avx512_bf16() says 0, and the Python side keeps the fp32
 * prompt kernel.
 */
#ifndef BULKHEAD_LINEAR_BF16_H
#define BULKHEAD_LINEAR_BF16_H
/* Rows per pass over a block: measured best of 6-14 (up to 14 x 2 sums fit
 * the registers, but ran slower). */
#define BF16IN_RMAX 6
#ifdef __AVX512BF16__
/* Rows [0, R) against one block: xb [R][K] bf16, wb [K / 2][NB][2] bf16. */
#define DEFINE_BF16IN_BLOCK(R)                                                                               \
    static void bf16in_block_##R(const uint16_t *restrict xb, int64_t K, const uint16_t *restrict wb,       \
                          float *restrict y, int64_t ldy) {                                           \
        __m512 acc[R][2];                                                                             \
        for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();                      \
        for (int64_t p = 0; p < K / 2; p++) {                                                         \
            const uint16_t *w = wb + p * 2 * NB;                                                      \
            __m512bh w0 = (__m512bh)_mm512_loadu_si512(w), w1 = (__m512bh)_mm512_loadu_si512(w + NB); \
            dot_pair(acc, R, xb, K, p, w0, w1);                                                       \
        }                                                                                             \
        for (int r = 0; r < R; r++) {                                                                 \
            _mm512_storeu_ps(y + r * ldy, acc[r][0]);                                                 \
            _mm512_storeu_ps(y + r * ldy + 16, acc[r][1]);                                            \
        }                                                                                             \
    }

DEFINE_BF16IN_BLOCK(1)
DEFINE_BF16IN_BLOCK(2)
DEFINE_BF16IN_BLOCK(3)
DEFINE_BF16IN_BLOCK(4)
DEFINE_BF16IN_BLOCK(5)
DEFINE_BF16IN_BLOCK(6)

typedef void (*bf16in_block_fn)(const uint16_t *, int64_t, const uint16_t *, float *, int64_t);
static const bf16in_block_fn BF16IN_BLOCK[BF16IN_RMAX + 1] = {0, bf16in_block_1, bf16in_block_2, bf16in_block_3,
                                                              bf16in_block_4, bf16in_block_5, bf16in_block_6};

/* Rows [0, R) against gate block wg and the up block wu of the same outputs:
 * act[r][0..NB) = silu(gate) * up rounded to bf16, each sum the one bf16in_block_R
 * computes, then silu_mul_row's arithmetic (glue.h), then the rounding the
 * down projection's call would give it (round_rows). */
#define DEFINE_SILU_BLOCK(R)                                                                            \
    static void silu_block_##R(const uint16_t *restrict xb, int64_t K, const uint16_t *restrict wg,    \
                               const uint16_t *restrict wu, uint16_t *restrict act, int64_t ldact) {   \
        __m512 g[R][2], u[R][2];                                                                        \
        for (int r = 0; r < R; r++) g[r][0] = g[r][1] = u[r][0] = u[r][1] = _mm512_setzero_ps();        \
        for (int64_t p = 0; p < K / 2; p++) {                                                           \
            const uint16_t *gp = wg + p * 2 * NB, *up = wu + p * 2 * NB;                                \
            __m512bh g0 = (__m512bh)_mm512_loadu_si512(gp), g1 = (__m512bh)_mm512_loadu_si512(gp + NB); \
            __m512bh u0 = (__m512bh)_mm512_loadu_si512(up), u1 = (__m512bh)_mm512_loadu_si512(up + NB); \
            dot_pair(g, R, xb, K, p, g0, g1);                                                           \
            dot_pair(u, R, xb, K, p, u0, u1);                                                           \
        }                                                                                               \
        for (int r = 0; r < R; r++) {                                                                   \
            float gu[2 * NB] __attribute__((aligned(64))), a[NB];                                       \
            _mm512_store_ps(gu, g[r][0]);                                                               \
            _mm512_store_ps(gu + 16, g[r][1]);                                                          \
            _mm512_store_ps(gu + NB, u[r][0]);                                                          \
            _mm512_store_ps(gu + NB + 16, u[r][1]);                                                     \
            silu_mul_row(gu, a, NB);                                                                    \
            for (int j = 0; j < NB; j++) act[r * ldact + j] = to_bf16(a[j]);                            \
        }                                                                                               \
    }

DEFINE_SILU_BLOCK(1)
DEFINE_SILU_BLOCK(2)
DEFINE_SILU_BLOCK(3)
DEFINE_SILU_BLOCK(4)

#define SILU_RMAX 4 /* four rows' 16 sums and the four weight vectors fill most of the 32 registers */
typedef void (*silu_block_fn)(const uint16_t *, int64_t, const uint16_t *, const uint16_t *, uint16_t *, int64_t);
static const silu_block_fn SILU_BLOCK[SILU_RMAX + 1] = {0, silu_block_1, silu_block_2, silu_block_3, silu_block_4};

/* xb [M, K] = x rounded to bf16, rows split between the threads. */
static void round_rows(const float *x, uint16_t *xb, int64_t M, int64_t K, int threads) {
    (void)threads; /* unused where OpenMP is not built in */
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads)
#endif
    for (int64_t r = 0; r < M; r++)
        for (int64_t k = 0; k < K; k++) xb[r * K + k] = to_bf16(x[r * K + k]);
}

/* Decode rows of a bf16 checkpoint with bf16 inputs (`bf16-in` for decode
 * rows): the prompt kernel's arithmetic (each row rounded to bf16 once a
 * call, vdpbf16ps against the weight pairs, fp32 sums, k in order), so a
 * row's numbers are the prompt kernel's for the same row. Why: at 16 rows
 * the fp32-input kernel this replaced (linear_bf16_f32in, in git history)
 * was bound by its multiply-adds (two FMAs and two widening ops per weight
 * pair and 16 outputs, against one vdpbf16ps),
 * while the bytes of bf16 weights stay the same (measured in process, one
 * thread: SmolLM2's decode step at 16 rows 71.7 -> 50.2 ms, at 1 row 14.0
 * -> 13.3 ms; docs/performance.md, "A step in process"). The lm_head of a
 * bf16 checkpoint runs it too (head_linear's `bf16-in`). Up to
 * BF16_DECODE_RMAX rows share a pass over a block: 8 rows x 2 sums and the two weight
 * vectors fit the 32 registers, so 16 decode rows read each weight block
 * twice (from L1 / L2 the second time), not three times at the prompt
 * kernel's 6. R a constant at each call (bf16_decode_rows' switch). */
#define BF16_DECODE_RMAX 8
static inline __attribute__((always_inline)) void bf16_decode_block(const uint16_t *restrict xb, int64_t K,
                                                                    const uint16_t *restrict wb, float *restrict y,
                                                                    int64_t ldy, const int R) {
    __m512 acc[BF16_DECODE_RMAX][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t p = 0; p < K / 2; p++) {
        const uint16_t *w = wb + p * 2 * NB;
        __m512bh w0 = (__m512bh)_mm512_loadu_si512(w), w1 = (__m512bh)_mm512_loadu_si512(w + NB);
        dot_pair(acc, R, xb, K, p, w0, w1);
    }
    for (int r = 0; r < R; r++) {
        _mm512_storeu_ps(y + r * ldy, acc[r][0]);
        _mm512_storeu_ps(y + r * ldy + 16, acc[r][1]);
    }
}

static void bf16_decode_rows(const uint16_t *xb, int64_t K, const uint16_t *wb, float *y, int64_t ldy, int R) {
    switch (R) {
    case 1: bf16_decode_block(xb, K, wb, y, ldy, 1); break;
    case 2: bf16_decode_block(xb, K, wb, y, ldy, 2); break;
    case 3: bf16_decode_block(xb, K, wb, y, ldy, 3); break;
    case 4: bf16_decode_block(xb, K, wb, y, ldy, 4); break;
    case 5: bf16_decode_block(xb, K, wb, y, ldy, 5); break;
    case 6: bf16_decode_block(xb, K, wb, y, ldy, 6); break;
    case 7: bf16_decode_block(xb, K, wb, y, ldy, 7); break;
    default: bf16_decode_block(xb, K, wb, y, ldy, BF16_DECODE_RMAX); break;
    }
}

/* Tile (b, r) of linear_bf16_bf16in: x the rows in bf16 (rounded once a call), w as bf16in_tile's. */
static void bf16_decode_tile(const struct linear_call *c, int64_t b, int64_t r, int rows) {
    bf16_decode_rows((const uint16_t *)c->x + r * c->K, c->K, (const uint16_t *)c->w + b * c->K * NB,
                     (float *)c->y + r * c->N + b * NB, c->N, rows);
}

/* Tile (b, r) of linear_bf16in_rounded: x the rows in bf16, w [N / NB][K / 2][NB][2]. */
static void bf16in_tile(const struct linear_call *c, int64_t b, int64_t r, int rows) {
    BF16IN_BLOCK[rows]((const uint16_t *)c->x + r * c->K, c->K, (const uint16_t *)c->w + b * c->K * NB,
                       (float *)c->y + r * c->N + b * NB, c->N);
}

/* Tile (b, r) of linear_bf16in_silu_mul: N = I gate outputs, w's blocks [0,
 * I / NB) the gate's and [I / NB, 2 I / NB) the up's; y the bf16 act [M, I]. */
static void bf16in_silu_tile(const struct linear_call *c, int64_t b, int64_t r, int rows) {
    const uint16_t *w = c->w;
    int64_t K = c->K, blocks = c->N / NB;
    SILU_BLOCK[rows]((const uint16_t *)c->x + r * K, K, w + b * K * NB, w + (blocks + b) * K * NB,
                     (uint16_t *)c->y + r * c->N + b * NB, c->N);
}

#endif
#endif
