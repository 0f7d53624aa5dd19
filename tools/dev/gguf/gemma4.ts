/**
 * Gemma 4 with the MoE block for `export-gguf`: llama.cpp's `gemma4` architecture (checked against
 * the llama.cpp that node-llama-cpp 3.21.1 bundles, v0.4.0: its `gemma4` graph, loader and
 * converter). What the mapping has to carry:
 * - two attention geometries: the full layers' head width and KV heads are the file's
 *   `key_length` / per-layer `head_count_kv`, the sliding layers' `key_length_swa`; a per-layer
 *   `sliding_window_pattern`; full layers without `attn_v` take V from K (k = v);
 * - the proportional partial RoPE of the full layers: NeoX rotation over the whole head with a
 *   shared `rope_freqs` tensor whose factors are 1 on the rotated pairs and 1e30 on the rest (an
 *   angle of ~0), since ggml rotates only a leading slice; the sliding layers' theta is
 *   `rope.freq_base_swa`;
 * - norms multiplying by w as stored: the sandwich norms (`post_attention_norm`, `post_ffw_norm`),
 *   the dense MLP's and the experts' own pre/post norms (`ffn_norm` / `post_ffw_norm_1`,
 *   `pre_ffw_norm_2` / `post_ffw_norm_2`), `layer_output_scale` for the layer scalar;
 * - the router: `ffn_gate_inp.scale` is `router.scale` (llama.cpp applies hidden^−½ itself), the
 *   per-expert scales are `ffn_down_exps.scale`; the final logit softcap.
 *
 * llama.cpp multiplies the embedding by √hidden in f32, where a BF16 release rounds the factor to
 * BF16 (53.0 for 2816 against 53.07): the same function only when √hidden is exact in BF16 (the
 * F32 fixture's 8). Its CPU GELU rounds the input to f16 and reads a table.
 *
 * @module
 */
import { layerGeometry, type LayerTensor, type ModelConfig } from "../../../io/model_config.ts";
import type { GgufValue } from "./format.ts";

/** One GGUF tensor made from a canonical layer tensor: its name under `blk.N.`, shape, values. */
export interface Gemma4Tensor {
  rel: string;
  /** PyTorch order (rows first). */
  shape: number[];
  map: (v: Float32Array) => Float32Array;
}

/** llama.cpp's names of Gemma 4's layer tensors (under `blk.N.`). */
const NAMES: Partial<Record<LayerTensor, string>> = {
  attn_norm: "attn_norm.weight",
  wq: "attn_q.weight",
  wk: "attn_k.weight",
  wv: "attn_v.weight",
  wo: "attn_output.weight",
  q_norm: "attn_q_norm.weight",
  k_norm: "attn_k_norm.weight",
  attn_post_norm: "post_attention_norm.weight",
  ffn_norm: "ffn_norm.weight",
  ffn_gate: "ffn_gate.weight",
  ffn_up: "ffn_up.weight",
  ffn_down: "ffn_down.weight",
  dense_post_norm: "post_ffw_norm_1.weight",
  router: "ffn_gate_inp.weight",
  router_scale: "ffn_gate_inp.scale",
  expert_scale: "ffn_down_exps.scale",
  moe_norm: "pre_ffw_norm_2.weight",
  moe_post_norm: "post_ffw_norm_2.weight",
  ffn_post_norm: "post_ffw_norm.weight",
  layer_scalar: "layer_output_scale.weight",
};

/** Why llama.cpp's `gemma4` cannot compute `cfg`, or null when it can. */
export function gemma4Unsupported(cfg: ModelConfig): string | null {
  const a = cfg.attention, full = a?.fullLayers, moe = cfg.moe;
  if (!a || !full || !moe?.denseBeside || !cfg.residual || cfg.residual.kind !== "sandwich") {
    return "gemma4 needs sliding and full layers and the dense MLP beside the experts";
  }
  const w = a.windows.filter((x) => x > 0);
  // The full layers read the file's one rope_freqs tensor: without them llama.cpp refuses it.
  if (!w.length || w.some((x) => x !== w[0]) || w.length === a.windows.length) {
    return "llama.cpp's gemma4 needs one sliding window and at least one full layer";
  }
  if (full.rope.scaling.type !== "proportional" || cfg.rope.scaling.type !== "none") {
    return "gemma4 needs default RoPE on sliding layers and proportional RoPE on full layers";
  }
  if (cfg.layerKinds.some((k) => k !== "moe")) return "gemma4 needs the MoE block in every layer";
  // What llama.cpp's graph hard-codes: V normed, GELU-tanh, the scaled softmax router.
  if (
    !a.valueNorm || cfg.glu?.kind !== "gelu_tanh" || moe.scoring !== "softmax" || !moe.normTopK ||
    !moe.scaledRouterInput || !moe.expertScale
  ) {
    return "gemma4 needs the value norm, GELU-tanh and the scaled softmax router with expert scales";
  }
  return null;
}

