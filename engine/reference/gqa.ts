/**
 * The float64 reference of grouped-query attention (the llama family: Llama, Mixtral, Qwen3,
 * GLM-4.5, MiniMax-M2; and the gpt_oss family): optional q/k/v biases, Qwen3's per-head q/k
 * RMSNorm (MiniMax-M2's one over the whole projection), RoPE, and every query head attending to
 * its shared key/value head, as transformers' LlamaAttention computes it; gpt-oss adds one sink logit per head, a sliding window on the layers that have
 * one (the full cache is kept, the window is a mask) and an o_proj bias, as GptOssAttention does;
 * Gemma 4's full layers have their own head width, KV heads and RoPE, V the raw keys, and a
 * weightless norm on each value head, as Gemma4TextAttention does.
 *
 * @module
 */
import { layerGeometry } from "../../io/model_config.ts";
import type { ReferenceAttention } from "./forward.ts";
import { addInto, matvec, rmsNorm, sigmoid, unitRmsNorm } from "./math.ts";

/** Grouped-query attention of layer `l` at position `pos`, through o_proj. */
export const gqaReference: ReferenceAttention = (m, l, h, pos) => {
  const cfg = m.cfg;
  const { numHeads, hiddenSize: d, rmsNormEps: eps } = cfg;
  // Gemma 4's full layers have their own head width, KV heads and RoPE.
  const { headDim, numKvHeads, rope, kEqV } = layerGeometry(cfg, l);
  const proj = (t: "wq" | "wk" | "wv", b: "bq" | "bk" | "bv", heads: number) => {
    const y = matvec(m.lw(l, t), h, heads * headDim, d, `layer ${l} ${t}`);
    if (cfg.attentionBias) addInto(y, Float64Array.from(m.lw(l, b)));
    return y;
  };
  const gated = cfg.attnOutputGate === true;
  const qg = proj("wq", "bq", gated ? 2 * numHeads : numHeads);
  // Gated: head h's rows are [query (headDim) | gate (headDim)].
  const q = gated ? new Float64Array(numHeads * headDim) : qg;
  const gate = new Float64Array(gated ? numHeads * headDim : 0);
  for (let hd = 0; gated && hd < numHeads; hd++) {
    q.set(qg.subarray(2 * hd * headDim, (2 * hd + 1) * headDim), hd * headDim);
    gate.set(qg.subarray((2 * hd + 1) * headDim, (2 * hd + 2) * headDim), hd * headDim);
  }
  const k = proj("wk", "bk", numKvHeads);
  // k = v: the values are the keys as projected, before their norm and rotation.
  const v = kEqV ? k.slice() : proj("wv", "bv", numKvHeads);
  if (cfg.qkNorm && cfg.qkNormWhole) {
    // MiniMax-M2: one norm over all heads of the token's projection.
    const unit = cfg.normUnitOffset;
    q.set(rmsNorm(q, m.lw(l, "q_norm"), eps, `layer ${l} q_norm`, 0, q.length, unit));
    k.set(rmsNorm(k, m.lw(l, "k_norm"), eps, `layer ${l} k_norm`, 0, k.length, unit));
  } else if (cfg.qkNorm) {
    m.normHeads(q, numHeads, m.lw(l, "q_norm"), `layer ${l} q_norm`, headDim);
    m.normHeads(k, numKvHeads, m.lw(l, "k_norm"), `layer ${l} k_norm`, headDim);
  }
  if (cfg.attention?.valueNorm) {
    // Gemma 4: every value head RMS-normed without a weight.
    for (let i = 0; i < numKvHeads; i++) {
      v.set(unitRmsNorm(v, eps, i * headDim, headDim), i * headDim);
    }
  }
  for (let hd = 0; hd < numHeads; hd++) m.rope(q, hd * headDim, pos, rope);
  for (let hd = 0; hd < numKvHeads; hd++) m.rope(k, hd * headDim, pos, rope);
  const cache = m.cacheOf(l);
  cache.keys.push(k);
  cache.values.push(v);
  if (numHeads % numKvHeads !== 0) {
    throw new Error(`${numHeads} heads do not share ${numKvHeads} kv heads evenly`);
  }
  const group = numHeads / numKvHeads;
  const out = new Float64Array(numHeads * headDim);
  const extras = cfg.attention;
  // A sliding layer's query at position pos sees keys pos − W + 1 .. pos.
  const window = extras?.windows[l] ?? 0;
  const from = window > 0 ? Math.max(0, cache.keys.length - window) : 0;
  const sinks = extras?.sinks ? m.lw(l, "sinks") : undefined;
  for (let hd = 0; hd < numHeads; hd++) {
    const kvOff = Math.floor(hd / group) * headDim;
    m.attend(q, hd * headDim, cache, kvOff, kvOff, headDim, headDim, out, hd * headDim, {
      from,
      sink: sinks?.[hd],
    });
  }
  for (let i = 0; i < gate.length; i++) out[i] *= sigmoid(gate[i]);
  const y = matvec(m.lw(l, "wo"), out, d, numHeads * headDim, `layer ${l} wo`);
  if (extras?.outputBias) addInto(y, Float64Array.from(m.lw(l, "bo")));
  return y;
};
