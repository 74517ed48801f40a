/* y = x @ w.T for fp32 rows x and bf16 weights w, accumulated and returned in
 * fp32: the lm_head's kernel (bulkhead/model/head_kernel.py).
 *
 * Why: at one request the lm_head reads its whole weight per token (49,152 x
 * 576 for SmolLM2: 113 MB in fp32), so it is bound by memory. bf16 weights
 * halve the bytes. The inputs stay fp32 and so do the products' sums and the
 * logits: only each weight is rounded (8 bits of mantissa), never the output,
 * which a bf16 GEMM would round to steps of 0.125 at a logit of 20.
 *
 * Batch invariance by construction: every (row, output) is the same sequence
 * of fused multiply-adds over k, in order, whichever rows share the call and
 * whichever thread runs it. Threads split the outputs, never a sum. The
 * weight is packed in blocks of NB outputs, k-major inside a block, so that
 * one vector holds NB outputs' running sums and no horizontal sum is made.
 *
 * The micro-kernel of bf16 weights in the lm_head's packing: linear.c's
 * driver hands it (block, rows) tiles. No -ffast-math: NaN and inf in x
 * reach the logits, where the runner's finite check fails the step closed.
 */
#ifndef BULKHEAD_LINEAR_BF16W_H
#define BULKHEAD_LINEAR_BF16W_H
/* Rows [0, R) of x against one block of NB outputs, packed [K][NB]: each
 * output's sum runs over k in order, one fused multiply-add per k, in a lane
 * of its own (no horizontal sums to make). */
#define DEFINE_BF16W_BLOCK(R)                                                                             \
    static void bf16w_block_##R(const float *restrict x, int64_t K, const uint16_t *restrict wp,         \
                          float *restrict y, int64_t ldy) {                                         \
        float acc[R][NB];                                                                           \
        memset(acc, 0, sizeof acc);                                                                 \
        for (int64_t k = 0; k < K; k++) {                                                           \
            float f[NB];                                                                            \
            for (int l = 0; l < NB; l++) f[l] = from_bf16(wp[k * NB + l]);                        \
            for (int r = 0; r < R; r++) {                                                           \
                float xv = x[r * K + k];                                                            \
                for (int l = 0; l < NB; l++) acc[r][l] = __builtin_fmaf(xv, f[l], acc[r][l]);       \
            }                                                                                       \
        }                                                                                           \
        for (int r = 0; r < R; r++)                                                                 \
            for (int l = 0; l < NB; l++) y[r * ldy + l] = acc[r][l];                                \
    }

DEFINE_BF16W_BLOCK(1)
DEFINE_BF16W_BLOCK(2)
DEFINE_BF16W_BLOCK(3)
DEFINE_BF16W_BLOCK(4)
DEFINE_BF16W_BLOCK(5)
DEFINE_BF16W_BLOCK(6)
DEFINE_BF16W_BLOCK(7)
DEFINE_BF16W_BLOCK(8)

typedef void (*bf16w_block_fn)(const float *, int64_t, const uint16_t *, float *, int64_t);
static const bf16w_block_fn BF16W_BLOCK[RMAX + 1] = {0, bf16w_block_1, bf16w_block_2, bf16w_block_3, bf16w_block_4,
                                                     bf16w_block_5, bf16w_block_6, bf16w_block_7, bf16w_block_8};

/* Tile (b, r) of linear_bf16w: w [N / NB][K][NB] bf16. */
static void bf16w_tile(const struct linear_call *c, int64_t b, int64_t r, int rows) {
    const float *x = c->x;
    BF16W_BLOCK[rows](x + r * c->K, c->K, (const uint16_t *)c->w + b * c->K * NB, (float *)c->y + r * c->N + b * NB,
                      c->N);
}
#endif
