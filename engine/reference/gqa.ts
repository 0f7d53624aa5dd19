/**
 * The float64 reference of grouped-query attention (the llama family: Llama, Mixtral, Qwen3):
 * optional q/k/v biases, Qwen3's per-head q/k RMSNorm, RoPE, and every query head attending to
 * its shared key/value head, as transformers' LlamaAttention computes it.
 *
 * @module
 */
import type { ReferenceAttention } from "./forward.ts";
import { addInto, matvec } from "./math.ts";

/** Grouped-query attention of layer `l` at position `pos`, through o_proj. */
export const gqaReference: ReferenceAttention = (m, l, h, pos) => {
  const cfg = m.cfg;
  const { numHeads, numKvHeads, headDim, hiddenSize: d } = cfg;
  const proj = (t: "wq" | "wk" | "wv", b: "bq" | "bk" | "bv", heads: number) => {
    const y = matvec(m.lw(l, t), h, heads * headDim, d, `layer ${l} ${t}`);
    if (cfg.attentionBias) addInto(y, Float64Array.from(m.lw(l, b)));
    return y;
  };
  const q = proj("wq", "bq", numHeads);
  const k = proj("wk", "bk", numKvHeads);
  const v = proj("wv", "bv", numKvHeads);
  if (cfg.qkNorm) {
    m.normHeads(q, numHeads, m.lw(l, "q_norm"), `layer ${l} q_norm`);
    m.normHeads(k, numKvHeads, m.lw(l, "k_norm"), `layer ${l} k_norm`);
  }
  for (let hd = 0; hd < numHeads; hd++) m.rope(q, hd * headDim, pos);
  for (let hd = 0; hd < numKvHeads; hd++) m.rope(k, hd * headDim, pos);
  const cache = m.cacheOf(l);
  cache.keys.push(k);
  cache.values.push(v);
  if (numHeads % numKvHeads !== 0) {
    throw new Error(`${numHeads} heads do not share ${numKvHeads} kv heads evenly`);
  }
  const group = numHeads / numKvHeads;
  const out = new Float64Array(numHeads * headDim);
  for (let hd = 0; hd < numHeads; hd++) {
    const kvOff = Math.floor(hd / group) * headDim;
    m.attend(q, hd * headDim, cache, kvOff, kvOff, headDim, headDim, out, hd * headDim);
  }
  return matvec(m.lw(l, "wo"), out, d, numHeads * headDim, `layer ${l} wo`);
};
