/* Decode attention read straight from the paged KV pool: one query row per
 * request, every position below the request's kv_len, nothing else.
 *
 * Why C: torch has no CPU paged-attention kernel. Without one, each decode
 * step copies every request's pages out of the pool (index_select) and calls
 * SDPA once per request and layer; on this project's 2-core machine that was
 * about half of a 16-request step. Batched SDPA over padded rows was tried
 * and is not batch-invariant at 2 threads (its work split depends on the
 * batch size), which the isolation oracle forbids.
 *
 * Batch invariance by construction: one work item is (request, kv head); a
 * single thread computes it, in a fixed order over positions and lanes, from
 * that request's own pages only. Which thread takes it, and which other
 * requests share the step, cannot change its numbers.
 *
 * Threads: built with -fopenmp (decode_kernel.py does so where torch runs
 * on libgomp), the items run in the calling thread's OpenMP team, which is
 * torch's: its workers spin between torch's ops, so they start at once.
 * The threads take items as they free up (run_share): another thread that
 * wakes on this 2-core machine takes a core from one of them, and the other
 * goes on with the remaining items. Without OpenMP, a pool of pthreads of
 * our own.
 *
 * Fail closed: a page id outside the pool, or a page list longer than the
 * table, stops the call (returns the request's index + 1, and the caller
 * raises) before any KV byte is read; a non-finite score or value (poisoned
 * or corrupted KV) yields non-finite output, which the runner's finite check
 * turns into a failed request. No -ffast-math, for that reason.
 *
 * KV element type: float32, or bfloat16 / float16 when built with -DKV_BF16 /
 * -DKV_F16 (a 2-byte cache: decode attention reads half the bytes). Every element is widened to
 * fp32 as it is loaded; q, the scores, the sums and out stay fp32.
 *
 * Layouts (bulkhead.kv.pool.KVPool):
 *   q, out        [B, H, hd], contiguous
 *   k_pool        [num_pages, KVH, hd, page_size]   (one layer's view)
 *   v_pool        [num_pages, page_size, KVH, hd]
 *                 each page contiguous; page p starts p * page_stride floats
 *                 in (the pool is page-major: a page holds every layer)
 *   pages         int64, each request's page ids in position order, concatenated
 *   page_offset   int64 [B], where request b's ids start in `pages`
 *   kv_len        int64 [B], positions written (the watermark)
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(KV_BF16)
typedef uint16_t kv_t;
static inline float kv_f(kv_t h) { /* bf16 is fp32's top half: widening is exact */
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
#elif defined(KV_F16)
typedef _Float16 kv_t;
static inline float kv_f(kv_t h) { return (float)h; }  /* exact; vcvtph2ps with -march=native */
#else
typedef float kv_t;
static inline float kv_f(kv_t x) { return x; }
#endif

#define LANES 16
#define MAX_GROUP 16   /* query heads per kv head */
#define MAX_HEAD_DIM 256
#define MAX_PAGE 256

typedef struct {
    const float *q;
    const kv_t *k, *v;
    const int64_t *pages, *page_offset, *kv_len;
    float *out;
    int64_t num_pool_pages, table_len, pool_page_stride;
    int B, H, KVH, hd, page_size, threads;
    float scale;
    int64_t next_item;  /* the next (request, KV head) item to take: the threads share it (run_share) */
} Args;

/* exp(x) for x <= 0 (scores minus their max): 2^n * p(r), a degree-6
 * polynomial on [-ln2/2, ln2/2]; relative error < 2e-7; 0 below -87. Plain
 * arithmetic without branches or libm calls, so that it vectorises. */
