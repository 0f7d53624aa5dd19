/**
 * The memory plan: how a budget is split between what must stay resident (embeddings, KV cache,
 * scratch), the trunk (pinned layers + ring slots) and the expert cache. The arena is sized from
 * it once and never grows.
 *
 * Trunk bytes come before expert bytes: every trunk byte is used by every token, an expert byte
 * by a fraction top_k / experts of them.
 *
 * @module
 */
import { alignUp } from "../io/format.ts";
import type { Container } from "../io/container.ts";
import { KERNEL_RESERVED_BYTES } from "../wasm/mod.ts";
import { PAGE } from "./arena.ts";
import { type ModelConfig, MTP_DRAFT_LAYERS } from "../io/model_config.ts";
import { quantArenaBytes } from "./quant_matmul.ts";
import { runStateSizes } from "./run_state.ts";
import { lendableCount } from "./kv_lending.ts";
import { mixerRowRuns } from "./parts/mod.ts";
import { lookaheadScratchBytes } from "./stream/lookahead.ts";
import { formatBytes } from "./units.ts";
import { CTL_BYTES } from "./pool_protocol.ts";

/** The sizes the planner needs from a container. */
export interface PlanInput {
  cfg: ModelConfig;
  /** Bytes of the resident globals region (embedding, final norm, LM head). */
  globalsBytes: number;
  /** Bytes of each layer's trunk run (4 KiB multiples). */
  layerBytes: number[];
  /** Record stride of the expert banks (0 for a dense model). */
  expertStride: number;
  /** Expert records in the whole model. */
  totalExperts: number;
  /** Bytes of all routers and selection biases (kept resident when the lookahead is on). */
  routerBytes: number;
  /** Bytes of VQ3R codebooks and prepared (quantised / table) inputs for a prefill chunk. */
  quantBytes?: (maxBatch: number) => number;
  /**
   * The MTP layer runs (`--spec mtp`): its bank joins the expert cache, and its state, scratch
   * and run (`mtpRunBytes`) are room the cache lends it while it drafts ({@link MemoryPlan}).
   */
  mtp?: boolean;
  /** Bytes of the drafting MTP layer's trunk run (with `mtp`). */
  mtpRunBytes?: number;
}

/**
 * The planner's view of an opened container; with `mtp`, the drafting MTP layer's run and bank
 * too (its bank follows the main layers' in the expert store).
 */
export function planInput(c: Container, mtp = false): PlanInput {
  const m = c.manifest;
  const extra = mtp ? MTP_DRAFT_LAYERS : 0;
  const banks = [...m.experts, ...m.mtp?.experts.slice(0, extra) ?? []].filter((b) => b !== null);
  let routerBytes = 0;
  for (const run of m.trunk.layers) {
    for (const t of ["router", "router_bias", "router_b"]) {
      routerBytes += run.tensors[t]?.bytes ?? 0;
    }
  }
  return {
    cfg: c.config,
    globalsBytes: m.trunk.globals.region.bytes,
    layerBytes: m.trunk.layers.map((l) => l.bytes),
    expertStride: Math.max(0, ...banks.map((b) => b.stride)),
    totalExperts: banks.reduce((a, b) => a + b.count, 0),
    routerBytes,
    quantBytes: (maxBatch) => quantArenaBytes(c, maxBatch),
    mtp,
    mtpRunBytes: mtp ? m.mtp?.layers[MTP_DRAFT_LAYERS - 1]?.bytes ?? 0 : undefined,
  };
}

/** Knobs of a plan. */
export interface PlanOptions {
  /** Arena budget in bytes; undefined = whole model resident. */
  budget?: number;
  /** Context length the KV cache is sized for. */
  ctx: number;
  /** Most tokens per forward call (prefill chunk). */
  maxBatch: number;
  /** Ring slots wanted for unpinned layers (2 enables read-ahead). */
  ringSlots?: number;
  /** Cap on expert slots (for tests and benchmarks); the budget still bounds it. */
  expertSlots?: number;
  /** The router lookahead is on: routers stay resident. */
  lookahead?: boolean;
  /** Sequences run together, each with its own mixer state (default 1; engine/batch.ts). */
  sequences?: number;
  /**
   * Lend the KV cache's unwritten rows to the expert cache (engine/kv_lending.ts; default on).
   * Off, or with {@link expertSlots} capping the cache, nothing is lent.
   */
  lendKv?: boolean;
}

