/**
 * Expert-cache simulator: replays a routing trace (io/trace.ts format) through LRU, LFU, LFRU,
 * decay (the engine's default; LRU, LFRU and decay are engine/stream/expert_cache.ts itself) and
 * Belady, per layer (one cache of `capacity` slots per layer) and overall (one cache of capacity ×
 * layers slots shared by all layers).
 *
 * The engine hands a token's top-k ids of a layer to the cache at once (ExpertCache.acquire): the
 * hits are taken first and every routed record stays pinned until its matvec is done, so the
 * experts of one (token, layer) event never evict each other. LRU, LFU, LFRU, decay and
 * `belady-admit` follow that rule; when a cache is smaller than an event, its experts are streamed one by one
 * without pins instead. `belady` is the offline optimum with bypass (a miss whose next use is
 * farther than every resident's is used and not kept); it needs no pins, since a record evicted
 * right after its use loses nothing. Missing (token, layer) pairs are skipped.
 *
 * Usage: deno task sim --trace FILE [--capacity a,b,c] [--per-layer | --global] [--svg out.svg]
 *        [--json] [--sample N] [--seed N] [--aging N] [--keep-counts] [--half-life N]
 * `--json` prints `{"rows": [{"mode", "capacity", "hit_rates": {policy: rate}}]}` where hit_rates
 * also has `engine`, the rate of the engine's default policy, whichever that is.
 * A capacity below 1 is a fraction of each layer's experts (0.03 = 3%); one of 1 or more is a
 * number of slots per layer.
 *
 * @module
 */

import { parseArgs } from "node:util";
import { seededUniform } from "../../engine/sampler.ts";
import { CACHE_POLICIES, ExpertCache } from "../../engine/stream/expert_cache.ts";
import {
  readTrace,
  readTraceMeta,
  type TraceEvent,
  type TraceMeta,
  type TraceShape,
  traceShape,
} from "../../io/trace.ts";
import { type Series, writeLineChart } from "./svg_chart.ts";

/**
 * Policies the simulator compares. `belady` is the offline optimum with bypass; `belady-admit` is
 * the optimum when every routed expert must be read into a slot (no bypass) and an event's records
 * are pinned, the engine's own constraint, and the "Belady" of ../shared/traces/README.md.
 */
export type SimPolicy = "lru" | "lfu" | "lfru" | "decay" | "belady" | "belady-admit";
/** Each layer its own cache, or one cache shared by all layers. */
export type SimMode = "per-layer" | "global";

/** All policies, in table order. */
export const SIM_POLICIES: readonly SimPolicy[] = [
  "lru",
  "lfu",
  "lfru",
  "decay",
  "belady-admit",
  "belady",
];

/** The engine's default policy (engine/stream/expert_cache.ts), reported as `engine` too. */
export const ENGINE_POLICY: SimPolicy = CACHE_POLICIES[0];

/** Knobs of {@link simulate}. */
export interface SimOptions {
  /** Layer / expert counts; default: inferred from the events. */
  shape?: TraceShape;
  /** LFRU sample size, seed and aging period (see engine/stream/expert_cache.ts). */
  sample?: number;
  seed?: number;
  agingPeriod?: number;
  keepCounts?: boolean;
  /** Decay half-life in demand accesses (see engine/stream/expert_cache.ts). */
  halfLife?: number;
}

/** Outcome of one replay. */
export interface SimResult {
  policy: SimPolicy;
  mode: SimMode;
  /** Slots per layer as asked (may be fractional in global mode). */
  capacity: number;
  /** Slots of each cache (per-layer: per layer; global: the one cache). */
  slots: number;
  /** Total slots over all caches as a fraction of all experts. */
  fraction: number;
  accesses: number;
  hits: number;
  hitRate: number;
}

/** A cache under simulation: serves one event's keys, returns how many were hits. */
interface SimCache {
  request(keys: number[], nextUse: Float64Array, pos: number): number;
}