static inline float exp_neg(float x) {
    const float log2e = 1.44269504088896341f, ln2 = 0.693147180559945309f, shifter = 12582912.0f; /* 1.5 * 2^23 */
    float under = x < -87.0f ? 0.0f : 1.0f;
    x = x < -87.0f ? -87.0f : x;
    float n = (x * log2e + shifter) - shifter;  /* round to nearest, in the default rounding mode */
    float r = x - n * ln2;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720))))));
    union { float f; int32_t i; } scale2 = { .i = ((int32_t)n + 127) << 23 };
    return p * scale2.f * under;
}

static int check_pages(const Args *a, int b) {
    int64_t used = (a->kv_len[b] + a->page_size - 1) / a->page_size;
    if (a->page_offset[b] < 0 || a->page_offset[b] + used > a->table_len) return 0;  /* ids past the table */
    for (int64_t i = 0; i < used; i++) {
        int64_t page = a->pages[a->page_offset[b] + i];
        if (page < 0 || page >= a->num_pool_pages) return 0;
    }
    return 1;
}

#if defined(HEAD_DIM) && defined(GROUP) && defined(PAGE_SIZE) && HEAD_DIM % 16 == 0 && PAGE_SIZE % 16 == 0
/* Whole pages in GCC's vector types (16 fp32 lanes, lowered to whatever
 * SIMD -march=native has), each accumulator a named register. Written as
 * plain loops, GCC kept three q.k accumulators, one of them spilled to the
 * stack, and each page's 64 FMAs waited on one another: the kernel ran at a
 * third of the cores' FMA rate and of this machine's read bandwidth. Every
 * sum here is the same as one_item's loops compute, in the same order (the
 * same multiply-adds, fused the same way: tests/model/test_decode_kernel.py
 * checks bit for bit against the plain loops, built with -DPLAIN_LOOPS).
 * The only change is how many independent sums are in flight at once. */
#ifndef PLAIN_LOOPS
#define VECTOR_LOOPS 1
#endif
#endif

#ifdef VECTOR_LOOPS
/* Every prefetch below asks for L2 (prefetcht1), not L1: a step of 16
 * requests has about 250 lines in flight at a time (the next pages' K, these
 * pages' V), far more than L1's miss buffers hold, and the L1 prefetches of
 * them stalled the loads they were for. Into L2: the kernel alone, 16
 * requests x ~320 positions, bf16 KV, 30 layers, one thread, interleaved
 * with the L1 version in one process: 0.71-0.78x its time (5 runs); the
 * outputs bit for bit the same. */
#define TO_L2 2
typedef float vf __attribute__((vector_size(64)));
#define VL 16
#define KV_VECS (PAGE_SIZE / VL)  /* vectors a K row of one page spans */
#define HD_VECS (HEAD_DIM / VL)   /* vectors a V row spans */
/* Pages whose scores are summed side by side: about twelve accumulators, as
 * many as AVX-512's registers hold with room to spare (measured for SmolLM2:
 * 3 query heads a KV head, 16-token pages, so four pages; with AVX2 each
 * vector takes two registers and some spill, which costs speed, not exactness). */
#define PAGES_AT_ONCE (GROUP * KV_VECS >= 8 ? 1 : GROUP * KV_VECS >= 4 ? 2 : 4)

static inline vf load_vec(const kv_t *p) {
#if defined(KV_BF16) && defined(__AVX512F__)
    /* one widening load and a shift: GCC lowers the generic conversion below to two half-width loads, two
     * widenings and an insert, more vector operations than the three FMAs each K vector feeds (the kernel
     * alone at one request of ~320 positions, KV in cache: 0.89x the time; bound by memory at 16: the same) */
    return (vf)_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
#elif defined(KV_BF16)
    typedef uint16_t vh __attribute__((vector_size(VL * 2)));
    typedef uint32_t vu __attribute__((vector_size(VL * 4)));
    vh h;
    memcpy(&h, p, sizeof h);
    vu u = __builtin_convertvector(h, vu) << 16;  /* bf16 is fp32's top half: widening is exact */
    vf f;
    memcpy(&f, &u, sizeof f);
    return f;
#elif defined(KV_F16)
    typedef _Float16 vh __attribute__((vector_size(VL * 2)));
    vh h;
    memcpy(&h, p, sizeof h);
    return __builtin_convertvector(h, vf);
#else
    vf f;
    memcpy(&f, p, sizeof f);
    return f;
#endif
}