/** The outcome: every size the engine allocates. */
export interface MemoryPlan {
  budget: number;
  /** Bytes that do not depend on the budget: globals, KV cache, scratch, reserved. */
  fixedBytes: number;
  /** Bytes of the mixer state of all `sequences` (each sequence has every layer's). */
  kvBytes: number;
  /** Per layer: one sequence's KV cache at `ctx`, or its recurrent state (KDA), before page rounding. */
  layerStateBytes: number[];
  /** Sequences whose state the arena holds. */
  sequences: number;
  scratchBytes: number;
  /** The smallest budget that runs: fixed + one ring slot + 2 × top_k expert records. */
  floor: number;
  pinned: number;
  /** Trunk runs planned: every main layer's (the MTP layer's is in its room). */
  trunkLayers: number;
  ringSlots: number;
  ringSlotBytes: number;
  trunkBytes: number;
  expertSlots: number;
  expertBytes: number;
  /**
   * Expert slots lent to the cache at start from the KV cache's unwritten rows (its rows above
   * the context, engine/kv_lending.ts): the cache holds up to expertSlots + lentSlots records
   * while contexts are short, expertSlots when every sequence's context is full. Never more than
   * the records that do not fit in expertSlots.
   */
  lentSlots: number;
  /** Bytes of the lent slots (inside kvBytes, not beside it). */
  lentBytes: number;
  /** Expert records in the whole model. */
  totalExperts: number;
  /** Bytes the arena gets (≤ budget). */
  arenaBytes: number;
  /** Bytes one token touches: trunk + top_k records per MoE layer. */
  workingSetBytes: number;
  /** Budget at which everything is resident. */
  wholeModelBytes: number;
  /** Fraction of layer visits served by pinned layers: pinned / layers. */
  trunkHitRate: number;
  /**
   * Bytes of the MTP layer's room (`--spec mtp`: every sequence's MTP state, its scratch and its
   * trunk run), 0 without. It is not resident: while the MTP layer drafts, the expert cache lends
   * it its top `mtpLoanSlots` slots, and takes them back while the gate holds drafting off, so
   * a layer that does not pay takes no room from the main model (a model without experts keeps
   * the room resident instead, in fixedBytes).
   */
  mtpRoomBytes: number;
  /** Expert slots lent as the MTP layer's room while it drafts. */
  mtpLoanSlots: number;
}

/**
 * Bytes of the room the drafting MTP layer uses at `ctx`: `sequences` copies of its state, its
 * scratch (engine/run_state.ts) and its trunk run of `runBytes`, each page-rounded as allocated.
 */
export function mtpRoomBytes(
  cfg: ModelConfig,
  ctx: number,
  maxBatch: number,
  sequences: number,
  runBytes: number,
): number {
  const s = runStateSizes(cfg, ctx, maxBatch, true);
  const state = s.layerStateBytes.slice(cfg.numLayers).reduce((a, b) => a + alignUp(b, PAGE), 0);
  return sequences * state + s.scratch.mtp + alignUp(runBytes, PAGE);
}

/** Bytes of every main layer's mixer state (KV cache, latent rows or recurrent state) at `ctx`. */
export function kvCacheBytes(cfg: ModelConfig, ctx: number, maxBatch: number): number {
  return runStateSizes(cfg, ctx, maxBatch).layerStateBytes.reduce(
    (s, b) => s + alignUp(b, PAGE),
    0,
  );
}

/**
 * Regions allocated besides the parts' declared ones, each rounded to a page: the codebooks, the
 * lookahead's logits, prepared inputs made on first use, and the 64-byte aligned absorbed
 * matrices between them.
 */
const SLACK_PAGES = 32;

