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
#include <string.h>

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
 * adapter's weights once a step, beside the base model's); every sum is
 * fp32. Four arithmetics, one per process and step (the sections below):
 * int8 weights with int16 products where the CPU has AVX-512 VNNI and the
 * step asks for them (lora_delta_int8.h: half the bytes again), bf16
 * products where it has AVX-512 BF16 and the step asks for them (x and u
 * rounded to bf16), else fp32 products in register tiles (AVX-512), else
 * row by row as here:
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
    /* bf16, this module's scaled lora_B transposed: [r_len, out], or where the
     * step's products are bf16, [ceil(r_len / 2), out, 2] (each column's ranks
     * in pairs, an odd rank's last pair padded with 0), as vdpbf16ps reads
     * them; where int8, that layout in int8 (vpdpwssd widens them) */
    const uint16_t *bt;
    int64_t r0, r_len;   /* its ranks in u */
    int64_t c0, out;     /* its columns in the fused output */
} PackedPart;

typedef struct {
    /* bf16, the modules' lora_A stacked: [rank, in], or where the step's
     * products are bf16, [ceil(in / 2), rank, 2] (each rank's inputs in pairs,
     * an odd width's last pair padded with 0); where int8, that layout in
     * int8; NULL: no delta on this linear */
    const uint16_t *a;
    int64_t rank, in;
    int64_t n_parts;
    PackedPart parts[MAX_PARTS];
    const float *scale;  /* int8 only, [rank]: A's scale of that rank times its module's B's */
} PackedDelta;

typedef struct {
    int64_t n_groups;
    const PackedDelta *const *deltas;  /* [n_groups] -> that adapter's [num_layers * LINEARS] */
    const int64_t *group_start;        /* [n_groups + 1]: each group's span of `rows` */
    const int64_t *rows;               /* the step's adapter rows, grouped by adapter */
    float *u;                          /* scratch, [len(rows), u_stride] */
    int64_t u_stride;                  /* at least every delta's rank */
    uint16_t *xb;                      /* scratch where bf16 or int8, [len(rows), xb_stride]: the rows' x in
                                          bf16, or in int16 */
    int64_t xb_stride;                 /* even, above every delta's input width */
    uint16_t *ub;                      /* scratch where bf16 or int8, [len(rows), ub_stride], zeroed: u in bf16,
                                          or in int16 */
    int64_t ub_stride;                 /* even, above every delta's rank: an odd rank's last pair reads one
                                          number past it (zeroed, or the next module's) against a 0 weight */
    int64_t products;                  /* PRODUCTS_*: the packing of every delta of the step */
    float *scales;                     /* scratch where int8, [len(rows), 1 + MAX_PARTS]: x's scale, each part's u's */
} LoraStep;

/* LoraStep.products: fp32 products over bf16 weights (lora_tiled()), bf16
 * products (lora_bf16_dots()), int8 weights with int16 products (lora_int8()). */
enum { PRODUCTS_FP32 = 0, PRODUCTS_BF16 = 1, PRODUCTS_INT8 = 2 };

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

/* up_rows##NAME: TILE (an up_tile) for R rows of a whole block (the common
 * case, unrolled) or of a part's last, narrower one; up_group##NAME: one
 * column block of one part over every row of a group, ROWS rows at a time,
 * each row's u of type U in the step's scratch U_BUF (U_STRIDE apart). One
 * definition for the fp32 and the bf16 products, which differ only there. */
