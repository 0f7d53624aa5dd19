/**
 * Router lookahead: as soon as layer L's experts are chosen (their reads already queued), layer
 * L+1's router applied to L's MoE input predicts L+1's experts, and the top N predictions are read
 * speculatively while L's experts and L+1's attention compute. The reads go in the shim's lowest
 * priority class, so they only use disk time no demand read wants. Recall of the real top-k is
 * kept for the stats. Predictions are made and scored every time, but read only while a
 * {@link SpeculationGate} says they pay, from what the store measured they save and cost.
 *
 * The first MoE layer has no layer before it, and the disk would idle from the last layer's reads
 * to the first layer's routing of the next token (the tail: final norm, LM head, sampling; then
 * the first mixer). Guesses fill that time, each kind with a gate of its own. During the tail, as
 * many records as the last tail could read: the first layer's router applied to the embedding of
 * the token that followed the last token's latest earlier occurrence (a prompt-lookup guess of
 * the next token), then the experts recent tokens used in the first layer that the cache no
 * longer holds (recency). As soon as the next token is embedded, the first layer's router applied
 * to its embedding. Guesses from an embedding rank all top-k experts, as their reads mostly
 * queue until the layer routes (then they are promoted or withdrawn, unstarted).
 *
 * @module
 */
import { type Arena, PAGE } from "../arena.ts";
import { alignUp } from "../../io/format.ts";
import type { ModelConfig } from "../../io/model_config.ts";
import type { Ops } from "../ops.ts";
import { type Route, route } from "../routing.ts";
import type { TensorRef } from "../tensor.ts";

/** A router kept resident so the lookahead can use it before its layer is read. */
export interface ResidentRouter {
  weight: TensorRef;
  /** Arena offset of the f32 selection bias, if the model has one. */
  bias?: number;
  /** Arena offset of the f32 bias added to the logits (gpt-oss), if the model has one. */
  logitBias?: number;
}

/**
 * What speculative reads have cost and saved lately, as the expert store measures them (see
 * {@link SpeculationGate}). Times are milliseconds.
 */
export interface SpeculationCosts {
  /** Disk time of one record at the bandwidth the reader threads reach while busy. */
  recordMs: number;
  /** Share of a used guess that had landed by the time its layer asked for it. */
  hidden: number;
  /** Disk time per issued guess that guesses held while reads the engine needed were queued or
   * running (their share of the disk then). */
  blockedMs: number;
  /** Share of records evicted to make room for a guess that a demand access missed afterwards. */
  regret: number;
  /**
   * What a MoE layer waited for its records lately (ms): guesses can hide at most that, so a
   * prediction reads at most one guess more than the records that wait would read in (absent: no
   * bound). In a compute-bound run the disk idles long enough for every ranked guess, and reading
   * them all read 24% more bytes while the run's compute time rose (docs/LEARNED.md).
   */
  waitMs?: number;
}

/** Where predictions go: the expert store's speculative reads. */
export interface Speculator {
  speculate(layer: number, ids: readonly number[], max: number): number;
  /** Whether expert `id` of `layer` is cached or being read (a guess of it would read nothing). */
  holds(layer: number, id: number): boolean;
  /** The measured costs of speculation so far. */
  readonly speculationCosts: SpeculationCosts;
}

/** Predictions the gate's precision mostly reflects: older ones fade by 1 − 1/this each. */
export const GATE_WINDOW = 32;
/** While the gate is closed, every this-many-th prediction still reads its first guess, so the
 * costs it measures only while reading (hidden share, blocked time) stay current. */
export const GATE_PROBE_EVERY = 16;

/**
 * A ratio of decayed sums: each {@link add} fades the earlier ones by 1 − 1/window, so the ratio
 * mostly reflects the last `window` samples. It starts at `prior` with the weight of one sample.
 */
export class DecayedRatio {
  #num: number;
  #den = 1;
  #keep: number;

  constructor(prior: number, window = GATE_WINDOW) {
    this.#num = prior;
    this.#keep = 1 - 1 / window;
  }

  /** Adds a sample of `num` over `den`. */
  add(num: number, den: number): void {
    this.#num = this.#num * this.#keep + num;
    this.#den = this.#den * this.#keep + den;
  }

  get value(): number {
    return this.#num / this.#den;
  }
}

