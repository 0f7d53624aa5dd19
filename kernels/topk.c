/*
 * Selection over a float vector. Order used by both kernels: NaN ranks above every number (so a
 * corrupted logit is visible as the winner instead of silently skipped: callers can test
 * x[result] for NaN); among equal values, or among NaNs, the lower index ranks first. -0 == +0.
 */
#include "simd.h"

static inline int is_nan(float v) { return v != v; }

/* True when a value v at a higher index ranks before a value u at a lower index. */
static inline int later_ranks_before(float v, float u) { return is_nan(v) ? !is_nan(u) : v > u; }

/** Index of the first maximum of x[0..n); index of the first NaN if any; -1 when n <= 0. */
KEXPORT("argmax_f32")
int argmax_f32(const float *x, int n) {
  if (n <= 0) return -1;
  /* Pass 1: the maximum, NaN-propagating. Pass 2: its first index. */
  v128_t mv = wasm_f32x4_splat(-F32_INF);
  int i = 0;
  for (; i + 4 <= n; i += 4) mv = wasm_f32x4_max(mv, wasm_v128_load(x + i));
  float m = hmax_f32x4(mv);
  for (; i < n; i++) m = __builtin_wasm_max_f32(m, x[i]);
  if (is_nan(m)) {
    for (i = 0; i < n; i++)
      if (is_nan(x[i])) return i;
  }
  v128_t m4 = wasm_f32x4_splat(m);
  for (i = 0; i + 4 <= n; i += 4)
    if (wasm_v128_any_true(wasm_f32x4_eq(wasm_v128_load(x + i), m4))) break;
  for (; i < n; i++)
    if (x[i] == m) return i;
  return -1; /* unreachable: m is one of the x[i] */
}

/*
 * The k best indices of x[0..n) in rank order, written to idx[0..k). The list in idx is kept
 * sorted while scanning (insertion), which costs O(n) when k is small. If k > n the entries after
 * the first n are -1.
 */
KEXPORT("topk_f32")
void topk_f32(const float *x, int n, int k, int32_t *idx) {
  if (k <= 0) return;
  int count = 0;
  for (int i = 0; i < n; i++) {
    float v = x[i];
    if (count == k) {
      if (!later_ranks_before(v, x[idx[k - 1]])) continue;
      count--;
    }
    int j = count;
    while (j > 0) {
      if (!later_ranks_before(v, x[idx[j - 1]])) break;
      idx[j] = idx[j - 1];
      j--;
    }
    idx[j] = i;
    count++;
  }
  for (int j = count; j < k; j++) idx[j] = -1;
}
