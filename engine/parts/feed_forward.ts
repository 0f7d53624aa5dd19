/**
 * The feed-forward part of a layer, by the layer's kind (`layerKinds`): a dense gated MLP, or a
 * mixture of experts (router → top-k → experts as their records land → sum in routing order →
 * plus shared experts, computed while the first reads run). Features set from the config: the gate (SwiGLU, SiTU-GLU, the tanh GELU's
 * GeGLU by `glu`, or DeepSeek-V4's limited SwiGLU by `moe.swigluLimit`), a sigmoid gate on the
 * shared expert (`moe.sharedExpertGate`, Qwen3-Next and Qwen3.5), a latent MoE (`moe.latentDim`:
 * the routed experts work in a latent width, the input projected down once, the weighted sum
 * RMS-normed and projected back up), a bias on the router's logits, hash routing by token id
 * (`moe.hashLayers`), bias vectors in the experts and the clamped SwiGLU (gpt-oss), and Gemma 4's
 * dense MLP beside the experts (`moe.denseBeside`) with its router on the scaled stream and
 * per-expert scales. Works on a batch of tokens so that chunked prefill reads each distinct expert
 * once per chunk. Experts in compact formats read prepared inputs (engine/quant_matmul.ts): a
 * token's gate and up inputs are prepared once per layer and shared by every expert the token is
 * routed to.
 *
 * @module
 */
import type { Arena } from "../arena.ts";
import {
  expertWidth,
  layerKindOf,
  type LayerTensor,
  type ModelConfig,
} from "../../io/model_config.ts";
import type { GatedMlp, Ops } from "../ops.ts";
import { expertPrepSizes, InputPrep, preparedKey } from "../quant_matmul.ts";
import { inputFormOf } from "../tensor.ts";
import { type Route, route } from "../routing.ts";
import type { Timeline } from "../stream/timeline.ts";
import type { ExpertSource, ExpertWeights, LayerWeights } from "../weights.ts";
import { regionBytes } from "./scratch.ts";
import { MAX_JOBS } from "../pool_protocol.ts";

/**
 * Watches the MoE layers: called once per MoE layer and forward call when the layer's experts are
 * chosen (their reads queued, none computed yet), with the routes of the batch (the tokens at
 * `positions`, a batch's sequences each at their own) and `h`, the layer's normalised MoE input. The one hook of a run: the trace,
 * the hot-list counts and the lookahead all watch through it (engine/observers.ts).
 */
export type MoeObserver = (
  layer: number,
  routes: Route[],
  h: number,
  nb: number,
  positions: readonly number[],
) => void;

/** Most experts of one token that run in one dispatch: 4 jobs each (gate, up, activation, down). */
const MAX_FUSED_EXPERTS = Math.floor(MAX_JOBS / 4);

/** Rows of the widest gate/up of any FFN of the model: dense, routed expert or shared experts. */
function ffnRows(cfg: ModelConfig): number {
  return Math.max(
    cfg.intermediateSize,
    cfg.moe?.expertIntermediate ?? 0,
    cfg.moe?.sharedIntermediate ?? 0,
  );
}

/**
 * Bytes of each buffer for calls of up to `maxBatch` tokens, in allocation order: the gate and up
 * activations, one expert's gathered inputs, every routed expert's output of the batch, the
 * router's logits, with a latent MoE its projected input and weighted sum, with a dense MLP beside
 * the MoE its three buffers, and with shared experts their output.
 */
function ffnRegions(cfg: ModelConfig, maxBatch: number): number[] {
  const d = cfg.hiddenSize, f = maxBatch * 4;
  const latent = cfg.moe?.latentDim;
  return [
    f * ffnRows(cfg),
    f * ffnRows(cfg),
    f * d,
    f * (cfg.moe?.topK ?? 1) * d,
    f * (cfg.moe?.numExperts ?? 1),
    ...(latent ? [f * latent, f * latent] : []),
    // A dense MLP beside the MoE: the router's input, the experts' input, the dense output.
    ...(cfg.moe?.denseBeside ? [f * d, f * d, f * d] : []),
    // The shared experts' output: made while the routed experts' reads run, added after them.
    ...(cfg.moe?.sharedIntermediate ? [f * d] : []),
  ];
}

