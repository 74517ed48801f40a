/* Every transformer layer of one decode step in one call: the glue between
 * the matmuls and attention (RMSNorm, rotary, the KV write, SiLU, residuals)
 * in C (the row ops of glue.h), the matmuls and attention through a 4-bit
 * kernel (linear.c's linear_q4, linear_q4_i16in under `q4-i16in`, or a
 * bf16 checkpoint's linear_bf16_bf16in: one signature)
 * and the decode-attention kernel (paged_decode_attention.c),
 * whose entry points the caller hands in (bulkhead/model/decode_layers.py).
 *
 * Why: at one request a step's matmuls and attention take about 7 ms and
 * the ~20 small torch ops a layer around them (600 a step, each a dispatch
 * of a few microseconds, plus 150 ctypes calls) about 4 ms more. One call
 * a step does the same arithmetic without them.
 *
 * The same numbers as the torch path, up to the order of two sums: rotary,
 * the residual adds, the bias add and the KV cache's rounding are the same
 * IEEE operations in the same order (built with -ffp-contract=off, so that
 * no multiply and add fuse into one rounding); RMSNorm sums its squares in
 * 16 lanes and SiLU's exp is a polynomial (exp_neg below), where torch's
 * vectorised kernels have their own orders and polynomials.
 *
 * Batch invariance by construction: every row's glue reads only that row;
 * the kernels it calls are batch-invariant themselves (their own files).
 *
 * Fail closed: a pool geometry it does not take, a write slot outside the
 * pool or a position outside the rotary tables stops the call with a code
 * (the caller raises) before anything is written. Attention checks its own
 * page lists, layer by layer: a bad list stops the step after earlier
 * layers wrote this step's K and V into the request's own slots, which the
 * failed step then never reads. No -ffast-math: NaN
 * from poisoned KV reaches the logits, where the runner's check fails the
 * step closed.
 *
 * Layouts (bulkhead.kv.pool.KVPool, one layer's views):
 *   K  [num_pages, KVH, hd, page_size]   V  [num_pages, page_size, KVH, hd]
 *   page p of a layer starts p * page_stride elements after its base.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif
#include "bf16.h"
#include "glue.h"

typedef int (*linear_fn)(const float *x, const uint8_t *qs, const float *dm, float *y, int64_t M, int64_t N,
                         int64_t K, int nthreads);
typedef int64_t (*attention_fn)(const float *q, const void *k_pool, const void *v_pool, int64_t num_pool_pages,
                                int64_t pool_page_stride, const int64_t *pages, int64_t table_len,
                                const int64_t *page_offset, const int64_t *kv_len, float *out, int B, int H,
                                int KVH, int hd, int page_size, float scale, int threads);
/* The adapter rows' LoRA deltas on one fused linear (lora_delta.c's
 * lora_layer_delta; `step` is its LoraStep, opaque here): y[row] += the
 * row's adapter's B (A x[row]). which: 0 qkv, 1 o, 2 gate_up, 3 down. */
typedef int64_t (*lora_fn)(const void *step, int64_t layer, int64_t which, const float *x, int64_t x_stride,
                           int64_t in_f, float *y, int64_t y_stride, int threads);

typedef struct {
    const uint8_t *qs;  /* q4_kernel.pack's two tensors (bf16: bf16in_kernel.pack's, and an unused one) */
    const float *dm;
} Q4;

typedef struct {
    const float *input_norm, *post_norm;  /* [D] */
    const float *qkv_bias;                /* [(H + 2 KVH) hd], or NULL */
    Q4 qkv, o, gate_up, down;
    void *k_pool, *v_pool;                /* this layer's views of the pool */
} Layer;

typedef struct {
    const Layer *layers;
    int64_t num_layers, D, H, KVH, hd, I, page_size;
    int64_t kv_kind;                      /* 0 float32, 1 bfloat16, 2 float16 */
    int64_t num_pool_pages, page_stride;  /* elements from one page to the next */
    const float *cos, *sin;               /* [max_positions, hd] */
    int64_t max_positions;
    float eps, scale;
    linear_fn linear;
    attention_fn attention;
} Model;

enum { BAD_GEOMETRY = -1, BAD_SLOT = -2, BAD_POSITION = -3, NO_MEMORY = -4, LINEAR_REFUSED = -5 };
/* lora_delta.c's codes (LORA_BAD_SHAPE = -6) pass through. */