/**
 * How many of the next prediction's guesses should be read: a guess pays when what it saves beats
 * what it costs, both in disk time per guess, from measured quantities. Guesses are ranked by the
 * router's score, and each rank keeps its own precision, so a prediction reads its leading ranks
 * that pay.
 *
 * - Saved: a guess that a demand access then uses (precision p of its rank) takes its record's
 *   read off the demand path, for the share of it that landed before its layer asked
 *   (`hidden`): p × hidden × recordMs.
 * - Cost: a wrong guess holds the disk from reads the engine needs (`blockedMs`, its share of
 *   the disk while they wait or run beside it, measured per guess; a right guess holding the disk reads bytes its layer needs anyway) and may have evicted
 *   a record a later token misses (`regret`): (1 − p) × (blockedMs + regret × recordMs).
 *
 * Precision is scored on every prediction, read or not; the hidden share and the blocked time are
 * only measured while reading, so a closed gate still reads the first guess of every
 * {@link GATE_PROBE_EVERY}-th prediction. The store starts the blocked time at a whole record, so
 * before anything is measured the gate reads at p ≥ 1/2 (the precision starts at 1/2).
 * Output never depends on the gate: it only moves reads in time.
 */
export class SpeculationGate {
  /** "measured": decide from the costs; "always" / "never" pin the decision (tests, benches). */
  mode: "measured" | "always" | "never" = "measured";
  readonly #precision = new DecayedRatio(0.5);
  readonly #byRank: DecayedRatio[] = [];
  #closedRun = 0;
  /** Predictions {@link decide} has been asked about. */
  decisions = 0;
  /** Over the whole run, per rank: guesses scored, and those routed (not decayed: the bench's
   * evidence of how precise each rank is). */
  readonly ranks: { n: number; hits: number }[] = [];
  /** Least precision a rank needs to be read, whatever the costs say (0: none). */
  readonly floor: number;

  constructor(floor = 0) {
    this.floor = floor;
  }

  /** Scores one prediction: `routed[k]` says whether its guess of rank k was routed. */
  record(routed: readonly boolean[]): void {
    let hits = 0;
    routed.forEach((hit, k) => {
      if (hit) hits++;
      this.ranks[k] ??= { n: 0, hits: 0 };
      this.ranks[k].n++;
      if (hit) this.ranks[k].hits++;
      this.#byRank[k] ??= new DecayedRatio(0.5);
      this.#byRank[k].add(hit ? 1 : 0, 1);
    });
    this.#precision.add(hits, routed.length);
  }

  /** Decayed share of predicted experts that were routed. */
  get precision(): number {
    return this.#precision.value;
  }

  /** Decayed share of guesses of rank `k` (0: the router's top score) that were routed. */
  precisionAt(k: number): number {
    return this.#byRank[k]?.value ?? 0.5;
  }

  /** Whether a guess of precision `p` is worth reading at `costs`. */
  #pays(costs: SpeculationCosts, p: number): boolean {
    return p >= this.floor && this.gain(costs, p) >= 0;
  }

  /** Net disk time a read of a guess of precision `p` saves at `costs` (negative: it loses). */
  gain(costs: SpeculationCosts, p: number): number {
    return p * costs.hidden * costs.recordMs -
      (1 - p) * (costs.blockedMs + costs.regret * costs.recordMs);
  }

  /**
   * How many of the `n` ranked guesses of the next prediction to read at `costs`: the leading
   * ranks whose reads pay, else none but the first on every {@link GATE_PROBE_EVERY}-th
   * prediction in a row kept shut.
   */
  decide(costs: SpeculationCosts, n: number): number {
    this.decisions++;
    if (this.mode !== "measured") return this.mode === "always" ? n : 0;
    let k = 0;
    while (k < n && this.#pays(costs, this.precisionAt(k))) k++;
    if (k > 0) {
      this.#closedRun = 0;
      return k;
    }
    this.#closedRun++;
    return this.#closedRun % GATE_PROBE_EVERY === 0 ? Math.min(1, n) : 0;
  }
}

/** Tokens of one sequence the next-token guess looks back over. */
export const HISTORY_TOKENS = 256;

/** The lookahead's buffers: the router logits and one embedding row, in bytes. */
function lookaheadScratch(cfg: ModelConfig): { logits: number; row: number } {
  return { logits: (cfg.moe?.numExperts ?? 1) * 4, row: cfg.hiddenSize * 4 };
}

/** Bytes the lookahead allocates ({@link lookaheadScratch}, each page-aligned as allocated). */
export function lookaheadScratchBytes(cfg: ModelConfig): number {
  const s = lookaheadScratch(cfg);
  return alignUp(s.logits, PAGE) + alignUp(s.row, PAGE);
}