#define V_LINES ((HEAD_DIM * (int)sizeof(kv_t) + 63) / 64)  /* cache lines a V row of one head spans */

/* scores[g][l] for the PAGES_AT_ONCE whole pages from page index pi: each
 * score summed over d = 0, 1, ... as the plain loop does. */
static inline void scores_of_pages(const Args *a, const float *q, const int64_t *pages, int64_t pi, int64_t used,
                                   int kvh, int64_t stride, float *scores) {
    const kv_t *kt[PAGES_AT_ONCE], *ahead[PAGES_AT_ONCE], *vt[PAGES_AT_ONCE];
    for (int p = 0; p < PAGES_AT_ONCE; p++) {
        kt[p] = a->k + pages[pi + p] * a->pool_page_stride + (int64_t)kvh * HEAD_DIM * PAGE_SIZE;
        vt[p] = a->v + pages[pi + p] * a->pool_page_stride + (int64_t)kvh * HEAD_DIM;
        /* the next pages' K (or these again past the last): a page's K for one head is one block of
         * HEAD_DIM * PAGE_SIZE elements at a page of its own, which the hardware prefetcher meets cold */
        ahead[p] = pi + PAGES_AT_ONCE + p < used ? a->k + pages[pi + PAGES_AT_ONCE + p] * a->pool_page_stride
                                                        + (int64_t)kvh * HEAD_DIM * PAGE_SIZE
                                                  : kt[p];
    }
    vf acc[PAGES_AT_ONCE][GROUP][KV_VECS];
    memset(acc, 0, sizeof acc);
    for (int d = 0; d < HEAD_DIM; d++)
        for (int p = 0; p < PAGES_AT_ONCE; p++) {
            if ((d * PAGE_SIZE * (int)sizeof(kv_t)) % 64 < PAGE_SIZE * (int)sizeof(kv_t))  /* each line once */
                __builtin_prefetch(ahead[p] + d * PAGE_SIZE, 0, TO_L2);
            /* these pages' V rows too, a line a step: weighted_values reads them after the softmax, and
             * its own prefetch a page ahead was too late for a read from memory (the kernel alone,
             * 16 requests x 320 positions, bf16 KV, one thread: 0.88x the time) */
            if (d < PAGE_SIZE * V_LINES)
                __builtin_prefetch((const char *)(vt[p] + (d / V_LINES) * (int64_t)a->KVH * HEAD_DIM)
                                   + (d % V_LINES) * 64, 0, TO_L2);
            for (int j = 0; j < KV_VECS; j++) {
                const vf k = load_vec(kt[p] + d * PAGE_SIZE + j * VL);
                for (int g = 0; g < GROUP; g++) acc[p][g][j] += q[g * HEAD_DIM + d] * k;
            }
        }
    for (int p = 0; p < PAGES_AT_ONCE; p++)
        for (int g = 0; g < GROUP; g++)
            for (int j = 0; j < KV_VECS; j++) {
                const vf s = acc[p][g][j] * a->scale;
                memcpy(scores + g * stride + (pi + p) * PAGE_SIZE + j * VL, &s, sizeof s);
            }
}

/* Over s[0 .. n) with n the largest multiple of VL up to len: *max = the
 * largest score, *nan |= 1 where one is not finite; returns n. The scalar
 * loop these replace took a sixth of the kernel's time with its KV in cache.
 * A maximum is exact in any order, so the numbers are the plain loop's. */