#define LINE_BYTES 64  /* a cache line */

/* n floats rounded up to whole cache lines. */
static size_t line_floats(int64_t n) {
    const size_t per_line = LINE_BYTES / sizeof(float);
    return ((size_t)n + per_line - 1) / per_line * per_line;
}

#define MAX_KV_ROW 2048  /* KV heads x head_dim of one row: the k_rot buffer below */

int max_kv_row(void) { return MAX_KV_ROW; }

/* One row's K (already rotated) and V into its pool slot. */
static void store_kv(const Model *m, const Layer *layer, int64_t page, int64_t off, const float *k, const float *v) {
    int64_t n = m->KVH * m->hd, ps = m->page_size;
    for (int64_t e = 0; e < n; e++) {  /* e = kv head * hd + d */
        int64_t ki = page * m->page_stride + e * ps + off, vi = page * m->page_stride + off * n + e;
        if (m->kv_kind == 1) {
            ((uint16_t *)layer->k_pool)[ki] = to_bf16(k[e]);
            ((uint16_t *)layer->v_pool)[vi] = to_bf16(v[e]);
#ifdef __FLT16_MAX__
        } else if (m->kv_kind == 2) {
            ((_Float16 *)layer->k_pool)[ki] = (_Float16)k[e];
            ((_Float16 *)layer->v_pool)[vi] = (_Float16)v[e];
#endif
        } else {
            ((float *)layer->k_pool)[ki] = k[e];
            ((float *)layer->v_pool)[vi] = v[e];
        }
    }
}

/* x [T, D]: the step's input rows (embeddings), replaced by the last
 * layer's output. Rows [0, S) are the requests' (one each), rows [S, T)
 * padding: they run through the matmuls, attend to nothing and write no KV,
 * as in the torch path. positions [T]; write_slots [S] (page * page_size +
 * offset); pages, page_offset [S], kv_len [S] as the attention kernel takes
 * them. lora, lora_step: the adapter rows' deltas, added to each matmul's
 * output (after the qkv bias, before rotary, SiLU and the residual adds, as
 * the torch path adds them), or NULL where no row has an adapter. Returns 0; b + 1 where attention
 * refused request b's page list; or a negative code above. */
