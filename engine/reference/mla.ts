/**
 * The float64 reference of multi-head latent attention (the deepseek_v3 family: DeepSeek-V3/R1,
 * Kimi-K2), in the expanded form: full per-head keys and values are decompressed from the latent
 * at every position, as transformers' DeepseekV3Attention computes them, where the engine scores
 * in latent space (the absorbed form). The two agreeing is the check. GLM-5's lightning indexer
 * (DeepSeek Sparse Attention) keeps its key after the heads' keys in each cached key vector and
 * picks the positions a query attends to, as transformers' GlmMoeDsaIndexer does.
 *
 * @module
 */
import type { IndexerConfig } from "../../io/model_config.ts";
import type { ReferenceAttention, ReferenceContext } from "./forward.ts";
import { matvec, rmsNorm, sigmoid, softmax } from "./math.ts";

/**
 * The index scores Σ_h w_h·relu(q_h·k_t / √headDim) of `keys` for one query (`q`: heads × headDim,
 * `w`: heads, already scaled by 1/√heads).
 */
export function indexScoresReference(
  ix: IndexerConfig,
  q: ArrayLike<number>,
  w: ArrayLike<number>,
  keys: ArrayLike<number>[],
): Float64Array {
  return Float64Array.from(keys, (k) => {
    let s = 0;
    for (let h = 0; h < ix.numHeads; h++) {
      let d = 0;
      for (let i = 0; i < ix.headDim; i++) d += q[h * ix.headDim + i] * k[i];
      s += w[h] * Math.max(0, d / Math.sqrt(ix.headDim));
    }
    return s;
  });
}

/**
 * The positions of the `k` best scores (all when there are no more than `k`), a tie going to the
 * lower position, in increasing order: picked one at a time, best first.
 */
export function topKReference(scores: ArrayLike<number>, k: number): number[] {
  const taken = new Uint8Array(scores.length);
  const out: number[] = [];
  for (let j = 0; j < Math.min(k, scores.length); j++) {
    let best = -1;
    for (let t = 0; t < scores.length; t++) {
      if (!taken[t] && (best < 0 || scores[t] > scores[best])) best = t;
    }
    taken[best] = 1;
    out.push(best);
  }
  return out.sort((a, b) => a - b);
}

/**
 * The pool keys of the complete pools of `pool` positions among `keys` (each [k | g], headDim
 * floats each): per channel, the softmax over the pool of g + ape weighs the pool's keys.
 */
export function poolKeysReference(
  keys: ArrayLike<number>[],
  ape: ArrayLike<number>,
  pool: number,
  dim: number,
): Float64Array[] {
  const out: Float64Array[] = [];
  for (let j = 0; (j + 1) * pool <= keys.length; j++) {
    const K = new Float64Array(dim);
    for (let c = 0; c < dim; c++) {
      const a = softmax(
        Array.from({ length: pool }, (_, r) => keys[j * pool + r][dim + c] + ape[r * dim + c]),
      );
      for (let r = 0; r < pool; r++) K[c] += a[r] * keys[j * pool + r][c];
    }
    out.push(K);
  }
  return out;
}

/** The indexer's key of this position (LayerNorm with bias, eps 1e-6, RoPE on the leading dims). */
function indexerKey(m: ReferenceContext, l: number, h: Float64Array, pos: number): Float64Array {
  const ix = m.cfg.mla!.indexer!;
  const D = ix.headDim;
  const k = matvec(m.lw(l, "idx_wk"), h, D, m.cfg.hiddenSize, `layer ${l} idx_wk`);
  const mean = k.reduce((a, b) => a + b, 0) / D;
  const variance = k.reduce((a, b) => a + (b - mean) ** 2, 0) / D;
  const w = m.lw(l, "idx_k_norm"), bias = m.lw(l, "idx_k_bias");
  const out = k.map((v, i) => (v - mean) / Math.sqrt(variance + 1e-6) * w[i] + bias[i]);
  if (!m.cfg.mla!.nope) m.rope(out, 0, pos);
  if (!ix.pool) return out;
  const gate = matvec(m.lw(l, "idx_pool_gate"), h, D, m.cfg.hiddenSize, `layer ${l} idx_pool_gate`);
  const both = new Float64Array(2 * D);
  both.set(out);
  both.set(gate, D);
  return both;
}

