/* ---- int8 weights, int16 products (AVX-512 VNNI): the default where the CPU has them ----
 *
 * Included by lora_delta.c inside its AVX-512 section (ROWS, tail_mask,
 * pair_at, PackedDelta and LoraStep come from there).
 *
 * Why: at one decode row the delta is its reads of the adapter's weights
 * (rank 16 on SmolLM2-135M's seven linears: 9.8 MB in bf16 a step, ~1.1 ms
 * of a ~7-9 ms token); int8 halves them. The scales cost nothing a step:
 * A is scaled per rank (its rows) and each module's B per rank too (its
 * columns), so both fold into one number per rank of u (PackedDelta.scale):
 *
 *     u[k]  = scale[k] * sx * sum_i qa[k, i] * xq[i]          xq = round(x / sx), sx = max|x| / 32767
 *     y[j] += su_p * sum_k qb_p[j, k] * uq[k]                 uq = round(u / su_p), su_p = max|u_p| / 32767
 *
 * qa, qb in [-127, 127] (lora_layers.PackedAdapter rounds them, to nearest
 * even); x and u rounded to int16 per row (u per module part), with one
 * scale each; every product and every sum of products is exact in int32
 * (vpdpwssd); the int32 sums go to fp32 every FLUSH pairs (2 * 32768 * 127
 * * 256 < 2^31), in order. docs/adapters.md gives the logit bound measured.
 *
 * Batch invariance as for the other arithmetics: a row's scales are its
 * own numbers', integer sums do not depend on their order, and every fp32
 * operation is its own row's fixed sequence whatever its tile or thread.
 *
 * One row (a lone decode step, 120 calls a step on SmolLM2) waits on
 * latency, not on arithmetic: its down projection runs ROWS int32 chains
 * (pairs q mod ROWS, added together exactly before each flush: the same
 * numbers as one chain). Its reads are what it costs, so the weights are
 * one stream: an adapter's int8 weights lie in one buffer in the order a
 * step reads them (layer by layer, linear by linear: A's pairs, then each
 * module's B block-major, column block by column block of UP_BLOCK
 * columns, each block's pair rows together; lora_layers.PackedAdapter).
 * Each linear's delta used to start 2-4 separate matrices cold after the
 * base matmul had streamed the caches through, and read each B as 8 rows
 * a few kB apart at once; one stream is what the hardware prefetcher
 * follows best (in a decode step, 0.5 against 0.8 ms a token on SmolLM2,
 * docs/adapters.md). A lone row prefetches nothing in software: on this
 * stream that measured slower, prefetching the next call's weights too.
 * A tile of ROWS rows, with 4 rows' arithmetic a byte, prefetches
 * PREFETCH_BYTES ahead along the stream.
 */
#define FLUSH 256
#ifndef PREFETCH_BYTES
#define PREFETCH_BYTES 4096
#endif
#define SCALES (1 + MAX_PARTS)  /* a row's scales in LoraStep.scales: x's, then each part's u's */

static inline __mmask32 bytes_mask(int64_t left) { return left >= 32 ? (__mmask32)~0u : (__mmask32)((1u << left) - 1); }

/* 32 int8 weights (16 lanes' pairs) widened to int16 for vpdpwssd. */
static inline __m512i widen_i8(const int8_t *p, __mmask32 m) {
    return _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(m, p));
}

/* dst[0:n] = src / sc rounded to int16 (nearest even), sc = max|src| / 32767 (0 where all 0); returns sc. */
static float quantize_i16(const float *src, int64_t n, int16_t *dst) {
    __m512 mx = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_maskz_loadu_ps(tail_mask(n - i), src + i)));
    const float amax = _mm512_reduce_max_ps(mx);
    const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 32767.0f / amax : 0.0f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, src + i), inv));
        _mm256_mask_storeu_epi16(dst + i, m, _mm512_cvtsepi32_epi16(q));
    }
    return amax / 32767.0f;
}

/* xq[r] = x[rows[r]] in int16 and its scale; an odd width's pad element 0. */
static void quantize_row(const LoraStep *s, int64_t r, const float *x, int64_t x_stride, int64_t in) {
    int16_t *dst = (int16_t *)s->xb + r * s->xb_stride;
    s->scales[r * SCALES] = quantize_i16(x + s->rows[r] * x_stride, in, dst);
    if (in % 2) dst[in] = 0;
}