/** The GGUF tensor made from layer tensor `t` of layer `l` (as stored: llama.cpp's order). */
export function gemma4LayerTensors(cfg: ModelConfig, l: number, t: LayerTensor): Gemma4Tensor[] {
  const rel = NAMES[t];
  if (!rel) throw new Error(`layer ${l}: tensor ${t} has no GGUF name for gemma4`);
  const g = layerGeometry(cfg, l), H = cfg.hiddenSize, E = cfg.moe!.numExperts;
  const q = cfg.numHeads * g.headDim, kv = g.numKvHeads * g.headDim, ff = cfg.intermediateSize;
  const shapes: Partial<Record<LayerTensor, number[]>> = {
    wq: [q, H],
    wk: [kv, H],
    wv: [kv, H],
    wo: [H, q],
    q_norm: [g.headDim],
    k_norm: [g.headDim],
    ffn_gate: [ff, H],
    ffn_up: [ff, H],
    ffn_down: [H, ff],
    router: [E, H],
    expert_scale: [E],
    layer_scalar: [1],
  };
  return [{ rel, shape: shapes[t] ?? [H], map: (v) => v }];
}

/**
 * The `rope_freqs` tensor llama.cpp's full layers read: a frequency divisor per rotary pair of the
 * full head, 1 where the proportional RoPE rotates and 1e30 (no rotation) past its angles.
 */
export function gemma4RopeFreqs(cfg: ModelConfig): { name: string; values: Float32Array } {
  const full = cfg.attention!.fullLayers!;
  const s = full.rope.scaling;
  const angles = s.type === "proportional" ? s.angles : full.headDim / 2;
  const values = new Float32Array(full.headDim / 2).fill(1e30);
  values.fill(1, 0, angles);
  return { name: "rope_freqs.weight", values };
}

/**
 * Sets (or replaces) llama.cpp's `gemma4` metadata in `m`: the two geometries, both thetas, the
 * window and its per-layer pattern, the dense MLP's and the experts' widths, the softcap.
 */
export function gemma4Metadata(cfg: ModelConfig, m: Map<string, GgufValue>): void {
  const a = "gemma4", att = cfg.attention!, full = att.fullLayers!;
  const u32 = (k: string, v: number) => m.set(`${a}.${k}`, { type: "u32", value: v });
  const swa = att.windows.map((w) => w > 0);
  u32("feed_forward_length", cfg.intermediateSize);
  m.set(`${a}.attention.head_count_kv`, {
    type: "array",
    elem: "i32",
    value: swa.map((s) => s ? cfg.numKvHeads : full.numKvHeads),
  });
  m.set(`${a}.rope.freq_base`, { type: "f32", value: full.rope.theta });
  m.set(`${a}.rope.freq_base_swa`, { type: "f32", value: cfg.rope.theta });
  u32("attention.key_length", full.headDim);
  u32("attention.value_length", full.headDim);
  u32("attention.key_length_swa", cfg.headDim);
  u32("attention.value_length_swa", cfg.headDim);
  u32("rope.dimension_count", full.headDim);
  u32("rope.dimension_count_swa", cfg.rope.dim);
  u32("attention.sliding_window", att.windows.find((w) => w > 0)!);
  m.set(`${a}.attention.sliding_window_pattern`, { type: "array", elem: "bool", value: swa });
  u32("attention.shared_kv_layers", 0);
  u32("embedding_length_per_layer_input", 0);
  if (cfg.logitSoftcap) {
    m.set(`${a}.final_logit_softcapping`, { type: "f32", value: cfg.logitSoftcap });
  }
}
