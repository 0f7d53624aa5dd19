/*
 * INT4 group-32 symmetric matrix-vector product, compressed-tensors "pack-quantized" as
 * Kimi-K2-Thinking ships it: weight_packed int32 [rows, cols/8], element 8k+i of a row in bits
 * 4i..4i+3 of word k, stored as q + 8 for q in -8..7 (so, little-endian, byte j holds element 2j
 * in its low nibble and 2j+1 in its high); weight_scale bf16 [rows, cols/32]; w = q * scale.
 * x is the Q8 copy of the input (quant.h), so cols must be a multiple of 32.
 */
#include "quant.h"

static inline v128_t int4_block(const uint8_t *w, v128_t xe, v128_t xo) {
  v128_t lo, hi;
  SPLIT_NIBBLES(wasm_v128_load(w), lo, hi);
  return dot_block_q8(lo, hi, xe, xo);
}

#define INT4_SCALE4(s, b) bf16_lo_f32x4(wasm_v128_load64_zero((s) + (b)))
#define INT4_SCALE_TAIL(s, b, m) load_tail_bf16((s) + (b), (m))

DEFINE_Q4_DOT4(int4, uint16_t, int4_block, INT4_SCALE4, INT4_SCALE_TAIL, 8, 1.0f)

/*
 * y[r] = sum_c W[r, c] * x[c] for r in [r0, r1): W the packed int4 bytes [rows, cols/2], S the bf16
 * group scales [rows, cols/32], xq the Q8 copy of x (quantize_act_q8).
 */
DEFINE_Q4_MATVEC(matvec_int4g32, int4, uint16_t)
