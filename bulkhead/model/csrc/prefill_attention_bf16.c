/* Causal attention for one sequence's prefill chunk on bf16 dot products:
 * q, K and V rounded to bf16, every score, softmax sum and output fp32, the
 * probabilities rounded to bf16 for the value sum (and summed as rounded,
 * so that they still sum to the divisor). Flash-style: keys in blocks of KB
 * with a running max, so no [queries, keys] matrix is materialised.
 *
 * Why: a 4,096-token prompt spends over half its time in attention, which
 * torch's fp32 flash kernel runs at ~130 GFLOP/s on two cores; vdpbf16ps
 * does twice an fp32 FMA's multiply-adds.
 *
 * Layout: q [Tq][H][D], k and v [L][KVH][D] fp32 (position-major, as the
 * runner gathers them), each row rs floats after the last (q_rs, k_rs,
 * v_rs: views into the pass's qkv rows need no copy); query i sits at
 * position L - Tq + i and attends to keys 0..that position. Out [Tq][H][D]
 * fp32, rows out_rs apart. Scratch (caller-allocated):
 * kb [KVH][ceil(L / KB) * KB / 16][D / 2][16][2] bf16 (keys as lanes, pairs
 * along D), vb [KVH][ceil(L / KB) * KB / 2][D][2] bf16 (dims as lanes, pairs
 * along keys), qb [Tq][H][D] bf16.
 *
 * Each (query, head) is computed by one thread in a fixed order whatever
 * else is in the call. NaN and inf reach the output. A masked key's
 * probability is 0, but 0 x NaN is NaN: a non-finite V at a later position
 * of the same call, among the 16-key vectors a query block reads, reaches
 * earlier queries. Such a value comes from this chunk's own rows (only
 * written positions are passed), whose last row then fails the step closed
 * anyway.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "bf16.h"
#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef __AVX512BF16__
#include <immintrin.h>
#endif

#define D 64   /* head_dim this build takes */
#define KB 64  /* keys per block: four vectors of scores per query */
#define R 4    /* queries per pass over a key block */

int available(void) {
#ifdef __AVX512BF16__
    return 1;
#else
    return 0;
#endif
}

int head_dim(void) { return D; }
int key_block(void) { return KB; }

#ifdef __AVX512BF16__
static inline float hmax(__m512 v) { return _mm512_reduce_max_ps(v); }

/* exp(x) for x <= 0, 16 lanes: the decode-attention kernel's exp_neg
 * (paged_decode_attention.c): 2^n * a degree-6 polynomial, relative error
 * < 2e-7, 0 below -87 (so -inf, a masked score, gives 0); NaN stays NaN. */
static inline __m512 exp_neg16(__m512 x) {
    const __m512 log2e = _mm512_set1_ps(1.44269504088896341f), ln2 = _mm512_set1_ps(0.693147180559945309f);
    const __m512 shifter = _mm512_set1_ps(12582912.0f), lo = _mm512_set1_ps(-87.0f);
    __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_mask_blend_ps(under, x, lo);
    __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, log2e, shifter), shifter);
    __m512 r = _mm512_fnmadd_ps(n, ln2, x);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps(~under, p, _mm512_castsi512_ps(e));
}

#define INLINE static inline __attribute__((always_inline))

/* s[r][c] = q(row r) . key (j0 + 16 c + lane), for the block's first nvec vectors. */
INLINE void scores(const uint16_t *qb, const uint16_t *kb, int64_t H, int64_t h, const int64_t *qrow, int64_t j0,
                   __m512 (*s)[KB / 16], const int nvec) {
    for (int r = 0; r < R; r++)
        for (int c = 0; c < nvec; c++) s[r][c] = _mm512_setzero_ps();
    const uint16_t *kblk = kb + (j0 / 16) * (D / 2) * 32;
    for (int p = 0; p < D / 2; p++) {
        __m512bh kv[KB / 16];
        for (int c = 0; c < nvec; c++) {
            kv[c] = (__m512bh)_mm512_loadu_si512(kblk + (c * (D / 2) + p) * 32);
            __asm__("" : "+v"(kv[c]));
        }
        for (int r = 0; r < R; r++) {
            int32_t pair;
            memcpy(&pair, qb + (qrow[r] * H + h) * D + 2 * p, 4);
            __m512bh qv = (__m512bh)_mm512_set1_epi32(pair);
            for (int c = 0; c < nvec; c++) s[r][c] = _mm512_dpbf16_ps(s[r][c], qv, kv[c]);
        }
    }
}

