/**
 * Opening a container for inference: plan the memory, size the arena once, start the worker pool
 * and the reader, pin what the plan pins, and wire the trunk ring and the expert store into the
 * family's forward pass.
 *
 * @module
 */
import { type Container, type ExpertBank, type LayerRun } from "../io/container.ts";
import { openContainer } from "./container.ts";
import { CACHE_POLICIES, type CachePolicy, ExpertCache } from "./stream/expert_cache.ts";
import { type BankFiles, DEFAULT_READAHEAD_DEPTH, ExpertStore } from "./stream/expert_store.ts";
import { hotListPath, hottest, readHotList } from "./stream/hot_list.ts";
import { checkRecord } from "../io/record_check.ts";
import { regionChecker } from "./stream/region_check.ts";
import { type BlockReader, openReader, ReadPriority, type ReadTicket } from "../io/reader.ts";
import { logReads, type ReadLog } from "../io/read_log.ts";
import { Timeline } from "./stream/timeline.ts";
import { TrunkRing } from "./stream/trunk_ring.ts";
import { KvLender, lendableSlots, pickLent } from "./kv_lending.ts";
import { loadKernelModule } from "../wasm/mod.ts";
import { Arena, PAGE } from "./arena.ts";
import { alignUp } from "../io/format.ts";
import { type GlobalTensor, type ModelConfig, MTP_DRAFT_LAYERS } from "../io/model_config.ts";
import { loadCodebooks } from "./codebooks.ts";
import { Lookahead } from "./stream/lookahead.ts";
import { embedRows } from "./embedding.ts";
import { residentRouters, RunObservers } from "./observers.ts";
import { Ops } from "./ops.ts";
import { checkLogits } from "./finite_check.ts";
import {
  defaultParallel,
  type LookaheadWeighing,
  type MemoryPlan,
  planInput,
  planMemory,
  weighLookahead,
} from "./planner.ts";
import { formatBytes } from "./units.ts";
import { defaultThreads, Pool } from "./pool.ts";
import { checkContext, crcSampleOf, prefillChunkOf, threadsOf } from "./run_limits.ts";
import { type ExpertSource, tensorRef } from "./weights.ts";
import { type GlobalWeights, type MtpRoom, type SequenceRows, Transformer } from "./transformer.ts";

export { DEFAULT_CRC_SAMPLE } from "./run_limits.ts";

/** How to run a container. Every option changes speed or memory, never the output. */
export interface RunOptions {
  /** Arena budget in bytes (default: the whole model resident). */
  budget?: number;
  /** Context length to size the KV cache for (default: min(model max, 4096)). */
  ctx?: number;
  /** Compute threads including the main thread (default: all cores). */
  threads?: number;
  /**
   * Most prompt tokens per forward call (chunked prefill; default 128, or 512 at a context of
   * 8192 or more; at most 512).
   */
  prefillChunk?: number;
  /**
   * Sequences that can run together, each with its own KV cache or recurrent state in the arena
   * (default 1; engine/batch.ts runs them, `serve --parallel`); "auto": as many as the planner
   * gives the budget room for (engine/planner.ts `defaultParallel`).
   */
  parallel?: number | "auto";
  /** Expert cache policy (default decay, engine/stream/expert_cache.ts). */
  cache?: CachePolicy;
  /**
   * Expert reads kept in flight after the router picks (default {@link DEFAULT_READAHEAD_DEPTH};
   * 0 = read on demand).
   */
  readaheadDepth?: number;
  /** Ring slots for unpinned trunk layers (default 2, which enables trunk read-ahead). */
  ringSlots?: number;
  /** Read the next unpinned trunk layer while the current one computes (default true). */
  trunkReadahead?: boolean;
  /** Cap on expert slots (tests, benchmarks); the cache then borrows nothing. */
  expertSlots?: number;
  /**
   * Lend the KV cache's unwritten rows to the expert cache while contexts are short (default
   * true; engine/kv_lending.ts).
   */
  lendKv?: boolean;
  /** Check each expert record's CRC32 and each trunk region's CRC32 as it lands. */
  verify?: boolean;
  /**
   * Share of expert record landings whose payload CRC32 is checked besides the always-on header
   * check (0..1; default {@link DEFAULT_CRC_SAMPLE}; `verify` checks every one).
   */
  crcSample?: number;
  /** Directories holding bank shards: expert e in shard e % n (see tools/split_banks.ts). */
  shards?: string[];
  /** Reader kind: "direct" (O_DIRECT shim), "buffered", or "fallback" (node:fs). */
  io?: "direct" | "buffered" | "fallback";
  /** Reader threads of the shim: reads in flight at the disk (default 4, io/reader.ts). */
  ioThreads?: number;
  /**
   * Speculatively read the next layer's top-N predicted experts during decode (0 = off; default 1
   * while experts stream, 0 when all fit).
   */
  lookahead?: number;
  /** Warm the expert cache from the learned hot list beside the container (default true). */
  hotList?: boolean;
  /** Add this run's expert use counts to the hot list when the model closes. */
  learn?: boolean;
  /** Write one JSON line per (token, MoE layer) with the routed experts to this file. */
  trace?: string;
  /**
   * Load progress: called with the bytes read so far and the bytes the load reads in all (the
   * globals, the pinned trunk layers and the experts warmed), once before the first read and as
   * reads land.
   */
  onLoad?: (done: number, total: number) => void;
  /** Log every read (file, offset, length, priority, forward position) here; off by default. */
  readLog?: ReadLog;
  /** Keep a timeline of where each pass's time goes (`transformer.timeline`); off by default. */
  timeline?: boolean;
  /** No notices on stderr. */
  quiet?: boolean;
  /**
   * Run the container's multi-token-prediction layer beside every pass, so it can draft
   * (`--spec mtp`): the plan charges its trunk run, experts, cache and scratch.
   */
  mtp?: boolean;
}

