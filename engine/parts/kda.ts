/**
 * A Kimi Delta Attention layer (Kimi-Linear; Kimi K3 with its bounded gate), with its recurrent
 * state: per layer, heads × dk × dv floats of delta-rule state and the last K−1 pre-conv inputs
 * of q, k and v. The state has a fixed size whatever the context, and carries from prefill into
 * decode; position 0 starts it from zero.
 *
 * Per token, on the normed hidden u: q, k, v = SiLU(causal conv(W·u)); the forget gate g (log
 * decay per key channel, {@link kdaForgetGate}); β = σ(W_b·u) per head; the gated delta rule
 * (kernels/kda.c); per-head RMSNorm of the output times σ(W_gb·W_ga·u) (or σ(W_g·u), K3's
 * full-rank gate); o_proj. Kimi K3's variants are the config's `gateLowerBound` and
 * `fullRankOutputGate`.
 *
 * @module
 */
import type { Arena } from "../arena.ts";
import type { TensorSpec } from "../../io/manifest.ts";
import type { KdaConfig, LayerTensor, ModelConfig } from "../../io/model_config.ts";
import type { Ops } from "../ops.ts";
import type { LayerWeights } from "../weights.ts";
import type { MixerPart } from "./mixer.ts";
import { RecurrentMixer, type RecurrentRun, RecurrentStates } from "./recurrent.ts";
import { regionBytes } from "./scratch.ts";

/**
 * Floats per token of each scratch region, in allocation order: pre- and post-conv q/k/v, the
 * forget gate, beta, the two low-rank projections, the output gate and the output.
 */
function kdaScratchFloats(k: KdaConfig): [string, number][] {
  const p = k.numHeads * k.headDim;
  return [
    ["kda q pre-conv", p],
    ["kda k pre-conv", p],
    ["kda v pre-conv", p],
    ["kda q", p],
    ["kda k", p],
    ["kda v", p],
    ["kda forget gate", p],
    ["kda beta", k.numHeads],
    ["kda f_a", k.headDim],
    ["kda g_a", k.headDim],
    ["kda output gate", p],
    ["kda output", p],
  ];
}

/** Bytes of one KDA layer's recurrent state and conv windows. */
export function kdaLayerStateBytes(k: KdaConfig): { state: number; conv: number } {
  const p = k.numHeads * k.headDim;
  return { state: k.numHeads * k.headDim * k.headDim * 4, conv: 3 * (k.convKernel - 1) * p * 4 };
}

/**
 * The spec of a KDA layer's attention tensor `t`. A_log need only hold one rate per head
 * (Kimi-Linear stores [1, 1, H, 1], K3 a padded vector), so only its element count is checked.
 */
export function kdaTensorSpec(cfg: ModelConfig, t: LayerTensor): TensorSpec {
  const k = cfg.kda!;
  const h = cfg.hiddenSize, H = k.numHeads, dk = k.headDim, p = H * dk, K = k.convKernel;
  const shapes: Partial<Record<LayerTensor, number[]>> = {
    wq: [p, h],
    wk: [p, h],
    wv: [p, h],
    wo: [h, p],
    q_conv: [p, 1, K],
    k_conv: [p, 1, K],
    v_conv: [p, 1, K],
    a_log: [H],
    f_a: [dk, h],
    f_b: [p, dk],
    dt_bias: [p],
    beta_proj: [H, h],
    g_a: [dk, h],
    g_b: [p, dk],
    g_proj: [p, h],
    o_norm: [dk],
  };
  const shape = shapes[t];
  if (!shape) throw new Error(`a KDA layer has no attention tensor ${t}`);
  return { shape, role: shape.length === 2 ? "weight" : "vector", atLeast: t === "a_log" };
}

/**
 * The forget gate in place: z (tokens × heads × dk, the f_b projection) becomes the log-decay
 * g. Kimi-Linear: g = −exp(A_log[h])·softplus(z + dt_bias), softplus(x) = x above 20 as
 * transformers has it; K3 (`lowerBound` lb): g = lb·σ(exp(A_log[h])·(z + dt_bias)). Computed in
 * float64 and rounded once: a handful of transcendental calls per channel, on the main thread.
 */
export function kdaForgetGate(
  z: Float32Array,
  aLog: Float32Array,
  dtBias: Float32Array,
  heads: number,
  dk: number,
  lowerBound: number | null,
): void {
  const p = heads * dk;
  for (let i = 0; i < z.length; i++) {
    const c = i % p;
    const a = Math.exp(aLog[Math.floor(c / dk)]);
    const x = z[i] + dtBias[c];
    z[i] = lowerBound === null
      ? -a * (x > 20 ? x : Math.log1p(Math.exp(x)))
      : lowerBound / (1 + Math.exp(-a * x));
  }
}

/** Per-layer state in the arena: one region, the delta-rule state then the three windows. */
interface LayerState {
  state: number;
  /** Conv windows of q, k and v, each [K−1][heads·dk]. */
  conv: [number, number, number];
}

/** The KDA layers of one model: their state and the scratch of one call. */
export class KdaAttention extends RecurrentMixer<LayerState> {
  #ops: Ops;
  #cfg: ModelConfig;
  #k: KdaConfig;
  protected override readonly states: RecurrentStates<LayerState>;
  #pre: [number, number, number];
  #post: [number, number, number];
  #g: number;
  #beta: number;
  #lowA: number;
  #lowG: number;
  #gate: number;
  #o: number;

