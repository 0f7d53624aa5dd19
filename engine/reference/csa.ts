/**
 * The float64 reference of DeepSeek-V4's compressed sparse attention, as transformers 5.18's
 * `DeepseekV4Attention` computes it (../shared/models/README.md, tiny-deepseek-v4, "The
 * function"): q = wq_b · rmsw(wq_a · h), each head RMS-normed without a weight; one shared
 * vector kv = rmsw(wkv · h) is key and value; RoPE rotates the trailing dims of each head in
 * interleaved pairs (the plain table on window-only layers, the YaRN table on compressed ones);
 * each head attends to the window's kv and the layer's compressed entries with a sink logit; the
 * output's rotary dims are rotated back by −pos; a grouped low-rank projection (wo_a per group of
 * heads, then wo_b) gives the layer's output.
 *
 * Compressed entries: HCA layers (ratio r, not indexed) emit one entry per complete window of r
 * tokens, Σ_j softmax_j(z_j + ape_j) ⊙ c_j per channel, then rmsw and RoPE at position r·w; CSA
 * layers (indexed) mix 2r slots per entry (the previous window's Ca half and the window's own Cb
 * half), and a Lightning indexer with its own such compressor scores the entries
 * (Σ_h w_h · ReLU(q_h · k)) and keeps the best `indexer.topK`.
 *
 * The per-position projections the compressors need are kept in the layer cache beside kv
 * (values), so rewinding drops them with the keys; entries are recomputed from them each call,
 * which is slow and plain on purpose.
 *
 * @module
 */
import type { CsaLayer, LayerTensor, RopeConfig } from "../../io/model_config.ts";
import type { ReferenceAttention, ReferenceContext } from "./forward.ts";
import { matvec, rmsNorm, softmax } from "./math.ts";
import { applyRope, ropeInvFreq } from "./rope.ts";

const invFreqMemo = new WeakMap<RopeConfig, Float64Array>();

/** RoPE (interleaved, magnitude 1) of the trailing `rope.dim` dims of v[off, off + width). */
function ropeTail(
  v: Float64Array,
  off: number,
  width: number,
  pos: number,
  rope: RopeConfig,
): void {
  let inv = invFreqMemo.get(rope);
  if (!inv) {
    inv = ropeInvFreq(rope);
    invFreqMemo.set(rope, inv);
  }
  applyRope(v, off + width - rope.dim, pos, inv, "interleaved", 1);
}

/** x / sqrt(mean(x²) + eps) over v[off, off + n), in place. */
function normInPlace(v: Float64Array, off: number, n: number, eps: number): void {
  let ss = 0;
  for (let i = 0; i < n; i++) ss += v[off + i] * v[off + i];
  const inv = 1 / Math.sqrt(ss / n + eps);
  for (let i = 0; i < n; i++) v[off + i] *= inv;
}

/** The four tensors of one compressor. */
interface Compressor {
  wkv: LayerTensor;
  wgate: LayerTensor;
  ape: LayerTensor;
  norm: LayerTensor;
}
const MAIN: Compressor = { wkv: "cmp_wkv", wgate: "cmp_wgate", ape: "cmp_ape", norm: "cmp_norm" };
const INDEXER: Compressor = {
  wkv: "idx_wkv",
  wgate: "idx_wgate",
  ape: "idx_ape",
  norm: "idx_norm",
};

/**
 * Entries 0..count−1 of one compressor from the per-position projections: `c(p)` and `z(p)` are
 * position p's kv and gate projections (width·(indexed ? 2 : 1) values).
 */
function entries(
  m: ReferenceContext,
  l: number,
  layer: CsaLayer,
  t: Compressor,
  width: number,
  count: number,
  c: (p: number) => Float64Array,
  z: (p: number) => Float64Array,
): Float64Array[] {
  const r = layer.ratio, span = layer.indexed ? 2 * width : width;
  const ape = m.lw(l, t.ape), norm = m.lw(l, t.norm);
  const out: Float64Array[] = [];
  for (let w = 0; w < count; w++) {
    // Slots: [kv channel offset, position, ape row]; Ca halves of the previous window first.
    const slots: [number, number][] = [];
    if (layer.indexed && w > 0) { for (let j = 0; j < r; j++) slots.push([(w - 1) * r + j, 0]); }
    for (let j = 0; j < r; j++) slots.push([w * r + j, layer.indexed ? width : 0]);
    const mixed = new Float64Array(width);
    for (let i = 0; i < width; i++) {
      const logits = slots.map(([p, o]) => z(p)[o + i] + ape[(p % r) * span + o + i]);
      const p = softmax(logits);
      slots.forEach(([pos, o], s) => mixed[i] += p[s] * c(pos)[o + i]);
    }
    const e = rmsNorm(mixed, norm, m.cfg.rmsNormEps, `layer ${l} ${t.norm}`);
    ropeTail(e, 0, width, w * r, m.cfg.csa!.compressRope);
    out.push(e);
  }
  return out;
}