/** LRU, LFRU or decay: the engine's own class, with the event's records pinned while it runs. */
class EngineCache implements SimCache {
  readonly cache: ExpertCache;
  constructor(cache: ExpertCache) {
    this.cache = cache;
  }
  request(keys: number[]): number {
    const c = this.cache;
    let hits = 0;
    if (keys.length <= c.slots) {
      for (const a of c.acquire(keys)) if (a.hit) hits++;
      c.release(keys);
    } else {
      for (const k of keys) if (c.access(k).hit) hits++;
    }
    return hits;
  }
}

/**
 * Plain ("perfect") LFU: evict the resident with the fewest uses so far, ties to the least
 * recently used. Use counts survive eviction, as in the README baselines (restarting them at 1,
 * LFU scored 0.02-0.03 lower on both traces).
 */
class LfuCache implements SimCache {
  readonly #slots: number;
  readonly #lastUse = new Map<number, number>();
  /** Use counts of every key seen, resident or not. */
  readonly #uses = new Map<number, number>();
  readonly #resident = new Set<number>();
  #clock = 0;
  constructor(slots: number) {
    this.#slots = slots;
  }
  request(keys: number[]): number {
    if (keys.length > this.#slots) {
      let hits = 0;
      for (const k of keys) if (this.#use(k, null)) hits++;
      return hits;
    }
    // Hits first, then misses with the event's keys pinned, as ExpertCache.acquire does.
    const pinned = new Set(keys);
    const misses: number[] = [];
    for (const k of keys) {
      if (this.#resident.has(k)) this.#use(k, pinned);
      else misses.push(k);
    }
    for (const k of misses) this.#use(k, pinned);
    return keys.length - misses.length;
  }
  #use(k: number, pinned: Set<number> | null): boolean {
    this.#lastUse.set(k, ++this.#clock);
    this.#uses.set(k, (this.#uses.get(k) ?? 0) + 1);
    if (this.#resident.has(k)) return true;
    if (this.#resident.size >= this.#slots) {
      let victim = -1, vc = Infinity, vt = Infinity;
      for (const r of this.#resident) {
        if (pinned?.has(r)) continue;
        const rc = this.#uses.get(r)!, rt = this.#lastUse.get(r)!;
        if (rc < vc || (rc === vc && rt < vt)) [victim, vc, vt] = [r, rc, rt];
      }
      this.#resident.delete(victim);
    }
    this.#resident.add(k);
    return false;
  }
}

/**
 * Belady: keep the records whose next use is soonest. With bypass (the offline optimum), a miss
 * needed later than every resident is used and not kept. Without it, every routed expert must be
 * admitted and the event's own records are pinned, like the engine's slots.
 */
class BeladyCache implements SimCache {
  readonly #slots: number;
  readonly #bypass: boolean;
  /** Resident key → position of its next use (Infinity = never). */
  readonly #next = new Map<number, number>();
  constructor(slots: number, bypass: boolean) {
    this.#slots = slots;
    this.#bypass = bypass;
  }
  request(keys: number[], nextUse: Float64Array, pos: number): number {
    const pinned = !this.#bypass && keys.length <= this.#slots ? new Set(keys) : null;
    let hits = 0;
    for (let i = 0; i < keys.length; i++) {
      const k = keys[i], nk = nextUse[pos + i];
      if (this.#next.has(k)) {
        hits++;
        this.#next.set(k, nk);
        continue;
      }
      if (this.#next.size < this.#slots) {
        this.#next.set(k, nk);
        continue;
      }
      let victim = -1, vn = -1;
      for (const [r, rn] of this.#next) if (rn > vn && !pinned?.has(r)) [victim, vn] = [r, rn];
      if (this.#bypass && nk >= vn) continue;
      this.#next.delete(victim);
      this.#next.set(k, nk);
    }
    return hits;
  }
}

/** Position of the next access of the same key, for every access of the flattened trace. */
function nextUses(keysPerEvent: number[][]): Float64Array {
  const total = keysPerEvent.reduce((n, k) => n + k.length, 0);
  const next = new Float64Array(total);
  const seen = new Map<number, number>();
  let pos = total;
  for (let e = keysPerEvent.length - 1; e >= 0; e--) {
    const keys = keysPerEvent[e];
    for (let i = keys.length - 1; i >= 0; i--) {
      pos--;
      next[pos] = seen.get(keys[i]) ?? Infinity;
      seen.set(keys[i], pos);
    }
  }
  return next;
}

function makeCache(policy: SimPolicy, slots: number, opts: SimOptions, salt: number): SimCache {
  switch (policy) {
    case "lru":
      return new EngineCache(new ExpertCache({ slots, policy: "lru" }));
    case "lfru":
      return new EngineCache(
        new ExpertCache({
          slots,
          policy: "lfru",
          sample: opts.sample,
          seed: (opts.seed ?? 1) + salt,
          agingPeriod: opts.agingPeriod,
          keepCounts: opts.keepCounts,
        }),
      );
    case "decay":
      return new EngineCache(new ExpertCache({ slots, policy: "decay", halfLife: opts.halfLife }));
    case "lfu":
      return new LfuCache(slots);
    case "belady":
      return new BeladyCache(slots, true);
    case "belady-admit":
      return new BeladyCache(slots, false);
  }
}

/**
 * Replays `events` through `policy` with `capacity` slots per layer: per-layer mode gives each
 * layer round(capacity) slots; global mode one cache of round(capacity × layers) slots (at least
 * 1 either way). Keys are `layer × nExperts + expert`.
 */
export function simulate(
  events: TraceEvent[],
  policy: SimPolicy,
  capacity: number,
  mode: SimMode,
  opts: SimOptions = {},
): SimResult {
  const shape = opts.shape ?? traceShape(events);
  const { nLayers, nExperts } = shape;
  if (!(capacity > 0)) throw new Error(`simulate: capacity must be > 0, got ${capacity}`);
  const slots = Math.max(1, Math.round(mode === "global" ? capacity * nLayers : capacity));
  const keysPerEvent = events.map((e) => e.experts.map((x) => e.layer * nExperts + x));
  const next = policy.startsWith("belady") ? nextUses(keysPerEvent) : new Float64Array(0);
  const caches: SimCache[] = [];
  const cacheFor = (layer: number) => {
    const i = mode === "global" ? 0 : layer;
    return caches[i] ??= makeCache(policy, slots, opts, i);
  };
  let hits = 0, accesses = 0;
  for (let e = 0; e < events.length; e++) {
    const keys = keysPerEvent[e];
    hits += cacheFor(events[e].layer).request(keys, next, accesses);
    accesses += keys.length;
  }
  const totalSlots = mode === "global" ? slots : slots * nLayers;
  return {
    policy,
    mode,
    capacity,
    slots,
    fraction: totalSlots / (nLayers * nExperts),
    accesses,
    hits,
    hitRate: accesses ? hits / accesses : 0,
  };
}

/**
 * The trace replayed as `n` sequences decoding together, one token each per pass, as `serve
 * --parallel n` runs them: the tokens are cut into `n` contiguous stretches (one per sequence) and
 * pass p takes token p of every stretch. Per layer the batch's experts are requested once, as one
 * event holding their union in first-routed order. Passes stop at the shortest stretch; (token,
 * layer) pairs missing from any stretch's token leave that layer's event out of the pass.
 */
export function batchEvents(events: TraceEvent[], n: number): TraceEvent[] {
  if (!Number.isInteger(n) || n < 1) throw new Error(`batch must be a whole number ≥ 1, got ${n}`);
  const byToken = new Map<number, TraceEvent[]>();
  for (const e of events) {
    let list = byToken.get(e.token);
    if (!list) byToken.set(e.token, list = []);
    list.push(e);
  }
  const tokens = [...byToken.keys()];
  const stretch = Math.floor(tokens.length / n);
  if (stretch === 0) throw new Error(`${tokens.length} tokens cannot make ${n} sequences`);
  const out: TraceEvent[] = [];
  for (let p = 0; p < stretch; p++) {
    const layers = new Map<number, { experts: Set<number>; seen: number }>();
    for (let s = 0; s < n; s++) {
      for (const e of byToken.get(tokens[s * stretch + p])!) {
        let u = layers.get(e.layer);
        if (!u) layers.set(e.layer, u = { experts: new Set(), seen: 0 });
        u.seen++;
        for (const x of e.experts) u.experts.add(x);
      }
    }
    for (const [layer, u] of [...layers].sort((a, b) => a[0] - b[0])) {
      if (u.seen === n) out.push({ token: p, layer, experts: [...u.experts] });
    }
  }
  return out;
}

/**
 * The same (token, layer) pairs with each event's experts replaced by as many distinct ids drawn
 * uniformly at random (seeded): what routing with no preference between experts would read.
 */
export function uniformTwin(events: TraceEvent[], nExperts: number, seed = 1): TraceEvent[] {
  const u = seededUniform(seed);
  return events.map((e) => {
    const set = new Set<number>();
    while (set.size < e.experts.length) set.add(Math.floor(u() * nExperts));
    return { token: e.token, layer: e.layer, experts: [...set] };
  });
}

/** One batch size of {@link simulateBatch}. */
export interface BatchResult {
  batch: number;
  /** Tokens decoded: passes × batch. */
  tokens: number;
  /** Mean distinct experts a pass requests per layer. */
  distinct: number;
  /** Expert records read (cache misses) per token decoded. */
  readsPerToken: number;
}

/**
 * Expert reads per decoded token when `batch` sequences share each pass, through the engine's
 * cache policy with `capacity` slots per layer in `mode`.
 */
export function simulateBatch(
  events: TraceEvent[],
  batch: number,
  capacity: number,
  mode: SimMode,
  opts: SimOptions = {},
): BatchResult {
  const shape = opts.shape ?? traceShape(events);
  const merged = batchEvents(events, batch);
  const r = simulate(merged, ENGINE_POLICY, capacity, mode, { ...opts, shape });
  const passes = new Set(merged.map((e) => e.token)).size;
  return {
    batch,
    tokens: passes * batch,
    distinct: merged.length ? r.accesses / merged.length : 0,
    readsPerToken: passes ? (r.accesses - r.hits) / (passes * batch) : 0,
  };
}

/** Slots per layer for a CLI capacity: below 1 = fraction of a layer's experts. */
export function slotsPerLayer(capacity: number, nExperts: number): number {
  return capacity < 1 ? capacity * nExperts : capacity;
}

function defaultCapacities(meta: TraceMeta | null, shape: TraceShape): number[] {
  const k = meta?.top_k ?? 1;
  const caps = new Set<number>([0.03]);
  for (let m = 1; m * k < shape.nExperts; m++) caps.add(m * k);
  return [...caps].slice(0, 8);
}

const USAGE = `usage: deno task sim --trace FILE [options]
Replays a routing trace (../shared/traces/*/trace.jsonl) through every expert-cache policy the
engine has, plus Belady's offline optimum, and prints hit rates.
  --capacity a,b,c   slots per layer (below 1: a fraction of a layer's experts)
  --per-layer        one cache per layer only      --global   one shared cache only
  --json             {"rows": [{"mode", "capacity", "hit_rates": {engine, belady, ...}}]}
  --svg PATH         hit-rate chart
  --sample N, --seed N  replay N sampled tokens (seeded)
  --aging N, --keep-counts, --half-life N   LFU/decay parameters
  --batch a,b,c      instead: n sequences decoding together (contiguous stretches of the trace,
                     one token each per pass, each layer's union read once), engine policy:
                     expert reads per token and the gain over one sequence, beside the same
                     replay with uniformly random routing`;

/** Exits with the usage text and a one-line reason on a bad command line. */
function usageError(why: string): never {
  console.error(`sim: ${why}`);
  console.error(USAGE);
  Deno.exit(2);
}

function main(args: string[]): void {
  let parsed;
  try {
    parsed = parseArgs({
      args,
      options: {
        trace: { type: "string" },
        capacity: { type: "string" },
        "per-layer": { type: "boolean", default: false },
        global: { type: "boolean", default: false },
        svg: { type: "string" },
        json: { type: "boolean", default: false },
        sample: { type: "string" },
        seed: { type: "string" },
        aging: { type: "string" },
        "keep-counts": { type: "boolean", default: false },
        "half-life": { type: "string" },
        batch: { type: "string" },
        help: { type: "boolean", short: "h", default: false },
      },
    });
  } catch (e) {
    usageError(e instanceof Error ? e.message : String(e));
  }
  const { values } = parsed;
  if (values.help) {
    console.log(USAGE);
    return;
  }
  if (!values.trace) usageError("--trace is required");
  const events = readTrace(values.trace);
  const meta = readTraceMeta(values.trace);
  const shape = traceShape(events, meta);
  const caps = values.capacity
    ? values.capacity.split(",").map((s) => {
      const v = Number(s);
      if (!(v > 0)) throw new Error(`--capacity: "${s}" is not a positive number`);
      return v;
    })
    : defaultCapacities(meta, shape);
  const modes: SimMode[] = values["per-layer"] && !values.global
    ? ["per-layer"]
    : values.global && !values["per-layer"]
    ? ["global"]
    : ["per-layer", "global"];
  const int = (s: string | undefined) => (s === undefined ? undefined : Number(s));
  const opts: SimOptions = {
    shape,
    sample: int(values.sample),
    seed: int(values.seed),
    agingPeriod: int(values.aging),
    keepCounts: values["keep-counts"],
    halfLife: int(values["half-life"]),
  };
  if (values.batch) {
    const sizes = values.batch.split(",").map((s) => {
      const v = Number(s);
      if (!Number.isInteger(v) || v < 1) {
        throw new Error(`--batch: "${s}" is not a whole number ≥ 1`);
      }
      return v;
    });
    const rows = batchRows(events, shape, sizes, caps, modes, opts);
    if (values.json) {
      console.log(JSON.stringify({ trace: values.trace, shape, batch_rows: rows }, null, 1));
    } else printBatchTable(values.trace, meta, shape, rows);
    return;
  }
  const results: SimResult[] = [];
  for (const mode of modes) {
    for (const cap of caps) {
      for (const policy of SIM_POLICIES) {
        results.push(simulate(events, policy, slotsPerLayer(cap, shape.nExperts), mode, opts));
      }
    }
  }
  if (values.json) {
    console.log(JSON.stringify(jsonReport(values.trace, shape, results), null, 1));
  } else {
    printTable(values.trace, meta, shape, events.length, results);
  }
  if (values.svg) {
    const series: Series[] = [];
    const colors = {
      lru: "#1f77b4",
      lfu: "#2ca02c",
      lfru: "#d62728",
      decay: "#ff7f0e",
      "belady-admit": "#9467bd",
      belady: "#333333",
    };
    for (const mode of modes) {
      for (const policy of SIM_POLICIES) {
        series.push({
          name: `${policy.toUpperCase()} ${mode}`,
          color: colors[policy],
          dashed: mode === "global",
          points: results.filter((r) => r.mode === mode && r.policy === policy)
            .map((r) => [100 * r.fraction, r.hitRate]),
        });
      }
    }
    writeLineChart(values.svg, {
      title: `Expert-cache hit rate: ${meta?.model?.split(" ")[0] ?? values.trace}`,
      xLabel: "cache size (% of all experts)",
      yLabel: "hit rate",
      xMin: 0,
      yMin: 0,
      yMax: 1,
      series,
    });
    console.log(`wrote ${values.svg}`);
  }
}

/** One row per (mode, capacity) with every policy's hit rate, plus `engine`. */
export interface SimRow {
  mode: SimMode;
  /** Slots per layer as asked. */
  capacity: number;
  hit_rates: Record<string, number>;
}

/** The `--json` report: rows of {@link SimRow}, with the trace and its shape. */
export function jsonReport(
  trace: string,
  shape: TraceShape,
  results: SimResult[],
): { trace: string; shape: TraceShape; rows: SimRow[] } {
  const rows = new Map<string, SimRow>();
  for (const r of results) {
    const id = `${r.mode}:${r.capacity}`;
    let row = rows.get(id);
    if (!row) rows.set(id, row = { mode: r.mode, capacity: r.capacity, hit_rates: {} });
    row.hit_rates[r.policy] = r.hitRate;
    if (r.policy === ENGINE_POLICY) row.hit_rates.engine = r.hitRate;
  }
  return { trace, shape, rows: [...rows.values()] };
}

/** One (mode, capacity, batch) row of `--batch`: the trace's replay and its uniform twin's. */
export interface BatchRow {
  mode: SimMode;
  /** Slots per layer as asked. */
  capacity: number;
  trace: BatchResult & { gain: number };
  uniform: BatchResult & { gain: number };
}

/** `--batch` rows; the gain is reads per token at batch 1 over reads per token at the batch. */
export function batchRows(
  events: TraceEvent[],
  shape: TraceShape,
  sizes: number[],
  caps: number[],
  modes: SimMode[],
  opts: SimOptions,
): BatchRow[] {
  const twin = uniformTwin(events, shape.nExperts, opts.seed);
  const rows: BatchRow[] = [];
  for (const mode of modes) {
    for (const cap of caps) {
      const slots = slotsPerLayer(cap, shape.nExperts);
      const run = (ev: TraceEvent[]) => {
        const one = simulateBatch(ev, 1, slots, mode, { ...opts, shape }).readsPerToken;
        return sizes.map((n) => {
          const r = simulateBatch(ev, n, slots, mode, { ...opts, shape });
          return { ...r, gain: r.readsPerToken ? one / r.readsPerToken : 0 };
        });
      };
      const a = run(events), b = run(twin);
      for (let i = 0; i < sizes.length; i++) {
        rows.push({ mode, capacity: cap, trace: a[i], uniform: b[i] });
      }
    }
  }
  return rows;
}

function printBatchTable(
  path: string,
  meta: TraceMeta | null,
  shape: TraceShape,
  rows: BatchRow[],
): void {
  console.log(
    `${path}: ${meta?.model ?? "?"}; ${shape.nLayers} layers × ${shape.nExperts} experts, ` +
      `top-${meta?.top_k ?? "?"}; batched decoding through the ${ENGINE_POLICY} cache`,
  );
  console.log(
    "mode       slots/layer  batch  │ trace: distinct  reads/token  gain │ uniform: distinct  reads/token  gain",
  );
  for (const r of rows) {
    const cell = (x: BatchResult & { gain: number }) =>
      `${x.distinct.toFixed(2).padStart(8)}  ${x.readsPerToken.toFixed(3).padStart(11)}  ` +
      `${x.gain.toFixed(2).padStart(5)}×`;
    console.log(
      `${r.mode.padEnd(10)} ${String(r.capacity).padStart(11)}  ${
        String(r.trace.batch).padStart(5)
      }  │ ` +
        `${cell(r.trace)}       │ ${cell(r.uniform)}`,
    );
  }
}

function printTable(
  path: string,
  meta: TraceMeta | null,
  shape: TraceShape,
  nEvents: number,
  results: SimResult[],
): void {
  console.log(
    `${path}: ${meta?.model ?? "?"}; ${shape.nLayers} layers × ${shape.nExperts} experts, ` +
      `top-${meta?.top_k ?? "?"}, ${nEvents} (token, layer) events`,
  );
  console.log(
    "mode       slots/layer  total  % experts   LRU    LFU    LFRU   decay  Belady-admit  Belady",
  );
  for (let i = 0; i < results.length; i += SIM_POLICIES.length) {
    const row = results.slice(i, i + SIM_POLICIES.length);
    const r = row[0];
    const total = r.mode === "global" ? r.slots : r.slots * shape.nLayers;
    const perLayer = r.mode === "global" ? total / shape.nLayers : r.slots;
    console.log(
      `${r.mode.padEnd(10)} ${perLayer.toFixed(2).padStart(11)} ${String(total).padStart(6)} ` +
        `${(100 * r.fraction).toFixed(1).padStart(9)}  ` +
        row.map((x) => x.hitRate.toFixed(3).padEnd(x.policy === "belady-admit" ? 12 : 5))
          .join("  "),
    );
  }
}

if (import.meta.main) {
  try {
    main(Deno.args);
  } catch (e) {
    if (Deno.env.get("SLUICE_DEBUG")) console.error(e);
    console.error(`sim: ${e instanceof Error ? e.message : String(e)}`);
    Deno.exit(1);
  }
}
