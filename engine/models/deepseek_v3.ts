/**
 * The deepseek_v3 family (DeepSeek-V3/R1, Kimi-K2): multi-head latent attention with a latent KV
 * cache. Each cached position holds the normalised compressed KV (kv_lora_rank floats) and the
 * shared rope key (qk_rope_head_dim floats), about 57× less than expanded K/V at rank 512. This
 * file holds everything about the family: config normalisation, attention tensors and their
 * Hugging Face names, the planner's sizes, the stored-config check, the engine's attention, and
 * the pointer to its float64 reference (engine/reference/mla.ts).
 *
 * Decode uses the absorbed form: a head's no-rope query is pulled into latent space through its
 * slice of kv_b_proj (q_lat = W_kbᵀ·q_nope), scored against the latent rows directly, and the
 * attention-weighted latent is mapped to the head's values through W_vb afterwards. The expanded
 * form (engine/reference/mla.ts) is the independent check.
 *
 * Kimi K3's MLA layers add a sigmoid output gate on the heads' values before o_proj (the layer's
 * `g_proj`, when `mla.outputGate`).
 *
 * @module
 */
import { manifestField, MAX_DIM } from "../../io/manifest.ts";
import { isKdaLayer, type LayerTensor, type ModelConfig } from "../../io/model_config.ts";
import { alignUp } from "../../io/format.ts";
import type { Arena } from "../arena.ts";
import { rowsToF32 } from "../dequant.ts";
import type { AttentionShape, Matmul, Ops } from "../ops.ts";
import { mlaReference } from "../reference/mla.ts";
import { buildRopeTable, ropeAt, type RopeTable } from "../rope_table.ts";
import type { TensorRef } from "../tensor.ts";
import type { CacheRegion } from "../transformer.ts";
import type { LayerWeights } from "../weights.ts";
import type { Family } from "./family.ts";
import { groupedMoe, MAX_LAYERS, type Normaliser, requireSilu, ropeSource } from "./hf_config.ts";

/** Per-layer absorbed matrices, float32, built on the layer's first visit. */
interface Absorbed {
  /** Per head: W_kbᵀ, kv_lora_rank × qk_nope_head_dim. */
  kbT: TensorRef[];
  /** Per head: W_vb, v_head_dim × kv_lora_rank. */
  vb: TensorRef[];
}

/** MLA attention of every layer of one model, with its latent cache and scratch. */
export class MlaAttention {
  #ops: Ops;
  #arena: Arena;
  #cfg: ModelConfig;
  /** null under NoPE (Kimi-Linear). */
  #rope: RopeTable | null;
  #cache: number[] = [];
  #absorbed: (Absorbed | null)[];
  #qa: number;
  #q: number;
  #kva: number;
  #qFull: number;
  #latOut: number;
  #att: number;
  /** Output-gate pre-activations (0 when the model has no output gate). */
  #gate = 0;
  #scores: number;
  #scoreTokens: number;
  #maxCtx: number;
  #row: number;
  #qkDim: number;
  #shape: AttentionShape;

