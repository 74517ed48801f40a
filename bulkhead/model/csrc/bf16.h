/* fp32 <-> bf16 for the C kernels that store or read bf16 (decode_layers.c,
 * linear.c, prefill_attention_bf16.c): one rounding, so that what
 * a kernel rounds is what torch's .to(bfloat16) would have stored.
 * decode_kernel._build folds this file into each including kernel's cache key. */
#ifndef BULKHEAD_BF16_H
#define BULKHEAD_BF16_H
#include <stdint.h>
#include <string.h>

/* Round to nearest even, as torch's .to(bfloat16); a NaN becomes torch's
 * quiet NaN 0x7fc0, where adding the rounding bias could carry it into inf. */
static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
#endif
