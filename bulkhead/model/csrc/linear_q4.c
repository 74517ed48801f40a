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
 * Built with -fopenmp where torch runs on libgomp (the decode-attention
 * kernel's reasoning), -march=native so the loops below become AVX-512 or
 * AVX2 as the CPU has them. No -ffast-math: NaN and inf in x reach the
 * logits, where the runner's finite check fails the step closed.
 */
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define NB 32    /* outputs per block: two AVX-512 vectors of fp32 */
#define HALF (NB / 2)
#define G 32     /* inputs per scale/offset group, as GGUF's Q4_0 / Q4_1 */
#define RMAX 8   /* rows per pass over a block: 8 x 2 accumulators stay in registers */

int uses_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

int block_outputs(void) { return NB; }
int group_inputs(void) { return G; }

/* Rows [0, R) of x against one block: qs [K][HALF] bytes, dm [K / G][2][NB]. */
#define DEFINE_BLOCK(R)                                                                              \
    static void block_##R(const float *restrict x, int64_t K, const uint8_t *restrict qs,           \
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

DEFINE_BLOCK(1)
DEFINE_BLOCK(2)
DEFINE_BLOCK(3)
DEFINE_BLOCK(4)
DEFINE_BLOCK(5)
DEFINE_BLOCK(6)
DEFINE_BLOCK(7)
DEFINE_BLOCK(8)

typedef void (*block_fn)(const float *, int64_t, const uint8_t *, const float *, float *, int64_t);
static const block_fn BLOCK[RMAX + 1] = {0, block_1, block_2, block_3, block_4, block_5, block_6, block_7, block_8};

/* x [M, K] fp32 contiguous; qs [N / NB][K][HALF]; dm [N / NB][K / G][2][NB];
 * y [M, N] fp32 contiguous. Returns 0, or -1 for a shape it does not take. */
int linear_q4(const float *x, const uint8_t *qs, const float *dm, float *y, int64_t M, int64_t N, int64_t K,
              int nthreads) {
    if (N % NB || K % G || M < 1 || K < 1) return -1;
    int64_t blocks = N / NB;
    /* Blocks handed out as threads free up (bulkhead/model/c_linear.py says why). */
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic) num_threads(nthreads > 0 ? nthreads : 1)
#endif
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t r = 0; r < M; r += RMAX) {
            int rows = M - r < RMAX ? (int)(M - r) : RMAX;
            BLOCK[rows](x + r * K, K, qs + b * K * HALF, dm + b * (K / G) * 2 * NB, y + r * N + b * NB, N);
        }
    (void)nthreads;
    return 0;
}
