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
 * Built with -fopenmp where torch runs on libgomp (the decode-attention
 * kernel's reasoning: the work runs in torch's own thread team). No
 * -ffast-math: NaN and inf in x reach the logits, where the runner's finite
 * check fails the step closed.
 */
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define NB 32    /* outputs per block: two AVX-512 vectors of fp32 */
#define RMAX 8   /* rows per pass over a block: 8 x 2 accumulators stay in registers */

int uses_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Rows [0, R) of x against one block of NB outputs, packed [K][NB]: each
 * output's sum runs over k in order, one fused multiply-add per k, in a lane
 * of its own (no horizontal sums to make). */
#define DEFINE_BLOCK(R)                                                                             \
    static void block_##R(const float *restrict x, int64_t K, const uint16_t *restrict wp,         \
                          float *restrict y, int64_t ldy) {                                         \
        float acc[R][NB];                                                                           \
        memset(acc, 0, sizeof acc);                                                                 \
        for (int64_t k = 0; k < K; k++) {                                                           \
            float f[NB];                                                                            \
            for (int l = 0; l < NB; l++) f[l] = bf16_to_f32(wp[k * NB + l]);                        \
            for (int r = 0; r < R; r++) {                                                           \
                float xv = x[r * K + k];                                                            \
                for (int l = 0; l < NB; l++) acc[r][l] = __builtin_fmaf(xv, f[l], acc[r][l]);       \
            }                                                                                       \
        }                                                                                           \
        for (int r = 0; r < R; r++)                                                                 \
            for (int l = 0; l < NB; l++) y[r * ldy + l] = acc[r][l];                                \
    }

DEFINE_BLOCK(1)
DEFINE_BLOCK(2)
DEFINE_BLOCK(3)
DEFINE_BLOCK(4)
DEFINE_BLOCK(5)
DEFINE_BLOCK(6)
DEFINE_BLOCK(7)
DEFINE_BLOCK(8)

typedef void (*block_fn)(const float *, int64_t, const uint16_t *, float *, int64_t);
static const block_fn BLOCK[RMAX + 1] = {0, block_1, block_2, block_3, block_4, block_5, block_6, block_7, block_8};

int block_outputs(void) { return NB; }

/* x [M, K] fp32 contiguous; wp: the [N, K] bf16 weight packed as [N / NB, K,
 * NB] (bf16 bits); y [M, N] fp32 contiguous. N a multiple of NB. Returns 0,
 * or -1 for a shape it does not take. */
int linear_bf16w(const float *x, const uint16_t *wp, float *y, int64_t M, int64_t N, int64_t K, int nthreads) {
    if (N % NB || M < 1 || K < 1) return -1;
    int64_t blocks = N / NB;
    /* Blocks handed out as threads free up (bulkhead/model/c_linear.py says why). */
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic) num_threads(nthreads > 0 ? nthreads : 1)
#endif
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t m = 0; m < M; m += RMAX) {
            int rows = M - m < RMAX ? (int)(M - m) : RMAX;
            BLOCK[rows](x + m * K, K, wp + b * K * NB, y + m * N + b * NB, N);
        }
    (void)nthreads;
    return 0;
}