static inline int64_t max_and_finite(const float *s, int64_t len, float *max, int *nan) {
    typedef int32_t vi __attribute__((vector_size(64)));
    vf m;
    vi bad = {0};
    for (int i = 0; i < VL; i++) m[i] = *max;
    int64_t l = 0;
    for (; l + VL <= len; l += VL) {
        vf x;
        memcpy(&x, s + l, sizeof x);
        bad |= ~((x - x) == 0);  /* x - x is 0 for a finite x, NaN for an infinite or NaN one */
        const vi bigger = x > m;
        m = (vf)(((vi)x & bigger) | ((vi)m & ~bigger));
    }
    for (int i = 0; i < VL; i++) {
        *max = m[i] > *max ? m[i] : *max;
        *nan |= bad[i] != 0;
    }
    return l;
}

/* acc[g] = sum_l p_g[l] v_l over positions 0, 1, ..., len - 1, in that order. */
static inline void weighted_values(const Args *a, const int64_t *pages, int64_t len, int kvh, int64_t stride,
                                   const float *scores, float *out) {
    const int64_t row_stride = (int64_t)a->KVH * HEAD_DIM;
    vf acc[GROUP][HD_VECS];
    memset(acc, 0, sizeof acc);
    for (int64_t l0 = 0; l0 < len; l0 += PAGE_SIZE) {
        const kv_t *vp = a->v + pages[l0 / PAGE_SIZE] * a->pool_page_stride + (int64_t)kvh * HEAD_DIM;
        const int64_t n = len - l0 < PAGE_SIZE ? len - l0 : PAGE_SIZE;
        /* the next page's row j while this page's row j is read: a page ahead, spread over the page (a
         * burst of 32 prefetches at the page's start measured no better) */
        const kv_t *next = l0 + PAGE_SIZE < len
                               ? a->v + pages[l0 / PAGE_SIZE + 1] * a->pool_page_stride + (int64_t)kvh * HEAD_DIM
                               : vp;
        for (int64_t j = 0; j < n; j++) {
            for (int c = 0; c < HEAD_DIM * (int)sizeof(kv_t); c += 64)
                __builtin_prefetch((const char *)(next + j * row_stride) + c, 0, TO_L2);
            vf v[HD_VECS];
            for (int i = 0; i < HD_VECS; i++) v[i] = load_vec(vp + j * row_stride + i * VL);
            for (int g = 0; g < GROUP; g++) {
                const float p = scores[g * stride + l0 + j];
                for (int i = 0; i < HD_VECS; i++) acc[g][i] += p * v[i];
            }
        }
    }
    memcpy(out, acc, sizeof acc);
}
#endif