/* Each row's scores scaled and masked, its running max and divisor moved on,
 * its output so far rescaled, and its probabilities rounded into p16. */
INLINE void softmax_rows(__m512 (*s)[KB / 16], const int64_t *pos, int64_t j0, int diagonal, float scale, float *m,
                         float *l, float (*o)[D], uint16_t (*p16)[KB], const int nvec) {
    for (int r = 0; r < R; r++) {
        __m512 vmax = _mm512_set1_ps(-INFINITY);
        for (int c = 0; c < nvec; c++) {
            s[r][c] = _mm512_mul_ps(s[r][c], _mm512_set1_ps(scale));
            if (diagonal) {
                __m512i idx = _mm512_add_epi32(_mm512_set1_epi32((int)(j0 + c * 16)),
                                               _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
                __mmask16 ok = _mm512_cmple_epi32_mask(idx, _mm512_set1_epi32((int)pos[r]));
                s[r][c] = _mm512_mask_blend_ps(ok, _mm512_set1_ps(-INFINITY), s[r][c]);
            }
            vmax = _mm512_max_ps(vmax, s[r][c]);
        }
        float bmax = hmax(vmax); /* one reduction a block: max is exact in any order */
        float mnew = m[r] > bmax ? m[r] : bmax;
        /* 0 on the first block (m = -inf); exactly 1, so skipped, where the max stays */
        float alpha = mnew == m[r] ? 1.0f : expf(m[r] - mnew);
        m[r] = mnew;
        __m512 vsum = _mm512_setzero_ps(), vm = _mm512_set1_ps(mnew);
        for (int c = 0; c < nvec; c++) {
            /* p rounded to bf16 once; the divisor sums the rounded values */
            __m256bh b = _mm512_cvtneps_pbh(exp_neg16(_mm512_sub_ps(s[r][c], vm)));
            _mm256_storeu_si256((__m256i *)(p16[r] + c * 16), (__m256i)b);
            vsum = _mm512_add_ps(vsum, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)b), 16)));
        }
        float sum = _mm512_reduce_add_ps(vsum);
        l[r] = l[r] * alpha + sum;
        if (alpha != 1.0f)
            for (int d = 0; d < D; d++) o[r][d] *= alpha;
    }
}

/* o[r] += p16[r] . V over the block's first nvec * 16 keys. */
INLINE void add_values(const uint16_t *vb, int64_t j0, float (*o)[D], uint16_t (*p16)[KB], const int nvec) {
    const uint16_t *vblk = vb + j0 * D;
    __m512 acc[R][D / 16];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < D / 16; c++) acc[r][c] = _mm512_load_ps(o[r] + c * 16);
    for (int jp = 0; jp < nvec * 8; jp++) {
        __m512bh vv[D / 16];
        for (int c = 0; c < D / 16; c++) {
            vv[c] = (__m512bh)_mm512_loadu_si512(vblk + (jp * D + c * 16) * 2);
            __asm__("" : "+v"(vv[c]));
        }
        for (int r = 0; r < R; r++) {
            int32_t pair;
            memcpy(&pair, p16[r] + 2 * jp, 4);
            __m512bh pv = (__m512bh)_mm512_set1_epi32(pair);
            for (int c = 0; c < D / 16; c++) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], pv, vv[c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < D / 16; c++) _mm512_store_ps(o[r] + c * 16, acc[r][c]);
}

/* One pass of a block's R query rows (row block i0, head h) over the key
 * block at j0: its first nvec vectors of 16 keys, the rest lying past every
 * row's position (a masked key's score is -inf, its probability exactly 0,
 * so skipping it adds nothing to any sum: the same numbers, without the
 * ~25% of a 256-token prompt's dot products that the last block of each row
 * block spent on keys past its queries). nvec a constant at each call
 * (block()'s switch), as are R and D: every loop then has a constant count,
 * so the score and output sums stay in registers. With the real row count
 * as a loop bound the compiler kept them in memory, and it reloaded the key
 * and value vectors for every row unless told to hold them (the asm lines);
 * the kernel then ran at ~100 useful GFLOP/s of vdpbf16ps's ~230 on one core
 * (docs/performance.md). Row r is query qrow[r], at position pos[r]. */