#define DEFINE_UP_GROUP(NAME, TILE, U, U_BUF, U_STRIDE)                                                          \
static inline __attribute__((always_inline)) void up_rows##NAME(int R, const PackedPart *p, const U *const *us,  \
                                                                float *const *ys, int64_t j0, int64_t jn) {     \
    if (jn == UP_BLOCK) TILE(R, UP_BLOCK / 16, p, us, ys, j0, jn);                                              \
    else for (int64_t v = 0; v < jn; v += 16) TILE(R, 1, p, us, ys, j0 + v, jn - v < 16 ? jn - v : 16);        \
}                                                                                                               \
static void up_group##NAME(const PackedPart *p, const LoraStep *s, int64_t first, int64_t n, float *y,          \
                           int64_t y_stride, int64_t j0, int64_t jn) {                                          \
    for (int64_t r0 = 0; r0 < n; r0 += ROWS) {                                                                  \
        const int64_t rn = n - r0 < ROWS ? n - r0 : ROWS;                                                       \
        const U *us[ROWS];                                                                                      \
        float *ys[ROWS];                                                                                        \
        for (int64_t r = 0; r < rn; r++) {                                                                      \
            us[r] = s->U_BUF + (first + r0 + r) * s->U_STRIDE;                                                  \
            ys[r] = y + s->rows[first + r0 + r] * y_stride;                                                     \
        }                                                                                                       \
        if (rn == ROWS) up_rows##NAME(ROWS, p, us, ys, j0, jn);                                                 \
        else for (int64_t r = 0; r < rn; r++) up_rows##NAME(1, p, us + r, ys + r, j0, jn);                     \
    }                                                                                                           \
}

DEFINE_UP_GROUP(, up_tile, float, u, u_stride)

/* ---- bf16 products (AVX-512 BF16): the fast path where the CPU has them ----
 *
 * Why: vdpbf16ps does 32 multiply-adds an instruction against 16 for an fp32
 * FMA (57 against 22 GMAC/s on one core here, measured), and the base
 * model's own kernels multiply in 16-bit integers: in fp32 the delta's 4% of
 * the multiply-adds took 15-25% of a step. The price: each row's x, and its
 * u = A x, are rounded to bf16 (to nearest even) before they are multiplied,
 * a relative 2^-9 of each; sums stay fp32 (docs/adapters.md gives the logit
 * bound measured). Batch invariance as above: x and u are rounded per row,
 * and every output is its own row's fixed sequence of vdpbf16ps (pairs of
 * inputs in order, 16 lanes, then the fixed tree) whatever its tile. */
#if defined(__AVX512BF16__)
#define BF16_DOTS 1

static inline __mmask32 tail_mask32(int64_t left) { return left >= 32 ? (__mmask32)~0u : (__mmask32)((1u << left) - 1); }

/* xb[r] = x[rows[r]] rounded to bf16 (to nearest even); an odd width's pad element 0. */
static void round_row(const LoraStep *s, int64_t r, const float *x, int64_t x_stride, int64_t in) {
    const float *src = x + s->rows[r] * x_stride;
    uint16_t *dst = s->xb + r * s->xb_stride;
    for (int64_t i = 0; i < in; i += 16) {
        const __mmask16 m = tail_mask(in - i);
        __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + i));
        _mm256_mask_storeu_epi16(dst + i, m, (__m256i)h);
    }
    if (in % 2) dst[in] = 0;
}

static inline int32_t pair_at(const uint16_t *p) { int32_t v; memcpy(&v, p, 4); return v; }

/* ub[row][k] for R rows (xs, bf16) and every rank, in NV vectors of 16:
 * A in pairs [ceil(in / 2), rank, 2]; each lane k sums its pairs in order. */
