/**
 * The `gdn` mixer: Gated DeltaNet layers (Qwen3-Next, Qwen3.5/3.6-MoE), with their recurrent
 * state: per layer, value heads × dk × dv floats of delta-rule state and the last K−1 pre-conv
 * q/k/v inputs. The state has a fixed size whatever the context, carries from prefill into
 * decode, and position 0 starts it from zero.
 *
 * Per token, on the normed hidden u: q|k|v = SiLU(causal conv(W_qkv·u)) over all their channels
 * at once; β = σ(W_b·u) and the decay g = −exp(A_log)·softplus(W_a·u + dt_bias), one each per
 * value head (kda.ts's `kdaForgetGate` with one channel a head); the delta rule with `ratio`
 * value heads on each key head's q and k (kernels/kda.c, split by key head); an RMSNorm of each
 * head's output with its plain weight, times SiLU(W_z·u); out_proj. Qwen3-Next's fused
 * projections (a block per key head) are regrouped into the flat order first. Its float64
 * reference is engine/reference/gated_deltanet.ts.
 *
 * @module
 */
import type { Arena } from "../arena.ts";
import type { TensorSpec } from "../../io/manifest.ts";
import type { GatedDeltaNetConfig, LayerTensor, ModelConfig } from "../../io/model_config.ts";
import { kdaForgetGate } from "./kda.ts";
import { RecurrentMixer, type RecurrentRun, RecurrentStates } from "./recurrent.ts";
import type { Ops } from "../ops.ts";
import type { LayerWeights } from "../weights.ts";
import type { MixerPart } from "./mixer.ts";
import { regionBytes } from "./scratch.ts";

/** Channels of the conv: q and k of every key head, v of every value head. */
function convChannels(g: GatedDeltaNetConfig): number {
  return 2 * g.numKeyHeads * g.keyHeadDim + g.numValueHeads * g.valueHeadDim;
}

/** Bytes of one Gated DeltaNet layer's recurrent state and conv window. */
export function gdnLayerStateBytes(g: GatedDeltaNetConfig): { state: number; conv: number } {
  return {
    state: g.numValueHeads * g.keyHeadDim * g.valueHeadDim * 4,
    conv: (g.convKernel - 1) * convChannels(g) * 4,
  };
}

/**
 * Floats per token of each scratch region, in allocation order: the projections as stored
 * (grouped: q/k/v/z and b/a per key head; none when flat), pre- and post-conv q/k/v, z, β, the
 * decays and the output.
 */
function gdnScratchFloats(g: GatedDeltaNetConfig): [string, number][] {
  const C = convChannels(g), vDim = g.numValueHeads * g.valueHeadDim, Hv = g.numValueHeads;
  const grouped = g.projections === "grouped";
  return [
    ["gdn qkvz as stored", grouped ? C + vDim : 0],
    ["gdn ba as stored", grouped ? 2 * Hv : 0],
    ["gdn qkv pre-conv", C],
    ["gdn qkv", C],
    ["gdn z", vDim],
    ["gdn beta", Hv],
    ["gdn decay", Hv],
    ["gdn output", vDim],
  ];
}

/** The spec of a Gated DeltaNet layer's tensor `t`. */
export function gdnTensorSpec(cfg: ModelConfig, t: LayerTensor): TensorSpec {
  const g = cfg.gdn!;
  const h = cfg.hiddenSize, Hv = g.numValueHeads, vDim = Hv * g.valueHeadDim;
  const C = convChannels(g);
  const shapes: Partial<Record<LayerTensor, number[]>> = {
    gdn_qkv: [C, h],
    gdn_z: [vDim, h],
    gdn_b: [Hv, h],
    gdn_a: [Hv, h],
    gdn_qkvz: [C + vDim, h],
    gdn_ba: [2 * Hv, h],
    qkv_conv: [C, 1, g.convKernel],
    dt_bias: [Hv],
    a_log: [Hv],
    o_norm: [g.valueHeadDim],
    wo: [h, vDim],
  };
  const shape = shapes[t];
  if (!shape) throw new Error(`a Gated DeltaNet layer has no tensor ${t}`);
  return { shape, role: shape.length === 2 ? "weight" : "vector" };
}

/** Per-layer state in the arena: one region, the delta-rule state then the conv window. */
interface LayerState {
  state: number;
  conv: number;
}

/** The Gated DeltaNet layers of one model: their state and the scratch of one call. */
export class GatedDeltaNet extends RecurrentMixer<LayerState> {
  #ops: Ops;
  #cfg: ModelConfig;
  #g: GatedDeltaNetConfig;
  protected override readonly states: RecurrentStates<LayerState>;
  #rawQkvz: number;
  #rawBa: number;
  #pre: number;
  #post: number;
  #z: number;
  #beta: number;
  #decay: number;
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
    const g = cfg.gdn;
    if (!g) throw new Error(`${cfg.modelType}: Gated DeltaNet needs the gdn config`);
    this.#ops = ops;
    this.#cfg = cfg;
    this.#g = g;
    const sizes = gdnLayerStateBytes(g);
    this.states = new RecurrentStates(
      "Gated DeltaNet",
      "gdn state + conv window",
      arena,
      cfg.numLayers,
      layers,
      sequences,
      sizes.state + sizes.conv,
      (state) => ({ state, conv: state + sizes.state }),
    );
    [this.#rawQkvz, this.#rawBa, this.#pre, this.#post, this.#z, this.#beta, this.#decay, this.#o] =
      gdnScratchFloats(g).map(([what, floats]) => arena.alloc(what, maxBatch * floats * 4));
  }

