/* The inner step of the kernels that run bf16 dot products over blocks of
 * 32 outputs (linear_bf16.h's, for prompt rows): one pair of inputs of each row against the
 * weight pairs of the block's 32 outputs. Needs AVX-512 BF16; includers
 * guard it with __AVX512BF16__. decode_kernel._build folds this file into
 * each including kernel's cache key. */
#ifndef BULKHEAD_DOT_BF16_H
#define BULKHEAD_DOT_BF16_H
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* t[r] += row r's inputs 2p and 2p + 1 (one bf16 pair, rows K apart in xb)
 * times the weight pairs of outputs 0-15 (w0) and 16-31 (w1). Inlined into
 * each block function, where R is a constant. */
static inline __attribute__((always_inline)) void dot_pair(__m512 (*t)[2], int R, const uint16_t *xb, int64_t K,
                                                           int64_t p, __m512bh w0, __m512bh w1) {
    for (int r = 0; r < R; r++) {
        int32_t pair;
        memcpy(&pair, xb + r * K + 2 * p, 4);
        __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
        t[r][0] = _mm512_dpbf16_ps(t[r][0], xv, w0);
        t[r][1] = _mm512_dpbf16_ps(t[r][1], xv, w1);
    }
}
#endif