/** An open model: its plan, its forward pass and the counters behind the stats block. */
export class Model {
  readonly cfg: ModelConfig;
  readonly container: Container;
  readonly plan: MemoryPlan;
  readonly transformer: Transformer;
  readonly arena: Arena;
  readonly pool: Pool;
  readonly reader: BlockReader;
  readonly trunk: TrunkRing;
  /** Null for dense models. */
  readonly experts: ExpertStore | null;
  /** What the KV cache lends the expert cache; null when it lends nothing. */
  readonly lender: KvLender | null;
  readonly prefillChunk: number;
  /** Positions the KV cache holds. */
  readonly maxContext: number;
  /** Bytes read while opening (globals, pinned layers, warmed experts); not counted per token. */
  readonly loadBytes: number;
  /** Trace, hot-list learning and lookahead hooks on the MoE layers. */
  readonly observers: RunObservers;
  readonly #readLog: ReadLog | undefined;
  #closed = false;

  private constructor(init: {
    container: Container;
    plan: MemoryPlan;
    arena: Arena;
    pool: Pool;
    reader: BlockReader;
    trunk: TrunkRing;
    experts: ExpertStore | null;
    lender: KvLender | null;
    transformer: Transformer;
    prefillChunk: number;
    maxContext: number;
    observers: RunObservers;
    loadBytes: number;
    readLog: ReadLog | undefined;
  }) {
    this.container = init.container;
    this.cfg = init.container.config;
    this.plan = init.plan;
    this.arena = init.arena;
    this.pool = init.pool;
    this.reader = init.reader;
    this.trunk = init.trunk;
    this.experts = init.experts;
    this.lender = init.lender;
    this.transformer = init.transformer;
    this.prefillChunk = init.prefillChunk;
    this.maxContext = init.maxContext;
    this.observers = init.observers;
    this.loadBytes = init.loadBytes;
    this.#readLog = init.readLog;
  }

