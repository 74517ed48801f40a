/* One adapter's low-rank delta on a pass's rows, in torch's OpenMP team
 * (bulkhead.model.lora_rows):
 *
 *     u[r, k]           = sum_i A[k, i] * x[rows[r], i]          k < R
 *     y[rows[r], c0+j] += sum_k B_p[j, k] * u[r, r0_p + k]       per module part p
 *
 * Why: in torch this is ~25 small ops a layer, ~17 us each, which made a
 * decode step under an adapter 2-3x the base model's (docs/adapters.md).
 *
 * Batch invariance by construction: every u[r, k] and every output is one
 * thread's fixed-order sum over its own row (16 lanes, then the lanes in a
 * fixed order), so a row's numbers do not depend on how many rows share
 * the call or where it sits. Built with -ffp-contract=off.
 */
#include <omp.h>
#include <stdint.h>

#define LANES 16

static float dot(const float *a, const float *b, int64_t n) {
    float acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += a[i + l] * b[i + l];
    float tail = 0.0f;
    for (; i < n; i++) tail += a[i] * b[i];
    float s = 0.0f;
    for (int l = 0; l < LANES; l++) s += acc[l];
    return s + tail;
}

/* u [n_rows, R] (scratch) = x[rows] @ A.T; A [R, in] row-major, x rows of stride x_stride. */
void lora_down(const float *x, int64_t x_stride, const int64_t *rows, int64_t n_rows, const float *a,
               int64_t rank, int64_t in_f, float *u, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t t = 0; t < n_rows * rank; t++) {
        int64_t r = t / rank, k = t % rank;
        u[t] = dot(a + k * in_f, x + rows[r] * x_stride, in_f);
    }
}

/* y[rows[r], c0 + j] += B [out, r_len] row-major . u[r, r0 : r0 + r_len]. */
void lora_up(const float *u, int64_t rank_total, const int64_t *rows, int64_t n_rows, const float *b,
             int64_t out_f, int64_t r0, int64_t r_len, float *y, int64_t y_stride, int64_t c0, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t t = 0; t < n_rows * out_f; t++) {
        int64_t r = t / out_f, j = t % out_f;
        y[rows[r] * y_stride + c0 + j] += dot(b + j * r_len, u + r * rank_total + r0, r_len);
    }
}