INLINE void pass_keys(const uint16_t *qb, const uint16_t *kb, const uint16_t *vb, int64_t H, int64_t h,
                      const int64_t *qrow, const int64_t *pos, int64_t j0, int diagonal, float scale, float *m,
                      float *l, float (*o)[D], uint16_t (*p16)[KB], const int nvec) {
    __m512 s[R][KB / 16];
    scores(qb, kb, H, h, qrow, j0, s, nvec);
    softmax_rows(s, pos, j0, diagonal, scale, m, l, o, p16, nvec);
    add_values(vb, j0, o, p16, nvec);
}

/* Queries [i0, i0 + rows) of head h against keys [0, their last position].
 * Every pass computes R rows, a block of fewer repeating its last query:
 * rows share no sum, and the block's last position (the key loop's bound,
 * the mask) stays the same, so a repeated row's numbers are its own. */
static void block(const uint16_t *qb, const uint16_t *kb, const uint16_t *vb, float *out, int64_t out_rs,
                  int64_t H, int64_t h, int64_t i0, int rows, int64_t first, float scale) {
    float m[R], l[R];
    float o[R][D] __attribute__((aligned(64)));
    uint16_t p16[R][KB] __attribute__((aligned(64)));
    int64_t qrow[R], pos[R];
    for (int r = 0; r < R; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
        memset(o[r], 0, sizeof o[r]);
        qrow[r] = i0 + (r < rows ? r : rows - 1);
        pos[r] = first + qrow[r];
    }
    int64_t last = first + i0 + rows - 1; /* the block's last query's position */
    for (int64_t j0 = 0; j0 <= last; j0 += KB) {
        /* Only a block reaching past the row block's first query needs a mask. */
        int diagonal = j0 + KB - 1 > first + i0;
        int64_t nvec = (last - j0) / 16 + 1; /* vectors holding a key at or before `last` */
        switch (nvec) {
        case 1: pass_keys(qb, kb, vb, H, h, qrow, pos, j0, diagonal, scale, m, l, o, p16, 1); break;
        case 2: pass_keys(qb, kb, vb, H, h, qrow, pos, j0, diagonal, scale, m, l, o, p16, 2); break;
        case 3: pass_keys(qb, kb, vb, H, h, qrow, pos, j0, diagonal, scale, m, l, o, p16, 3); break;
        default: pass_keys(qb, kb, vb, H, h, qrow, pos, j0, diagonal, scale, m, l, o, p16, KB / 16); break;
        }
    }
    for (int r = 0; r < rows; r++)
        for (int d = 0; d < D; d++) out[(i0 + r) * out_rs + h * D + d] = o[r][d] / l[r];
}
#endif