/** Bytes the feed-forward allocates up front (prepared inputs come with the quant formats). */
export function feedForwardScratchBytes(cfg: ModelConfig, maxBatch: number): number {
  return regionBytes(...ffnRegions(cfg, maxBatch));
}

/** The FFN of every layer of one model, with its scratch buffers. */
export class FeedForward {
  /**
   * Called once per MoE layer right after its experts were handed to the expert source (so their
   * reads are queued first), before any expert computes: the lookahead's moment, and where the
   * trace and the hot-list counts record the routes.
   */
  readonly observers: MoeObserver[] = [];
  #ops: Ops;
  #cfg: ModelConfig;
  #experts: ExpertSource;
  #gate: number;
  #up: number;
  #gathered: number;
  #expertOut: number;
  #logits: number;
  /** Latent MoE: the projected input and the weighted sum (0 when experts use the full width). */
  #latentIn = 0;
  #latentSum = 0;
  /** A dense MLP beside the MoE: the router's input, the experts' input, the dense output. */
  #beside: { routerIn: number; input: number; dense: number } | null = null;
  /** The shared experts' output (0 without shared experts). */
  #sharedOut = 0;
  #maxBatch: number;
  #arena: Arena;
  /** Prepared gate/up inputs of the batch, and the down inputs of one expert; made on first use. */
  #prep: { shared: InputPrep; local: InputPrep } | null = null;
  /** Decoded copies of exact expert weights for batches (two slots), made on first use. */
  #decoded: { offset: number; bytes: number } | null = null;
  #timeline: Timeline | undefined;