static void one_item(const Args *a, int b, int kvh, float *scores) {
#if defined(HEAD_DIM) && defined(GROUP) && defined(PAGE_SIZE)
    /* compiled for this model: loop bounds are constants, accumulators stay in registers */
    const int hd = HEAD_DIM, G = GROUP, ps = PAGE_SIZE;
#else
    const int hd = a->hd, G = a->H / a->KVH, ps = a->page_size;
#endif
    const int64_t len = a->kv_len[b], stride = len + 1;      /* a score row, and its 1 / sum */
    const int64_t page_stride = a->pool_page_stride;          /* elements from one page to the next */
    const float *q = a->q + ((int64_t)b * a->H + (int64_t)kvh * G) * hd;
    const int64_t *pages = a->pages + a->page_offset[b];
    const int64_t used = (len + ps - 1) / ps;

    /* scores[g][l] = scale * q_g . k_l, a page at a time. A page's K for one
     * kv head is [hd][ps]: row d holds dimension d of every position, so one
     * vector FMA adds q[d] * k[d] to ps scores at once, in the order d = 0,
     * 1, ... for every score (a fixed order, whatever the batch). */
    int64_t pi = 0;
#ifdef VECTOR_LOOPS
    for (; pi + PAGES_AT_ONCE <= len / ps; pi += PAGES_AT_ONCE)
        scores_of_pages(a, q, pages, pi, used, kvh, stride, scores);
#endif
    for (; pi < used; pi++) {
        const kv_t *restrict kt = a->k + pages[pi] * page_stride + (int64_t)kvh * hd * ps;
        const int64_t n = len - pi * ps < ps ? len - pi * ps : ps;  /* written positions only */
        float acc[MAX_GROUP * MAX_PAGE];
        if (n == ps) {  /* a whole page: the same loop as below with a constant bound, which the compiler unrolls */
            for (int g = 0; g < G; g++)
                for (int j = 0; j < ps; j++) acc[g * ps + j] = 0.0f;
            for (int d = 0; d < hd; d++)
                for (int g = 0; g < G; g++) {
                    const float qd = q[g * hd + d];
                    for (int j = 0; j < ps; j++) acc[g * ps + j] += qd * kv_f(kt[d * ps + j]);
                }
        } else {
            for (int g = 0; g < G; g++)
                for (int64_t j = 0; j < n; j++) acc[g * ps + j] = 0.0f;
            for (int d = 0; d < hd; d++)
                for (int g = 0; g < G; g++) {
                    const float qd = q[g * hd + d];
                    for (int64_t j = 0; j < n; j++) acc[g * ps + j] += qd * kv_f(kt[d * ps + j]);
                }
        }
        for (int g = 0; g < G; g++)
            for (int64_t j = 0; j < n; j++) scores[g * stride + pi * ps + j] = acc[g * ps + j] * a->scale;
    }
    /* softmax numerators in place; scores[g][len] = 1 / their sum */
    int nan_head[MAX_GROUP];
    for (int g = 0; g < G; g++) {
        float *s = scores + g * stride;
        float max = s[0];
        int nan = 0;
        int64_t l0 = 0;
#ifdef VECTOR_LOOPS
        l0 = max_and_finite(s, len, &max, &nan);
#endif
        for (int64_t l = l0; l < len; l++) {
            nan |= !isfinite(s[l]);
            max = s[l] > max ? s[l] : max;
        }
        nan_head[g] = nan;  /* poisoned or corrupted KV (NaN or inf): make it visible, never hide it */
        for (int64_t l = 0; l < len; l++) s[l] = nan ? 0.0f : exp_neg(s[l] - max);
        float lanes[LANES] = {0};  /* the sum in 16 lanes, then halving: a fixed order */
        int64_t l = 0;
        for (; l + LANES <= len; l += LANES)
            for (int j = 0; j < LANES; j++) lanes[j] += s[l + j];
        for (; l < len; l++) lanes[0] += s[l];
        for (int w = LANES / 2; w > 0; w /= 2)
            for (int j = 0; j < w; j++) lanes[j] += lanes[j + w];
        s[len] = nan ? 0.0f : 1.0f / lanes[0];
    }
    /* out_g = sum_l p_g[l] v_l / sum_g: each V row read once for all G heads. */
    float acc[MAX_GROUP * MAX_HEAD_DIM];
#ifdef VECTOR_LOOPS
    weighted_values(a, pages, len, kvh, stride, scores, acc);
#else
    const int64_t row_stride = (int64_t)a->KVH * hd; /* V: floats per position */
    memset(acc, 0, sizeof(float) * (size_t)(G * hd));
    for (int64_t l = 0; l < len; l++) {
        const kv_t *restrict v = a->v + pages[l / ps] * page_stride + (l % ps) * row_stride + (int64_t)kvh * hd;
        for (int g = 0; g < G; g++) {
            const float p = scores[g * stride + l];
            float *restrict o = acc + g * hd;
            for (int d = 0; d < hd; d++) o[d] += p * kv_f(v[d]);
        }
    }
#endif
    for (int g = 0; g < G; g++) {
        float *o = a->out + ((int64_t)b * a->H + (int64_t)kvh * G + g) * hd;
        const float inv = scores[g * stride + len];
        for (int d = 0; d < hd; d++) o[d] = nan_head[g] ? NAN : acc[g * hd + d] * inv;
    }
}

