/**
 * The float64 reference of multi-head latent attention (the deepseek_v3 family: DeepSeek-V3/R1,
 * Kimi-K2), in the expanded form: full per-head keys and values are decompressed from the latent
 * at every position, as transformers' DeepseekV3Attention computes them, where the engine scores
 * in latent space (the absorbed form). The two agreeing is the check.
 *
 * @module
 */
import type { ReferenceAttention } from "./forward.ts";
import { matvec, rmsNorm, sigmoid } from "./math.ts";

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
  let q: Float64Array;
  if (mla.qLoraRank === null) {
    q = matvec(m.lw(l, "wq"), h, numHeads * qk, d, `layer ${l} wq`);
  } else {
    const qa = matvec(m.lw(l, "wq_a"), h, mla.qLoraRank, d, `layer ${l} wq_a`);
    const qn = rmsNorm(qa, m.lw(l, "q_a_norm"), eps, `layer ${l} q_a_norm`);
    q = matvec(m.lw(l, "wq_b"), qn, numHeads * qk, mla.qLoraRank, `layer ${l} wq_b`);
  }
  const kva = matvec(m.lw(l, "wkv_a"), h, mla.kvLoraRank + rope, d, `layer ${l} wkv_a`);
  const ckv = rmsNorm(
    kva,
    m.lw(l, "kv_a_norm"),
    eps,
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
  const keys = new Float64Array(numHeads * qk);
  const values = new Float64Array(numHeads * vd);
  for (let hd = 0; hd < numHeads; hd++) {
    if (!mla.nope) m.rope(q, hd * qk + nope, pos);
    keys.set(kv.subarray(hd * (nope + vd), hd * (nope + vd) + nope), hd * qk);
    keys.set(kpe, hd * qk + nope);
    values.set(kv.subarray(hd * (nope + vd) + nope, (hd + 1) * (nope + vd)), hd * vd);
  }
  const cache = m.cacheOf(l);
  cache.keys.push(keys);
  cache.values.push(values);
  const out = new Float64Array(numHeads * vd);
  for (let hd = 0; hd < numHeads; hd++) {
    m.attend(q, hd * qk, cache, hd * qk, hd * vd, qk, vd, out, hd * vd);
  }
  if (mla.outputGate) {
    // K3: a sigmoid gate on the heads' values, from the layer's normed input.
    const gate = matvec(m.lw(l, "g_proj"), h, numHeads * vd, d, `layer ${l} g_proj`);
    for (let i = 0; i < numHeads * vd; i++) out[i] *= sigmoid(gate[i]);
  }
  return matvec(m.lw(l, "wo"), out, d, numHeads * vd, `layer ${l} wo`);
};