/**
 * Least precision of a rank of the next layer's guesses that is read. A guess its layer does not
 * use is withdrawn only if it has not started; on a disk that idles for longer than the guesses
 * take (a compute-bound run) every one is read, so a rank is read only if it is right at least as
 * often as wrong: each read then saves at least the bytes it wastes. On the 48-layer MXFP4 synth
 * (bench stream, budget 0.2) ranks 1-8 were right 98, 94, 90, 88, 76, 70, 59, 48% of the time,
 * and reading every rank read 24–30% more bytes per token (docs/PERFORMANCE.md).
 */
export const NEXT_LAYER_FLOOR = 0.5;

/**
 * Reads one prediction of the next layer may start at `costs`: one, plus as many records as the
 * layers' recent wait for reads would read in (see {@link SpeculationCosts.waitMs}).
 */
export function guessRoom(costs: SpeculationCosts): number {
  if (costs.waitMs === undefined) return Infinity;
  return 1 + Math.floor(costs.waitMs / Math.max(1e-3, costs.recordMs));
}

/** Tokens whose first-layer experts the tail's recency guess draws from. */
export const RECENT_TOKENS = 4;

/**
 * Least precision of a tail recency guess that is read. On the 8-layer bf16 synth (bench stream,
 * budget 0.25) their top guess was right 5–7% of the time; read anyway they filled the tail's idle
 * disk without raising tok/s (docs/LEARNED.md).
 */
export const RECENT_FLOOR = 0.5;

/**
 * A prediction waiting for its layer's routes: each row's ranked guesses, the gate to score, and
 * the reads it started.
 */
interface Pending {
  gate: SpeculationGate;
  guesses: number[][];
  reads: number;
}

/**
 * Predicts and prefetches the next MoE layer's experts during decode, and the first MoE layer's
 * of the next token (during the tail from a guessed next token and from recent tokens, from its
 * embedding once it is known).
 */
export class Lookahead {
  /**
   * Real routed experts that had been predicted, and all real routed experts, over decode; and
   * predictions the gate kept from being read.
   */
  readonly stats = { predictedHits: 0, routed: 0, skipped: 0 };
  /** Decides whether the next MoE layer's predictions are read, and how many of their ranks. */
  readonly gate = new SpeculationGate(NEXT_LAYER_FLOOR);
  /** The gate of the first MoE layer's guesses from the token's embedding. */
  readonly embeddingGate = new SpeculationGate();
  /** The gate of the tail's first-layer guesses from the guessed next token's embedding. */
  readonly nextTokenGate = new SpeculationGate();
  /**
   * The gate of the tail's guesses from the first MoE layer's recent routes. They start at once
   * (the disk idles in the tail), so a wrong one is never withdrawn: it costs the reader threads'
   * CPU and a cache slot, which the measured costs do not see, so it reads only ranks right at
   * least {@link RECENT_FLOOR} of the time.
   */
  readonly recentGate = new SpeculationGate(RECENT_FLOOR);
  /**
   * Where the gate's costs come from: the store's measurements. Tests pin them here, so what the
   * gate decides does not hang on how busy the machine was while the store measured.
   */
  costs: () => SpeculationCosts;
  #ops: Ops;
  #cfg: ModelConfig;
  #routers: (ResidentRouter | null)[];
  #target: Speculator;
  #n: number;
  #logits: number;
  /** One embedding row (the guessed next token's). */
  #row: number;
  #embed: (tokens: number[], dst: number) => void;
  /** The tokens of the one sequence the recent passes ran (empty when several ran). */
  #history: number[] = [];
  /** The current pass runs one sequence. */
  #single = false;
  /** The first MoE layer (−1: none). */
  #first: number;
  /** Per MoE layer: the predictions of each predicted row's guesses, scored when it routes. */
  #pending = new Map<number, Pending[]>();
  /** The tail's guesses (for the first MoE layer), scored by the next pass. */
  #tailPending = new Map<number, Pending[]>();
  /** The first MoE layer's experts in the last {@link RECENT_TOKENS} predicted passes, newest
   * last. */
  #recent: number[][] = [];
  /** When the last tail started (ms), and how long it lasted until the next pass's embedding. */
  #tailStart = 0;
  #tailMs = 0;
  /**
   * Most tokens of one sequence in a pass that get predictions: 1 (decode); a speculative decoder
   * raises it to its verify batch while it decodes.
   */
  predictBatch = 1;
  /** Rows of the current pass that get predictions (see {@link beginPass}). */
  #rows: number[] = [];