  constructor(
    ops: Ops,
    arena: Arena,
    cfg: ModelConfig,
    layers: number[],
    maxBatch: number,
    sequences: number,
  ) {
    super();
    const k = cfg.kda;
    if (!k) throw new Error(`${cfg.modelType}: KDA attention needs the kda config`);
    this.#ops = ops;
    this.#cfg = cfg;
    this.#k = k;
    const sizes = kdaLayerStateBytes(k);
    const w = sizes.conv / 3;
    this.states = new RecurrentStates(
      "KDA",
      "kda state + conv windows",
      arena,
      cfg.numLayers,
      layers,
      sequences,
      sizes.state + sizes.conv,
      (state) => {
        const at = state + sizes.state;
        return { state, conv: [at, at + w, at + 2 * w] };
      },
    );
    const [preQ, preK, preV, q, kk, v, g, beta, lowA, lowG, gate, o] = kdaScratchFloats(k).map((
      [what, floats],
    ) => arena.alloc(what, maxBatch * floats * 4));
    this.#pre = [preQ, preK, preV];
    this.#post = [q, kk, v];
    this.#g = g;
    this.#beta = beta;
    this.#lowA = lowA;
    this.#lowG = lowG;
    this.#gate = gate;
    this.#o = o;
  }

  protected override run(
    lw: LayerWeights,
    h: number,
    out: number,
    runs: RecurrentRun<LayerState>[],
  ): void {
    const ops = this.#ops;
    const k = this.#k;
    const H = k.numHeads, dk = k.headDim, p = H * dk, K = k.convKernel;
    const nb = runs.reduce((s, r) => s + r.n, 0);
    const [xq, xk, xv] = this.#pre;
    const [q, kk, v] = this.#post;
    const fullGate = k.fullRankOutputGate;
    ops.matmul(
      { w: lw.get("wq"), x: h, y: xq, nb },
      { w: lw.get("wk"), x: h, y: xk, nb },
      { w: lw.get("wv"), x: h, y: xv, nb },
      { w: lw.get("f_a"), x: h, y: this.#lowA, nb },
      { w: lw.get("beta_proj"), x: h, y: this.#beta, nb },
      fullGate
        ? { w: lw.get("g_proj"), x: h, y: this.#gate, nb }
        : { w: lw.get("g_a"), x: h, y: this.#lowG, nb },
    );
    ops.matmul(
      { w: lw.get("f_b"), x: this.#lowA, y: this.#g, nb },
      ...(fullGate ? [] : [{ w: lw.get("g_b"), x: this.#lowG, y: this.#gate, nb }]),
    );
    ops.shortConv(...runs.flatMap(({ st, n, first }) => {
      const conv = (x: number, state: number, t: "q_conv" | "k_conv" | "v_conv", y: number) => ({
        x: x + first * p * 4,
        state,
        w: lw.get(t).ptr,
        y: y + first * p * 4,
        tokens: n,
        channels: p,
        kernel: K,
        xStride: p,
        yStride: p,
        group: dk,
      });
      return [
        conv(xq, st.conv[0], "q_conv", q),
        conv(xk, st.conv[1], "k_conv", kk),
        conv(xv, st.conv[2], "v_conv", v),
      ];
    }));
    kdaForgetGate(
      ops.f32(this.#g, nb * p),
      ops.f32(lw.get("a_log").ptr, H),
      ops.f32(lw.get("dt_bias").ptr, p),
      H,
      dk,
      k.gateLowerBound,
    );
    ops.sigmoid(this.#beta, nb * H);
    ops.sigmoid(this.#gate, nb * p);
    // Prefill runs the recurrence too, token after token, so a prompt gives the same bits
    // however it is chunked (docs/LEARNED.md: the chunked WY form was also slower here).
    for (const { st, n, first } of runs) {
      const at = first * p * 4;
      ops.kda({
        state: st.state,
        q: q + at,
        k: kk + at,
        v: v + at,
        g: this.#g + at,
        gChannels: dk,
        beta: this.#beta + first * H * 4,
        out: this.#o + at,
        tokens: n,
        heads: H,
        ratio: 1,
        dk,
        dv: dk,
        qkStride: p,
        vStride: p,
        gStride: p,
        betaStride: H,
        outStride: p,
      });
    }
    ops.rmsnorm(this.#o, lw.get("o_norm").ptr, this.#o, dk, nb * H, this.#cfg.rmsNormEps);
    ops.mul(this.#o, this.#gate, nb * p);
    ops.matmul({ w: lw.get("wo"), x: this.#o, y: out, nb });
  }

  protected override zero(st: LayerState): void {
    const sizes = kdaLayerStateBytes(this.#k);
    this.#ops.f32(st.state, sizes.state / 4).fill(0);
    for (const c of st.conv) this.#ops.f32(c, sizes.conv / 12).fill(0);
  }
}

/** The KDA mixer: its state is a fixed size whatever the context. */
export const KDA: MixerPart = {
  name: "kda",
  shape: (cfg, t) => kdaTensorSpec(cfg, t),
  stateBytes(cfg) {
    const { state, conv } = kdaLayerStateBytes(cfg.kda!);
    return state + conv;
  },
  scratchBytes: (cfg, _layers, _ctx, maxBatch) =>
    regionBytes(...kdaScratchFloats(cfg.kda!).map(([, floats]) => maxBatch * floats * 4)),
  create: (ops, arena, cfg, layers, maxBatch, _maxCtx, sequences) =>
    new KdaAttention(ops, arena, cfg, layers, maxBatch, sequences),
};