/**
 * Bytes of the run state's scratch (every part's but the MTP layer's, which is in its room), the
 * kernels' reserved region and control.
 */
export function scratchBytes(cfg: ModelConfig, ctx: number, maxBatch: number): number {
  const s = runStateSizes(cfg, ctx, maxBatch).scratch;
  return s.skeleton + s.residual + s.mixers + s.feedForward + SLACK_PAGES * PAGE +
    KERNEL_RESERVED_BYTES + CTL_BYTES;
}

/**
 * Where the budget would hold a shorter context than `ctx` asks for, the longest one (floors grow
 * with the context), as the tail of a below-the-floor refusal; else nothing.
 */
function contextHint(budget: number, ctx: number, floorAt: (ctx: number) => number): string {
  if (ctx <= 1 || floorAt(1) > budget) return "";
  let lo = 1, hi = ctx - 1;
  while (lo < hi) {
    const mid = Math.ceil((lo + hi) / 2);
    if (floorAt(mid) <= budget) lo = mid;
    else hi = mid - 1;
  }
  return `; the context is what does not fit: this budget holds a context of at most ${lo} (-c ${lo})`;
}

/** Splits `opts.budget` (or the whole model) into the sizes the engine allocates. */
export function planMemory(input: PlanInput, opts: PlanOptions): MemoryPlan {
  const { cfg, layerBytes, expertStride, totalExperts } = input;
  const sequences = opts.sequences ?? 1;
  if (!(Number.isInteger(sequences) && sequences >= 1 && sequences <= opts.maxBatch)) {
    throw new Error(
      `${sequences} parallel sequences: expected 1 to ${opts.maxBatch} (the prefill chunk, which ` +
        `bounds the rows of one pass)`,
    );
  }
  const mtp = input.mtp ?? false;
  const topK = cfg.moe?.topK ?? 0;
  const minExperts = totalExperts > 0 ? Math.min(totalExperts, 2 * topK) : 0;
  const trunkAll = layerBytes.reduce((a, b) => a + b, 0);
  const maxLayer = Math.max(0, ...layerBytes);
  const routers = opts.lookahead
    ? input.routerBytes + cfg.numLayers * 64 + lookaheadScratchBytes(cfg)
    : 0;
  // The MTP layer's room, lent by the expert cache (in whole slots), or resident without one.
  const roomAt = (ctx: number) =>
    mtp ? mtpRoomBytes(cfg, ctx, opts.maxBatch, sequences, input.mtpRunBytes ?? 0) : 0;
  const loanAt = (ctx: number) => expertStride > 0 ? Math.ceil(roomAt(ctx) / expertStride) : 0;
  // What stays resident at a context of `ctx`: the KV cache and the RoPE tables grow with it.
  const residentAt = (ctx: number) => {
    const kv = sequences * kvCacheBytes(cfg, ctx, opts.maxBatch);
    const scratch = scratchBytes(cfg, ctx, opts.maxBatch) +
      (input.quantBytes?.(opts.maxBatch) ?? 0);
    const room = expertStride > 0 ? 0 : roomAt(ctx);
    return { kv, scratch, fixed: input.globalsBytes + kv + scratch + routers + room };
  };
  const floorAt = (ctx: number) =>
    alignUp(residentAt(ctx).fixed + maxLayer + (minExperts + loanAt(ctx)) * expertStride, 65536);
  const { kv: kvBytes, scratch, fixed: fixedBytes } = residentAt(opts.ctx);
  const layerStateBytes = runStateSizes(cfg, opts.ctx, opts.maxBatch).layerStateBytes;
  const floor = floorAt(opts.ctx);
  const loan = loanAt(opts.ctx);
  const wholeModelBytes = fixedBytes + trunkAll + (totalExperts + loan) * expertStride;
  // The arena is made of 64 KiB wasm pages: a budget is honoured to the page.
  const budget = opts.budget !== undefined
    ? Math.floor(opts.budget / 65536) * 65536
    : alignUp(wholeModelBytes, 65536);
  if (budget < floor) {
    throw new Error(
      `budget ${formatBytes(opts.budget ?? budget)} is below the floor of ${formatBytes(floor)} ` +
        `(resident ${formatBytes(fixedBytes)}: KV cache ${formatBytes(kvBytes)} at a context of ` +
        `${opts.ctx}, scratch ${formatBytes(scratch)} for ${opts.maxBatch}-token passes; + one ` +
        `trunk slot ${formatBytes(maxLayer)} + ${minExperts} expert records of ` +
        `${formatBytes(expertStride)})` + contextHint(budget, opts.ctx, floorAt),
    );
  }
  const wanted = opts.ringSlots ?? 2;
  const trunkIn = (forTrunk: number) => {
    let pinned = 0, ringSlots = 0, ringSlotBytes = 0;
    if (trunkAll <= forTrunk) {
      pinned = layerBytes.length;
    } else {
      // Pin the longest prefix whose pinned bytes plus the ring (sized for the largest remaining
      // layer) fit: the slot size depends on the prefix, so search the prefix, not the slot.
      for (const slots of [wanted, 1]) {
        let prefix = 0;
        for (let n = 0; n < layerBytes.length; n++) {
          prefix += n > 0 ? layerBytes[n - 1] : 0;
          const slotBytes = Math.max(...layerBytes.slice(n));
          if (prefix + Math.min(slots, layerBytes.length - n) * slotBytes <= forTrunk) {
            pinned = n;
            ringSlots = Math.min(slots, layerBytes.length - n);
            ringSlotBytes = slotBytes;
          }
        }
        if (ringSlots > 0) break;
      }
    }
    const bytes = layerBytes.slice(0, pinned).reduce((a, b) => a + b, 0) +
      ringSlots * ringSlotBytes;
    return { pinned, ringSlots, ringSlotBytes, bytes };
  };
  // The trunk as without the MTP layer; only where what is left cannot lend its room as well
  // as keep 2 × top_k records does the MTP layer's loan come out of the trunk.
  let trunk = trunkIn(budget - fixedBytes - minExperts * expertStride);
  if (budget - fixedBytes - trunk.bytes < (minExperts + loan) * expertStride) {
    trunk = trunkIn(budget - fixedBytes - (minExperts + loan) * expertStride);
  }
  const { pinned, ringSlots, ringSlotBytes, bytes: trunkBytes } = trunk;
  const left = budget - fixedBytes - trunkBytes;
  let expertSlots = expertStride > 0
    ? Math.min(totalExperts + loan, Math.floor(left / expertStride))
    : 0;
  if (opts.expertSlots !== undefined) {
    expertSlots = Math.max(minExperts + loan, Math.min(expertSlots, opts.expertSlots));
  }
  const expertBytes = expertSlots * expertStride;
  const lentSlots = expertStride > 0 && (opts.lendKv ?? true) && opts.expertSlots === undefined
    ? Math.min(
      // Records past every expert (plus the MTP loan's room) would hold nothing.
      Math.max(0, totalExperts + loan - expertSlots),
      lendableCount(mixerRowRuns(cfg, opts.ctx, opts.maxBatch), expertStride, sequences),
    )
    : 0;
  const moeLayers = cfg.layerKinds.filter((k) => k === "moe").length;
  return {
    budget,
    fixedBytes,
    kvBytes,
    layerStateBytes,
    sequences,
    scratchBytes: scratch,
    floor,
    pinned,
    trunkLayers: layerBytes.length,
    ringSlots,
    ringSlotBytes,
    trunkBytes,
    expertSlots,
    expertBytes,
    lentSlots,
    lentBytes: lentSlots * expertStride,
    totalExperts,
    arenaBytes: fixedBytes + trunkBytes + expertBytes,
    workingSetBytes: trunkAll + moeLayers * topK * expertStride,
    wholeModelBytes,
    trunkHitRate: layerBytes.length ? pinned / layerBytes.length : 1,
    mtpRoomBytes: roomAt(opts.ctx),
    mtpLoanSlots: loan,
  };
}