static inline __attribute__((always_inline)) void down_tile_bf16(int R, int NV, const uint16_t *const *xs,
                                                                 const uint16_t *a, int64_t in, int64_t rank,
                                                                 uint16_t *const *ub) {
    __m512 acc[ROWS][4];
    __mmask32 m[4];
    for (int v = 0; v < NV; v++) m[v] = tail_mask32(2 * (rank - 16 * v));
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();
    for (int64_t q = 0; q < (in + 1) / 2; q++) {
        __m512bh w[4];
        for (int v = 0; v < NV; v++) w[v] = (__m512bh)_mm512_maskz_loadu_epi16(m[v], a + (q * rank + 16 * v) * 2);
        for (int r = 0; r < R; r++) {
            const __m512bh xq = (__m512bh)_mm512_set1_epi32(pair_at(xs[r] + 2 * q));
            for (int v = 0; v < NV; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], xq, w[v]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++)
            _mm256_mask_storeu_epi16(ub[r] + 16 * v, tail_mask(rank - 16 * v), (__m256i)_mm512_cvtneps_pbh(acc[r][v]));
}

#define DOWN_BF16(R, xs, ub) do { switch ((d->rank + 15) / 16) {                      \
    case 1: down_tile_bf16(R, 1, xs, d->a, d->in, d->rank, ub); break;                 \
    case 2: down_tile_bf16(R, 2, xs, d->a, d->in, d->rank, ub); break;                 \
    case 3: down_tile_bf16(R, 3, xs, d->a, d->in, d->rank, ub); break;                 \
    default: down_tile_bf16(R, 4, xs, d->a, d->in, d->rank, ub); } } while (0)

/* Rows [r0, r0 + n) of a group (n <= ROWS), every rank. */
static void down_rows_bf16(const PackedDelta *d, const LoraStep *s, int64_t first, int64_t r0, int64_t n) {
    const uint16_t *xs[ROWS];
    uint16_t *ub[ROWS];
    for (int64_t r = 0; r < n; r++) {
        xs[r] = s->xb + (first + r0 + r) * s->xb_stride;
        ub[r] = s->ub + (first + r0 + r) * s->ub_stride;
    }
    if (n == ROWS) DOWN_BF16(ROWS, xs, ub);
    else for (int64_t r = 0; r < n; r++) DOWN_BF16(1, xs + r, ub + r);
}