/** Compressed sparse attention of layer `l` at position `pos`, through the output projection. */
export const csaReference: ReferenceAttention = (m, l, h, pos) => {
  const cfg = m.cfg, csa = cfg.csa!;
  const layer = csa.layers[l];
  const { numHeads: H, headDim: hd, hiddenSize: d } = cfg;
  const eps = cfg.rmsNormEps;
  const rope = layer.ratio ? csa.compressRope : cfg.rope;
  const qr = rmsNorm(
    matvec(m.lw(l, "wq_a"), h, csa.qLoraRank, d, `layer ${l} wq_a`),
    m.lw(l, "q_a_norm"),
    eps,
    `layer ${l} q_norm`,
  );
  const q = matvec(m.lw(l, "wq_b"), qr, H * hd, csa.qLoraRank, `layer ${l} wq_b`);
  for (let i = 0; i < H; i++) {
    normInPlace(q, i * hd, hd, eps);
    ropeTail(q, i * hd, hd, pos, rope);
  }
  const kv = rmsNorm(
    matvec(m.lw(l, "wkv"), h, hd, d, `layer ${l} wkv`),
    m.lw(l, "kv_norm"),
    eps,
    `layer ${l} kv_norm`,
  );
  ropeTail(kv, 0, hd, pos, rope);
  // The compressors' projections of this position: [c | z | indexer c | indexer z].
  const cw = layer.indexed ? 2 * hd : hd, iw = 2 * csa.indexer.headDim;
  const parts: Float64Array[] = [];
  if (layer.ratio) {
    parts.push(matvec(m.lw(l, "cmp_wkv"), h, cw, d, `layer ${l} compressor wkv`));
    parts.push(matvec(m.lw(l, "cmp_wgate"), h, cw, d, `layer ${l} compressor wgate`));
  }
  if (layer.indexed) {
    parts.push(matvec(m.lw(l, "idx_wkv"), h, iw, d, `layer ${l} indexer wkv`));
    parts.push(matvec(m.lw(l, "idx_wgate"), h, iw, d, `layer ${l} indexer wgate`));
  }
  const cache = m.cacheOf(l);
  cache.keys.push(kv);
  cache.values.push(parts.length ? Float64Array.from(parts.flatMap((p) => [...p])) : kv);
  const proj = (p: number, off: number, n: number) => cache.values[p].subarray(off, off + n);

  // Keys: the window (its own position included), then the kept compressed entries.
  const keys: Float64Array[] = [];
  for (let p = Math.max(0, pos - csa.window + 1); p <= pos; p++) keys.push(cache.keys[p]);
  if (layer.ratio) {
    const count = Math.floor((pos + 1) / layer.ratio);
    const main = entries(
      m,
      l,
      layer,
      MAIN,
      hd,
      count,
      (p) => proj(p, 0, cw),
      (p) => proj(p, cw, cw),
    );
    if (!layer.indexed) keys.push(...main);
    else {keys.push(
        ...indexerPick(m, l, layer, qr, h, pos, count, cw, iw, proj).map((w) => main[w]),
      );}
  }

  const out = new Float64Array(H * hd);
  const sinks = m.lw(l, "sinks");
  for (let i = 0; i < H; i++) {
    const logits = new Float64Array(keys.length + 1);
    keys.forEach((k, t) => {
      let s = 0;
      for (let j = 0; j < hd; j++) s += q[i * hd + j] * k[j];
      logits[t] = s * cfg.attnScale;
    });
    logits[keys.length] = sinks[i];
    const p = softmax(logits);
    keys.forEach((k, t) => {
      for (let j = 0; j < hd; j++) out[i * hd + j] += p[t] * k[j];
    });
    // The values carried RoPE at their positions: rotate the output back by the query's.
    ropeTail(out, i * hd, hd, -pos, rope);
  }
  // Grouped output: group g (heads g·H/G ..) through rows g·R .. g·R + R − 1 of wo_a.
  const G = csa.oGroups, R = csa.oLoraRank, gw = (H * hd) / G;
  const woA = m.lw(l, "wo_a");
  if (woA.length !== G * R * gw) {
    throw new Error(`layer ${l} wo_a: ${woA.length} values, expected ${G * R}×${gw}`);
  }
  const low = new Float64Array(G * R);
  for (let g = 0; g < G; g++) {
    low.set(
      matvec(
        woA.subarray(g * R * gw, (g + 1) * R * gw),
        out.subarray(g * gw, (g + 1) * gw),
        R,
        gw,
        `layer ${l} wo_a`,
      ),
      g * R,
    );
  }
  return matvec(m.lw(l, "wo_b"), low, d, G * R, `layer ${l} wo_b`);
};

/** The Lightning indexer's choice among `count` entries: the best topK by score, best first. */
function indexerPick(
  m: ReferenceContext,
  l: number,
  layer: CsaLayer,
  qr: Float64Array,
  h: Float64Array,
  pos: number,
  count: number,
  cw: number,
  iw: number,
  proj: (p: number, off: number, n: number) => Float64Array,
): number[] {
  const cfg = m.cfg, csa = cfg.csa!;
  const { heads, headDim: ih, topK } = csa.indexer;
  const keys = entries(
    m,
    l,
    layer,
    INDEXER,
    ih,
    count,
    (p) => proj(p, 2 * cw, iw),
    (p) => proj(p, 2 * cw + iw, iw),
  );
  const iq = matvec(m.lw(l, "idx_wq_b"), qr, heads * ih, csa.qLoraRank, `layer ${l} indexer wq_b`);
  for (let i = 0; i < heads; i++) ropeTail(iq, i * ih, ih, pos, csa.compressRope);
  const wts = matvec(
    m.lw(l, "idx_weights"),
    h,
    heads,
    cfg.hiddenSize,
    `layer ${l} indexer weights`,
  );
  const scores = keys.map((k) => {
    let s = 0;
    for (let i = 0; i < heads; i++) {
      let dot = 0;
      for (let j = 0; j < ih; j++) dot += iq[i * ih + j] * k[j];
      s += (wts[i] / Math.sqrt(heads)) * Math.max(0, dot) / Math.sqrt(ih);
    }
    return s;
  });
  return scores.map((_, w) => w).sort((a, b) => scores[b] - scores[a] || a - b).slice(0, topK);
}