  constructor(ops: Ops, arena: Arena, cfg: ModelConfig, maxBatch: number, maxCtx: number) {
    const mla = cfg.mla;
    if (!mla) throw new Error(`${cfg.modelType}: MLA attention needs the mla config`);
    this.#ops = ops;
    this.#arena = arena;
    this.#cfg = cfg;
    this.#maxCtx = maxCtx;
    const H = cfg.numHeads;
    this.#row = mla.kvLoraRank + mla.qkRopeHeadDim;
    this.#qkDim = mla.qkNopeHeadDim + mla.qkRopeHeadDim;
    // Hybrids (Kimi-Linear) keep a latent cache only for their full-attention layers.
    for (let l = 0; l < cfg.numLayers; l++) {
      // Sized by the function the planner sums.
      this.#cache.push(
        isKdaLayer(cfg, l)
          ? -1
          : arena.alloc(`latent kv cache L${l}`, DEEPSEEK_V3.stateBytes(cfg, l, maxCtx, maxBatch)),
      );
    }
    this.#absorbed = new Array(cfg.numLayers).fill(null);
    this.#rope = mla.nope ? null : buildRopeTable(arena, cfg.rope, maxCtx);
    if (mla.outputGate) {
      this.#gate = arena.alloc("mla output gate", maxBatch * H * mla.vHeadDim * 4);
    }
    this.#qa = arena.alloc("mla q_a", maxBatch * (mla.qLoraRank ?? 1) * 4);
    this.#q = arena.alloc("mla q", maxBatch * H * this.#qkDim * 4);
    this.#kva = arena.alloc("mla kv_a", maxBatch * this.#row * 4);
    this.#qFull = arena.alloc("mla latent queries", maxBatch * H * this.#row * 4);
    this.#latOut = arena.alloc("mla latent outputs", maxBatch * H * mla.kvLoraRank * 4);
    this.#att = arena.alloc("mla values", maxBatch * H * mla.vHeadDim * 4);
    this.#scoreTokens = Math.min(maxBatch, 8);
    this.#scores = arena.alloc("mla scores", this.#scoreTokens * H * maxCtx * 4);
    this.#shape = {
      nHeads: H,
      nKvHeads: 1,
      headDim: this.#row,
      vHeadDim: mla.kvLoraRank,
      kStride: this.#row,
      vStride: this.#row,
      scale: cfg.attnScale,
    };
  }

  /** Splits kv_b_proj into per-head float32 W_kbᵀ and W_vb, once per layer. */
  #absorb(layer: number, lw: LayerWeights): Absorbed {
    const have = this.#absorbed[layer];
    if (have) return have;
    const mla = this.#cfg.mla!;
    const H = this.#cfg.numHeads;
    const r = mla.kvLoraRank, nope = mla.qkNopeHeadDim, v = mla.vHeadDim;
    const wkvb = lw.get("wkv_b");
    const all = rowsToF32(this.#arena, wkvb, 0, wkvb.rows);
    const kbT: TensorRef[] = [];
    const vb: TensorRef[] = [];
    for (let h = 0; h < H; h++) {
      const base = h * (nope + v) * r;
      const kOff = this.#arena.alloc(`mla W_kbT L${layer} h${h}`, r * nope * 4, 64);
      const k = this.#arena.f32(kOff, r * nope);
      for (let i = 0; i < nope; i++) {
        for (let c = 0; c < r; c++) k[c * nope + i] = all[base + i * r + c];
      }
      kbT.push({ ptr: kOff, dtype: "f32", rows: r, cols: nope });
      const vOff = this.#arena.alloc(`mla W_vb L${layer} h${h}`, v * r * 4, 64);
      this.#arena.f32(vOff, v * r).set(all.subarray(base + nope * r, base + (nope + v) * r));
      vb.push({ ptr: vOff, dtype: "f32", rows: v, cols: r });
    }
    const made = { kbT, vb };
    this.#absorbed[layer] = made;
    return made;
  }

  /** The latent cache of every layer (compressed KV and the shared RoPE key). */
  cacheRegions(): CacheRegion[] {
    return this.#cache.map((offset) => ({ offset, rowBytes: this.#row * 4 }));
  }

  /** out = o_proj(MLA(h)) for `nb` tokens at positions pos..pos+nb−1. */
  forward(layer: number, lw: LayerWeights, h: number, out: number, nb: number, pos: number): void {
    const ops = this.#ops;
    const cfg = this.#cfg;
    const mla = cfg.mla!;
    const H = cfg.numHeads;
    const eps = cfg.rmsNormEps;
    const nope = mla.qkNopeHeadDim, ropeDim = mla.qkRopeHeadDim, r = mla.kvLoraRank;
    const row = this.#row, qk = this.#qkDim;
    if (pos + nb > this.#maxCtx) {
      throw new Error(`context full: ${pos + nb} > ${this.#maxCtx} positions`);
    }
    const ab = this.#absorb(layer, lw);

    // Queries and the new latent rows.
    if (mla.qLoraRank !== null) {
      ops.matmul({ w: lw.get("wq_a"), x: h, y: this.#qa, nb }, {
        w: lw.get("wkv_a"),
        x: h,
        y: this.#kva,
        nb,
      });
      ops.rmsnorm(this.#qa, lw.get("q_a_norm").ptr, this.#qa, mla.qLoraRank, nb, eps);
      ops.matmul({ w: lw.get("wq_b"), x: this.#qa, y: this.#q, nb });
    } else {
      ops.matmul({ w: lw.get("wq"), x: h, y: this.#q, nb }, {
        w: lw.get("wkv_a"),
        x: h,
        y: this.#kva,
        nb,
      });
    }
    const interleaved = cfg.rope.layout === "interleaved";
    const lengths: number[] = [];
    for (let b = 0; b < nb; b++) {
      const kv = this.#kva + b * row * 4;
      ops.rmsnorm(kv, lw.get("kv_a_norm").ptr, kv, r, 1, eps);
      if (this.#rope) {
        const [cos, sin] = ropeAt(this.#rope, pos + b);
        ops.rope(kv + r * 4, 1, row, ropeDim, cos, sin, interleaved);
        ops.rope(this.#q + (b * H * qk + nope) * 4, H, qk, ropeDim, cos, sin, interleaved);
      }
      lengths.push(pos + b + 1);
    }
    ops.copy(this.#cache[layer] + pos * row * 4, this.#kva, nb * row);

    // Absorbed queries: [W_kbᵀ · q_nope | q_pe] per (token, head).
    const absorb: Matmul[] = [];
    for (let b = 0; b < nb; b++) {
      for (let hh = 0; hh < H; hh++) {
        const q = this.#q + (b * H + hh) * qk * 4;
        const qf = this.#qFull + (b * H + hh) * row * 4;
        absorb.push({ w: ab.kbT[hh], x: q, y: qf, nb: 1 });
        ops.copy(qf + r * 4, q + nope * 4, ropeDim);
      }
    }
    ops.matmul(...absorb);

    ops.attention({
      shape: this.#shape,
      q: this.#qFull,
      qStride: H * row,
      k: this.#cache[layer],
      v: this.#cache[layer],
      out: this.#latOut,
      outStride: H * r,
      scores: this.#scores,
      scoresPerToken: H * this.#maxCtx,
      scoreTokens: this.#scoreTokens,
      lengths,
    });

    // Latent outputs → per-head values → o_proj.
    const values: Matmul[] = [];
    for (let b = 0; b < nb; b++) {
      for (let hh = 0; hh < H; hh++) {
        const lat = this.#latOut + (b * H + hh) * r * 4;
        values.push({
          w: ab.vb[hh],
          x: lat,
          y: this.#att + (b * H + hh) * mla.vHeadDim * 4,
          nb: 1,
        });
      }
    }
    if (this.#gate) values.push({ w: lw.get("g_proj"), x: h, y: this.#gate, nb });
    ops.matmul(...values);
    if (this.#gate) {
      ops.sigmoid(this.#gate, nb * H * mla.vHeadDim);
      ops.mul(this.#att, this.#gate, nb * H * mla.vHeadDim);
    }
    ops.matmul({ w: lw.get("wo"), x: this.#att, y: out, nb });
  }
}

/** yarn_get_mscale of DeepSeek's code: the attention scale multiplier for a YaRN factor. */
function yarnMscale(factor: number, mscale: number): number {
  return factor <= 1 ? 1 : 0.1 * mscale * Math.log(factor) + 1;
}

/** DeepSeek-V3 and Kimi-K2: MLA, sigmoid or softmax routing with groups, shared experts. */
export const normaliseDeepseekV3: Normaliser = (f, mt) => {
  requireSilu(f);
  const hidden = f.int("hidden_size", { min: 1 });
  const numHeads = f.int("num_attention_heads", { min: 1 });
  const numLayers = f.int("num_hidden_layers", { min: 1, max: MAX_LAYERS });
  const qkNope = f.int("qk_nope_head_dim", { min: 1 });
  const qkRope = f.int("qk_rope_head_dim", { min: 2 });
  if (qkRope % 2) throw new Error(`${f.where}: qk_rope_head_dim ${qkRope} must be even`);
  const { theta, scaling } = ropeSource(f, {
    ropeTheta: 10000,
    rmsNormEps: 1e-6,
    maxPositions: 4096,
  });
  let attnScale = 1 / Math.sqrt(qkNope + qkRope);
  if (scaling.type === "yarn" && scaling.mscaleAllDim) {
    const m = yarnMscale(scaling.factor, scaling.mscaleAllDim);
    attnScale *= m * m;
  }
  const numExperts = f.has("n_routed_experts") ? f.int("n_routed_experts", { min: 1 }) : 0;
  const firstDense = f.int("first_k_dense_replace", { def: numExperts ? undefined : 0 });
  const freq = f.int("moe_layer_freq", { def: 1, min: 1 });
  const layerKinds = Array.from(
    { length: numLayers },
    (_, l) => numExperts > 0 && l >= firstDense && l % freq === 0 ? "moe" : "dense",
  ) as ("dense" | "moe")[];
  const moe = layerKinds.includes("moe")
    ? groupedMoe(f, numExperts, f.str("scoring_func", "sigmoid"), f.str("topk_method", "noaux_tc"))
    : null;
  const qLora = f.src.q_lora_rank === null ? null : f.int("q_lora_rank", { min: 1 });
  return {
    family: "deepseek_v3",
    modelType: mt,
    vocabSize: f.int("vocab_size", { min: 1 }),
    hiddenSize: hidden,
    numLayers,
    numHeads,
    // MLA: every head has its own k and v (decompressed from the shared latent).
    numKvHeads: numHeads,
    headDim: qkNope + qkRope,
    intermediateSize: layerKinds.includes("dense") ? f.int("intermediate_size", { min: 1 }) : 0,
    rmsNormEps: f.num("rms_norm_eps", 1e-6),
    rope: {
      theta,
      // transformers' rope_interleave defaults to true: the checkpoint's q_pe/k_pe pairs are (2i, 2i+1).
      layout: f.bool("rope_interleave", true) ? "interleaved" : "half",
      dim: qkRope,
      scaling,
    },
    maxPositions: f.int("max_position_embeddings", { def: 4096, min: 1 }),
    tieWordEmbeddings: f.bool("tie_word_embeddings", false),
    qkNorm: false,
    attentionBias: f.bool("attention_bias", false),
    layerKinds,
    moe,
    mla: {
      qLoraRank: qLora,
      kvLoraRank: f.int("kv_lora_rank", { min: 1 }),
      qkNopeHeadDim: qkNope,
      qkRopeHeadDim: qkRope,
      vHeadDim: f.int("v_head_dim", { min: 1 }),
    },
    attnScale,
  };
};

/** The MLA tensors of a layer and their Hugging Face names (also Kimi-Linear's MLA layers). */
export function mlaTensors(cfg: ModelConfig): Partial<Record<LayerTensor, string>> {
  const names: Partial<Record<LayerTensor, string>> = {};
  if (cfg.mla?.qLoraRank === null) names.wq = "self_attn.q_proj.weight";
  names.wo = "self_attn.o_proj.weight";
  if (cfg.mla?.qLoraRank !== null) {
    names.wq_a = "self_attn.q_a_proj.weight";
    names.q_a_norm = "self_attn.q_a_layernorm.weight";
    names.wq_b = "self_attn.q_b_proj.weight";
  }
  names.wkv_a = "self_attn.kv_a_proj_with_mqa.weight";
  names.kv_a_norm = "self_attn.kv_a_layernorm.weight";
  names.wkv_b = "self_attn.kv_b_proj.weight";
  return names;
}

/** The shape of MLA attention tensor `t` (also Kimi-Linear's and K3's MLA layers). */
export function mlaShape(cfg: ModelConfig, t: LayerTensor): number[] {
  const m = cfg.mla!;
  const H = cfg.hiddenSize, heads = cfg.numHeads;
  const q = heads * (m.qkNopeHeadDim + m.qkRopeHeadDim);
  switch (t) {
    case "wq":
      return [q, H];
    case "wq_a":
      return [m.qLoraRank!, H];
    case "q_a_norm":
      return [m.qLoraRank!];
    case "wq_b":
      return [q, m.qLoraRank!];
    case "wkv_a":
      return [m.kvLoraRank + m.qkRopeHeadDim, H];
    case "kv_a_norm":
      return [m.kvLoraRank];
    case "wkv_b":
      return [heads * (m.qkNopeHeadDim + m.vHeadDim), m.kvLoraRank];
    case "wo":
      return [H, heads * m.vHeadDim];
    default:
      throw new Error(`the deepseek_v3 family has no attention tensor ${t}`);
  }
}

/** The deepseek_v3 family. */
export const DEEPSEEK_V3: Family = {
  name: "deepseek_v3",
  attentionTensors: mlaTensors,
  attentionShape: (cfg, t) => mlaShape(cfg, t),
  validateConfig(c, where) {
    const m = manifestField.obj(c.mla, `${where}.mla`);
    if (m.qLoraRank !== null) manifestField.int(m.qLoraRank, `${where}.mla.qLoraRank`, 1, MAX_DIM);
    for (const k of ["kvLoraRank", "qkNopeHeadDim", "qkRopeHeadDim", "vHeadDim"]) {
      manifestField.int(m[k], `${where}.mla.${k}`, 1, MAX_DIM);
    }
    // Derived fields must say what the MLA section says (normaliseDeepseekV3 sets them so).
    const qk = (m.qkNopeHeadDim as number) + (m.qkRopeHeadDim as number);
    if (c.headDim !== qk || c.numKvHeads !== c.numHeads) {
      throw new Error(
        `${where}: headDim ${c.headDim} and numKvHeads ${c.numKvHeads} must be ` +
          `qkNopeHeadDim + qkRopeHeadDim (${qk}) and numHeads (${c.numHeads}) for MLA`,
      );
    }
    if (m.nope !== undefined) manifestField.bool(m.nope, `${where}.mla.nope`);
  },
  stateBytes: (cfg, _layer, ctx) => ctx * (cfg.mla!.kvLoraRank + cfg.mla!.qkRopeHeadDim) * 4,
  scratchFloats(cfg, maxBatch) {
    const { kvLoraRank: r, qkNopeHeadDim: nope, qkRopeHeadDim: rope } = cfg.mla!;
    const heads = cfg.numHeads;
    return maxBatch *
      (3 * heads * (nope + rope) + 2 * heads * (r + rope) + 2 * cfg.numKvHeads * cfg.headDim);
  },
  // The absorbed float32 matrices of every (MLA) layer: W_kbᵀ and W_vb of every head.
  persistentBytes(cfg) {
    const { kvLoraRank: r, qkNopeHeadDim: nope, vHeadDim: v } = cfg.mla!;
    let layers = 0;
    for (let l = 0; l < cfg.numLayers; l++) if (!isKdaLayer(cfg, l)) layers++;
    return layers * cfg.numHeads * (alignUp(r * nope * 4, 64) + alignUp(v * r * 4, 64));
  },
  createAttention: (ops, arena, cfg, maxBatch, maxCtx) =>
    new MlaAttention(ops, arena, cfg, maxBatch, maxCtx),
  reference: mlaReference,
};
