/**
 * The parts a layer is made of, by kind: the token mixers (one file each beside this one), the
 * feed-forward (engine/parts/feed_forward.ts) and the residual stream (residual.ts, attn_res.ts).
 * A layer's mixer is chosen by its config (io/model_config.ts `mixerOf`); the planner, the arena,
 * the prompt cache and saved sessions all read the same declarations through here.
 *
 * Adding a mixer kind: one file with its {@link MixerPart} (and its kernel), its name in
 * io/model_config.ts `MixerName` and `mixerOf`, its entry here, and its float64 reference in
 * engine/reference/mixers.ts.
 *
 * @module
 */
import type { MixerName, ModelConfig } from "../../io/model_config.ts";
import { mixerOf } from "../../io/model_config.ts";
import type { Arena } from "../arena.ts";
import type { Ops } from "../ops.ts";
import type { LayerWeights } from "../weights.ts";
import { CSA } from "./csa.ts";
import { GDN } from "./gated_deltanet.ts";
import { GQA } from "./gqa.ts";
import { KDA } from "./kda.ts";
import type {
  CacheRegion,
  Mixer,
  MixerPart,
  RowShape,
  SequenceSpan,
  StateRegion,
} from "./mixer.ts";
import { MLA } from "./mla.ts";

/** Every mixer kind, by name. */
export const MIXERS: Readonly<Record<MixerName, MixerPart>> = {
  gqa: GQA,
  mla: MLA,
  kda: KDA,
  csa: CSA,
  gdn: GDN,
};

/** The mixer kind of layer `layer`. */
export function mixerPartOf(cfg: ModelConfig, layer: number): MixerPart {
  return MIXERS[mixerOf(cfg, layer)];
}

/** Every main layer's index (the MTP layers, io/model_config.ts `mtpLayerIds`, are apart). */
function mainLayers(cfg: ModelConfig): number[] {
  return Array.from({ length: cfg.numLayers }, (_, l) => l);
}

/**
 * The mixer kinds `layers` (default: the main layers) run, each with its layers in order, in
 * order of first use.
 */
export function mixerGroups(cfg: ModelConfig, layers = mainLayers(cfg)): [MixerPart, number[]][] {
  const groups = new Map<MixerPart, number[]>();
  for (const l of layers) {
    const part = mixerPartOf(cfg, l);
    const layers = groups.get(part) ?? [];
    layers.push(l);
    groups.set(part, layers);
  }
  return [...groups];
}

/**
 * Bytes of the per-sequence mixer state of each of `layers` (default: the main layers) at `ctx`
 * positions, layer by layer.
 */
export function mixerStateBytes(
  cfg: ModelConfig,
  ctx: number,
  maxBatch: number,
  layers = mainLayers(cfg),
): number[] {
  return layers.map((l) => mixerPartOf(cfg, l).stateBytes(cfg, l, ctx, maxBatch));
}

/**
 * Per main layer, the position-indexed runs its state region starts with at `ctx` positions
 * ({@link MixerPart.rowRuns}; none where the mixer lends nothing).
 */
export function mixerRowRuns(cfg: ModelConfig, ctx: number, maxBatch: number): RowShape[][] {
  return mainLayers(cfg).map((l) => mixerPartOf(cfg, l).rowRuns?.(cfg, l, ctx, maxBatch) ?? []);
}

/** Bytes of the scratch of every mixer kind `layers` (default: the main layers) run. */
export function mixerScratchBytes(
  cfg: ModelConfig,
  ctx: number,
  maxBatch: number,
  layers = mainLayers(cfg),
): number {
  return mixerGroups(cfg, layers).reduce(
    (s, [part, layers]) => s + part.scratchBytes(cfg, layers, ctx, maxBatch),
    0,
  );
}

/**
 * The mixers of every layer of one model (or of `layers`, its MTP layers): each layer runs its
 * own kind's, on the state of the selected one of `sequences` sequences.
 */
export class LayerMixers implements Mixer {
  #byLayer: Mixer[] = [];
  #all: Mixer[] = [];
  #hidden: number;

  constructor(
    ops: Ops,
    arena: Arena,
    cfg: ModelConfig,
    maxBatch: number,
    maxCtx: number,
    sequences: number,
    layers = mainLayers(cfg),
  ) {
    this.#hidden = cfg.hiddenSize;
    for (const [part, own] of mixerGroups(cfg, layers)) {
      const mixer = part.create(ops, arena, cfg, own, maxBatch, maxCtx, sequences);
      this.#all.push(mixer);
      for (const l of own) this.#byLayer[l] = mixer;
    }
  }

  /** Runs layer `layer`'s own mixer. */
  forward(layer: number, lw: LayerWeights, h: number, out: number, nb: number, pos: number): void {
    this.#byLayer[layer].forward(layer, lw, h, out, nb, pos);
  }

  /**
   * Runs layer `layer`'s mixer on the rows of several sequences (`spans` one after another in h
   * and out): at once where the mixer can (each projection weight read once), else each
   * sequence's rows in turn on its own state.
   */
  forwardSpans(
    layer: number,
    lw: LayerWeights,
    h: number,
    out: number,
    spans: readonly SequenceSpan[],
  ): void {
    const mixer = this.#byLayer[layer];
    if (mixer.forwardSpans && spans.length > 1) {
      mixer.forwardSpans(layer, lw, h, out, spans);
      return;
    }
    const d = this.#hidden;
    let r0 = 0;
    for (const s of spans) {
      mixer.select(s.seq);
      mixer.forward(layer, lw, h + r0 * d * 4, out + r0 * d * 4, s.n, s.pos);
      r0 += s.n;
    }
  }

  /** Selects sequence `seq`'s state in every mixer. */
  select(seq: number): void {
    for (const m of this.#all) m.select(seq);
  }

  /** Lets every mixer refuse a position before any layer runs. */
  begin(pos: number, nb: number): void {
    for (const m of this.#all) m.begin?.(pos, nb);
  }

  /** The position-indexed caches of every mixer, grouped by kind in order of first use. */
  cacheRegions(): CacheRegion[] {
    return this.#all.flatMap((m) => m.cacheRegions());
  }

  /** The recurrent states of every mixer, grouped by kind in order of first use. */
  stateRegions(): StateRegion[] {
    return this.#all.flatMap((m) => m.stateRegions?.() ?? []);
  }

  /** Declares the restored recurrent states to be at position `pos`. */
  resumeAt(pos: number): void {
    for (const m of this.#all) m.resumeAt?.(pos);
  }
}
