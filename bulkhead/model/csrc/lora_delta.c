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

/* ---- Every adapter's delta on one fused linear of one decode layer, bf16 weights ----
 *
 * Called by decode_layers.c after each base matmul (bulkhead.model.lora_layers
 * binds it), so that a step with adapter rows keeps the C decode layers.
 * The weights are bf16 (half the bytes of fp32: the delta reads each
 * adapter's weights once a step, beside the base model's), widened exactly
 * as they are loaded; every sum is fp32.
 *
 *     u[r, k]            = sum_i A[k, i] * x[r, i]                (16 lanes, then the lanes in order)
 *     y[r, c0_p + j]    += sum_k u[r, r0_p + k] * Bt_p[k, j]      (k = 0, 1, ... in order)
 *
 * Bt is B transposed, [r_p, out_p], so that the up projection runs along
 * its output columns (vectors) instead of summing 16 products per output.
 * Batch invariance as above: each number is one thread's fixed-order sum
 * over its own row; the rows are grouped by adapter only so that an
 * adapter's weights are read once for all its rows. One parallel region a
 * call, with one barrier between the down and the up projection. */

#define MAX_PARTS 3      /* q, k, v: the most modules one fused linear holds */
#define UP_BLOCK 64      /* output columns a work item of the up projection takes */
#define LINEARS 4        /* qkv, o, gate_up, down: bulkhead.model.lora_layers.LINEARS */

typedef struct {
    const uint16_t *bt;  /* [r_len, out] bf16: this module's scaled lora_B, transposed */
    int64_t r0, r_len;   /* its ranks in u */
    int64_t c0, out;     /* its columns in the fused output */
} PackedPart;

typedef struct {
    const uint16_t *a;   /* [rank, in] bf16: the modules' lora_A stacked; NULL: no delta on this linear */
    int64_t rank, in;
    int64_t n_parts;
    PackedPart parts[MAX_PARTS];
} PackedDelta;

typedef struct {
    int64_t n_groups;
    const PackedDelta *const *deltas;  /* [n_groups] -> that adapter's [num_layers * LINEARS] */
    const int64_t *group_start;        /* [n_groups + 1]: each group's span of `rows` */
    const int64_t *rows;               /* the step's adapter rows, grouped by adapter */
    float *u;                          /* scratch, [len(rows), u_stride] */
    int64_t u_stride;                  /* at least every delta's rank */
} LoraStep;

enum { LORA_BAD_SHAPE = -6 };

static inline float widen(uint16_t h) {
    union { uint32_t u; float f; } v = { .u = (uint32_t)h << 16 };
    return v.f;
}

static float dot_bf16(const uint16_t *a, const float *x, int64_t n) {
    float acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += widen(a[i + l]) * x[i + l];
    float tail = 0.0f;
    for (; i < n; i++) tail += widen(a[i]) * x[i];
    float s = 0.0f;
    for (int l = 0; l < LANES; l++) s += acc[l];
    return s + tail;
}

/* One row's columns [j0, j0 + jn) of one part: y += u_row[r0:r0+r_len] @ Bt. */
static void up_block(const PackedPart *p, const float *u_row, float *y_row, int64_t j0, int64_t jn) {
    float acc[UP_BLOCK] = {0};
    for (int64_t k = 0; k < p->r_len; k++) {
        const float uk = u_row[p->r0 + k];
        const uint16_t *b = p->bt + k * p->out + j0;
        for (int64_t j = 0; j < jn; j++) acc[j] += uk * widen(b[j]);
    }
    for (int64_t j = 0; j < jn; j++) y_row[p->c0 + j0 + j] += acc[j];
}

/* y[rows] += each row's adapter delta on linear `which` of `layer`; x [T, in]
 * rows x_stride apart, y [T, out] rows y_stride apart. Returns 0, or
 * LORA_BAD_SHAPE (nothing written) where a delta's rank exceeds the scratch
 * or its input width is not `in_f`. */
int64_t lora_layer_delta(const LoraStep *s, int64_t layer, int64_t which, const float *x, int64_t x_stride,
                         int64_t in_f, float *y, int64_t y_stride, int threads) {
    for (int64_t g = 0; g < s->n_groups; g++) {
        const PackedDelta *d = &s->deltas[g][layer * LINEARS + which];
        if (d->a && (d->rank > s->u_stride || d->in != in_f || d->n_parts > MAX_PARTS)) return LORA_BAD_SHAPE;
    }
#pragma omp parallel num_threads(threads)
    {
        for (int64_t g = 0; g < s->n_groups; g++) {
            const PackedDelta *d = &s->deltas[g][layer * LINEARS + which];
            if (!d->a) continue;
            const int64_t first = s->group_start[g], n = s->group_start[g + 1] - first;
#pragma omp for schedule(static) nowait
            for (int64_t t = 0; t < n * d->rank; t++) {
                int64_t r = t / d->rank, k = t % d->rank;
                const float *row = x + s->rows[first + r] * x_stride;
                s->u[(first + r) * s->u_stride + k] = dot_bf16(d->a + k * d->in, row, d->in);
            }
        }
#pragma omp barrier
        for (int64_t g = 0; g < s->n_groups; g++) {
            const PackedDelta *d = &s->deltas[g][layer * LINEARS + which];
            if (!d->a) continue;
            const int64_t first = s->group_start[g], n = s->group_start[g + 1] - first;
            for (int64_t q = 0; q < d->n_parts; q++) {
                const PackedPart *p = &d->parts[q];
                const int64_t blocks = (p->out + UP_BLOCK - 1) / UP_BLOCK;
#pragma omp for schedule(static) nowait
                for (int64_t b = 0; b < blocks; b++) {
                    const int64_t j0 = b * UP_BLOCK, jn = p->out - j0 < UP_BLOCK ? p->out - j0 : UP_BLOCK;
                    for (int64_t r = 0; r < n; r++)  /* the block's weights stay in cache across the group's rows */
                        up_block(p, s->u + (first + r) * s->u_stride, y + s->rows[first + r] * y_stride, j0, jn);
                }
            }
        }
    }
    return 0;
}
