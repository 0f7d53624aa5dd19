/**
 * Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2, Kimi-Linear and Kimi K3's full-attention
 * layers) with a latent KV cache: each cached position holds the normalised compressed KV
 * (kv_lora_rank floats) and the shared rope key (qk_rope_head_dim floats), about 57× less than
 * expanded K/V at rank 512. Features set from the config: q through a low-rank pair or one
 * projection, NoPE (no rotary at all), and a sigmoid output gate on the heads' values before
 * o_proj (`g_proj`).
 *
 * Decode uses the absorbed form: a head's no-rope query is pulled into latent space through its
 * slice of kv_b_proj (q_lat = W_kbᵀ·q_nope), scored against the latent rows directly, and the
 * attention-weighted latent is mapped to the head's values through W_vb afterwards. The expanded
 * form (engine/reference/mla.ts) is the independent check.
 *
 * @module
 */
import { alignUp } from "../../io/format.ts";
import type { LayerTensor, ModelConfig } from "../../io/model_config.ts";
import type { Arena } from "../arena.ts";
import { rowsToF32 } from "../dequant.ts";
import type { AttentionShape, Matmul, Ops } from "../ops.ts";
import { buildRopeTable, ropeAt, type RopeTable } from "../rope_table.ts";
import type { TensorRef } from "../tensor.ts";
import type { LayerWeights } from "../weights.ts";
import type { CacheRegion, Mixer, MixerPart } from "./mixer.ts";
import { regionBytes, ropeTableBytes, scoreBytes, scoreTokens } from "./scratch.ts";

/** Bytes of one MLA layer's latent cache for `ctx` positions. */
function mlaStateBytes(cfg: ModelConfig, _layer: number, ctx: number): number {
  return ctx * (cfg.mla!.kvLoraRank + cfg.mla!.qkRopeHeadDim) * 4;
}

/** Per-layer absorbed matrices, float32, built on the layer's first visit. */
interface Absorbed {
  /** Per head: W_kbᵀ, kv_lora_rank × qk_nope_head_dim. */
  kbT: TensorRef[];
  /** Per head: W_vb, v_head_dim × kv_lora_rank. */
  vb: TensorRef[];
}

/** MLA of the layers that run it, with their latent caches and its scratch. */
export class MlaAttention implements Mixer {
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
  #layers: number[];

  constructor(
    ops: Ops,
    arena: Arena,
    cfg: ModelConfig,
    layers: number[],
    maxBatch: number,
    maxCtx: number,
  ) {
    const mla = cfg.mla;
    if (!mla) throw new Error(`${cfg.modelType}: MLA attention needs the mla config`);
    this.#ops = ops;
    this.#arena = arena;
    this.#cfg = cfg;
    this.#maxCtx = maxCtx;
    const H = cfg.numHeads;
    this.#row = mla.kvLoraRank + mla.qkRopeHeadDim;
    this.#qkDim = mla.qkNopeHeadDim + mla.qkRopeHeadDim;
    this.#layers = layers;
    // Sized by the function the planner sums.
    for (const l of layers) {
      this.#cache[l] = arena.alloc(`latent kv cache L${l}`, mlaStateBytes(cfg, l, maxCtx));
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
    this.#scoreTokens = scoreTokens(maxBatch);
    this.#scores = arena.alloc("mla scores", scoreBytes(cfg, maxCtx, maxBatch));
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

  /** The latent caches of its layers (compressed KV and the shared RoPE key). */
  cacheRegions(): CacheRegion[] {
    return this.#layers.map((l) => ({ offset: this.#cache[l], rowBytes: this.#row * 4 }));
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

/** The shape of MLA tensor `t`. */
function mlaShape(cfg: ModelConfig, t: LayerTensor): number[] {
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
    // The output gate: one sigmoid per value element of every head.
    case "g_proj":
      return [heads * m.vHeadDim, H];
    default:
      throw new Error(`multi-head latent attention has no tensor ${t}`);
  }
}

/** The MLA mixer. */
export const MLA: MixerPart = {
  name: "mla",
  shape: (cfg, t) => mlaShape(cfg, t),
  stateBytes: mlaStateBytes,
  scratchBytes(cfg, layers, ctx, maxBatch) {
    const m = cfg.mla!;
    const H = cfg.numHeads, f = maxBatch * 4;
    const row = m.kvLoraRank + m.qkRopeHeadDim;
    // The absorbed float32 matrices of every layer it runs: W_kbᵀ and W_vb of every head, each
    // 64-byte aligned, made on a layer's first visit.
    const absorbed = layers.length * H *
      (alignUp(m.kvLoraRank * m.qkNopeHeadDim * 4, 64) +
        alignUp(m.vHeadDim * m.kvLoraRank * 4, 64));
    return (m.nope ? 0 : ropeTableBytes(cfg.rope, ctx)) +
      regionBytes(
        ...(m.outputGate ? [f * H * m.vHeadDim] : []),
        f * (m.qLoraRank ?? 1),
        f * H * (m.qkNopeHeadDim + m.qkRopeHeadDim),
        f * row,
        f * H * row,
        f * H * m.kvLoraRank,
        f * H * m.vHeadDim,
        scoreBytes(cfg, ctx, maxBatch),
      ) + absorbed;
  },
  create: (ops, arena, cfg, layers, maxBatch, maxCtx) =>
    new MlaAttention(ops, arena, cfg, layers, maxBatch, maxCtx),
};