/* u[row][k] (fp32, unscaled) for R rows (xs, int16) and every rank, in NV vectors of 16:
 * A in pairs [ceil(in / 2), rank, 2]; lane k sums its pairs in int32, to fp32 every FLUSH pairs. */
static inline __attribute__((always_inline)) void down_tile_i8(int R, int NV, const int16_t *const *xs,
                                                               const int8_t *a, int64_t in, int64_t rank,
                                                               float *const *us) {
    __m512 sum[ROWS][4];
    __m512i acc[ROWS][4];
    __mmask32 m[4];
    for (int v = 0; v < NV; v++) m[v] = bytes_mask(2 * (rank - 16 * v));
    for (int r = 0; r < ROWS; r++)
        for (int v = 0; v < NV; v++) sum[r][v] = _mm512_setzero_ps(), acc[r][v] = _mm512_setzero_si512();
    const int64_t pairs = (in + 1) / 2;
    for (int64_t q0 = 0; q0 < pairs; q0 += FLUSH) {
        const int64_t q1 = pairs - q0 < FLUSH ? pairs : q0 + FLUSH;
        int64_t q = q0;
        if (R == 1)  /* one row: ROWS chains of pairs q mod ROWS, summed exactly in int32 below */
            for (; q + ROWS <= q1; q += ROWS) {
                for (int c = 0; c < ROWS; c++) {
                    const __m512i xq = _mm512_set1_epi32(pair_at((const uint16_t *)xs[0] + 2 * (q + c)));
                    for (int v = 0; v < NV; v++)
                        acc[c][v] = _mm512_dpwssd_epi32(acc[c][v], xq, widen_i8(a + ((q + c) * rank + 16 * v) * 2, m[v]));
                }
            }
        for (; q < q1; q++) {
#ifndef LORA_NO_PREFETCH
            if (R == ROWS)
                for (int64_t o = 0; o < rank * 2; o += 64)
                    _mm_prefetch((const char *)(a + q * rank * 2 + o + PREFETCH_BYTES), _MM_HINT_T0);
#endif
            __m512i w[4];
            for (int v = 0; v < NV; v++) w[v] = widen_i8(a + (q * rank + 16 * v) * 2, m[v]);
            for (int r = 0; r < R; r++) {
                const __m512i xq = _mm512_set1_epi32(pair_at((const uint16_t *)xs[r] + 2 * q));
                for (int v = 0; v < NV; v++) acc[r][v] = _mm512_dpwssd_epi32(acc[r][v], xq, w[v]);
            }
        }
        if (R == 1)
            for (int v = 0; v < NV; v++)
                for (int c = 1; c < ROWS; c++) {
                    acc[0][v] = _mm512_add_epi32(acc[0][v], acc[c][v]);
                    acc[c][v] = _mm512_setzero_si512();
                }
        for (int r = 0; r < R; r++)
            for (int v = 0; v < NV; v++) {
                sum[r][v] = _mm512_add_ps(sum[r][v], _mm512_cvtepi32_ps(acc[r][v]));
                acc[r][v] = _mm512_setzero_si512();
            }
    }
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++) _mm512_mask_storeu_ps(us[r] + 16 * v, tail_mask(rank - 16 * v), sum[r][v]);
}

#define DOWN_I8(R, xs, us) do { switch ((d->rank + 15) / 16) {                                    \
    case 1: down_tile_i8(R, 1, xs, (const int8_t *)d->a, d->in, d->rank, us); break;               \
    case 2: down_tile_i8(R, 2, xs, (const int8_t *)d->a, d->in, d->rank, us); break;               \
    case 3: down_tile_i8(R, 3, xs, (const int8_t *)d->a, d->in, d->rank, us); break;               \
    default: down_tile_i8(R, 4, xs, (const int8_t *)d->a, d->in, d->rank, us); } } while (0)

/* Row r's u scaled (x's scale, then each rank's), and each part's ranks in int16 with their own scale. */
static void finish_u(const PackedDelta *d, const LoraStep *s, int64_t r) {
    float *u = s->u + r * s->u_stride;
    const float sx = s->scales[r * SCALES];
    for (int64_t k = 0; k < d->rank; k++) u[k] = u[k] * sx * d->scale[k];
    for (int64_t q = 0; q < d->n_parts; q++) {
        const PackedPart *p = &d->parts[q];
        s->scales[r * SCALES + 1 + q] = quantize_i16(u + p->r0, p->r_len, (int16_t *)s->ub + r * s->ub_stride + p->r0);
    }
}

