/* y = x @ w.T for fp32 rows x and 4-bit grid weights w (each group of G
 * inputs of an output: w = q * d + m, q in 0..15, d and m fp32), summed and
 * returned in fp32: the decode kernel of `--linear-kernel q4`
 * (bulkhead/model/q4_kernel.py).
 *
 * Why: a decode step reads every weight for a handful of rows, so it is
 * bound by memory; 4 bits a weight read 8x fewer bytes than fp32. torch's
 * int4 kernel also reads 4 bits, but rounds the inputs to bf16 (so its
 * answers are not the model's) and, at 16 rows, spends most of a step
 * computing. Here every weight is rebuilt exactly (q * d is exact in fp32 for
 * a 4-bit q and a d of fp16 precision, so one rounding of the add, the same
 * as the fp32 model's dequantized weight) and the inputs and every sum stay
 * fp32: the exact model's numbers, up to the order of a sum.
 *
 * Batch invariance by construction: every (row, output) is the same sequence
 * of fused multiply-adds over k, in order, whichever rows share the call and
 * whichever thread runs it. Threads split the outputs, never a sum.
 *
 * Packing (q4_kernel.pack): outputs in blocks of NB; for block b and input k,
 * NB / 2 bytes, byte j holding output j's q in its low nibble and output
 * j + NB / 2's in its high one; then for each group of G inputs, NB scales d
 * and NB offsets m.
 *
 * The micro-kernel of the 4-bit grid with fp32 inputs: linear.c's driver
 * hands it (block, rows) tiles. -march=native makes the loops below AVX-512
 * or AVX2 as the CPU has them. No -ffast-math: NaN and inf in x reach the
 * logits, where the runner's finite check fails the step closed.
 */
#ifndef BULKHEAD_LINEAR_Q4_H
#define BULKHEAD_LINEAR_Q4_H
/* Rows [0, R) of x against one block: qs [K][HALF] bytes, dm [K / G][2][NB]. */
#define DEFINE_Q4_BLOCK(R)                                                                              \
    static void q4_block_##R(const float *restrict x, int64_t K, const uint8_t *restrict qs,           \
                          const float *restrict dm, float *restrict y, int64_t ldy) {                \
        float acc[R][NB];                                                                            \
        memset(acc, 0, sizeof acc);                                                                  \
        for (int64_t g = 0; g < K / G; g++) {                                                        \
            const float *d = dm + g * 2 * NB, *m = d + NB;                                           \
            for (int64_t k = g * G; k < (g + 1) * G; k++) {                                          \
                const uint8_t *b = qs + k * HALF;                                                    \
                float w[NB];                                                                         \
                for (int l = 0; l < HALF; l++) w[l] = __builtin_fmaf((float)(b[l] & 15), d[l], m[l]); \
                for (int l = 0; l < HALF; l++)                                                       \
                    w[HALF + l] = __builtin_fmaf((float)(b[l] >> 4), d[HALF + l], m[HALF + l]);      \
                for (int r = 0; r < R; r++) {                                                        \
                    float xv = x[r * K + k];                                                         \
                    for (int l = 0; l < NB; l++) acc[r][l] = __builtin_fmaf(xv, w[l], acc[r][l]);    \
                }                                                                                    \
            }                                                                                        \
        }                                                                                            \
        for (int r = 0; r < R; r++)                                                                  \
            for (int l = 0; l < NB; l++) y[r * ldy + l] = acc[r][l];                                 \
    }

DEFINE_Q4_BLOCK(1)
DEFINE_Q4_BLOCK(2)
DEFINE_Q4_BLOCK(3)
DEFINE_Q4_BLOCK(4)
DEFINE_Q4_BLOCK(5)
DEFINE_Q4_BLOCK(6)
DEFINE_Q4_BLOCK(7)
DEFINE_Q4_BLOCK(8)

typedef void (*q4_block_fn)(const float *, int64_t, const uint8_t *, const float *, float *, int64_t);
static const q4_block_fn Q4_BLOCK[RMAX + 1] = {0, q4_block_1, q4_block_2, q4_block_3, q4_block_4, q4_block_5,
                                               q4_block_6, q4_block_7, q4_block_8};

/* Tile (b, r) of linear_q4: w qs [N / NB][K][HALF], w2 dm [N / NB][K / G][2][NB]. */
static void q4_tile(const struct linear_call *c, int64_t b, int64_t r, int rows) {
    const float *x = c->x;
    Q4_BLOCK[rows](x + r * c->K, c->K, (const uint8_t *)c->w + b * c->K * HALF,
                   (const float *)c->w2 + b * (c->K / G) * 2 * NB, (float *)c->y + r * c->N + b * NB, c->N);
}
#endif