/* One thread's share of the items: each takes the next untaken item until
 * none is left, so a thread taken off its core (another process's thread
 * woke on this 2-core machine) leaves its items to the others instead of
 * keeping them waiting at the end. Which thread computes an item never
 * changes its numbers. Returns 0, or 1 when out of memory. */
static int run_share(Args *a) {
    int64_t longest = 0;
    for (int b = 0; b < a->B; b++) longest = a->kv_len[b] > longest ? a->kv_len[b] : longest;
    int G = a->H / a->KVH;
    float *scores = (float *)malloc(sizeof(float) * (size_t)(G * (longest + 1)));
    if (scores == NULL) return 1;
    int64_t items = (int64_t)a->B * a->KVH;
    for (int64_t item; (item = __atomic_fetch_add(&a->next_item, 1, __ATOMIC_RELAXED)) < items;)
        one_item(a, (int)(item / a->KVH), (int)(item % a->KVH), scores);
    free(scores);
    return 0;
}

#ifndef _OPENMP
/* A persistent pool of helper threads. Creating threads per call cost
 * ~110 us here (30 layers a step); these sleep on a condition variable
 * between calls, so they never spin on a core that torch's threads need.
 * One call at a time (call_lock); a forked child starts a pool of its own. */
#define MAX_THREADS 64
static pthread_mutex_t call_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work_ready = PTHREAD_COND_INITIALIZER, work_done = PTHREAD_COND_INITIALIZER;
static int pool_size = 0, pending = 0, failures = 0;
static pid_t pool_pid = 0;
static long generation = 0;
static Args *current = NULL;

static long born_at[MAX_THREADS + 1];  /* the generation current when helper t was created */

static void *helper(void *arg) {
    int t = (int)(intptr_t)arg;
    pthread_mutex_lock(&pool_lock);
    long seen = born_at[t];  /* not `generation`: a call may have started before this thread ran */
    for (;;) {
        while (generation == seen) pthread_cond_wait(&work_ready, &pool_lock);
        seen = generation;
        Args *a = current;
        if (t >= a->threads) continue;  /* not needed for this call */
        pthread_mutex_unlock(&pool_lock);
        int failed = run_share(a);
        pthread_mutex_lock(&pool_lock);
        failures += failed;
        if (--pending == 0) pthread_cond_signal(&work_done);
    }
    return NULL;
}

/* Grows the pool to `want` helpers (threads 1..want); returns how many exist. */
static int ensure_pool(int want) {
    if (pool_pid != getpid()) { pool_size = 0; pool_pid = getpid(); }  /* fork: the parent's helpers are not here */
    while (pool_size < want) {
        pthread_t tid;
        born_at[pool_size + 1] = generation;  /* generation moves only under call_lock, which we hold */
        if (pthread_create(&tid, NULL, helper, (void *)(intptr_t)(pool_size + 1)) != 0) break;
        pthread_detach(tid);
        pool_size++;
    }
    return pool_size;
}
#endif

/* Returns 0 on success; -1 for bad geometry or no memory; b + 1 for a
 * request b whose page list runs past the table or names a page outside the
 * pool (nothing computed then). */