/* Rows [r0, r0 + n) of a group (n <= ROWS), every rank. */
static void down_rows_i8(const PackedDelta *d, const LoraStep *s, int64_t first, int64_t r0, int64_t n) {
    const int16_t *xs[ROWS];
    float *us[ROWS];
    for (int64_t r = 0; r < n; r++) {
        xs[r] = (const int16_t *)s->xb + (first + r0 + r) * s->xb_stride;
        us[r] = s->u + (first + r0 + r) * s->u_stride;
    }
    if (n == ROWS) DOWN_I8(ROWS, xs, us);
    else for (int64_t r = 0; r < n; r++) DOWN_I8(1, xs + r, us + r);
    for (int64_t r = 0; r < n; r++) finish_u(d, s, first + r0 + r);
}

/* y[row][c0 + j + c] += su * sum over rank pairs of uq's pair . qb's pair, R rows, NV vectors of 16
 * columns c < jn; b: those columns of the block's first pair row, its pair rows `row` bytes apart (B
 * block-major, above). */
static inline __attribute__((always_inline)) void up_tile_i8(int R, int NV, const PackedPart *p,
                                                             const int16_t *const *us, const float *su,
                                                             float *const *ys, const int8_t *b, int64_t row,
                                                             int64_t j, int64_t jn) {
    enum { V = UP_BLOCK / 16 };
    __m512i acc[ROWS][V];
    __mmask16 m[V];
    for (int v = 0; v < NV; v++) m[v] = tail_mask(jn - 16 * v);
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_si512();
    for (int64_t q = 0; q < (p->r_len + 1) / 2; q++, b += row) {  /* r_len <= 64: 32 pairs, no int32 overflow */
#ifndef LORA_NO_PREFETCH
        if (R == ROWS && NV == V)  /* the stream PREFETCH_BYTES on: this part's next blocks, the next part's... */
            for (int o = 0; o < row; o += 64) _mm_prefetch((const char *)(b + PREFETCH_BYTES + o), _MM_HINT_T0);
#endif
        __m512i w[V];
        for (int v = 0; v < NV; v++) w[v] = widen_i8(b + 32 * v, bytes_mask(2 * (jn - 16 * v)));
        for (int r = 0; r < R; r++) {
            const __m512i uq = _mm512_set1_epi32(pair_at((const uint16_t *)us[r] + p->r0 + 2 * q));
            for (int v = 0; v < NV; v++) acc[r][v] = _mm512_dpwssd_epi32(acc[r][v], uq, w[v]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++) {
            float *y = ys[r] + p->c0 + j + 16 * v;
            const __m512 delta = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[r][v]), _mm512_set1_ps(su[r]));
            _mm512_mask_storeu_ps(y, m[v], _mm512_add_ps(_mm512_maskz_loadu_ps(m[v], y), delta));
        }
}

/* Columns [j0, j0 + jn) of a part (one block: its bytes start at j0 * pairs * 2, rows of jn pairs). */
static inline __attribute__((always_inline)) void up_rows_i8(int R, const PackedPart *p, const int16_t *const *us,
                                                             const float *su, float *const *ys, int64_t j0,
                                                             int64_t jn) {
    const int8_t *block = (const int8_t *)p->bt + j0 * ((p->r_len + 1) / 2) * 2;
    if (jn == UP_BLOCK) up_tile_i8(R, UP_BLOCK / 16, p, us, su, ys, block, 2 * jn, j0, jn);
    else for (int64_t v = 0; v < jn; v += 16)
        up_tile_i8(R, 1, p, us, su, ys, block + 2 * v, 2 * jn, j0 + v, jn - v < 16 ? jn - v : 16);
}

/* Part `part` of a delta, columns [j0, j0 + jn), over rows [first, first + n) (n <= ROWS). */
static void up_group_i8(const PackedPart *p, int64_t part, const LoraStep *s, int64_t first, int64_t n, float *y,
                        int64_t y_stride, int64_t j0, int64_t jn) {
    const int16_t *us[ROWS];
    float su[ROWS];
    float *ys[ROWS];
    for (int64_t r = 0; r < n; r++) {
        us[r] = (const int16_t *)s->ub + (first + r) * s->ub_stride;
        su[r] = s->scales[(first + r) * SCALES + 1 + part];
        ys[r] = y + s->rows[first + r] * y_stride;
    }
    if (n == ROWS) up_rows_i8(ROWS, p, us, su, ys, j0, jn);
    else for (int64_t r = 0; r < n; r++) up_rows_i8(1, p, us + r, su + r, ys + r, j0, jn);
}