/* y[row][c0 + j0 + j] += sum over rank pairs of u's pair . Bt's pair, R rows, NV vectors of 16 columns. */
static inline __attribute__((always_inline)) void up_tile_bf16(int R, int NV, const PackedPart *p,
                                                               const uint16_t *const *us, float *const *ys,
                                                               int64_t j0, int64_t jn) {
    enum { V = UP_BLOCK / 16 };
    __m512 acc[ROWS][V];
    __mmask16 m[V];
    for (int v = 0; v < NV; v++) m[v] = tail_mask(jn - 16 * v);
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();
    for (int64_t q = 0; q < (p->r_len + 1) / 2; q++) {
        const uint16_t *b = p->bt + (q * p->out + j0) * 2;
        __m512bh w[V];
        for (int v = 0; v < NV; v++) w[v] = (__m512bh)_mm512_maskz_loadu_epi16(tail_mask32(2 * (jn - 16 * v)), b + 32 * v);
        for (int r = 0; r < R; r++) {
            const __m512bh uq = (__m512bh)_mm512_set1_epi32(pair_at(us[r] + p->r0 + 2 * q));
            for (int v = 0; v < NV; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], uq, w[v]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++) {
            float *y = ys[r] + p->c0 + j0 + 16 * v;
            _mm512_mask_storeu_ps(y, m[v], _mm512_add_ps(_mm512_maskz_loadu_ps(m[v], y), acc[r][v]));
        }
}

DEFINE_UP_GROUP(_bf16, up_tile_bf16, uint16_t, ub, ub_stride)
#else
#define BF16_DOTS 0
#endif
#if defined(__AVX512VNNI__)
#define INT8_DOTS 1
#include "lora_delta_int8.h"
#else
#define INT8_DOTS 0
#endif
#define TILED 1
#else
#define TILED 0
#define BF16_DOTS 0
#define INT8_DOTS 0
#endif

/* Which arithmetic lora_layer_delta runs here: 1 the register tiles (AVX-512 F, BW, VL), 0 row by row. */
int lora_tiled(void) { return TILED; }

/* 1 where lora_layer_delta can take bf16 products (PRODUCTS_BF16), 0 where this CPU has none. */
int lora_bf16_dots(void) { return BF16_DOTS; }

/* 1 where lora_layer_delta can take int8 weights with int16 products (PRODUCTS_INT8), 0 where this CPU has none. */
int lora_int8(void) { return INT8_DOTS; }

/* One group's down projection (u = A x) on this thread's share of its tiles. */
static void down_group(const PackedDelta *d, const LoraStep *s, int64_t first, int64_t n, const float *x,
                       int64_t x_stride) {
#if INT8_DOTS
    if (s->products == PRODUCTS_INT8) {
#pragma omp for schedule(static) nowait
        for (int64_t r0 = 0; r0 < n; r0 += ROWS) down_rows_i8(d, s, first, r0, n - r0 < ROWS ? n - r0 : ROWS);
        return;
    }
#endif
#if BF16_DOTS
    if (s->products == PRODUCTS_BF16) {
#pragma omp for schedule(static) nowait
        for (int64_t r0 = 0; r0 < n; r0 += ROWS) down_rows_bf16(d, s, first, r0, n - r0 < ROWS ? n - r0 : ROWS);
        return;
    }
#endif
#if TILED
    const int64_t row_tiles = (n + ROWS - 1) / ROWS, rank_tiles = (d->rank + RANKS - 1) / RANKS;
#pragma omp for schedule(static) nowait
    for (int64_t t = 0; t < row_tiles * rank_tiles; t++) {
        const int64_t r0 = t / rank_tiles * ROWS, k0 = t % rank_tiles * RANKS;
        down_rows(d, s, first, r0, n - r0 < ROWS ? n - r0 : ROWS, k0, d->rank - k0 < RANKS ? d->rank - k0 : RANKS,
                  x, x_stride);
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

static inline int64_t blocks_of(const PackedPart *p) { return (p->out + UP_BLOCK - 1) / UP_BLOCK; }

/* One group's up projection (y += B u) on this thread's share of its work
 * items: a tile of rows by one column block of one part, row tile major, so
 * that a thread runs through a few rows of y at a time (y of gate_up over a
 * 512-row prompt is 6 MB: column block major, every block went through it
 * all again, and its rows fell out of cache; 22 against 33-45 GMAC/s). */
static void up_group_all(const PackedDelta *d, const LoraStep *s, int64_t first, int64_t n, float *y,
                         int64_t y_stride) {
#if TILED
    int64_t per_tile = 0;
    for (int64_t q = 0; q < d->n_parts; q++) per_tile += blocks_of(&d->parts[q]);
    const int64_t row_tiles = (n + ROWS - 1) / ROWS;
#pragma omp for schedule(static) nowait
    for (int64_t t = 0; t < row_tiles * per_tile; t++) {
        const int64_t r0 = t / per_tile * ROWS, rn = n - r0 < ROWS ? n - r0 : ROWS;
        int64_t b = t % per_tile, q = 0;
        while (b >= blocks_of(&d->parts[q])) b -= blocks_of(&d->parts[q++]);
        const PackedPart *p = &d->parts[q];
        const int64_t j0 = b * UP_BLOCK, jn = p->out - j0 < UP_BLOCK ? p->out - j0 : UP_BLOCK;
#if INT8_DOTS
        if (s->products == PRODUCTS_INT8) { up_group_i8(p, q, s, first + r0, rn, y, y_stride, j0, jn); continue; }
#endif
#if BF16_DOTS
        if (s->products == PRODUCTS_BF16) { up_group_bf16(p, s, first + r0, rn, y, y_stride, j0, jn); continue; }
#endif
        up_group(p, s, first + r0, rn, y, y_stride, j0, jn);
    }
#else
    for (int64_t q = 0; q < d->n_parts; q++) {
        const PackedPart *p = &d->parts[q];
#pragma omp for schedule(static) nowait
        for (int64_t b = 0; b < blocks_of(p); b++) {
            const int64_t j0 = b * UP_BLOCK, jn = p->out - j0 < UP_BLOCK ? p->out - j0 : UP_BLOCK;
            for (int64_t r = 0; r < n; r++)  /* the block's weights stay in cache across the group's rows */
                up_block(p, s->u + (first + r) * s->u_stride, y + s->rows[first + r] * y_stride, j0, jn);
        }
    }
#endif
}

/* The body of lora_layer_delta, run by each thread of its team (or, orphaned,
 * by the calling thread alone: its worksharing loops then take every item
 * and its barrier returns). */
static void delta_team(const LoraStep *s, int64_t layer, int64_t which, const float *x, int64_t x_stride,
                       int64_t in_f, float *y, int64_t y_stride) {
#if INT8_DOTS
    if (s->products == PRODUCTS_INT8) {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < s->group_start[s->n_groups]; r++) quantize_row(s, r, x, x_stride, in_f);
    }
#endif
#if BF16_DOTS
    if (s->products == PRODUCTS_BF16) {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < s->group_start[s->n_groups]; r++) round_row(s, r, x, x_stride, in_f);
    }
#endif
    for (int64_t g = 0; g < s->n_groups; g++) {
        const PackedDelta *d = &s->deltas[g][layer * LINEARS + which];
        if (d->a) down_group(d, s, s->group_start[g], s->group_start[g + 1] - s->group_start[g], x, x_stride);
    }
#pragma omp barrier
    for (int64_t g = 0; g < s->n_groups; g++) {
        const PackedDelta *d = &s->deltas[g][layer * LINEARS + which];
        if (d->a) up_group_all(d, s, s->group_start[g], s->group_start[g + 1] - s->group_start[g], y, y_stride);
    }
}

/* y[rows] += each row's adapter delta on linear `which` of `layer`; x [T, in]
 * rows x_stride apart, y [T, out] rows y_stride apart. Returns 0, or
 * LORA_BAD_SHAPE (nothing written) where a delta's rank exceeds the scratch
 * or its input width is not `in_f`, or bf16 or int8 products are asked of
 * a build without them (or of a scratch too narrow, or int8 without its
 * scales). One parallel region a call (none on one thread): (bf16, int8:
 * the rows' x rounded, barrier,) the down projection, barrier, the up. */
int64_t lora_layer_delta(const LoraStep *s, int64_t layer, int64_t which, const float *x, int64_t x_stride,
                         int64_t in_f, float *y, int64_t y_stride, int threads) {
    const int64_t pairs = s->products == PRODUCTS_BF16 || s->products == PRODUCTS_INT8;
    if (s->products < 0 || s->products > PRODUCTS_INT8 || (s->products == PRODUCTS_BF16 && !BF16_DOTS)
        || (s->products == PRODUCTS_INT8 && (!INT8_DOTS || !s->scales)))
        return LORA_BAD_SHAPE;
    if (pairs && (in_f >= s->xb_stride || s->xb_stride % 2 || s->ub_stride % 2)) return LORA_BAD_SHAPE;
    for (int64_t g = 0; g < s->n_groups; g++) {
        const PackedDelta *d = &s->deltas[g][layer * LINEARS + which];
        if (d->a && (d->rank > s->u_stride || d->in != in_f || d->n_parts > MAX_PARTS)) return LORA_BAD_SHAPE;
        if (d->a && pairs && (d->rank > 64 || d->rank >= s->ub_stride)) return LORA_BAD_SHAPE;
        if (d->a && s->products == PRODUCTS_INT8 && !d->scale) return LORA_BAD_SHAPE;
    }
    if (threads <= 1) {  /* a lone decode row's step runs on one thread: no team to start, 120 calls a step */
        delta_team(s, layer, which, x, x_stride, in_f, y, y_stride);
        return 0;
    }
#pragma omp parallel num_threads(threads)
    delta_team(s, layer, which, x, x_stride, in_f, y, y_stride);
    return 0;
}