int64_t paged_decode_attention(const float *q, const kv_t *k_pool, const kv_t *v_pool, int64_t num_pool_pages,
                               int64_t pool_page_stride, const int64_t *pages, int64_t table_len, const int64_t *page_offset,
                               const int64_t *kv_len,
                               float *out, int B, int H, int KVH, int hd, int page_size, float scale, int threads) {
    if (KVH <= 0 || H % KVH || H / KVH > MAX_GROUP || hd > MAX_HEAD_DIM || page_size <= 0 ||
        page_size > MAX_PAGE || pool_page_stride < (int64_t)KVH * hd * page_size) return -1;
#if defined(HEAD_DIM) && defined(GROUP) && defined(PAGE_SIZE)
    if (hd != HEAD_DIM || H / KVH != GROUP || page_size != PAGE_SIZE) return -1;  /* built for another model */
#endif
    int64_t work = 0;
    for (int b = 0; b < B; b++) {
        if (kv_len[b] <= 0) return -1;
        work += kv_len[b];
    }
    Args a = {q, k_pool, v_pool, pages, page_offset, kv_len, out, num_pool_pages, table_len, pool_page_stride,
              B, H, KVH, hd, page_size,
              threads < 1 ? 1 : threads, scale, 0};
    for (int b = 0; b < B; b++) {
        if (!check_pages(&a, b)) return (int64_t)b + 1;
    }
    /* Waking a helper costs more than a few thousand positions of work. Which
     * thread computes an item never changes its numbers. */
    if (work * KVH < 4096) a.threads = 1;
    if (a.threads > B * KVH) a.threads = B * KVH;
#ifdef _OPENMP
    /* In torch's own OpenMP team: its workers spin between torch's ops, so a
     * pool of our own found the second core busy (see docs/performance.md). */
    int failed = 0;
    if (a.threads > 1) {
#pragma omp parallel num_threads(a.threads) reduction(|:failed)
        failed |= run_share(&a);
    } else {
        failed = run_share(&a);
    }
    return failed ? -1 : 0;
#else
    if (a.threads > MAX_THREADS) a.threads = MAX_THREADS;
    pthread_mutex_lock(&call_lock);
    if (a.threads > 1) a.threads = 1 + ensure_pool(a.threads - 1);
    int failed = 0;
    if (a.threads > 1) {
        pthread_mutex_lock(&pool_lock);
        current = &a;
        pending = a.threads - 1;
        failures = 0;
        generation++;
        pthread_cond_broadcast(&work_ready);
        pthread_mutex_unlock(&pool_lock);
    }
    failed |= run_share(&a);
    if (a.threads > 1) {
        pthread_mutex_lock(&pool_lock);
        while (pending > 0) pthread_cond_wait(&work_done, &pool_lock);
        failed |= failures;
        pthread_mutex_unlock(&pool_lock);
    }
    pthread_mutex_unlock(&call_lock);
    return failed ? -1 : 0;
#endif
}

/* 1 when built with -fopenmp (items run in the caller's OpenMP team). */
int uses_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

/* The listed pages' K in position-major order, out [n * page_size, KVH, hd]
 * in the pool's element type,
 * for prefill chunks that attend to pages already in the pool (SDPA wants
 * head_dim innermost; torch's permute-copy of the same bytes took ~2.5 ms
 * a layer for a 4,096-token context, measured). Returns 0, i + 1 for the
 * first page id outside the pool, or -1 for a page stride shorter than a
 * page (nothing copied then). */
int64_t gather_k_position_major(const kv_t *k_pool, int64_t num_pool_pages, int64_t pool_page_stride,
                                const int64_t *pages, int64_t n, kv_t *out, int KVH, int hd, int page_size) {
    for (int64_t i = 0; i < n; i++) {
        if (pages[i] < 0 || pages[i] >= num_pool_pages) return i + 1;
    }
    const int64_t page_floats = (int64_t)KVH * hd * page_size;
    if (pool_page_stride < page_floats) return -1;
    for (int64_t i = 0; i < n; i++) {
        const kv_t *src = k_pool + pages[i] * pool_page_stride;  /* [KVH][hd][page_size] */
        kv_t *dst = out + i * page_floats;                        /* [page_size][KVH][hd] */
        for (int h = 0; h < KVH; h++)
            for (int d = 0; d < hd; d++)
                for (int p = 0; p < page_size; p++)
                    dst[((int64_t)p * KVH + h) * hd + d] = src[((int64_t)h * hd + d) * page_size + p];
    }
    return 0;
}
