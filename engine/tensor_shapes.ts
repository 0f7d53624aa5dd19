/**
 * The one schema of a model's tensors: the shape and role of every trunk and expert tensor,
 * derived from the normalised config — the skeleton's and the feed-forward's (norms, dense FFN,
 * router, shared and routed experts, a latent MoE's projections) here, a residual stream's and
 * each layer's mixer's by their parts (engine/parts/) — and the bounds a config must meet before
 * anything is sized from it. The
 * packer checks a checkpoint against it and the container reader a manifest (engine/container.ts
 * hands it to io/), so a transposed projection, a short norm or a config that disagrees with its
 * tensors is refused instead of read past its end.
 *
 * @module
 */
import type { TensorSpec } from "../io/manifest.ts";
import {
  type ExpertMatrix,
  expertWidth,
  type GlobalTensor,
  type LayerTensor,
  mixerOf,
  type ModelConfig,
  type RopeConfig,
} from "../io/model_config.ts";
import { MAX_LAYERS } from "./models/hf_config.ts";
import { mixerPartOf } from "./parts/mod.ts";
import { residualPartOf } from "./parts/residual.ts";
import { layerTensorsOf } from "./tensor_names.ts";

const vector = (n: number): TensorSpec => ({ shape: [n], role: "vector" });
const weight = (rows: number, cols: number): TensorSpec => ({
  shape: [rows, cols],
  role: "weight",
});
/** The spec of a global tensor. */
export function globalTensorSpec(cfg: ModelConfig, g: GlobalTensor): TensorSpec {
  const residual = residualPartOf(cfg);
  if (residual.globalTensors.includes(g)) return { shape: residual.shape(cfg, g), role: "vector" };
  return g === "final_norm" ? vector(cfg.hiddenSize) : weight(cfg.vocabSize, cfg.hiddenSize);
}

/** The spec of layer `layer`'s tensor `t` (which the layer must have, see layerTensorsOf). */
export function layerTensorSpec(cfg: ModelConfig, t: LayerTensor, layer: number): TensorSpec {
  const H = cfg.hiddenSize;
  const moe = cfg.moe;
  switch (t) {
    case "attn_norm":
    case "ffn_norm":
    case "mtp_enorm":
    case "mtp_hnorm":
    case "mtp_head_norm":
      return vector(H);
    // An MTP layer's projection of [normed embedding; normed hidden state].
    case "mtp_proj":
      return weight(H, 2 * H);
    case "ffn_gate":
    case "ffn_up":
      return weight(cfg.intermediateSize, H);
    case "ffn_down":
      return weight(H, cfg.intermediateSize);
    case "router":
      return { shape: [moe!.numExperts, H], role: "router" };
    case "router_bias":
    case "router_b":
      return { shape: [moe!.numExperts], role: "router" };
    case "router_tid2eid":
      // Expert ids per token id, exact in f32 (decoded from I64 and range-checked on read).
      return { shape: [cfg.vocabSize, moe!.topK], role: "vector" };
    case "shared_gate":
    case "shared_up":
      return weight(moe!.sharedIntermediate, H);
    case "shared_down":
      return weight(H, moe!.sharedIntermediate);
    case "shared_expert_gate":
      return weight(1, H);
    case "latent_down":
      return weight(expertWidth(cfg), H);
    case "latent_norm":
      return vector(expertWidth(cfg));
    case "latent_up":
      return weight(H, expertWidth(cfg));
    // The router's input scale and per-expert scale, the norms of a dense MLP beside the MoE.
    case "router_scale":
    case "dense_post_norm":
    case "moe_norm":
    case "moe_post_norm":
      return vector(H);
    case "expert_scale":
      return vector(moe!.numExperts);
    default: {
      const residual = residualPartOf(cfg);
      // A residual stream's vectors (and [1, d] rows) are read as f32 vectors.
      if (residual.layerTensors.includes(t)) {
        return { shape: residual.shape(cfg, t), role: "vector" };
      }
      const spec = mixerPartOf(cfg, layer).shape(cfg, t, layer);
      if (!Array.isArray(spec)) return spec;
      return { shape: spec, role: spec.length === 2 ? "weight" : "vector" };
    }
  }
}

/** [rows, cols] of one routed expert's matrix (in a latent MoE's width, see expertWidth). */
export function expertMatrixShape(cfg: ModelConfig, m: ExpertMatrix): [number, number] {
  const inter = cfg.moe!.expertIntermediate, width = expertWidth(cfg);
  return m === "down" ? [width, inter] : [inter, width];
}