  constructor(
    ops: Ops,
    arena: Arena,
    cfg: ModelConfig,
    routers: (ResidentRouter | null)[],
    target: Speculator,
    n: number,
    embed: (tokens: number[], dst: number) => void,
  ) {
    this.#ops = ops;
    this.#cfg = cfg;
    this.#routers = routers;
    this.#target = target;
    this.#n = n;
    this.#first = cfg.layerKinds.indexOf("moe");
    this.costs = () => target.speculationCosts;
    const scratch = lookaheadScratch(cfg);
    this.#logits = arena.alloc("lookahead logits", scratch.logits);
    this.#row = arena.alloc("lookahead embedding", scratch.row);
    this.#embed = embed;
  }

  /** The gates of every kind of prediction. */
  get gates(): SpeculationGate[] {
    return [this.gate, this.embeddingGate, this.nextTokenGate, this.recentGate];
  }

  /** Pins every gate ("always" / "never": tests, benches) or leaves it to the costs. */
  setMode(mode: SpeculationGate["mode"]): void {
    for (const g of this.gates) g.mode = mode;
  }

  /** Recall so far: share of routed experts that the lookahead had predicted (null before any). */
  get recall(): number | null {
    return this.stats.routed > 0 ? this.stats.predictedHits / this.stats.routed : null;
  }

