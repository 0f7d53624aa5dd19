/**
 * Rotary position embedding as Hugging Face transformers computes it (`ROPE_INIT_FUNCTIONS`), in
 * float64: the inverse frequencies for every scaling type, the YaRN cos/sin magnitude, and the
 * rotation itself for both pairings of a head's dimensions.
 *
 * @module
 */

import type { RopeConfig, RopeLayout } from "../../io/model_config.ts";

/** YaRN's `get_mscale`: 0.1·mscale·ln(factor) + 1, or 1 for factor ≤ 1. */
export function yarnGetMscale(factor: number, mscale = 1): number {
  return factor <= 1 ? 1 : 0.1 * mscale * Math.log(factor) + 1;
}

/**
 * Inverse frequencies θ_i, i = 0 … dim/2 − 1, of a RoPE configuration (the angle of pair i at
 * position p is p·θ_i). Base: θ_i = theta^(−2i/dim). Then:
 * - linear: θ_i / factor;
 * - proportional: θ_i for i < angles, 0 after (those pairs do not rotate);
 * - llama3: wavelengths longer than original/lowFreqFactor divided by factor, shorter than
 *   original/highFreqFactor kept, a linear blend in between;
 * - yarn: a ramp from the correction range [low, high] (the dimension where the wavelength makes
 *   betaFast resp. betaSlow turns over the original context, floored/ceiled unless truncate is
 *   false, clamped to [0, dim − 1]) mixes θ_i (ramp 0) and θ_i / factor (ramp 1).
 */
export function ropeInvFreq(rope: RopeConfig): Float64Array {
  const { dim, theta, scaling } = rope;
  if (!Number.isInteger(dim) || dim <= 0 || dim % 2 !== 0) {
    throw new Error(`rope: rotated dimension must be a positive even integer, got ${dim}`);
  }
  if (!(theta > 0)) throw new Error(`rope: theta must be > 0, got ${theta}`);
  const half = dim / 2;
  const base = new Float64Array(half);
  for (let i = 0; i < half; i++) base[i] = 1 / Math.pow(theta, (2 * i) / dim);
  switch (scaling.type) {
    case "none":
      return base;
    case "linear":
      return base.map((f) => f / scaling.factor);
    case "llama3": {
      const { factor, lowFreqFactor, highFreqFactor, originalMaxPositions } = scaling;
      const lowFreqWavelen = originalMaxPositions / lowFreqFactor;
      const highFreqWavelen = originalMaxPositions / highFreqFactor;
      return base.map((f) => {
        const wavelen = (2 * Math.PI) / f;
        if (wavelen < highFreqWavelen) return f;
        if (wavelen > lowFreqWavelen) return f / factor;
        const smooth = (originalMaxPositions / wavelen - lowFreqFactor) /
          (highFreqFactor - lowFreqFactor);
        return (1 - smooth) * (f / factor) + smooth * f;
      });
    }
    case "proportional":
      // Gemma 4's full layers: the exponent runs over the whole head; pairs past `angles` stay.
      return base.map((f, i) => i < scaling.angles ? f : 0);
    case "yarn": {
      const { factor, betaFast, betaSlow, originalMaxPositions } = scaling;
      const [low, high] = yarnCorrectionRange(
        betaFast,
        betaSlow,
        dim,
        theta,
        originalMaxPositions,
        scaling.truncate ?? true,
      );
      const ramp = yarnRamp(low, high, half);
      return base.map((f, i) => f * (1 - ramp[i]) + (f / factor) * ramp[i]);
    }
  }
}

/** The dimension (fractional) at which a wavelength makes `rotations` turns over `maxPos`. */
function yarnCorrectionDim(rotations: number, dim: number, theta: number, maxPos: number): number {
  return (dim * Math.log(maxPos / (rotations * 2 * Math.PI))) / (2 * Math.log(theta));
}

/**
 * YaRN's [low, high] correction range, floored/ceiled to integers as transformers does unless
 * `truncate` is false (gpt-oss), then kept fractional.
 */
export function yarnCorrectionRange(
  betaFast: number,
  betaSlow: number,
  dim: number,
  theta: number,
  maxPos: number,
  truncate = true,
): [number, number] {
  let low = yarnCorrectionDim(betaFast, dim, theta, maxPos);
  let high = yarnCorrectionDim(betaSlow, dim, theta, maxPos);
  if (truncate) [low, high] = [Math.floor(low), Math.ceil(high)];
  return [Math.max(low, 0), Math.min(high, dim - 1)];
}

/** clamp((i − low)/(high − low), 0, 1) for i = 0 … n − 1 (high nudged when equal to low). */
export function yarnRamp(low: number, high: number, n: number): Float64Array {
  const hi = low === high ? high + 0.001 : high;
  const out = new Float64Array(n);
  for (let i = 0; i < n; i++) out[i] = Math.min(1, Math.max(0, (i - low) / (hi - low)));
  return out;
}

/**
 * The factor transformers multiplies cos and sin by: for YaRN, get_mscale(factor, mscale) /
 * get_mscale(factor, mscaleAllDim) when both are non-zero, else get_mscale(factor); 1 otherwise.
 */
export function ropeAttentionFactor(rope: RopeConfig): number {
  const s = rope.scaling;
  if (s.type !== "yarn") return 1;
  if (s.mscale && s.mscaleAllDim) {
    return yarnGetMscale(s.factor, s.mscale) / yarnGetMscale(s.factor, s.mscaleAllDim);
  }
  return yarnGetMscale(s.factor);
}

/**
 * Rotates the first `invFreq.length·2` values of `v[off…]` in place for position `pos`. `half`
 * pairs (i, i + n) as rotate_half does; `interleaved` pairs (2i, 2i + 1).
 */
export function applyRope(
  v: Float64Array,
  off: number,
  pos: number,
  invFreq: Float64Array,
  layout: RopeLayout,
  magnitude = 1,
): void {
  const n = invFreq.length;
  for (let i = 0; i < n; i++) {
    const angle = pos * invFreq[i];
    const c = Math.cos(angle) * magnitude;
    const s = Math.sin(angle) * magnitude;
    const a = layout === "half" ? off + i : off + 2 * i;
    const b = layout === "half" ? off + i + n : off + 2 * i + 1;
    const x0 = v[a];
    const x1 = v[b];
    v[a] = x0 * c - x1 * s;
    v[b] = x1 * c + x0 * s;
  }
}
