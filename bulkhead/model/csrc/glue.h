/* The elementwise and row ops around a layer's matmuls and attention, one
 * row at a time: RMSNorm, SiLU times up, rotary. Shared by decode_layers.c
 * (a decode step's layers in one call), prefill_glue.c (a prompt pass's
 * rows, from torch) and linear_bf16.h (SiLU in its one-pass gate_up), so
 * that all compute them the same way. All build with -ffp-contract=off:
 * rotary and the products round as torch's separate ops do.
 * decode_kernel._build folds this file into each includer's cache key.
 *
 * Against torch's kernels: RMSNorm sums its squares in 16 lanes and SiLU's
 * exp is a polynomial (exp_neg), where torch's vectorised kernels have their
 * own orders and polynomials; rotary is the same IEEE operations in the same
 * order. NaN in a row stays in that row. */
#ifndef BULKHEAD_GLUE_H
#define BULKHEAD_GLUE_H
#include <math.h>
#include <stdint.h>

#define GLUE_LANES 16  /* RMSNorm sums its squares in this many lanes, then adds them in order */

/* y = x * (1 / sqrt(mean(x^2) + eps)) * w for one row of D. */
static inline void rms_norm_row(const float *x, const float *w, float *y, int64_t D, float eps) {
    float acc[GLUE_LANES] = {0};
    int64_t d = 0;
    for (; d + GLUE_LANES <= D; d += GLUE_LANES)
        for (int l = 0; l < GLUE_LANES; l++) acc[l] += x[d + l] * x[d + l];
    for (; d < D; d++) acc[d % GLUE_LANES] += x[d] * x[d];
    float sum = 0;
    for (int l = 0; l < GLUE_LANES; l++) sum += acc[l];
    float r = 1.0f / sqrtf(sum / (float)D + eps);
    for (d = 0; d < D; d++) y[d] = x[d] * r * w[d];
}

/* exp(x) for x <= 0, as the decode-attention kernel computes it (its file
 * says why: branch-free, so that it vectorises; relative error < 2e-7). */
static inline float exp_neg(float x) {
    const float log2e = 1.44269504088896341f, ln2 = 0.693147180559945309f, shifter = 12582912.0f;
    float under = x < -87.0f ? 0.0f : 1.0f;
    x = x < -87.0f ? -87.0f : x;
    float n = (x * log2e + shifter) - shifter;
    float r = x - n * ln2;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720))))));
    union { float f; int32_t i; } scale2 = { .i = ((int32_t)n + 127) << 23 };
    return p * scale2.f * under;
}

/* act[i] = silu(gate[i]) * up[i] for one row, gate_up [2 I] holding gate then up. */
static inline void silu_mul_row(const float *gate_up, float *act, int64_t I) {
    const float *g = gate_up, *u = g + I;
    for (int64_t i = 0; i < I; i++) {
        float x = g[i];
        float e = exp_neg(x != x ? 0.0f : -fabsf(x));  /* exp(-|x|): no overflow; NaN kept out of the cast */
        /* One division, its numerator chosen first: the same IEEE result as
         * dividing in each branch, at half the divisions once vectorised. */
        float sigmoid = (x >= 0 ? 1.0f : e) / (1.0f + e);
        if (x != x) sigmoid = x;      /* NaN stays NaN */
        act[i] = x * sigmoid * u[i];
    }
}

/* out = x * cos + rotate_half(x) * sin for `heads` heads of one row. */
static inline void rope(const float *x, float *out, int64_t heads, int64_t hd, const float *cos, const float *sin) {
    int64_t half = hd / 2;
    for (int64_t h = 0; h < heads; h++) {
        const float *xh = x + h * hd;
        float *oh = out + h * hd;
        for (int64_t d = 0; d < half; d++) oh[d] = xh[d] * cos[d] + (-xh[d + half]) * sin[d];
        for (int64_t d = half; d < hd; d++) oh[d] = xh[d] * cos[d] + xh[d - half] * sin[d];
    }
}
#endif