/**
 * The share of the lookahead's guesses that their layer used, measured by `bench stream` with
 * trained routers (one guess per layer, docs/LEARNED.md): what the planner expects of a guess
 * before anything ran. Random routers score far less; the gate (engine/stream/lookahead.ts) then
 * stops reading guesses, but the routers stay resident.
 */
export const GUESS_PRECISION = 0.86;

/** What keeping the routers resident for the lookahead gains and costs per token, in bytes. */
export interface LookaheadWeighing {
  /** Guesses per MoE layer and token. */
  guesses: number;
  /** Bytes the resident routers take from the trunk and the expert cache. */
  routerBytes: number;
  /**
   * Expert reads per token the guesses may take off the wait path (read while attention runs):
   * per MoE layer, the guesses that miss the cache and are right ({@link GUESS_PRECISION}).
   */
  hiddenBytes: number;
  /** Reads per token the routers add by what they displace: pinned trunk layers, cached records. */
  displacedBytes: number;
  /** The lookahead is worth its routers: hiddenBytes > displacedBytes. */
  on: boolean;
}

/**
 * Bytes one token is expected to read under `plan`: every trunk layer not pinned, and per MoE
 * layer its top_k records at the miss rate of a cache of expertSlots of totalExperts (routing taken
 * as uniform, which both plans weighed share).
 */