  /**
   * Qwen3-Next's fused projections of `nb` tokens, one block per key head ([q_h | k_h | v and z
   * of its value heads] and [b | a of them]), copied into the flat q/k/v, z, b and a buffers.
   */
  #regroup(nb: number): void {
    const g = this.#g, ops = this.#ops;
    const Hk = g.numKeyHeads, Hv = g.numValueHeads, dk = g.keyHeadDim;
    const rv = (Hv / Hk) * g.valueHeadDim, r = Hv / Hk;
    const C = convChannels(g), vDim = Hv * g.valueHeadDim, block = 2 * dk + 2 * rv;
    const raw = ops.f32(this.#rawQkvz, nb * (C + vDim)), ba = ops.f32(this.#rawBa, nb * 2 * Hv);
    const pre = ops.f32(this.#pre, nb * C), z = ops.f32(this.#z, nb * vDim);
    const b = ops.f32(this.#beta, nb * Hv), a = ops.f32(this.#decay, nb * Hv);
    for (let t = 0; t < nb; t++) {
      for (let h = 0; h < Hk; h++) {
        const at = t * (C + vDim) + h * block, q = t * C + h * dk;
        pre.set(raw.subarray(at, at + dk), q);
        pre.set(raw.subarray(at + dk, at + 2 * dk), q + Hk * dk);
        pre.set(raw.subarray(at + 2 * dk, at + 2 * dk + rv), t * C + 2 * Hk * dk + h * rv);
        z.set(raw.subarray(at + 2 * dk + rv, at + block), t * vDim + h * rv);
        const bAt = t * 2 * Hv + h * 2 * r;
        b.set(ba.subarray(bAt, bAt + r), t * Hv + h * r);
        a.set(ba.subarray(bAt + r, bAt + 2 * r), t * Hv + h * r);
      }
    }
  }

  protected override run(
    lw: LayerWeights,
    h: number,
    out: number,
    runs: RecurrentRun<LayerState>[],
  ): void {
    const ops = this.#ops;
    const g = this.#g;
    const Hk = g.numKeyHeads, Hv = g.numValueHeads, dk = g.keyHeadDim, dv = g.valueHeadDim;
    const C = convChannels(g), vDim = Hv * dv;
    const nb = runs.reduce((s, r) => s + r.n, 0);
    if (g.projections === "grouped") {
      ops.matmul(
        { w: lw.get("gdn_qkvz"), x: h, y: this.#rawQkvz, nb },
        { w: lw.get("gdn_ba"), x: h, y: this.#rawBa, nb },
      );
      this.#regroup(nb);
    } else {
      ops.matmul(
        { w: lw.get("gdn_qkv"), x: h, y: this.#pre, nb },
        { w: lw.get("gdn_z"), x: h, y: this.#z, nb },
        { w: lw.get("gdn_b"), x: h, y: this.#beta, nb },
        { w: lw.get("gdn_a"), x: h, y: this.#decay, nb },
      );
    }
    ops.shortConv(...runs.map(({ st, n, first }) => ({
      x: this.#pre + first * C * 4,
      state: st.conv,
      w: lw.get("qkv_conv").ptr,
      y: this.#post + first * C * 4,
      tokens: n,
      channels: C,
      kernel: g.convKernel,
      xStride: C,
      yStride: C,
      group: dk,
    })));
    // One decay per value head: KDA's gate with one channel a head.
    kdaForgetGate(
      ops.f32(this.#decay, nb * Hv),
      ops.f32(lw.get("a_log").ptr, Hv),
      ops.f32(lw.get("dt_bias").ptr, Hv),
      Hv,
      1,
      null,
    );
    ops.sigmoid(this.#beta, nb * Hv);
    // Prefill runs the recurrence token after token too: any chunking gives the same bits.
    for (const { st, n, first } of runs) {
      const post = this.#post + first * C * 4;
      ops.kda({
        state: st.state,
        q: post,
        k: post + Hk * dk * 4,
        v: post + 2 * Hk * dk * 4,
        g: this.#decay + first * Hv * 4,
        gChannels: 1,
        beta: this.#beta + first * Hv * 4,
        out: this.#o + first * vDim * 4,
        tokens: n,
        heads: Hk,
        ratio: Hv / Hk,
        dk,
        dv,
        qkStride: C,
        vStride: C,
        gStride: Hv,
        betaStride: Hv,
        outStride: vDim,
      });
    }
    ops.rmsnorm(this.#o, lw.get("o_norm").ptr, this.#o, dv, nb * Hv, this.#cfg.rmsNormEps);
    // z ← SiLU(z)·o: the norm's output times its gate.
    ops.siluMul(this.#z, this.#o, nb * vDim);
    ops.matmul({ w: lw.get("wo"), x: this.#z, y: out, nb });
  }

  protected override zero(st: LayerState): void {
    const sizes = gdnLayerStateBytes(this.#g);
    this.#ops.f32(st.state, (sizes.state + sizes.conv) / 4).fill(0);
  }
}

/** The Gated DeltaNet mixer: its state is a fixed size whatever the context. */
export const GDN: MixerPart = {
  name: "gdn",
  shape: (cfg, t) => gdnTensorSpec(cfg, t),
  stateBytes(cfg) {
    const { state, conv } = gdnLayerStateBytes(cfg.gdn!);
    return state + conv;
  },
  scratchBytes: (cfg, _layers, _ctx, maxBatch) =>
    regionBytes(...gdnScratchFloats(cfg.gdn!).map(([, floats]) => maxBatch * floats * 4)),
  create: (ops, arena, cfg, layers, maxBatch, _maxCtx, sequences) =>
    new GatedDeltaNet(ops, arena, cfg, layers, maxBatch, sequences),
};
