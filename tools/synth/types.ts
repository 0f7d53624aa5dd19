/**
 * Types shared by the synthetic checkpoint writer: architectures, dtypes, the sizes of a model
 * and the description of one tensor, plus the byte arithmetic on tensor descriptions.
 *
 * @module
 */

/** The architectures {@link synthCheckpoint} can write. */
export const SYNTH_ARCHS = [
  "qwen3_moe",
  "deepseek_v3",
  "mixtral",
  "glm4_moe",
  "gpt_oss",
  "kimi_k3",
  "qwen3_5_moe",
  "deepseek_v4",
  "glm5_next",
  "gemma4",
  "minimax_m2",
] as const;

/** One of {@link SYNTH_ARCHS}. */
export type SynthArch = typeof SYNTH_ARCHS[number];

/**
 * Storage dtype of the weights (the DeepSeek selection bias is always F32, as in the real one).
 * fp8: the weight matrices in FP8 E4M3 with 128×128 `weight_scale_inv` blocks and the rest in
 * BF16, as DeepSeek and MiniMax release them (only recipes with `fp8` take it).
 */
export type SynthDtype = "bf16" | "f32" | "fp8";

/**
 * A tensor's safetensors dtype (U8: the MXFP4 codes and scales of gpt-oss and Kimi K3; F8_E4M3,
 * F8_E8M0, I8 and I64: DeepSeek-V4's FP8 linears, power-of-two scales, FP4 experts and hash tables;
 * F8_E4M3 also GLM-5.3-Flash's FP8 linears, with F32 scales).
 */
export type SynthElemType = "BF16" | "F32" | "U8" | "F8_E4M3" | "F8_E8M0" | "I8" | "I64";

/** Every size of a synthetic model. Fields an architecture has no use for are ignored. */
export interface SynthDims {
  hidden: number;
  layers: number;
  experts: number;
  topK: number;
  /** Rows of one routed expert's gate/up. */
  expertInter: number;
  /** Rows of a dense MLP's gate/up (DeepSeek's first layers; written to Qwen3's config only). */
  denseInter: number;
  heads: number;
  kvHeads: number;
  headDim: number;
  vocab: number;
  maxPositions: number;
  qLoraRank: number;
  kvLoraRank: number;
  ropeDim: number;
  nopeDim: number;
  vDim: number;
  /** DeepSeek: number of leading dense layers. */
  firstDense: number;
  nGroup: number;
  topkGroup: number;
  sharedExperts: number;
  /** Kimi K3: the routed experts' latent width. */
  latent: number;
  /** Kimi K3: KDA heads and head dim. */
  kdaHeads: number;
  kdaHeadDim: number;
  /** Kimi K3: layers per Attention Residual block. */
  attnResBlock: number;
  /** Kimi K3: every this-many-th layer (1-based) and the last one are MLA, the rest KDA. */
  mlaEvery: number;
  /** Kimi K3: 1 = routed experts in MXFP4 (`weight_packed`/`weight_scale`, as released), 0 = dtype. */
  mxfp4Experts: number;
  /** Qwen3.5: Gated DeltaNet key and value heads (value heads a multiple) and their dims. */
  gdnKeyHeads: number;
  gdnValueHeads: number;
  gdnKeyDim: number;
  gdnValueDim: number;
  /** Qwen3.5: every this-many-th layer (1-based) is full attention, the rest Gated DeltaNet. */
  fullEvery: number;
  /** Qwen3.5: rows of the shared expert's gate/up. */
  sharedInter: number;
  /** DeepSeek-V4: output-projection groups and their low rank. */
  oGroups: number;
  oLoraRank: number;
  /** DeepSeek-V4: the sliding window every layer attends over. */
  window: number;
  /** DeepSeek-V4: the Lightning indexer's heads, head dim and kept compressed entries. */
  indexHeads: number;
  indexHeadDim: number;
  indexTopK: number;
  /** DeepSeek-V4: leading layers routed by the token id's table (`tid2eid`). */
  hashLayers: number;
  /** DeepSeek-V4: hyper-connection residual streams. */
  hcMult: number;
  /** Gemma 4: the full-attention layers' head dim and KV heads (sliding layers: headDim, kvHeads). */
  globalHeadDim: number;
  globalKvHeads: number;
}

/** Sizes fixed by the caller; the solver chooses the rest. */
export type SynthOverrides = Partial<SynthDims>;

/** How one tensor's values are drawn. */
export type SynthInit =
  | { kind: "normal"; mean: number; std: number }
  /** A router: normal rows with std 1/sqrt(hidden), each times its row scale. */
  | { kind: "router" }
  | { kind: "zeros" }
  /** U8: uniformly random bytes in [lo, hi] (MXFP4 codes 0..255: every nibble is a valid E2M1 value; gpt-oss's scales a narrow range). */
  | { kind: "bytes"; lo: number; hi: number }
  /** U8: every byte `value` (Kimi K3's E8M0 block scales). */
  | { kind: "fill"; value: number }
  /** F8_E4M3: codes of a normal variate of std `std` (the `.scale` tensor scales them). */
  | { kind: "e4m3"; std: number }
  /** I64 [vocab, k]: per row k distinct expert ids below `experts` (DeepSeek-V4's `tid2eid`). */
  | { kind: "hash"; experts: number };

/** One tensor of the checkpoint. */
export interface SynthTensor {
  name: string;
  shape: number[];
  dtype: SynthElemType;
  init: SynthInit;
  /** Layer it belongs to, or -1 for the embedding, final norm and lm_head. */
  layer: number;
}

/** What {@link synthShape} chose. */
export interface SynthShape {
  arch: SynthArch;
  dims: SynthDims;
  /** The Hugging Face config.json. */
  config: Record<string, unknown>;
  /** Bytes of tensor data (safetensors headers excluded). */
  dataBytes: number;
}

/** The safetensors dtype of a {@link SynthDtype}; throws on anything else. */
export function dtypeName(dtype: SynthDtype): SynthElemType {
  if (dtype !== "bf16" && dtype !== "f32" && dtype !== "fp8") {
    throw new Error(`--dtype must be bf16, f32 or fp8, got ${dtype}`);
  }
  return ({ bf16: "BF16", f32: "F32", fp8: "F8_E4M3" } as const)[dtype];
}

/** Bytes of one element of each dtype. */
const ELEM_BYTES: Record<SynthElemType, number> = {
  BF16: 2,
  F32: 4,
  U8: 1,
  F8_E4M3: 1,
  F8_E8M0: 1,
  I8: 1,
  I64: 8,
};

/** Bytes of one tensor's data. */
export function tensorBytes(t: SynthTensor): number {
  return t.shape.reduce((a, b) => a * b, 1) * ELEM_BYTES[t.dtype];
}

/** Bytes of the data of all of `ts`. */
export const sumBytes = (ts: SynthTensor[]): number => ts.reduce((n, t) => n + tensorBytes(t), 0);
