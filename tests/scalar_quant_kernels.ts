/**
 * Scalar TypeScript versions of the compact-weight kernels (wasm/quant_kernels.ts). Weights
 * are decoded by engine/quant/* and dot products run in float64, rounded to f32 once, so the
 * kernels are compared with a tolerance relative to Σ|w·x|. The Q8 activation quantiser is
 * reproduced exactly (same f32 roundings), so its bytes compare bit for bit.
 *
 * @module
 */
import { roundHalfEven } from "../engine/quant/int8.ts";

const f32 = Math.fround;

/** The Q8 copy of x: int8 values in natural order, block scales, block sums, kernel bytes. */
export interface Q8Ref {
  q: Int8Array;
  scales: Float32Array;
  sums: Int32Array;
  /** The kernel's layout (kernels/quant.h): deinterleaved int8 blocks, scales, sums. */
  bytes: Uint8Array;
}

/** quantize_act_q8: per 32-block scale = max|x| / 127, q = round-half-even(x · f32(127 / max)). */
export function quantizeActQ8Ref(x: Float32Array): Q8Ref {
  const cols = x.length, nb = cols / 32;
  if (!Number.isInteger(nb)) throw new Error(`quantizeActQ8Ref: ${cols} is not a multiple of 32`);
  const q = new Int8Array(cols), scales = new Float32Array(nb), sums = new Int32Array(nb);
  const bytes = new Uint8Array(cols + nb * 8);
  const view = new DataView(bytes.buffer);
  for (let b = 0; b < nb; b++) {
    let amax = 0;
    for (let i = 0; i < 32; i++) amax = Math.max(amax, Math.abs(x[32 * b + i]));
    const inv = amax > 0 ? f32(127 / amax) : 0;
    scales[b] = amax > 0 ? f32(amax / 127) : 0;
    for (let i = 0; i < 32; i++) {
      const v = roundHalfEven(f32(x[32 * b + i] * inv));
      q[32 * b + i] = v;
      sums[b] += v;
      // Even elements fill the block's first 16 bytes, odd ones the next 16.
      bytes[32 * b + (i % 2) * 16 + (i >> 1)] = v & 0xff;
    }
    view.setFloat32(cols + 4 * b, scales[b], true);
    view.setInt32(cols + 4 * nb + 4 * b, sums[b], true);
  }
  return { q, scales, sums, bytes };
}

/** The f32 vector a Q8 copy stands for: q · scale. */
export function dequantizeActQ8(q8: Q8Ref): Float32Array {
  return Float32Array.from(q8.q, (v, i) => v * q8.scales[i >> 5]);
}

/** y[r] = Σ_c w[r,c]·x[c] in float64, rounded to f32. */
export function denseMatvecRef(
  w: ArrayLike<number>,
  x: ArrayLike<number>,
  rows: number,
  cols: number,
): Float32Array {
  const y = new Float32Array(rows);
  for (let r = 0; r < rows; r++) {
    let s = 0;
    for (let c = 0; c < cols; c++) s += w[r * cols + c] * x[c];
    y[r] = s;
  }
  return y;
}

/** Σ_c |w[r,c]·x[c]| per row: the scale a row's rounding error is judged against. */
export function denseAbsRef(
  w: ArrayLike<number>,
  x: ArrayLike<number>,
  rows: number,
  cols: number,
): Float64Array {
  const y = new Float64Array(rows);
  for (let r = 0; r < rows; r++) {
    let s = 0;
    for (let c = 0; c < cols; c++) s += Math.abs(w[r * cols + c] * x[c]);
    y[r] = s;
  }
  return y;
}