export function readBytesPerToken(input: PlanInput, plan: MemoryPlan): number {
  const trunk = input.layerBytes.slice(plan.pinned).reduce((a, b) => a + b, 0);
  return trunk + expertMisses(input, plan) * (input.cfg.moe?.topK ?? 0) * input.expertStride;
}

/** Expected misses per MoE layer and routed expert under `plan`, summed over MoE layers. */
function expertMisses(input: PlanInput, plan: MemoryPlan): number {
  if (plan.totalExperts === 0) return 0;
  const moeLayers = input.cfg.layerKinds.filter((k) => k === "moe").length;
  return moeLayers * (1 - plan.expertSlots / plan.totalExperts);
}

/**
 * Weighs a lookahead of `guesses` per MoE layer: `withIt` is the plan with its routers resident,
 * `without` the same budget's plan without them. The guesses hide at most what they read in time;
 * the routers' bytes cost what they displace, read again every token. Deterministic: sizes only.
 */
export function weighLookahead(
  input: PlanInput,
  without: MemoryPlan,
  withIt: MemoryPlan,
  guesses: number,
): LookaheadWeighing {
  const hiddenBytes = expertMisses(input, withIt) * guesses * GUESS_PRECISION * input.expertStride;
  const displacedBytes = Math.max(
    0,
    readBytesPerToken(input, withIt) - readBytesPerToken(input, without),
  );
  return {
    guesses,
    routerBytes: withIt.fixedBytes - without.fixedBytes,
    hiddenBytes,
    displacedBytes,
    on: hiddenBytes > displacedBytes,
  };
}

/** The most sequences a server runs together when none is asked for. */
export const MAX_DEFAULT_PARALLEL = 4;

/**
 * The sequences a server runs together when none is asked for: the most, up to
 * {@link MAX_DEFAULT_PARALLEL}, whose extra state (every sequence past the first holds its own
 * KV cache or recurrent state) takes at most an eighth of the budget (of the whole model when
 * resident) and still plans. Beyond RAM, what a batch saves is reads, and the expert cache it
 * would shrink is what saves reads too.
 */
export function defaultParallel(input: PlanInput, opts: PlanOptions): number {
  const one = kvCacheBytes(input.cfg, opts.ctx, opts.maxBatch);
  const budget = opts.budget ?? planMemory(input, { ...opts, sequences: 1 }).wholeModelBytes;
  for (let n = Math.min(MAX_DEFAULT_PARALLEL, opts.maxBatch); n > 1; n--) {
    if ((n - 1) * one > budget / 8) continue;
    try {
      planMemory(input, { ...opts, sequences: n });
      return n;
    } catch {
      // Below the floor with n sequences' state: try fewer.
    }
  }
  return 1;
}
