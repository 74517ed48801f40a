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

__attribute__((unused)) static float dot_bf16(const uint16_t *a, const float *x, int64_t n) {
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
__attribute__((unused)) static void up_block(const PackedPart *p, const float *u_row, float *y_row, int64_t j0, int64_t jn) {
    float acc[UP_BLOCK] = {0};
    for (int64_t k = 0; k < p->r_len; k++) {
        const float uk = u_row[p->r0 + k];
        const uint16_t *b = p->bt + k * p->out + j0;
        for (int64_t j = 0; j < jn; j++) acc[j] += uk * widen(b[j]);
    }
    for (int64_t j = 0; j < jn; j++) y_row[p->c0 + j0 + j] += acc[j];
}

/* ---- The same sums in register tiles (AVX-512 F, BW and VL) ----
 *
 * Why: row by row (down_rows/up_rows below) every multiply reloaded both
 * of its operands and widened the weight again, so the delta ran at a
 * tenth of what the core does: a 256-token prompt under an adapter took
 * 1.4x the base model's pass, and 16 decode rows 1.25x (docs/adapters.md).
 * A tile of ROWS rows and RANKS ranks (down) or UP_BLOCK columns (up) keeps
 * its sums in registers and widens each weight once for all its rows.
 *
 * Batch invariance is unchanged by the tiling: each output is still its own
 * row's fixed sequence of operations (one fused multiply-add per input
 * element into lane i mod 16, in order, then one fixed tree over the 16
 * lanes; up: one fused multiply-add per rank, in order, then one add to y),
 * whichever tile, thread or neighbours it is computed beside. A group's last
 * rows, short of a whole tile, take the same sequence one row at a time. */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define ROWS 4   /* rows of a tile */
#define RANKS 4  /* ranks of a down-projection tile */

static inline __m512 widen16(const uint16_t *p, __mmask16 m) {
    __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static inline __mmask16 tail_mask(int64_t left) { return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1); }

/* u[r][k] for R rows (xs) and K ranks (a rows) of one tile: R, K constants where inlined. */
static inline __attribute__((always_inline)) void down_tile(int R, int K, const float *const *xs,
                                                            const uint16_t *a, int64_t in, float *u,
                                                            int64_t u_stride) {
    __m512 acc[ROWS][RANKS];
    for (int r = 0; r < R; r++)
        for (int k = 0; k < K; k++) acc[r][k] = _mm512_setzero_ps();
    for (int64_t i = 0; i < in; i += 16) {
        const __mmask16 m = tail_mask(in - i);
        __m512 w[RANKS];
        for (int k = 0; k < K; k++) w[k] = widen16(a + k * in + i, m);
        for (int r = 0; r < R; r++) {
            const __m512 xv = _mm512_maskz_loadu_ps(m, xs[r] + i);
            for (int k = 0; k < K; k++) acc[r][k] = _mm512_fmadd_ps(w[k], xv, acc[r][k]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int k = 0; k < K; k++) u[r * u_stride + k] = _mm512_reduce_add_ps(acc[r][k]);
}

/* Down projection of rows [r0, r0 + n) of a group (at most ROWS), ranks [k0, k0 + RANKS) or one rank. */
static void down_rows(const PackedDelta *d, const LoraStep *s, int64_t first, int64_t r0, int64_t n, int64_t k0,
                      int64_t nk, const float *x, int64_t x_stride) {
    const float *xs[ROWS];
    for (int64_t r = 0; r < n; r++) xs[r] = x + s->rows[first + r0 + r] * x_stride;
    const uint16_t *a = d->a + k0 * d->in;
    float *u = s->u + (first + r0) * s->u_stride + k0;
    if (n == ROWS && nk == RANKS) { down_tile(ROWS, RANKS, xs, a, d->in, u, s->u_stride); return; }
    for (int64_t r = 0; r < n; r++)
        for (int64_t k = 0; k < nk; k += (nk - k >= RANKS ? RANKS : 1)) {
            if (nk - k >= RANKS) down_tile(1, RANKS, xs + r, a + k * d->in, d->in, u + r * s->u_stride + k, s->u_stride);
            else down_tile(1, 1, xs + r, a + k * d->in, d->in, u + r * s->u_stride + k, s->u_stride);
        }
}

/* y[row][c0 + j0 + j] += sum_k u[row][r0 + k] Bt[k][j0 + j] for R rows and NV
 * vectors of 16 columns, j < jn <= 16 NV (R and NV constants where inlined,
 * so that the sums stay in registers). */
static inline __attribute__((always_inline)) void up_tile(int R, int NV, const PackedPart *p, const float *const *us,
                                                          float *const *ys, int64_t j0, int64_t jn) {
    enum { V = UP_BLOCK / 16 };
    __m512 acc[ROWS][V];
    __mmask16 m[V];
    for (int v = 0; v < NV; v++) m[v] = tail_mask(jn - 16 * v);
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();
    for (int64_t k = 0; k < p->r_len; k++) {
        const uint16_t *b = p->bt + k * p->out + j0;
        __m512 w[V];
        for (int v = 0; v < NV; v++) w[v] = widen16(b + 16 * v, m[v]);
        for (int r = 0; r < R; r++) {
            const __m512 uk = _mm512_set1_ps(us[r][p->r0 + k]);
            for (int v = 0; v < NV; v++) acc[r][v] = _mm512_fmadd_ps(uk, w[v], acc[r][v]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++) {
            float *y = ys[r] + p->c0 + j0 + 16 * v;
            _mm512_mask_storeu_ps(y, m[v], _mm512_add_ps(_mm512_maskz_loadu_ps(m[v], y), acc[r][v]));
        }
}

/* up_tile for R rows of a whole block (the common case, unrolled) or of a part's last, narrower one. */
static inline __attribute__((always_inline)) void up_rows(int R, const PackedPart *p, const float *const *us,
                                                          float *const *ys, int64_t j0, int64_t jn) {
    if (jn == UP_BLOCK) up_tile(R, UP_BLOCK / 16, p, us, ys, j0, jn);
    else for (int64_t v = 0; v < jn; v += 16) up_tile(R, 1, p, us, ys, j0 + v, jn - v < 16 ? jn - v : 16);
}

/* One column block of one part over every row of a group, ROWS rows at a time. */
static void up_group(const PackedPart *p, const LoraStep *s, int64_t first, int64_t n, float *y, int64_t y_stride,
                     int64_t j0, int64_t jn) {
    for (int64_t r0 = 0; r0 < n; r0 += ROWS) {
        const int64_t rn = n - r0 < ROWS ? n - r0 : ROWS;
        const float *us[ROWS];
        float *ys[ROWS];
        for (int64_t r = 0; r < rn; r++) {
            us[r] = s->u + (first + r0 + r) * s->u_stride;
            ys[r] = y + s->rows[first + r0 + r] * y_stride;
        }
        if (rn == ROWS) up_rows(ROWS, p, us, ys, j0, jn);
        else for (int64_t r = 0; r < rn; r++) up_rows(1, p, us + r, ys + r, j0, jn);
    }
}
#define TILED 1
#else
#define TILED 0
#endif

/* Which arithmetic lora_layer_delta runs here: 1 the register tiles (AVX-512 F, BW, VL), 0 row by row. */
int lora_tiled(void) { return TILED; }

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
#if TILED
            const int64_t row_tiles = (n + ROWS - 1) / ROWS, rank_tiles = (d->rank + RANKS - 1) / RANKS;
#pragma omp for schedule(static) nowait
            for (int64_t t = 0; t < row_tiles * rank_tiles; t++) {
                const int64_t r0 = t / rank_tiles * ROWS, k0 = t % rank_tiles * RANKS;
                down_rows(d, s, first, r0, n - r0 < ROWS ? n - r0 : ROWS, k0,
                          d->rank - k0 < RANKS ? d->rank - k0 : RANKS, x, x_stride);
            }
#else
#pragma omp for schedule(static) nowait
            for (int64_t t = 0; t < n * d->rank; t++) {
                int64_t r = t / d->rank, k = t % d->rank;
                const float *row = x + s->rows[first + r] * x_stride;
                s->u[(first + r) * s->u_stride + k] = dot_bf16(d->a + k * d->in, row, d->in);
            }
#endif
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
#if TILED
                    up_group(p, s, first, n, y, y_stride, j0, jn);
#else
                    for (int64_t r = 0; r < n; r++)  /* the block's weights stay in cache across the group's rows */
                        up_block(p, s->u + (first + r) * s->u_stride, y + s->rows[first + r] * y_stride, j0, jn);
#endif
                }
            }
        }
    }
    return 0;
}