/** vq3r_lut: lut[s][k][e] = Σ_d C[s][d][e]·x[8k + d] with C in the kernel's [3][8][256] layout. */
export function vq3rLutRef(kernelCodebooks: Float32Array, x: Float32Array): Float32Array {
  const nch = x.length / 8;
  const lut = new Float32Array(3 * nch * 256);
  for (let s = 0; s < 3; s++) {
    for (let k = 0; k < nch; k++) {
      for (let e = 0; e < 256; e++) {
        let v = 0;
        for (let d = 0; d < 8; d++) v += kernelCodebooks[(s * 8 + d) * 256 + e] * x[8 * k + d];
        lut[(s * nch + k) * 256 + e] = v;
      }
    }
  }
  return lut;
}

/** matvec_vq3r: y[r] = S[r]·Σ_k Σ_s lut[s][k][I[r][s][k]], summed in float64. */
export function matvecVq3rRef(
  indices: Uint8Array,
  scales: Float32Array,
  lut: Float32Array,
  rows: number,
  cols: number,
): Float32Array {
  const nch = cols / 8;
  const y = new Float32Array(rows);
  for (let r = 0; r < rows; r++) {
    let s = 0;
    for (let st = 0; st < 3; st++) {
      for (let k = 0; k < nch; k++) {
        s += lut[(st * nch + k) * 256 + indices[(r * 3 + st) * nch + k]];
      }
    }
    y[r] = scales[r] * s;
  }
  return y;
}

/** Σ_k |Σ_s lut[s][k][·]| per row times |S[r]|: the scale for matvec_vq3r's rounding. */
export function vq3rAbsRef(
  indices: Uint8Array,
  scales: Float32Array,
  lut: Float32Array,
  rows: number,
  cols: number,
): Float64Array {
  const nch = cols / 8;
  const y = new Float64Array(rows);
  for (let r = 0; r < rows; r++) {
    let s = 0;
    for (let st = 0; st < 3; st++) {
      for (let k = 0; k < nch; k++) {
        s += Math.abs(lut[(st * nch + k) * 256 + indices[(r * 3 + st) * nch + k]]);
      }
    }
    y[r] = Math.abs(scales[r]) * s;
  }
  return y;
}

/**
 * vq4p_lut before rounding: f64 dots of each entry of C (the kernel's [4][8][64] layout) with each
 * 8-chunk of x, as [nch][4][64].
 */
export function vq4pLutRef(kernelCodebooks: Float32Array, x: Float32Array): Float64Array {
  const nch = x.length / 8;
  const lut = new Float64Array(nch * 256);
  for (let k = 0; k < nch; k++) {
    for (let s = 0; s < 4; s++) {
      for (let e = 0; e < 64; e++) {
        let v = 0;
        for (let d = 0; d < 8; d++) v += kernelCodebooks[(s * 8 + d) * 64 + e] * x[8 * k + d];
        lut[k * 256 + s * 64 + e] = v;
      }
    }
  }
  return lut;
}

/**
 * matvec_vq4p as the kernel computes it: per group g of 16 chunks and stage s, the exact integer
 * sum of the row's table entries times q[g][s], added into an f32 accumulator (g, then s, unfused),
 * times S[r]. `index(r, s, k)` reads the packed indices; `q` is [ceil(nch/16)][4].
 */
export function matvecVq4pRef(
  index: (r: number, s: number, k: number) => number,
  scales: Float32Array,
  lut: Int8Array,
  q: Float32Array,
  rows: number,
  cols: number,
): Float32Array {
  const nch = cols / 8, f = Math.fround;
  const y = new Float32Array(rows);
  for (let r = 0; r < rows; r++) {
    let acc = 0;
    for (let k0 = 0; k0 < nch; k0 += 16) {
      for (let s = 0; s < 4; s++) {
        let sum = 0;
        for (let k = k0; k < Math.min(nch, k0 + 16); k++) {
          sum += lut[k * 256 + s * 64 + index(r, s, k)];
        }
        acc = f(acc + f(q[(k0 / 16) * 4 + s] * sum));
      }
    }
    y[r] = f(scales[r] * acc);
  }
  return y;
}