int64_t decode_layers(const Model *m, float *x, int64_t T, int64_t S, const int64_t *positions,
                      const int64_t *write_slots, const int64_t *pages, int64_t table_len,
                      const int64_t *page_offset, const int64_t *kv_len, int nthreads,
                      lora_fn lora, const void *lora_step) {
    const int64_t D = m->D, hd = m->hd, qd = m->H * hd, kvd = m->KVH * hd, qkvd = qd + 2 * kvd, I = m->I;
    if (T < 1 || S < 0 || S > T || hd % 2 || m->num_layers < 1 || m->page_size <= 0 || m->KVH <= 0 ||
        m->H % m->KVH || kvd > MAX_KV_ROW || m->page_stride < kvd * m->page_size || m->kv_kind < 0 || m->kv_kind > 2)
        return BAD_GEOMETRY;
#ifndef __FLT16_MAX__
    if (m->kv_kind == 2) return BAD_GEOMETRY;  /* this compiler has no _Float16 */
#endif
    for (int64_t t = 0; t < T; t++)
        if (positions[t] < 0 || positions[t] >= m->max_positions) return BAD_POSITION;
    for (int64_t s = 0; s < S; s++)
        if (write_slots[s] < 0 || write_slots[s] / m->page_size >= m->num_pool_pages) return BAD_SLOT;

    /* Each buffer starts on a cache line of its own (line_floats rounds
     * each one up to whole lines). The kernels' threads write neighbouring
     * 32-float blocks of an output row, and the default 16-bit-integer and
     * the bf16-input decode kernels add into their outputs once per group
     * of 32 inputs; off a line, a block's edge shares a line with the next
     * block's, which can then bounce between the cores on every group
     * (docs/performance.md, "The slow spell was false sharing"). The
     * kernels take only multiples of 32 outputs, so every row of a buffer
     * starts on a line too. */
    const size_t at_qkv = line_floats(T * D), at_q = at_qkv + line_floats(T * qkvd),
                 at_attn = at_q + line_floats(T * qd), at_proj = at_attn + line_floats(T * qd),
                 at_gate_up = at_proj + line_floats(T * D), at_act = at_gate_up + line_floats(T * 2 * I),
                 total = at_act + line_floats(T * I);
    float *buf = aligned_alloc(LINE_BYTES, total * sizeof(float));
    if (!buf) return NO_MEMORY;
    float *h = buf, *qkv = buf + at_qkv, *q = buf + at_q, *attn = buf + at_attn, *proj = buf + at_proj,
          *gate_up = buf + at_gate_up, *act = buf + at_act;
    float k_rot[MAX_KV_ROW];  /* one row's rotated K: KVH * hd (checked above) */
    memset(attn, 0, sizeof(float) * (size_t)T * qd);  /* padding rows attend to nothing: 0 */
    int64_t rc = 0;

    for (int64_t l = 0; l < m->num_layers && rc == 0; l++) {
        const Layer *layer = &m->layers[l];
        for (int64_t t = 0; t < T; t++) rms_norm_row(x + t * D, layer->input_norm, h + t * D, D, m->eps);
        if (m->linear(h, layer->qkv.qs, layer->qkv.dm, qkv, T, qkvd, D, nthreads)) { rc = LINEAR_REFUSED; break; }
        if (layer->qkv_bias)  /* the bias, then the delta: the torch path's order */
            for (int64_t t = 0; t < T; t++)
                for (int64_t e = 0; e < qkvd; e++) qkv[t * qkvd + e] = qkv[t * qkvd + e] + layer->qkv_bias[e];
        if (lora && (rc = lora(lora_step, l, 0, h, D, D, qkv, qkvd, nthreads))) break;
        for (int64_t t = 0; t < T; t++) {
            float *row = qkv + t * qkvd;
            const float *cos = m->cos + positions[t] * hd, *sin = m->sin + positions[t] * hd;
            rope(row, q + t * qd, m->H, hd, cos, sin);
            if (t < S) {
                rope(row + qd, k_rot, m->KVH, hd, cos, sin);
                store_kv(m, layer, write_slots[t] / m->page_size, write_slots[t] % m->page_size, k_rot, row + qd + kvd);
            }
        }
        if (S > 0) {
            rc = m->attention(q, layer->k_pool, layer->v_pool, m->num_pool_pages, m->page_stride, pages, table_len,
                              page_offset, kv_len, attn, (int)S, (int)m->H, (int)m->KVH, (int)hd, (int)m->page_size,
                              m->scale, nthreads);
            if (rc) break;
        }
        if (m->linear(attn, layer->o.qs, layer->o.dm, proj, T, D, qd, nthreads)) { rc = LINEAR_REFUSED; break; }
        if (lora && (rc = lora(lora_step, l, 1, attn, qd, qd, proj, D, nthreads))) break;
        for (int64_t e = 0; e < T * D; e++) x[e] = x[e] + proj[e];
        for (int64_t t = 0; t < T; t++) rms_norm_row(x + t * D, layer->post_norm, h + t * D, D, m->eps);
        if (m->linear(h, layer->gate_up.qs, layer->gate_up.dm, gate_up, T, 2 * I, D, nthreads)) {
            rc = LINEAR_REFUSED;
            break;
        }
        if (lora && (rc = lora(lora_step, l, 2, h, D, D, gate_up, 2 * I, nthreads))) break;
        for (int64_t t = 0; t < T; t++) silu_mul_row(gate_up + t * 2 * I, act + t * I, I);
        if (m->linear(act, layer->down.qs, layer->down.dm, proj, T, D, I, nthreads)) { rc = LINEAR_REFUSED; break; }
        if (lora && (rc = lora(lora_step, l, 3, act, I, I, proj, D, nthreads))) break;
        for (int64_t e = 0; e < T * D; e++) x[e] = x[e] + proj[e];
    }
    free(buf);
    return rc;
}

/* The lm_head after the last layer, for decode_step: the final RMSNorm's
 * weight and the lm_head's kernel (linear_q4's signature: linear_q8_i16in
 * or linear_bf16_bf16in, over the weight pointers the Python layer hands). */
typedef struct {
    const float *final_norm;  /* [D] */
    const void *w, *w2;
    linear_fn linear;
    int64_t vocab;
} Head;

/* Whether every value of a row is finite, and the row's greedy pick as
 * numpy's and torch's argmax give it: the first of equal maxima (-0.0 and
 * 0.0 equal), the first NaN where there is one (NaN counts as the largest),
 * 0 for a row of -inf. The usual row (all finite) takes two vector passes
 * over its logits, still in cache from the lm_head: the largest value,
 * then the first place it occurs; a row with NaN or an infinity takes the
 * scalar pass that states the rule. */