  /**
   * Opens the container at `path` under the memory plan `opts` asks for, in named steps: plan,
   * arena and workers, resident globals, trunk ring, expert store, lookahead, forward pass (its
   * attention state), the KV cache's unwritten rows lent to the expert cache, warm-up.
   */
  static async open(path: string, opts: RunOptions = {}): Promise<Model> {
    // Run options that size things are refused before anything is read or allocated.
    prefillChunkOf(opts.prefillChunk);
    checkContext(opts.ctx);
    const sample = opts.verify ? 1 : crcSampleOf(opts.crcSample);
    const notice = (line: string) => opts.quiet || console.error(line);
    const threads = threadsOf(opts.threads, defaultThreads(), notice);
    const container = openContainer(path);
    const cfg = container.config;
    if (opts.mtp) checkMtp(path, container);
    const { plan, lookahead, ctx, prefillChunk } = planRun(container, opts);
    // With MTP drafts, the drafting MTP layer's bank follows the main layers' (its run is read
    // into its room, mtpRoom).
    const m = container.manifest, extra = opts.mtp ? MTP_DRAFT_LAYERS : 0;
    const runs = m.trunk.layers;
    const banks = [...m.experts, ...m.mtp?.experts.slice(0, extra) ?? []];
    const arena = new Arena(plan.arenaBytes);
    loadCodebooks(container, arena);
    const pool = await Pool.create(arena, await loadKernelModule(), threads);
    const reader = logReads(
      openReader(arena.memory, {
        direct: opts.io !== "buffered" && opts.io !== "fallback",
        forceFallback: opts.io === "fallback",
        threads: opts.ioThreads,
        quiet: opts.quiet,
      }),
      opts.readLog,
    );
    try {
      const trunkFile = reader.open(container.trunkPath);
      const checkRegion = opts.verify ? regionChecker(arena, container) : undefined;
      const warm = warmList(container, banks, plan, opts);
      const landed = loadMeter(container, runs, banks, plan, warm, opts.onLoad);
      const globals = readGlobals(arena, reader, trunkFile, container, landed, checkRegion);
      const trunk = new TrunkRing(arena, reader, trunkFile, runs, {
        pinned: plan.pinned,
        slots: plan.ringSlots,
        readahead: opts.trunkReadahead ?? true,
        check: checkRegion,
        landed,
      });
      const experts = plan.totalExperts > 0
        ? openExpertStore(arena, reader, container, banks, plan, opts, sample)
        : null;
      const ops = new Ops(arena, pool);
      const observers = new RunObservers(container, opts);
      if (experts && lookahead > 0) {
        const routers = residentRouters(arena, container);
        observers.lookahead = new Lookahead(
          ops,
          arena,
          cfg,
          routers,
          experts,
          lookahead,
          (tokens, dst) => embedRows(arena, globals.embed, tokens, dst),
        );
      }
      const transformer = new Transformer({
        cfg,
        arena,
        ops,
        trunk,
        experts: experts ?? noExperts,
        globals,
        maxBatch: prefillChunk,
        maxCtx: ctx,
        sequences: plan.sequences,
        mtp: opts.mtp
          ? mtpRoom(
            arena,
            trunk,
            m.mtp!.layers[extra - 1],
            runs.length,
            plan,
            experts,
            cfg.moe?.topK ?? 1,
          )
          : undefined,
        timeline: opts.timeline ? new Timeline(() => reader.diskStats()?.busyMs ?? 0) : undefined,
      });
      transformer.moeObservers.push(observers.observe);
      if (observers.lookahead) transformer.passObservers.push(observers.lookahead);
      const lender = experts && plan.lentSlots > 0 ? lendKv(transformer, experts, plan) : null;
      experts?.warm(warm, landed);
      if (!opts.quiet) console.error(planLine(plan));
      const loadBytes = container.manifest.trunk.globals.region.bytes + trunk.stats.bytes +
        (experts?.stats.bytesRead ?? 0);
      trunk.resetStats();
      experts?.resetStats();
      return new Model({
        container,
        plan,
        arena,
        pool,
        reader,
        trunk,
        experts,
        lender,
        transformer,
        prefillChunk,
        maxContext: ctx,
        observers,
        loadBytes,
        readLog: opts.readLog,
      });
    } catch (e) {
      reader.close();
      pool.close();
      throw e;
    }
  }

  /** Logits of the last of `tokens` run at positions pos.., or of all of them. */
  forward(tokens: number[], pos: number, allLogits = false): Float32Array {
    return this.forwardBatch([{ seq: 0, tokens, pos, allLogits }])[0];
  }