/** Multi-head latent attention of layer `l` at position `pos`, through o_proj. */
export const mlaReference: ReferenceAttention = (m, l, h, pos) => {
  const cfg = m.cfg;
  const mla = cfg.mla;
  if (!mla) throw new Error(`${cfg.modelType}: the deepseek_v3 family needs an MLA config`);
  const { numHeads, hiddenSize: d, rmsNormEps: eps } = cfg;
  const nope = mla.qkNopeHeadDim;
  const rope = mla.qkRopeHeadDim;
  const qk = nope + rope;
  const vd = mla.vHeadDim;
  const latentEps = mla.latentNormEps ?? eps;
  const ix = mla.indexer;
  let q: Float64Array;
  let qn: Float64Array | undefined;
  if (mla.qLoraRank === null) {
    q = matvec(m.lw(l, "wq"), h, numHeads * qk, d, `layer ${l} wq`);
  } else {
    const qa = matvec(m.lw(l, "wq_a"), h, mla.qLoraRank, d, `layer ${l} wq_a`);
    qn = rmsNorm(qa, m.lw(l, "q_a_norm"), latentEps, `layer ${l} q_a_norm`);
    q = matvec(m.lw(l, "wq_b"), qn, numHeads * qk, mla.qLoraRank, `layer ${l} wq_b`);
  }
  const kva = matvec(m.lw(l, "wkv_a"), h, mla.kvLoraRank + rope, d, `layer ${l} wkv_a`);
  const ckv = rmsNorm(
    kva,
    m.lw(l, "kv_a_norm"),
    latentEps,
    `layer ${l} kv_a_norm`,
    0,
    mla.kvLoraRank,
  );
  const kpe = kva.slice(mla.kvLoraRank);
  if (!mla.nope) m.rope(kpe, 0, pos);
  const kv = matvec(
    m.lw(l, "wkv_b"),
    ckv,
    numHeads * (nope + vd),
    mla.kvLoraRank,
    `layer ${l} wkv_b`,
  );
  const keys = new Float64Array(numHeads * qk + (ix ? ix.headDim * (ix.pool ? 2 : 1) : 0));
  const values = new Float64Array(numHeads * vd);
  for (let hd = 0; hd < numHeads; hd++) {
    if (!mla.nope) m.rope(q, hd * qk + nope, pos);
    keys.set(kv.subarray(hd * (nope + vd), hd * (nope + vd) + nope), hd * qk);
    keys.set(kpe, hd * qk + nope);
    values.set(kv.subarray(hd * (nope + vd) + nope, (hd + 1) * (nope + vd)), hd * vd);
  }
  if (ix) keys.set(indexerKey(m, l, h, pos), numHeads * qk);
  const cache = m.cacheOf(l);
  cache.keys.push(keys);
  cache.values.push(values);
  let keep: number[] | undefined;
  if (ix) {
    // Every query selects; with no more candidates than it keeps, it keeps them all.
    const iq = matvec(m.lw(l, "idx_wq"), qn!, ix.numHeads * ix.headDim, mla.qLoraRank!, "idx_wq");
    if (!mla.nope) { for (let hd = 0; hd < ix.numHeads; hd++) m.rope(iq, hd * ix.headDim, pos); }
    const w = matvec(m.lw(l, "idx_w"), h, ix.numHeads, d, `layer ${l} idx_w`)
      .map((v) => v / Math.sqrt(ix.numHeads));
    const own = cache.keys.map((k) => k.subarray(numHeads * qk));
    if (ix.pool) {
      const pools = poolKeysReference(own, m.lw(l, "idx_pool_ape"), ix.pool, ix.headDim);
      const chosen = topKReference(
        indexScoresReference(ix, iq, w, pools),
        Math.floor(ix.topK / ix.pool),
      );
      keep = [];
      for (const j of chosen) for (let r = 0; r < ix.pool; r++) keep.push(j * ix.pool + r);
      for (let t = pools.length * ix.pool; t < cache.keys.length; t++) keep.push(t);
    } else {
      keep = topKReference(indexScoresReference(ix, iq, w, own), ix.topK);
    }
  }
  const out = new Float64Array(numHeads * vd);
  for (let hd = 0; hd < numHeads; hd++) {
    m.attend(q, hd * qk, cache, hd * qk, hd * vd, qk, vd, out, hd * vd, { keep });
  }
  if (mla.outputGate) {
    // K3: a sigmoid gate on the heads' values, from the layer's normed input.
    const gate = matvec(m.lw(l, "g_proj"), h, numHeads * vd, d, `layer ${l} g_proj`);
    for (let i = 0; i < numHeads * vd; i++) out[i] *= sigmoid(gate[i]);
  }
  return matvec(m.lw(l, "wo"), out, d, numHeads * vd, `layer ${l} wo`);
};
