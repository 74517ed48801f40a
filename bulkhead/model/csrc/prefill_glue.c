/* The glue of a prompt pass's layers, row-parallel in torch's OpenMP team:
 * RMSNorm (alone, and after the residual add), SiLU times up, and rotary on
 * q and k (bulkhead/model/prefill_glue.py; the ops themselves in glue.h,
 * shared with decode_layers.c).
 *
 * Why: a 512-row prompt pass spent about 70 ms of ~420 in these torch ops
 * (about 15 a layer, several passes over [512, 1536] each); one pass an op,
 * rows split between the threads, does the same arithmetic with less memory
 * traffic and no dispatch.
 *
 * Every row's numbers depend only on that row (rows never share a sum), so
 * how the threads split them changes nothing. Returns 0, or -1 for a
 * position outside the rotary tables (checked before anything is written).
 */
#include <stdint.h>
#include "glue.h"
#ifdef _OPENMP
#include <omp.h>
#endif

int uses_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

/* h = rms_norm(x) * w; x, h [T, D]. */
void rms_norm_rows(const float *x, const float *w, float *h, int64_t T, int64_t D, float eps, int threads) {
    (void)threads;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads)
#endif
    for (int64_t t = 0; t < T; t++) rms_norm_row(x + t * D, w, h + t * D, D, eps);
}

/* x += delta (the residual, in place), then h = rms_norm(x) * w; all [T, D]. */
void add_rms_norm_rows(float *x, const float *delta, const float *w, float *h, int64_t T, int64_t D, float eps,
                       int threads) {
    (void)threads;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads)
#endif
    for (int64_t t = 0; t < T; t++) {
        float *xr = x + t * D;
        const float *dr = delta + t * D;
        for (int64_t d = 0; d < D; d++) xr[d] = xr[d] + dr[d];
        rms_norm_row(xr, w, h + t * D, D, eps);
    }
}

/* act [T, I] = silu(gate) * up, gate_up [T, 2 I]. */
void silu_mul_rows(const float *gate_up, float *act, int64_t T, int64_t I, int threads) {
    (void)threads;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads)
#endif
    for (int64_t t = 0; t < T; t++) silu_mul_row(gate_up + t * 2 * I, act + t * I, I);
}

/* qk [T, heads, hd] = rotary of the first heads * hd columns of each row of
 * qkv [T, row_stride] (q's and k's heads), at positions [T]; cos, sin
 * [max_positions, hd]. */
int rope_rows(const float *qkv, int64_t row_stride, float *qk, int64_t T, int64_t heads, int64_t hd,
              const int64_t *positions, const float *cos, const float *sin, int64_t max_positions, int threads) {
    for (int64_t t = 0; t < T; t++)
        if (positions[t] < 0 || positions[t] >= max_positions) return -1;
    (void)threads;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads)
#endif
    for (int64_t t = 0; t < T; t++)
        rope(qkv + t * row_stride, qk + t * heads * hd, heads, hd, cos + positions[t] * hd, sin + positions[t] * hd);
    return 0;
}