/** Largest size of one dimension (hidden, vocabulary, intermediate rows) sluice accepts. */
export const MAX_MODEL_DIM = 1 << 24;
/** Most routed experts per layer accepted. */
export const MAX_EXPERTS = 1 << 20;
/** Largest element count of one tensor: its f32 copy must stay far below 2^53 bytes. */
export const MAX_TENSOR_ELEMENTS = 2 ** 40;

/**
 * Throws, naming `where` and the field, when a normalised config could make NaN or absurd
 * allocations: non-positive sizes or eps, heads that do not divide, a rotary part wider than the
 * head, ids outside the vocabulary, tensors too large for the platform.
 */
export function checkConfigBounds(cfg: ModelConfig, where: string): void {
  const fail = (what: string): never => {
    throw new Error(`${where}: ${what}`);
  };
  const dims: [string, number][] = [
    ["vocabSize", cfg.vocabSize],
    ["hiddenSize", cfg.hiddenSize],
    ["numHeads", cfg.numHeads],
    ["numKvHeads", cfg.numKvHeads],
    ["headDim", cfg.headDim],
  ];
  // A latent MoE's routed experts work in a width of their own.
  if (cfg.moe?.latentDim !== undefined) dims.push(["moe.latentDim", cfg.moe.latentDim]);
  for (const [k, v] of dims) {
    if (!Number.isSafeInteger(v) || v < 1 || v > MAX_MODEL_DIM) {
      fail(`${k} ${v} must be a whole number in 1..${MAX_MODEL_DIM}`);
    }
  }
  if (cfg.numLayers > MAX_LAYERS) fail(`numLayers ${cfg.numLayers} is above ${MAX_LAYERS}`);
  if (!(cfg.rmsNormEps > 0 && cfg.rmsNormEps < 1)) {
    fail(`rms_norm_eps ${cfg.rmsNormEps} must be in (0, 1): RMSNorm divides by sqrt(mean + eps)`);
  }
  if (cfg.numHeads % cfg.numKvHeads) {
    fail(
      `num_attention_heads ${cfg.numHeads} is not a multiple of num_key_value_heads ` +
        `${cfg.numKvHeads}`,
    );
  }
  const rope = cfg.rope;
  if (!(rope.theta > 0)) fail(`rope_theta ${rope.theta} must be > 0`);
  // NoPE MLA rotates nothing, so its rotary part may be empty (GLM-5.3-Flash).
  const unrotated = cfg.mla?.nope === true && rope.dim === 0;
  if (!unrotated && (rope.dim < 2 || rope.dim % 2 || rope.dim > cfg.headDim)) {
    fail(`the rotary dimension ${rope.dim} must be even and in 2..head_dim ${cfg.headDim}`);
  }
  // Proportional RoPE rotates its leading `angles` pairs of the dim / 2.
  const proportional = (r: RopeConfig) => {
    const a = r.scaling.type === "proportional" ? r.scaling.angles : 1;
    if (!Number.isSafeInteger(a) || a < 1 || a > r.dim / 2) {
      fail(`proportional RoPE rotates ${a} pairs; expected 1..${r.dim / 2}`);
    }
  };
  if (!unrotated) proportional(rope);
  // Every float the engine reads has a range real models sit far inside: outside it the
  // softmaxes and rotations overflow into NaN or collapse, and the output is silently wrong.
  const within = (what: string, v: number, lo: number, hi: number) => {
    if (!(v >= lo && v <= hi)) fail(`${what} ${v} is outside [${lo}, ${hi}]`);
  };
  within("the attention scale", cfg.attnScale, 1e-4, 16);
  within("rope_theta", rope.theta, 1e-3, 1e12);
  if (rope.scaling.type !== "none" && rope.scaling.type !== "proportional") {
    within("rope_scaling.factor", rope.scaling.factor, 1e-3, 1e4);
    if (rope.scaling.type === "yarn") {
      within("rope_scaling.mscale", rope.scaling.mscale, 0, 1e3);
      within("rope_scaling.mscale_all_dim", rope.scaling.mscaleAllDim, 0, 1e3);
    }
  }
  const moe = cfg.moe;
  if (moe) {
    if (moe.numExperts > MAX_EXPERTS) fail(`numExperts ${moe.numExperts} is above ${MAX_EXPERTS}`);
    if (moe.topK < 1 || moe.topK > moe.numExperts) {
      fail(`num_experts_per_tok ${moe.topK} must be in 1..${moe.numExperts}`);
    }
    if (moe.numExperts % moe.nGroup || moe.topkGroup > moe.nGroup) {
      fail(`n_group ${moe.nGroup} must divide ${moe.numExperts} experts and be ≥ topk_group`);
    }
    within("routed_scaling_factor", moe.routedScaling, 1e-6, 1e3);
    if (moe.clampedSwiglu) {
      within("swiglu_limit", moe.clampedSwiglu.limit, 1e-6, 1e6);
      within("swiglu alpha", moe.clampedSwiglu.alpha, 1e-6, 1e6);
    }
  }
  const residual = cfg.residual;
  if (
    residual?.kind === "attn_res" &&
    (!Number.isSafeInteger(residual.blockSize) || residual.blockSize < 1)
  ) {
    fail(`attn_res_block_size ${residual.blockSize} must be a whole number ≥ 1`);
  }
  if (residual?.kind === "sandwich") within("the embedding scale", residual.embedScale, 1e-3, 1e4);
  if (cfg.logitSoftcap !== undefined) {
    within("final_logit_softcapping", cfg.logitSoftcap, 1e-3, 1e6);
  }
  const full = cfg.attention?.fullLayers;
  if (full) {
    // Gemma 4's full layers: their own head width, KV heads and RoPE.
    if (
      !Number.isSafeInteger(full.headDim) || full.headDim < 2 || full.headDim % 2 ||
      full.headDim > MAX_MODEL_DIM || !Number.isSafeInteger(full.numKvHeads) ||
      full.numKvHeads < 1 || cfg.numHeads % full.numKvHeads
    ) {
      fail(
        `the full layers' head_dim ${full.headDim} must be even and their ${full.numKvHeads} KV ` +
          `heads divide num_attention_heads ${cfg.numHeads}`,
      );
    }
    within("the full layers' rope_theta", full.rope.theta, 1e-3, 1e12);
    if (full.rope.dim !== full.headDim || full.rope.scaling.type !== "proportional") {
      fail(`the full layers' RoPE must be proportional over head_dim ${full.headDim}`);
    }
    proportional(full.rope);
  }
  if (residual?.kind === "hyper") {
    if (!Number.isSafeInteger(residual.streams) || residual.streams < 1 || residual.streams > 64) {
      fail(`hc_mult ${residual.streams} must be a whole number in 1..64`);
    }
    if (
      !Number.isSafeInteger(residual.sinkhornIters) || residual.sinkhornIters < 1 ||
      residual.sinkhornIters > 1000
    ) {
      fail(`hc_sinkhorn_iters ${residual.sinkhornIters} must be a whole number in 1..1000`);
    }
    // Sinkhorn divides by sums + eps; a sum can be 0 only in the limit, eps keeps it finite.
    if (!(residual.eps >= 0 && residual.eps < 1)) fail(`hc_eps ${residual.eps} must be in [0, 1)`);
  }
  if (cfg.glu?.kind === "situ") {
    const caps: [string, number][] = [
      ["activation_situ_beta", cfg.glu.beta],
      ["activation_situ_linear_beta", cfg.glu.linearBeta],
    ];
    for (const [k, v] of caps) {
      // SiTU divides by its caps: tanh(x / β).
      if (!(v > 0 && Number.isFinite(v))) fail(`${k} ${v} must be a positive number`);
    }
  }
  for (const id of [...(cfg.bosId === null ? [] : [cfg.bosId]), ...cfg.eosIds]) {
    if (id >= cfg.vocabSize) {
      fail(`special token id ${id} is outside the vocabulary of ${cfg.vocabSize}`);
    }
  }
  const sized = (what: string, shape: number[]) => {
    const n = shape.reduce((a, b) => a * b, 1);
    if (
      shape.some((d) => !Number.isSafeInteger(d) || d > MAX_MODEL_DIM) || n > MAX_TENSOR_ELEMENTS
    ) {
      fail(`${what} of shape [${shape}] is larger than sluice supports`);
    }
  };
  sized("the embedding", globalTensorSpec(cfg, "embed").shape);
  // One layer of each kind (dense or MoE, by mixer) stands for all: shapes differ only there.
  const seen = new Set<string>();
  for (let l = 0; l < cfg.numLayers; l++) {
    const kind = `${cfg.layerKinds[l]} ${mixerOf(cfg, l)}`;
    if (seen.has(kind)) continue;
    seen.add(kind);
    for (const t of layerTensorsOf(cfg, l)) {
      sized(`layer ${l} ${t}`, layerTensorSpec(cfg, t, l).shape);
    }
  }
  if (moe) sized("an expert matrix", expertMatrixShape(cfg, "gate"));
}