static int64_t first_max_scalar(const float *row, int64_t V) {
    int64_t arg = 0;
    float best = row[0];
    if (best != best) return 0;
    for (int64_t i = 1; i < V; i++) {
        float v = row[i];
        if (v != v) return i;
        if (v > best) {
            best = v;
            arg = i;
        }
    }
    return arg;
}

static int64_t row_pick(const float *row, int64_t V, int *finite) {
    float best = -INFINITY;
    int bad = 0;
    int64_t i = 0;
#ifdef __AVX512F__
    __m512 top = _mm512_set1_ps(-INFINITY);
    __mmask16 odd = 0;
    for (; i + 16 <= V; i += 16) {
        __m512 v = _mm512_loadu_ps(row + i);
        odd |= _mm512_cmp_ps_mask(_mm512_sub_ps(v, v), _mm512_setzero_ps(), _CMP_NEQ_UQ);  /* NaN, inf: v - v is NaN */
        top = _mm512_max_ps(top, v);
    }
    bad = odd != 0;
    best = _mm512_reduce_max_ps(top);
#endif
    for (; i < V; i++) {
        bad |= !(row[i] - row[i] == 0.0f);
        best = row[i] > best ? row[i] : best;
    }
    *finite = !bad;
    if (bad) return first_max_scalar(row, V);
    i = 0;
#ifdef __AVX512F__
    const __m512 b = _mm512_set1_ps(best);
    for (; i + 16 <= V; i += 16) {
        __mmask16 hit = _mm512_cmp_ps_mask(_mm512_loadu_ps(row + i), b, _CMP_EQ_OQ);
        if (hit) return i + __builtin_ctz(hit);
    }
#endif
    for (; i < V; i++)
        if (row[i] == best) return i;
    return 0;  /* unreachable: best is one of the row's values */
}

/* Each of rows [0, S) of logits [S, V]: its greedy pick into picks[s]
 * (row_pick). Returns how many rows hold NaN or an infinity. */
int64_t pick_rows(const float *logits, int64_t S, int64_t V, int64_t *picks) {
    int64_t bad = 0;
    for (int64_t s = 0; s < S; s++) {
        int finite;
        picks[s] = row_pick(logits + s * V, V, &finite);
        bad += !finite;
    }
    return bad;
}

/* One decode step whole: decode_layers, then the final RMSNorm and the
 * lm_head over every row (padding too, as the torch path computes them:
 * logits [T, vocab]), then each request row's finite check and greedy pick
 * (picks [S]; *nonfinite_rows: how many of rows [0, S) hold NaN or an
 * infinity). Why one call: back in Python after the layers, the final norm
 * and the lm_head's call, the finite check and the argmax were a few small
 * ops each, run cold (the weights streamed through the layers had evicted
 * the interpreter's and torch's code and data) at ~0.5 ms a token in all
 * (docs/performance.md). The same numbers as the separate calls: the same
 * glue.h RMSNorm and the same lm_head kernel. Returns decode_layers' codes,
 * or LINEAR_REFUSED / NO_MEMORY from the tail. */
int64_t decode_step(const Head *head, const Model *m, float *x, int64_t T, int64_t S, const int64_t *positions,
                    const int64_t *write_slots, const int64_t *pages, int64_t table_len,
                    const int64_t *page_offset, const int64_t *kv_len, int nthreads,
                    lora_fn lora, const void *lora_step, float *logits, int64_t *picks, int64_t *nonfinite_rows) {
    int64_t rc = decode_layers(m, x, T, S, positions, write_slots, pages, table_len, page_offset, kv_len, nthreads,
                               lora, lora_step);
    if (rc) return rc;
    const int64_t D = m->D, V = head->vocab;
    float *h = aligned_alloc(LINE_BYTES, line_floats(T * D) * sizeof(float));
    if (!h) return NO_MEMORY;
    for (int64_t t = 0; t < T; t++) rms_norm_row(x + t * D, head->final_norm, h + t * D, D, m->eps);
    rc = head->linear(h, head->w, head->w2, logits, T, V, D, nthreads) ? LINEAR_REFUSED : 0;
    free(h);
    if (rc) return rc;
    *nonfinite_rows = pick_rows(logits, S, V, picks);
    return 0;
}
