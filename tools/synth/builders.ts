/**
 * Builders of tensor descriptions ({@link SynthTensor}) shared by the architecture recipes: linear
 * layers, norms, routers, grouped-query attention, gated MLPs and the global tensors.
 *
 * @module
 */

import type { SynthDims, SynthElemType, SynthTensor } from "./types.ts";

/** A row-major [out, in] weight with std 1/sqrt(fan_in). */
export function linear(
  name: string,
  out: number,
  inp: number,
  dt: SynthElemType,
  l: number,
): SynthTensor {
  return {
    name,
    shape: [out, inp],
    dtype: dt,
    init: { kind: "normal", mean: 0, std: 1 / Math.sqrt(inp) },
    layer: l,
  };
}

/** The token embedding [vocab, hidden], standard normal. */
export function embedding(name: string, d: SynthDims, dt: SynthElemType): SynthTensor {
  return {
    name,
    shape: [d.vocab, d.hidden],
    dtype: dt,
    init: { kind: "normal", mean: 0, std: 1 },
    layer: -1,
  };
}

/** An RMSNorm weight: 1 + 0.05·n. */
export function norm(name: string, n: number, dt: SynthElemType, l: number): SynthTensor {
  return { name, shape: [n], dtype: dt, init: { kind: "normal", mean: 1, std: 0.05 }, layer: l };
}

/**
 * A router [experts, hidden]. Router rows ∝ 1/sqrt(hidden) give logits of about unit spread on
 * RMS-normalised inputs.
 */
export function router(
  name: string,
  experts: number,
  h: number,
  dt: SynthElemType,
  l: number,
): SynthTensor {
  return { name, shape: [experts, h], dtype: dt, init: { kind: "router" }, layer: l };
}

/** Norms and q/k/v/o projections of a grouped-query attention layer (Qwen3, Mixtral). */
export function gqaAttention(d: SynthDims, l: number, dt: SynthElemType): SynthTensor[] {
  const p = `model.layers.${l}.`;
  const q = d.heads * d.headDim, kv = d.kvHeads * d.headDim;
  return [
    norm(p + "input_layernorm.weight", d.hidden, dt, l),
    norm(p + "post_attention_layernorm.weight", d.hidden, dt, l),
    linear(p + "self_attn.q_proj.weight", q, d.hidden, dt, l),
    linear(p + "self_attn.k_proj.weight", kv, d.hidden, dt, l),
    linear(p + "self_attn.v_proj.weight", kv, d.hidden, dt, l),
    linear(p + "self_attn.o_proj.weight", d.hidden, q, dt, l),
  ];
}

/** Gate, up and down matrices of a gated MLP, named `prefix + names[i] + ".weight"`. */
export function glu(
  prefix: string,
  names: [string, string, string],
  inter: number,
  h: number,
  dt: SynthElemType,
  l: number,
): SynthTensor[] {
  return [
    linear(prefix + names[0] + ".weight", inter, h, dt, l),
    linear(prefix + names[1] + ".weight", inter, h, dt, l),
    linear(prefix + names[2] + ".weight", h, inter, dt, l),
  ];
}

/** Hugging Face's usual names of the gated MLP matrices. */
export const PROJ: [string, string, string] = ["gate_proj", "up_proj", "down_proj"];

/** The tensors outside the layers: the embedding first, the final norm and lm_head last. */
export function globalTensors(
  d: SynthDims,
  dt: SynthElemType,
): { head: SynthTensor[]; tail: SynthTensor[] } {
  return {
    head: [embedding("model.embed_tokens.weight", d, dt)],
    tail: [
      norm("model.norm.weight", d.hidden, dt, -1),
      linear("lm_head.weight", d.vocab, d.hidden, dt, -1),
    ],
  };
}