  /**
   * One pass over the rows of several sequences (see Transformer.forwardBatch): per sequence,
   * the logits of its last token, or of all of them; `stop` may end it between layers
   * (Transformer.forwardBatch).
   */
  forwardBatch(batch: readonly SequenceRows[], stop?: () => boolean): Float32Array[] {
    if (this.#readLog) this.#readLog.position = batch[0]?.pos ?? 0;
    this.observers.lookahead?.beginPass(batch.map((r) => r.tokens.length));
    const logits = this.transformer.forwardBatch(batch, stop);
    batch.forEach((r, i) =>
      checkLogits(this, r.tokens, r.pos, r.allLogits ?? false, logits[i], r.seq)
    );
    return logits;
  }

  /** Stops the workers and reader threads. Idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    // Every part is closed even when one fails (a failed read must not leave threads running).
    let failure: unknown;
    const steps = [
      () => this.observers.close(),
      () => this.trunk.abandon(),
      () => this.experts?.abandon(),
      () => this.reader.close(),
      () => this.pool.close(),
    ];
    for (const step of steps) {
      try {
        step();
      } catch (e) {
        failure ??= e;
      }
    }
    if (failure) throw failure;
  }
}

/**
 * The least budget a run of `container` under `opts` starts with: its plan's floor without the
 * lookahead's resident routers, which a run at the floor goes without (see {@link planRun}).
 */
export function runFloor(container: Container, opts: RunOptions = {}): number {
  return planRun(container, { ...opts, budget: undefined, lookahead: 0 }).plan.floor;
}

/** The memory plan of a run, with the lookahead depth it leaves room for. */
export function planRun(
  container: Container,
  opts: RunOptions,
): {
  plan: MemoryPlan;
  lookahead: number;
  ctx: number;
  prefillChunk: number;
  /** Why the default lookahead is on or off, when it was weighed (none was asked for). */
  lookaheadWeighing: LookaheadWeighing | null;
} {
  const ctx = Math.min(opts.ctx ?? 4096, container.config.maxPositions);
  const prefillChunk = prefillChunkOf(opts.prefillChunk, ctx);
  const input = planInput(container, opts.mtp);
  const sequences = opts.parallel === "auto"
    ? defaultParallel(input, { budget: opts.budget, ctx, maxBatch: prefillChunk })
    : opts.parallel;
  const planFor = (lookahead: number) =>
    planMemory(input, {
      budget: opts.budget,
      ctx,
      maxBatch: prefillChunk,
      sequences,
      ringSlots: opts.ringSlots,
      expertSlots: opts.expertSlots,
      lendKv: opts.lendKv,
      lookahead: lookahead > 0,
    });
  let lookahead = opts.lookahead ?? 0;
  let plan = planFor(lookahead);
  let lookaheadWeighing: LookaheadWeighing | null = null;
  if (opts.lookahead === undefined && defaultLookahead(plan) > 0) {
    try {
      const withIt = planFor(defaultLookahead(plan));
      // Its routers take bytes from the trunk or the expert cache: on only where the reads the
      // guesses hide outweigh the reads what they displaced adds.
      lookaheadWeighing = weighLookahead(input, plan, withIt, defaultLookahead(withIt));
      if (lookaheadWeighing.on) {
        plan = withIt;
        lookahead = lookaheadWeighing.guesses;
      }
    } catch {
      // A budget at the floor has no room for the resident routers: no lookahead then.
    }
  }
  return { plan, lookahead, ctx, prefillChunk, lookaheadWeighing };
}

/**
 * Refuses `--spec mtp` on the container at `path` when it has no multi-token-prediction layers,
 * or a residual stream the MTP drafter does not run, naming the model.
 */
export function checkMtp(path: string, container: Container): void {
  const cfg = container.config;
  if (!container.manifest.mtp) {
    throw new Error(
      `${path}: --spec mtp needs the model's multi-token-prediction layers, and this container ` +
        `of ${cfg.modelType} has none (its checkpoint ships none, or it was packed with ` +
        `--no-mtp or by a sluice that skipped them: pack it again); use --spec ngram or --draft`,
    );
  }
  if (cfg.residual) {
    throw new Error(
      `${path}: --spec mtp: the MTP layers of ${cfg.modelType} (${cfg.residual.kind} residual ` +
        `stream) are not supported; use --spec ngram or --draft`,
    );
  }
}

/**
 * The MTP layer's room (engine/transformer.ts MtpRoom): with experts, the top
 * `plan.mtpLoanSlots` expert slots, lent while the layer drafts and taken back while it does not,
 * so that drafting that does not pay costs the main model no cache room (at least `keep` slots
 * stay, one token's experts; the planner leaves 2 × top_k); without experts, resident room.
 * Its state and buffers come first, its trunk run (re-read on every take) last.
 */
function mtpRoom(
  arena: Arena,
  trunk: TrunkRing,
  run: LayerRun,
  layer: number,
  plan: MemoryPlan,
  experts: ExpertStore | null,
  keep: number,
): MtpRoom {
  const state = plan.mtpRoomBytes - alignUp(run.bytes, PAGE);
  const open = (offset: number) => {
    arena.u8(offset, state).fill(0);
    return {
      arena: arena.within(offset, state),
      weights: trunk.readInto(layer, run, offset + state),
    };
  };
  if (!experts || plan.mtpLoanSlots === 0) {
    const offset = arena.alloc("mtp layer (state, scratch, run)", plan.mtpRoomBytes);
    return { take: () => open(offset), give: () => false };
  }
  return {
    take: () => open(experts.loan(plan.mtpLoanSlots, keep)),
    give: () => {
      experts.repay();
      return true;
    },
  };
}

/** Bytes per read of the globals region, and most such reads in flight. */
const GLOBALS_PIECE_BYTES = 4 << 20;
const GLOBALS_WINDOW = 32;

/**
 * Reads the globals region (embedding, final norm, LM head, a residual stream's own) into the
 * arena, where it stays, telling `landed` as pieces land; `check` (--verify) CRC-checks it.
 */
function readGlobals(
  arena: Arena,
  reader: BlockReader,
  trunkFile: number,
  container: Container,
  landed: (bytes: number) => void,
  check?: (layer: "globals", at: number) => void,
): GlobalWeights {
  const region = container.manifest.trunk.globals.region;
  const gOff = arena.alloc("globals (embedding, final norm, LM head)", region.bytes);
  // In pieces, a window of them in flight: every reader thread works (one read of the whole
  // region is one thread's), and the load's progress moves as they land (an embedding and LM
  // head can be gigabytes).
  const inflight: [ReadTicket, number][] = [];
  const land = () => {
    const [ticket, bytes] = inflight.shift()!;
    reader.wait(ticket);
    landed(bytes);
  };
  try {
    for (let o = 0; o < region.bytes; o += GLOBALS_PIECE_BYTES) {
      const len = Math.min(GLOBALS_PIECE_BYTES, region.bytes - o);
      const t = reader.submit(trunkFile, gOff + o, len, region.offset + o, ReadPriority.DEMAND);
      inflight.push([t, len]);
      if (inflight.length >= GLOBALS_WINDOW) land();
    }
    while (inflight.length > 0) land();
  } catch (e) {
    throw new Error(`globals region: ${(e as Error).message}`);
  }
  check?.("globals", gOff);
  const rel = gOff - region.offset;
  const g = container.manifest.trunk.globals.tensors;
  const get = (t: GlobalTensor) => {
    const e = g[t];
    if (!e) throw new Error(`${container.dir}: manifest has no ${t} tensor`);
    return tensorRef(e, rel);
  };
  return {
    embed: get("embed"),
    finalNorm: get("final_norm"),
    lmHead: g.lm_head ? tensorRef(g.lm_head, rel) : get("embed"),
    get,
  };
}

/**
 * The expert cache and store over the container's banks (or their shards), `slots` records;
 * every landing gets its header checked, a random share `crcSample` its payload CRC too.
 */
function openExpertStore(
  arena: Arena,
  reader: BlockReader,
  container: Container,
  banks: (ExpertBank | null)[],
  plan: MemoryPlan,
  opts: RunOptions,
  crcSample: number,
): ExpertStore {
  const shards = opts.shards ?? [];
  const files: (BankFiles | null)[] = banks.map((bank) => {
    if (!bank) return null;
    const paths = shards.length > 0
      ? shards.map((dir) => `${dir}/${bank.file}`)
      : [container.expertBankPath(bank.layer)];
    return { bank, paths, handles: paths.map((p) => reader.open(p)) };
  });
  const cache = new ExpertCache({
    slots: plan.expertSlots + plan.lentSlots,
    policy: opts.cache ?? CACHE_POLICIES[0],
  });
  return new ExpertStore(arena, reader, files, cache, {
    lentSlots: plan.lentSlots,
    readaheadDepth: opts.readaheadDepth ?? DEFAULT_READAHEAD_DEPTH,
    check: (layer, expert, slot, file, fileOffset) => {
      const bank = banks[layer]!;
      checkRecord(
        arena.u8(slot, bank.stride),
        bank,
        layer,
        expert,
        file,
        fileOffset,
        crcSample >= 1 || Math.random() < crcSample,
      );
    },
  });
}

/**
 * Places the plan's lent slots in the unwritten tops of every sequence's position-indexed caches
 * (the ones the context reaches last) and lends them all: nothing is written yet. Each pass then
 * reserves its rows first (Transformer.reserveRows).
 */
function lendKv(transformer: Transformer, experts: ExpertStore, plan: MemoryPlan): KvLender {
  const room = Array.from({ length: plan.sequences }, (_, seq) =>
    lendableSlots(
      transformer.cacheRegions(seq).flatMap((r) =>
        r.rows === undefined ? [] : [{ offset: r.offset, rows: r.rows, rowBytes: r.rowBytes }]
      ),
      experts.stride,
      seq,
    )).flat();
  const lent = pickLent(room, plan.lentSlots);
  experts.lend(lent.map((s) => s.offset));
  const lender = new KvLender(experts, lent, plan.expertSlots);
  for (let seq = 0; seq < plan.sequences; seq++) lender.reserve(seq, 0);
  lender.resetStats();
  transformer.reserveRows = (seq, end) => lender.reserve(seq, end);
  return lender;
}

/**
 * The experts warmed before the first token, in order: hot-list experts first, then, when every
 * record fits, all of them in file order, as an in-RAM engine loads its model, so decode never
 * waits for a first use. Entries naming no record are dropped; at most the cache's slots, the
 * lent ones included.
 */
function warmList(
  container: Container,
  banks: (ExpertBank | null)[],
  plan: MemoryPlan,
  opts: RunOptions,
): [number, number][] {
  if (plan.totalExperts === 0) return [];
  const hot = opts.hotList === false ? null : readHotList(hotListPath(container.dir));
  const all = plan.expertSlots >= plan.totalExperts ? allExperts(banks) : [];
  const seen = new Set<string>();
  const list: [number, number][] = [];
  for (const [layer, expert] of [...(hot ? hottest(hot) : []), ...all]) {
    if (list.length >= plan.expertSlots + plan.lentSlots) break;
    const key = `${layer}:${expert}`;
    if (!banks[layer] || expert >= banks[layer]!.count || seen.has(key)) continue;
    seen.add(key);
    list.push([layer, expert]);
  }
  return list;
}

/**
 * A counter of the load's landed bytes reporting to `onLoad` against the load's whole reads (the
 * globals, the pinned trunk layers and the `warm` records); reports the start at once.
 */
function loadMeter(
  container: Container,
  runs: LayerRun[],
  banks: (ExpertBank | null)[],
  plan: MemoryPlan,
  warm: [number, number][],
  onLoad: RunOptions["onLoad"],
): (bytes: number) => void {
  if (!onLoad) return () => {};
  let total = container.manifest.trunk.globals.region.bytes;
  for (const run of runs.slice(0, plan.pinned)) total += run.bytes;
  for (const [layer] of warm) total += banks[layer]!.stride;
  let done = 0;
  onLoad(0, total);
  return (bytes) => onLoad(done += bytes, total);
}

/**
 * The lookahead when none is asked for: one predicted expert per MoE layer while experts stream,
 * none when they all fit. Measured by `bench stream` (docs/PERFORMANCE.md): one guess fills the
 * disk's idle time during attention with 86% precision (1.19× tok/s); top-k guesses read 25% more
 * bytes and lost. Ranking all top-k with the gate's per-rank floor and `guessRoom`'s bound
 * read 3% more bytes and hid half the wait, yet ran 0.86–0.88× (median) at full depth on a loaded
 * 2-core machine: its compute time per token rose by more than the wait it hid (docs/LEARNED.md).
 */
function defaultLookahead(plan: MemoryPlan): number {
  return plan.totalExperts > 0 && plan.expertSlots < plan.totalExperts ? 1 : 0;
}

/** Every (layer, expert) of the model's banks, in file order. */
function allExperts(banks: (ExpertBank | null)[]): [number, number][] {
  const all: [number, number][] = [];
  for (const b of banks) for (let e = 0; b && e < b.count; e++) all.push([b.layer, e]);
  return all;
}

/** The start-up line: how the budget was split, and the trunk hit rate it implies. */
function planLine(p: MemoryPlan): string {
  const ring = p.ringSlots > 0
    ? `, ${p.ringSlots} ring slot(s) × ${formatBytes(p.ringSlotBytes)}`
    : "";
  return `sluice: budget ${
    formatBytes(p.budget)
  }; trunk ${p.pinned}/${p.trunkLayers} layers pinned${ring} ` +
    `(trunk hit rate ${
      (100 * p.trunkHitRate).toFixed(1)
    }%); expert cache ${p.expertSlots} records ` +
    `(${formatBytes(p.expertBytes)})` +
    (p.lentSlots > 0 ? ` + ${p.lentSlots} lent by the KV cache while the context is short` : "");
}

/** The expert source of a dense model: asking it for an expert is a bug. */
const noExperts: ExpertSource = {
  groupSize: 0,
  hint() {},
  acquire(layer, expert) {
    throw new Error(`dense model: no expert ${expert} in layer ${layer}`);
  },
  release() {},
  ready: () => false,
};