  constructor(
    ops: Ops,
    arena: Arena,
    cfg: ModelConfig,
    experts: ExpertSource,
    maxBatch: number,
    timeline?: Timeline,
  ) {
    this.#timeline = timeline;
    this.#ops = ops;
    this.#cfg = cfg;
    this.#experts = experts;
    this.#maxBatch = maxBatch;
    this.#arena = arena;
    const regions = ffnRegions(cfg, maxBatch);
    const [gate, up, gathered, expertOut, logits] = regions;
    this.#gate = arena.alloc("ffn gate", gate);
    this.#up = arena.alloc("ffn up", up);
    this.#gathered = arena.alloc("moe gathered input", gathered);
    this.#expertOut = arena.alloc("moe expert outputs", expertOut);
    this.#logits = arena.alloc("moe router logits", logits);
    if (cfg.moe?.latentDim) {
      this.#latentIn = arena.alloc("moe latent input", regions[5]);
      this.#latentSum = arena.alloc("moe latent sum", regions[6]);
    }
    if (cfg.moe?.denseBeside) {
      const [routerIn, input, dense] = regions.slice(cfg.moe.latentDim ? 7 : 5);
      this.#beside = {
        routerIn: arena.alloc("moe router input", routerIn),
        input: arena.alloc("moe input", input),
        dense: arena.alloc("ffn dense branch", dense),
      };
    }
    if (cfg.moe?.sharedIntermediate) {
      this.#sharedOut = arena.alloc("moe shared experts' output", regions[regions.length - 1]);
    }
  }

  /** g = act(g) · u over n floats: SiLU, SiTU or the tanh GELU, by `glu`. */
  #activate(g: number, u: number, n: number): void {
    const glu = this.#cfg.glu;
    const limit = this.#cfg.moe?.swigluLimit;
    if (glu?.kind === "situ") this.#ops.situMul(g, u, n, glu.beta, glu.linearBeta);
    else if (glu?.kind === "gelu_tanh") this.#ops.geluTanhMul(g, u, n);
    else if (limit !== undefined) this.#ops.swigluLimit(g, u, n, limit);
    else this.#ops.siluMul(g, u, n);
  }

  /** out = down(act(gate·h) · up·h) for `nb` tokens, with weights `prefix`_{gate,up,down}. */
  #mlp(
    weights: LayerWeights | ExpertWeights,
    h: number,
    out: number,
    nb: number,
    prefix?: string,
  ) {
    const w = (m: "gate" | "up" | "down") =>
      prefix
        ? (weights as LayerWeights).get(`${prefix}_${m}` as LayerTensor)
        : (weights as ExpertWeights)[m];
    const g = w("gate"), u = w("up"), down = w("down");
    const ops = this.#ops;
    if (nb === 1 && this.#plainSilu() && [g, u, down].every((m) => inputFormOf(m) === "f32")) {
      return ops.gatedMlps([{ gate: g, up: u, down, x: h, g: this.#gate, u: this.#up, y: out }]);
    }
    ops.matmul({ w: g, x: h, y: this.#gate, nb }, { w: u, x: h, y: this.#up, nb });
    this.#activate(this.#gate, this.#up, nb * g.rows);
    ops.matmul({ w: down, x: this.#gate, y: out, nb });
  }

  /** The prepared-input scratch, allocated when the first compact-format expert is seen. */
  #prepFor(ew: ExpertWeights): { shared: InputPrep; local: InputPrep } {
    const s = expertPrepSizes(ew.gate, ew.up, ew.down, this.#maxBatch);
    if (this.#prep) {
      if (s.shared > this.#prep.shared.bytes || s.local > this.#prep.local.bytes) {
        throw new Error("experts of different compact formats need more prepared-input scratch");
      }
      return this.#prep;
    }
    const a = this.#arena,
      k = this.#ops.pool.exports as Record<string, (...x: unknown[]) => unknown>;
    const pad = s.pad ? a.alloc("vq3r padded input", s.pad) : 0;
    const shared = s.shared ? a.alloc("moe prepared gate/up inputs", s.shared) : 0;
    const local = s.local ? a.alloc("moe prepared down inputs", s.local) : 0;
    this.#prep = {
      shared: new InputPrep(a, k, shared, s.shared, pad, s.pad),
      local: new InputPrep(a, k, local, s.local, pad, s.pad),
    };
    return this.#prep;
  }

  /**
   * The two slots where exact weights (shipped MXFP4, INT4) of `ew` decode for a batch, or none when
   * its matrices multiply batches as stored (engine/tensor.ts exactBatchJob).
   */
  #decodedFor(ew: ExpertWeights): [number, number] | [] {
    const bytes = expertPrepSizes(ew.gate, ew.up, ew.down, this.#maxBatch).decoded;
    if (bytes === 0) return [];
    if (!this.#decoded) {
      this.#decoded = { offset: this.#arena.alloc("moe decoded expert weights", bytes), bytes };
    } else if (bytes > this.#decoded.bytes) {
      throw new Error("experts of different shapes need more decoded-weight scratch");
    }
    const d = this.#decoded;
    return [d.offset, d.offset + d.bytes / 2];
  }

  /**
   * One expert on the tokens `tokens` (whose rows are gathered at #gathered): gate and up read
   * the batch-wide prepared inputs `shared` when their format needs them; down prepares its own.
   */
  #expertMlp(
    ew: ExpertWeights,
    h: number,
    nb: number,
    tokens: number[],
    shared: Map<string, number[]>,
  ): void {
    const ops = this.#ops;
    const n = tokens.length;
    const compact = [ew.gate, ew.up, ew.down].some((w) => inputFormOf(w) !== "f32");
    const prep = compact ? this.#prepFor(ew) : null;
    const pick = (w: ExpertWeights["gate"]) => {
      if (!prep || inputFormOf(w) === "f32") return undefined;
      const all = this.#batchPrep(prep.shared, w, h, nb, shared);
      return tokens.map((t) => all[t]);
    };
    const x = this.#gathered;
    const [slot0, slot1] = this.#decodedFor(ew);
    ops.matmul(
      { w: ew.gate, x, y: this.#gate, nb: n, prep: pick(ew.gate), scratch: slot0 },
      { w: ew.up, x, y: this.#up, nb: n, prep: pick(ew.up), scratch: slot1 },
    );
    const inter = ew.gate.rows, d = ew.down.rows;
    const b = ew.biases;
    if (b) {
      for (let t = 0; t < n; t++) {
        ops.add(this.#gate + t * inter * 4, b.gate, inter);
        ops.add(this.#up + t * inter * 4, b.up, inter);
      }
    }
    const clamp = this.#cfg.moe?.clampedSwiglu;
    if (clamp) ops.swigluClamped(this.#gate, this.#up, n * inter, clamp.limit, clamp.alpha);
    else this.#activate(this.#gate, this.#up, n * inter);
    prep?.local.reset();
    const downPrep = prep?.local.prepare(ew.down, this.#gate, n);
    // The down projection may overwrite the gathered inputs: gate and up have consumed them.
    ops.matmul({ w: ew.down, x: this.#gate, y: x, nb: n, prep: downPrep, scratch: slot0 });
    if (b) { for (let t = 0; t < n; t++) ops.add(x + t * d * 4, b.down, d); }
  }

  /** The prepared inputs of `w` for every token of the batch `h`, made once per key in `shared`. */
  #batchPrep(
    prep: InputPrep,
    w: ExpertWeights["gate"],
    h: number,
    nb: number,
    shared: Map<string, number[]>,
  ): number[] {
    const key = preparedKey(w);
    let all = shared.get(key);
    if (!all) {
      all = prep.prepare(w, h, nb)!;
      shared.set(key, all);
    }
    return all;
  }

  /**
   * Whether `ew` on one token can run as one pool dispatch ({@link Ops.gatedMlps}): a plain SiLU
   * gate, no biases, gate and up reading one input form and down reading f32 or Q8 (which the
   * activation's job makes).
   */
  #fusable(ew: ExpertWeights): boolean {
    const [g, d] = [ew.gate, ew.down].map(inputFormOf);
    return !ew.biases && this.#plainSilu() && this.#cfg.moe?.clampedSwiglu === undefined &&
      (g === "f32" || g === "q8") && preparedKey(ew.gate) === preparedKey(ew.up) &&
      (d === "f32" || d === "q8");
  }

  /** The gate is SiLU as {@link Ops.gatedMlps} computes it (not SiTU, GeGLU or a limited SwiGLU). */
  #plainSilu(): boolean {
    return this.#cfg.glu === undefined && this.#cfg.moe?.swigluLimit === undefined;
  }

  /**
   * The acquired experts on their tokens (`users`' slots), writing each slot's row of
   * #expertOut. Experts of one token each that {@link #fusable} allows run together, a dispatch
   * for all of them (gate/up, activation and down with no return to the main thread); the rest
   * one by one through #expertMlp.
   */
  #computeExperts(
    acquired: { e: number; ew: ExpertWeights }[],
    users: Map<number, number[]>,
    input: number,
    nb: number,
    shared: Map<string, number[]>,
  ): void {
    const ops = this.#ops, topK = this.#cfg.moe!.topK, d = expertWidth(this.#cfg);
    // #gate and #up hold maxBatch rows of the widest FFN: room for that many experts' one row.
    const most = Math.min(MAX_FUSED_EXPERTS, this.#maxBatch);
    let fused: GatedMlp[] = [];
    this.#prep?.local.reset();
    const flush = () => {
      ops.gatedMlps(fused);
      fused = [];
      // The downs' Q8 inputs of the next dispatch go where these were.
      this.#prep?.local.reset();
    };
    for (const { e, ew } of acquired) {
      const slots = users.get(e)!;
      if (slots.length === 1 && this.#fusable(ew)) {
        const s = slots[0], t = Math.floor(s / topK), i = fused.length, inter = ew.gate.rows;
        const prep = inputFormOf(ew.gate) === "q8" || inputFormOf(ew.down) === "q8"
          ? this.#prepFor(ew)
          : null;
        fused.push({
          gate: ew.gate,
          up: ew.up,
          down: ew.down,
          x: input + t * d * 4,
          g: this.#gate + i * inter * 4,
          u: this.#up + i * inter * 4,
          y: this.#expertOut + s * d * 4,
          ...(inputFormOf(ew.gate) === "q8"
            ? { xq: this.#batchPrep(prep!.shared, ew.gate, input, nb, shared)[t] }
            : {}),
          ...(inputFormOf(ew.down) === "q8" ? { gq: prep!.local.reserve(ew.down, 1) } : {}),
        });
        if (fused.length === most) flush();
        continue;
      }
      // #expertMlp reuses the downs' Q8 scratch: run what is pending first.
      if (fused.length > 0) flush();
      slots.forEach((s, i) =>
        ops.copy(this.#gathered + i * d * 4, input + Math.floor(s / topK) * d * 4, d)
      );
      this.#expertMlp(ew, input, nb, slots.map((s) => Math.floor(s / topK)), shared);
      slots.forEach((s, i) => ops.copy(this.#expertOut + s * d * 4, this.#gathered + i * d * 4, d));
    }
    if (fused.length > 0) flush();
  }

  /**
   * out = FFN(h) of layer `layer`, by its kind, for `nb` tokens at `positions`; `h` is the
   * normed input, `x` the stream's rows it was normed from (which a dense MLP beside the MoE
   * routes from and norms its own way), `tokens` their ids (hash-routed layers choose experts by
   * them).
   */
  forward(
    layer: number,
    lw: LayerWeights,
    h: number,
    x: number,
    out: number,
    nb: number,
    positions: readonly number[],
    tokens: readonly number[],
  ): void {
    if (layerKindOf(this.#cfg, layer) !== "moe") return this.dense(lw, h, out, nb);
    if (!this.#beside) return this.moe(layer, lw, h, out, nb, positions, tokens);
    // The dense MLP beside the MoE (`moe.denseBeside`): out = dense_post_norm(MLP(h)) +
    // moe_post_norm(MoE(moe_norm(x))), the experts routed from x.
    const ops = this.#ops, d = this.#cfg.hiddenSize, eps = this.#cfg.rmsNormEps;
    const { input, dense } = this.#beside;
    this.#mlp(lw, h, dense, nb, "ffn");
    ops.rmsnorm(dense, lw.get("dense_post_norm").ptr, dense, d, nb, eps);
    ops.rmsnorm(x, lw.get("moe_norm").ptr, input, d, nb, eps);
    this.moe(layer, lw, input, out, nb, positions, tokens, x);
    ops.rmsnorm(out, lw.get("moe_post_norm").ptr, out, d, nb, eps);
    ops.add(out, dense, nb * d);
  }

  /** Dense FFN of a layer: out = MLP(h) for `nb` tokens. */
  dense(lw: LayerWeights, h: number, out: number, nb: number): void {
    this.#mlp(lw, h, out, nb, "ffn");
  }

  /**
   * MoE FFN of `layer`: out = Σ_k w_k · expert_k(h) + shared(h) for `nb` tokens at
   * `positions`; with a latent MoE, out = up(RMSNorm(Σ_k w_k · expert_k(down(h)))) + shared(h). With
   * `moe.scaledRouterInput` the router reads unit RMSNorm(`residual`) × router_scale ×
   * hidden^−½ instead of h; with `moe.expertScale` each weight is × its expert's expert_scale.
   */
  moe(
    layer: number,
    lw: LayerWeights,
    h: number,
    out: number,
    nb: number,
    positions: readonly number[],
    tokens: readonly number[],
    residual = h,
  ): void {
    const moe = this.#cfg.moe!;
    const ops = this.#ops;
    const latent = this.#latentIn !== 0;
    // The routed experts' input and output width, and where their input and sum live.
    const d = expertWidth(this.#cfg);
    const input = latent ? this.#latentIn : h;
    const sum = latent ? this.#latentSum : out;
    const E = moe.numExperts;
    if (nb > this.#maxBatch) throw new Error(`batch ${nb} > ${this.#maxBatch}`);
    const timeline = this.#timeline;
    timeline?.mark("route", layer);
    let routerIn = h;
    if (moe.scaledRouterInput) {
      const hidden = this.#cfg.hiddenSize;
      routerIn = this.#beside!.routerIn;
      ops.rmsnorm(residual, lw.get("router_scale").ptr, routerIn, hidden, nb, this.#cfg.rmsNormEps);
      ops.scale(routerIn, 1 / Math.sqrt(hidden), nb * hidden);
    }
    ops.matmul({ w: lw.get("router"), x: routerIn, y: this.#logits, nb });
    if (moe.routerLogitBias) {
      for (let b = 0; b < nb; b++) ops.add(this.#logits + b * E * 4, lw.get("router_b").ptr, E);
    }
    const logits = ops.f32(this.#logits, nb * E);
    const bias = lw.has("router_bias") ? ops.f32(lw.get("router_bias").ptr, E) : undefined;
    // DeepSeek-V4's hash layers take their experts from the token's row of tid2eid.
    const table = layer < (moe.hashLayers ?? 0)
      ? ops.f32(lw.get("router_tid2eid").ptr, this.#cfg.vocabSize * moe.topK)
      : undefined;
    const routes: Route[] = [];
    for (let b = 0; b < nb; b++) {
      const chosen = table?.subarray(tokens[b] * moe.topK, (tokens[b] + 1) * moe.topK);
      routes.push(route(moe, logits.subarray(b * E, (b + 1) * E), bias, moe.topK, chosen));
    }
    if (moe.expertScale) {
      const scale = ops.f32(lw.get("expert_scale").ptr, E);
      for (const r of routes) r.weights = r.weights.map((w, k) => w * scale[r.ids[k]]);
    }

    // Distinct experts in first-use order; each is fetched once for the whole batch.
    const users = new Map<number, number[]>();
    for (let b = 0; b < nb; b++) {
      routes[b].ids.forEach((e, k) => {
        const list = users.get(e) ?? [];
        list.push(b * moe.topK + k);
        users.set(e, list);
      });
    }
    const distinct = [...users.keys()];
    const experts = this.#experts;
    const group = Math.max(1, experts.groupSize);
    // Prepared gate/up inputs of this batch by preparedKey, shared by all of its experts.
    const shared = new Map<string, number[]>();
    this.#prep?.shared.reset();
    let sharedDone = this.#sharedOut === 0;
    for (let g0 = 0; g0 < distinct.length; g0 += group) {
      const ids = distinct.slice(g0, g0 + group);
      experts.hint(layer, ids);
      if (g0 === 0) {
        for (const observe of this.observers) observe(layer, routes, h, nb, positions);
        // The reads are queued: project the input down while they run.
        if (latent) ops.matmul({ w: lw.get("latent_down"), x: h, y: input, nb });
      }
      timeline?.mark("expert", layer);
      // Experts compute as their records land: those already resident first, together, else the
      // first left in routing order, whose read was queued first. Each writes only its own rows
      // of #expertOut and the sum below runs in routing order, so the order changes no bit.
      const left = [...ids];
      while (left.length > 0) {
        const landed = left.filter((o) => experts.ready(layer, o));
        // Nothing landed yet: the shared experts need no read, so they fill the wait.
        if (landed.length === 0 && !sharedDone) {
          sharedDone = true;
          this.#mlp(lw, h, this.#sharedOut, nb, "shared");
          continue;
        }
        const batch = landed.length > 0 ? landed : [left[0]];
        if (timeline && landed.length === 0) {
          timeline.countWait(false);
          timeline.mark("wait", layer);
        }
        const acquired = batch.map((e) => ({ e, ew: experts.acquire(layer, e) }));
        // Records that landed during that wait join the batch.
        if (landed.length === 0) {
          for (const o of left) {
            if (o !== batch[0] && experts.ready(layer, o)) {
              acquired.push({ e: o, ew: experts.acquire(layer, o) });
            }
          }
        }
        timeline?.mark("expert", layer);
        for (const { e } of acquired) left.splice(left.indexOf(e), 1);
        this.#computeExperts(acquired, users, input, nb, shared);
        for (const { e } of acquired) experts.release(layer, e);
      }
    }
    // Sum in routing order, whatever order the experts arrived in.
    ops.f32(sum, nb * d).fill(0);
    for (let b = 0; b < nb; b++) {
      routes[b].weights.forEach((wk, k) => {
        ops.axpy(sum + b * d * 4, this.#expertOut + (b * moe.topK + k) * d * 4, wk, d);
      });
    }
    if (latent) {
      ops.rmsnorm(sum, lw.get("latent_norm").ptr, sum, d, nb, this.#cfg.rmsNormEps);
      ops.matmul({ w: lw.get("latent_up"), x: sum, y: out, nb });
    }
    if (this.#sharedOut !== 0) {
      const hidden = this.#cfg.hiddenSize, sharedOut = this.#sharedOut;
      if (!sharedDone) this.#mlp(lw, h, sharedOut, nb, "shared");
      if (moe.sharedExpertGate) {
        // Qwen3-Next / Qwen3.5: out += σ(w·h) · shared(h); the router logits are spent.
        ops.matmul({ w: lw.get("shared_expert_gate"), x: h, y: this.#logits, nb });
        ops.sigmoid(this.#logits, nb);
        const scale = ops.f32(this.#logits, nb);
        for (let b = 0; b < nb; b++) {
          ops.axpy(out + b * hidden * 4, sharedOut + b * hidden * 4, scale[b], hidden);
        }
      } else {
        ops.add(out, sharedOut, nb * hidden);
      }
    }
  }
}