  /**
   * Declares the next pass: its sequences' row counts, in order. The rows of a sequence that runs
   * at most {@link predictBatch} tokens (decoding, or verifying drafts) get predictions; a prompt
   * chunk's rows get none, so a batched pass of several decoding sequences predicts for each of
   * them, beside any prompt chunk.
   */
  beginPass(counts: readonly number[]): void {
    this.#pending.clear();
    this.#rows = [];
    this.#single = counts.length === 1;
    let r0 = 0;
    for (const n of counts) {
      if (n <= this.predictBatch) { for (let i = 0; i < n; i++) this.#rows.push(r0 + i); }
      r0 += n;
    }
    // The tail guessed for one row (the union of the last pass's rows): scored against the
    // first predicted row of this pass, or not at all.
    if (this.#rows.length > 0) this.#pending = new Map(this.#tailPending);
    this.#tailPending.clear();
  }

  /**
   * The pass's embedding rows `x` are ready (before the first layer runs): the first MoE layer's
   * router applied to each predicted row's embedding guesses that layer's experts. Routing ranks
   * the router's logits, which a norm's scale does not reorder: the raw embedding serves.
   */
  embedded(x: number, tokens: readonly number[]): void {
    if (this.#tailStart > 0) this.#tailMs = performance.now() - this.#tailStart;
    this.#tailStart = 0;
    if (this.#single) this.#history.push(...tokens);
    else this.#history = [];
    this.#history.splice(0, this.#history.length - HISTORY_TOKENS);
    const rows = this.#rows.filter((r) => r < tokens.length);
    if (rows.length === 0 || this.#first < 0) return;
    this.#pend(this.#pending, this.#first, this.#predict(this.#first, rows, x, this.embeddingGate));
  }

  /** The token that followed the last token's latest earlier occurrence, if any. */
  #nextToken(): number | null {
    const h = this.#history, last = h.length - 1;
    for (let j = last - 1; j >= 0; j--) if (h[j] === h[last]) return h[j + 1];
    return null;
  }

  /**
   * The pass's last layer has run: while the final norm and the LM head compute, guesses for the
   * next token's first MoE layer from the guessed next token's embedding, then from the experts
   * recent tokens routed there (most used first) that the cache no longer holds, up to as many
   * records as the last tail lasted (at the measured disk time per record). Only the first layer:
   * the next token's misses in the layers before a deeper one would evict its guesses (an unused
   * guess is the least recently used record) before they are used.
   */
  tail(): void {
    this.#tailStart = performance.now();
    if (this.#first < 0 || this.#n <= 0 || this.#rows.length === 0) return;
    let room = Math.ceil(this.#tailMs / Math.max(1e-3, this.costs().recordMs));
    const next = this.#nextToken();
    if (next !== null) {
      this.#embed([next], this.#row);
      const p = this.#predict(this.#first, [0], this.#row, this.nextTokenGate);
      this.#pend(this.#tailPending, this.#first, p);
      room -= p?.reads ?? 0;
      if (room <= 0) return;
    }
    const uses = new Map<number, number>();
    this.#recent.forEach((ids, age) => {
      // Most uses first; among equals, the most recently used.
      for (const e of ids) uses.set(e, (uses.get(e) ?? 0) + 1 + age / RECENT_TOKENS ** 2);
    });
    const guess = [...uses].filter(([e]) => !this.#target.holds(this.#first, e))
      .sort((a, b) => b[1] - a[1]).slice(0, Math.min(this.#n, room)).map(([e]) => e);
    if (guess.length === 0) return;
    const reads = this.#read(this.#first, [guess], this.recentGate);
    this.#pend(this.#tailPending, this.#first, { gate: this.recentGate, guesses: [guess], reads });
  }

  /**
   * The MoE observer: scores the predictions for `layer`, then predicts the next MoE layer for
   * each row {@link beginPass} picked, each on its own. The reads are the union of each row's
   * leading guesses.
   */
  observe(layer: number, routes: Route[], h: number, nb: number): void {
    const rows = this.#rows.filter((r) => r < nb);
    if (rows.length === 0) return;
    this.#score(layer, rows, routes);
    if (layer === this.#first) {
      this.#recent.push([...new Set(rows.flatMap((r) => routes[r].ids))]);
      if (this.#recent.length > RECENT_TOKENS) this.#recent.shift();
    }
    const next = this.#cfg.layerKinds.indexOf("moe", layer + 1);
    if (next >= 0) this.#pend(this.#pending, next, this.#predict(next, rows, h, this.gate));
  }

  /** Adds prediction `p` (if any) to those pending for `layer` in `into`. */
  #pend(into: Map<number, Pending[]>, layer: number, p: Pending | null): void {
    if (p) into.set(layer, [...into.get(layer) ?? [], p]);
  }

  /**
   * Scores the predictions pending for `layer` against the rows' routes, each with its gate; the
   * recall counts a routed expert as predicted when any of them guessed it.
   */
  #score(layer: number, rows: number[], routes: Route[]): void {
    const predictions = this.#pending.get(layer);
    if (!predictions) return;
    this.#pending.delete(layer);
    const guessed = new Map<number, Set<number>>();
    for (const { gate, guesses } of predictions) {
      guesses.forEach((guess, i) => {
        const routed = new Set(routes[rows[i]].ids);
        gate.record(guess.map((e) => routed.has(e)));
        const all = guessed.get(i) ?? new Set();
        for (const e of guess) all.add(e);
        guessed.set(i, all);
      });
    }
    for (const [i, all] of guessed) {
      const ids = routes[rows[i]].ids;
      this.stats.predictedHits += ids.filter((e) => all.has(e)).length;
      this.stats.routed += ids.length;
    }
  }

  /**
   * Guesses `layer`'s experts for each row from its input at `h` with that layer's router, and
   * reads what `gate` says pays. From an embedding (the first layer) every top-k expert is ranked,
   * else the lookahead's depth.
   */
  #predict(layer: number, rows: number[], h: number, gate: SpeculationGate): Pending | null {
    const router = this.#routers[layer];
    if (!router || this.#n <= 0) return null;
    const moe = this.#cfg.moe!;
    const bias = router.bias !== undefined ? this.#ops.f32(router.bias, moe.numExperts) : undefined;
    const guesses: number[][] = [];
    for (const r of rows) {
      const x = h + r * this.#cfg.hiddenSize * 4;
      this.#ops.matmul({ w: router.weight, x, y: this.#logits, nb: 1 });
      if (router.logitBias !== undefined) {
        this.#ops.add(this.#logits, router.logitBias, moe.numExperts);
      }
      const ranks = gate === this.gate ? this.#n : Math.max(this.#n, moe.topK);
      guesses.push(route(moe, this.#ops.f32(this.#logits, moe.numExperts), bias, ranks).ids);
    }
    return { gate, guesses, reads: this.#read(layer, guesses, gate) };
  }

  /**
   * Reads the union of each row's leading guesses that `gate` says pay, in rank order and
   * skipping those already held; the next layer's at most {@link guessRoom} per row. Returns the
   * reads.
   */
  #read(layer: number, guesses: number[][], gate: SpeculationGate): number {
    const costs = this.costs();
    const read = gate.decide(costs, guesses[0].length);
    if (read <= 0) {
      this.stats.skipped++;
      return 0;
    }
    const ids = [...new Set(guesses.flatMap((g) => g.slice(0, read)))];
    const max = gate === this.gate ? guesses.length * guessRoom(costs) : ids.length;
    return this.#target.speculate(layer, ids, max);
  }
}