/* Returns 0, or -1 for a shape it does not take (or no AVX-512 BF16). */
int prefill_attention_bf16(const float *q, const float *k, const float *v, float *out, uint16_t *kb, uint16_t *vb,
                           uint16_t *qb, int64_t Tq, int64_t L, int64_t H, int64_t KVH, int64_t hd, float scale,
                           int64_t q_rs, int64_t k_rs, int64_t v_rs, int64_t out_rs, int nthreads) {
#ifdef __AVX512BF16__
    if (hd != D || Tq < 1 || L < Tq || KVH < 1 || H % KVH || q_rs < H * D || k_rs < KVH * D || v_rs < KVH * D
        || out_rs < H * D)
        return -1;
    int threads = nthreads > 0 ? nthreads : 1;
    (void)threads;
    int64_t Lp = (L + KB - 1) / KB * KB, group = H / KVH, first = L - Tq;
    /* Pack, one key pair at a time: keys past L are zeros (masked to -inf
     * scores, and p = 0 times a zero value). Each 32-bit store is a bf16
     * pair: K's two dims of one key, V's one dim of two keys. */
#ifdef _OPENMP
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
#endif
    for (int64_t g = 0; g < KVH; g++)
        for (int64_t jp = 0; jp < Lp / 2; jp++) {
            uint32_t *kdst = (uint32_t *)(kb + g * Lp * D), *vdst = (uint32_t *)(vb + g * Lp * D) + jp * D;
            for (int64_t j = 2 * jp; j < 2 * jp + 2; j++) {
                uint32_t *kd = kdst + (j / 16) * (D / 2) * 16 + j % 16; /* pair p of key j, at kd[p * 16] */
                if (j >= L) {
                    for (int64_t p = 0; p < D / 2; p++) kd[p * 16] = 0;
                    continue;
                }
                const float *kr = k + j * k_rs + g * D;
                for (int64_t p = 0; p < D / 2; p++)
                    kd[p * 16] = (uint32_t)to_bf16(kr[2 * p]) | (uint32_t)to_bf16(kr[2 * p + 1]) << 16;
            }
            uint16_t lo[D] = {0}, hi[D] = {0};
            for (int64_t d = 0; 2 * jp < L && d < D; d++) lo[d] = to_bf16(v[2 * jp * v_rs + g * D + d]);
            for (int64_t d = 0; 2 * jp + 1 < L && d < D; d++) hi[d] = to_bf16(v[(2 * jp + 1) * v_rs + g * D + d]);
            for (int64_t d = 0; d < D; d++) vdst[d] = (uint32_t)lo[d] | (uint32_t)hi[d] << 16;
        }
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads)
#endif
    for (int64_t i = 0; i < Tq; i++)
        for (int64_t e = 0; e < H * D; e++) qb[i * H * D + e] = to_bf16(q[i * q_rs + e]);
    int64_t qblocks = (Tq + R - 1) / R;
#ifdef _OPENMP
#pragma omp parallel for collapse(2) schedule(dynamic, 4) num_threads(threads)
#endif
    for (int64_t b = 0; b < qblocks; b++)
        for (int64_t h = 0; h < H; h++) {
            int64_t i0 = b * R;
            int rows = Tq - i0 < R ? (int)(Tq - i0) : R;
            int64_t g = h / group;
            block(qb, kb + g * Lp * D, vb + g * Lp * D, out, out_rs, H, h, i0, rows, first, scale);
        }
    return 0;
#else
    (void)q; (void)k; (void)v; (void)out; (void)kb; (void)vb; (void)qb; (void)Tq; (void)L; (void)H; (void)KVH;
    (void)hd; (void)scale; (void)q_rs; (void)k_rs; (void)v_rs; (void)out_rs; (void)nthreads;
    return -1;
#endif
}

/* The pass's K and V rows into their pool slots, rounded to bf16 (the
 * default KV cache): row i's K (k + i * k_rs, [KVH][D]) to k_pool page
 * pages[i], [KVH][D][page_size] at offsets[i]; its V to v_pool's
 * [page_size][KVH][D] there; pages k_ps / v_ps elements apart. The values
 * torch's indexed assignment of the same rows stores (a NaN as a NaN),
 * without its index machinery (~3 ms less a 256-token pass, measured).
 * Fail closed: a page outside [0, P) or an offset outside [0, page_size)
 * returns -1 before anything is written. */
int write_kv_bf16(const float *k, const float *v, int64_t k_rs, int64_t v_rs, const int64_t *pages,
                  const int64_t *offsets, int64_t N, uint16_t *k_pool, uint16_t *v_pool, int64_t k_ps, int64_t v_ps,
                  int64_t P, int64_t page_size, int64_t KVH, int64_t hd, int nthreads) {
    for (int64_t i = 0; i < N; i++)
        if (pages[i] < 0 || pages[i] >= P || offsets[i] < 0 || offsets[i] >= page_size) return -1;
    int threads = nthreads > 0 ? nthreads : 1;
    (void)threads; /* unused where OpenMP is not built in */
    int64_t n = KVH * hd;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads)
#endif
    for (int64_t i = 0; i < N; i++) {
        uint16_t *kp = k_pool + pages[i] * k_ps + offsets[i], *vp = v_pool + pages[i] * v_ps + offsets[i] * n;
        for (int64_t e = 0; e < n; e++) { /* e = kv head * hd + d */
            kp[e * page_size] = to_bf16(k[i * k_rs + e]);
            vp[e] = to_bf16(v[i * v_rs + e]);
        }
    }
    return 0;
}
