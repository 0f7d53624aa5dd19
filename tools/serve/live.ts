/**
 * What the server knows about itself, for `/metrics` (Prometheus text) and the live view
 * (`/ui/state`): counters over all requests, a once-a-second history of token and read rates,
 * per-expert use counts and residency, the trunk ring's layout, the requests running now and the
 * batch they share passes in.
 *
 * @module
 */
import type { Batch, BatchTotals } from "../../engine/batch.ts";
import type { PrefixCache } from "../../engine/prefix_cache.ts";
import type { Session } from "../../engine/session.ts";
import { formatBytes } from "../../engine/units.ts";
import type { MoeObserver } from "../../engine/transformer.ts";

/** A request being served, as the live view shows it. */
export interface CurrentRequest {
  id: string;
  endpoint: string;
  phase: "prefill" | "decode";
  promptTokens: number;
  cachedTokens: number;
  prefilled: number;
  generated: number;
  maxTokens: number;
  startedMs: number;
}

/** One sample of the rate history. */
export interface RateSample {
  /** Seconds since the server started. */
  t: number;
  tokPerS: number;
  readBytesPerS: number;
  /** Fraction of the interval spent waiting for reads. */
  ioWait: number;
}

const HISTORY = 300;

/** The server's counters and history. */
export class LiveStats {
  readonly session: Session;
  readonly startedMs = Date.now();
  /** Totals over all requests served. */
  readonly totals = {
    requests: 0,
    errors: 0,
    cancelled: 0,
    promptTokens: 0,
    cachedTokens: 0,
    generatedTokens: 0,
  };
  /** Decode tok/s of the last finished request. */
  lastTokPerS = 0;
  /** Grammar masks of structured output: steps masked and the time spent. */
  readonly maskStats = { steps: 0, ms: 0 };
  /** The requests generating now, in the order they started. */
  readonly running: Set<CurrentRequest> = new Set();
  readonly history: RateSample[] = [];
  /** Per MoE layer (null for dense layers): how often each expert was routed to. */
  readonly expertUse: (Float64Array | null)[];
  #queueDepth: () => number;
  #prefixes: PrefixCache | null;
  #batch: Batch | null;
  #timer: ReturnType<typeof setInterval>;
  #observer: MoeObserver;
  #last = { ms: performance.now(), tokens: 0, bytes: 0, waitMs: 0 };

  constructor(
    session: Session,
    queueDepth: () => number,
    prefixes: PrefixCache | null = null,
    batch: Batch | null = null,
  ) {
    this.session = session;
    this.#queueDepth = queueDepth;
    this.#prefixes = prefixes;
    this.#batch = batch;
    const cfg = session.model.cfg;
    const n = cfg.moe?.numExperts ?? 0;
    this.expertUse = cfg.layerKinds.map((k) => (k === "moe" && n > 0 ? new Float64Array(n) : null));
    this.#observer = (layer, routes) => {
      const use = this.expertUse[layer];
      if (use) { for (const r of routes) for (const e of r.ids) use[e]++; }
    };
    session.model.transformer.moeObservers.push(this.#observer);
    this.#timer = setInterval(() => this.sample(), 1000);
  }

  /** The batch's pass counters so far (zeros without a batch). */
  batchTotals(): BatchTotals {
    return { ...(this.#batch?.totals ?? { passes: 0, rows: 0, sequences: 0, lastSequences: 0 }) };
  }

  /** The request that started first of those running, or null. */
  get current(): CurrentRequest | null {
    return this.running.values().next().value ?? null;
  }

  /** The generated-token count including the requests in flight. */
  #tokensNow(): number {
    let n = this.totals.generatedTokens;
    for (const r of this.running) n += r.generated;
    return n;
  }

  /** Adds one point to the rate history (called every second). */
  sample(): void {
    const now = performance.now();
    const s = this.session.stats();
    const dt = (now - this.#last.ms) / 1000;
    if (dt <= 0) return;
    const tokens = this.#tokensNow();
    this.history.push({
      t: (Date.now() - this.startedMs) / 1000,
      tokPerS: (tokens - this.#last.tokens) / dt,
      readBytesPerS: (s.bytes_read - this.#last.bytes) / dt,
      ioWait: Math.min(1, (s.io_wait_ms - this.#last.waitMs) / 1000 / dt),
    });
    if (this.history.length > HISTORY) this.history.shift();
    this.#last = { ms: now, tokens, bytes: s.bytes_read, waitMs: s.io_wait_ms };
  }

  /** The state the live view draws. */
  snapshot(): Record<string, unknown> {
    const m = this.session.model;
    const s = this.session.stats();
    const numExperts = m.cfg.moe?.numExperts ?? 0;
    const resident = this.expertUse.map((u) => (u ? new Array<number>(u.length).fill(0) : null));
    for (const key of m.experts?.cache.keys() ?? []) {
      const row = resident[Math.floor(key / numExperts)];
      if (row) row[key % numExperts] = 1;
    }
    return {
      model: modelId(this.session),
      uptimeS: (Date.now() - this.startedMs) / 1000,
      totals: { ...this.totals, generatedTokens: this.#tokensNow() },
      lastTokPerS: this.lastTokPerS,
      queueDepth: this.#queueDepth(),
      current: this.current,
      running: [...this.running],
      batch: this.#batch
        ? { parallel: this.#batch.capacity, active: this.#batch.active, ...this.#batch.totals }
        : null,
      history: this.history,
      experts: {
        perLayer: numExperts,
        slots: s.expert_cache_slots,
        hits: s.expert_hits,
        misses: s.expert_misses,
        layers: this.expertUse.map((u, l) =>
          u ? { layer: l, use: Array.from(u), resident: resident[l] } : null
        ).filter((x) => x !== null),
      },
      trunk: {
        layers: m.cfg.numLayers,
        pinned: m.plan.pinned,
        ringSlots: m.plan.ringSlots,
        reads: m.trunk.stats.reads,
        hits: m.trunk.stats.hits,
      },
      memory: { budget: m.plan.budget, arena: m.arena.capacity, rss: Deno.memoryUsage().rss },
      bytesRead: s.bytes_read,
      // Sizes as the stats block writes them, so the page needs no formatter of its own.
      text: {
        budget: formatBytes(m.plan.budget),
        arena: formatBytes(m.arena.capacity),
        rss: formatBytes(Deno.memoryUsage().rss),
        bytesRead: formatBytes(s.bytes_read),
      },
      ioWaitMs: s.io_wait_ms,
      contextTokens: this.session.cachedTokens.length,
      maxContext: m.maxContext,
    };
  }

  /** The Prometheus text exposition of the counters. */
  prometheus(): string {
    const s = this.session.stats();
    const t = this.totals;
    const lines: string[] = [];
    const metric = (name: string, type: "counter" | "gauge", help: string, value: number) => {
      lines.push(`# HELP sluice_${name} ${help}`, `# TYPE sluice_${name} ${type}`);
      lines.push(`sluice_${name} ${Number.isFinite(value) ? value : 0}`);
    };
    metric("requests_total", "counter", "Completion requests finished.", t.requests);
    metric("request_errors_total", "counter", "Requests answered with an error.", t.errors);
    metric("requests_cancelled_total", "counter", "Requests whose client went away.", t.cancelled);
    metric("prompt_tokens_total", "counter", "Prompt tokens of all requests.", t.promptTokens);
    metric(
      "prompt_cached_tokens_total",
      "counter",
      "Prompt tokens reused from the prompt cache (not run again).",
      t.cachedTokens,
    );
    metric("generated_tokens_total", "counter", "Tokens generated.", this.#tokensNow());
    metric(
      "decode_tokens_per_second",
      "gauge",
      "Decode speed of the last request.",
      this.lastTokPerS,
    );
    const d = this.session.decodeTotals;
    metric(
      "decode_passes_total",
      "counter",
      "Decode forward passes (verify passes included).",
      d.passes,
    );
    metric(
      "tokens_per_pass",
      "gauge",
      "Generated tokens per decode pass, all requests.",
      d.passes > 0 ? d.tokens / d.passes : 0,
    );
    metric("draft_tokens_total", "counter", "Tokens drafted by speculative decoding.", d.drafted);
    metric("draft_accepted_total", "counter", "Drafted tokens the model kept.", d.accepted);
    metric(
      "grammar_mask_steps_total",
      "counter",
      "Tokens sampled under a grammar.",
      this.maskStats.steps,
    );
    metric(
      "grammar_mask_seconds_total",
      "counter",
      "Time spent computing grammar masks.",
      this.maskStats.ms / 1000,
    );
    metric("expert_hits_total", "counter", "Expert cache hits.", s.expert_hits);
    metric("expert_misses_total", "counter", "Expert cache misses.", s.expert_misses);
    metric(
      "expert_cache_records",
      "gauge",
      "Records the expert cache holds now, those lent by the KV cache included.",
      s.expert_cache_slots,
    );
    metric(
      "expert_cache_lent_records",
      "gauge",
      "Expert cache records in the KV cache's unwritten rows (taken back as contexts grow).",
      s.expert_cache_lent,
    );
    metric(
      "read_bytes_total",
      "counter",
      "Bytes read from the container after load.",
      s.bytes_read,
    );
    metric(
      "io_wait_seconds_total",
      "counter",
      "Time spent waiting for reads.",
      s.io_wait_ms / 1000,
    );
    metric("queue_depth", "gauge", "Requests waiting for the model.", this.#queueDepth());
    metric("busy", "gauge", "1 while a request is running.", this.running.size > 0 ? 1 : 0);
    metric("requests_running", "gauge", "Requests generating now.", this.running.size);
    const b = this.#batch;
    if (b) {
      metric("parallel", "gauge", "Sequences that can generate at once (--parallel).", b.capacity);
      metric("batch_passes_total", "counter", "Forward passes of the batch.", b.totals.passes);
      metric(
        "batch_size",
        "gauge",
        "Sequences in the last forward pass.",
        b.totals.lastSequences,
      );
      metric(
        "batch_size_mean",
        "gauge",
        "Sequences per forward pass, all passes.",
        b.totals.passes > 0 ? b.totals.sequences / b.totals.passes : 0,
      );
      metric("batch_rows_total", "counter", "Tokens run by the batch's passes.", b.totals.rows);
      metric(
        "batch_sequences_total",
        "counter",
        "Sequences summed over the batch's passes.",
        b.totals.sequences,
      );
    }
    metric("resident_memory_bytes", "gauge", "Resident set size.", Deno.memoryUsage().rss);
    metric("arena_bytes", "gauge", "Bytes of the arena.", this.session.model.arena.capacity);
    metric(
      "context_tokens",
      "gauge",
      "Tokens held in the KV cache (prompt cache).",
      this.session.cachedTokens.length,
    );
    if (this.#prefixes) {
      const p = this.#prefixes;
      metric("saved_prefixes", "gauge", "Prompt prefixes saved beside the live cache.", p.count);
      metric("saved_prefix_bytes", "gauge", "Bytes of the saved prompt prefixes.", p.bytes);
    }
    return lines.join("\n") + "\n";
  }

  /** Stops the sampling timer and the expert-use counting. */
  close(): void {
    clearInterval(this.#timer);
    const observers = this.session.model.transformer.moeObservers;
    const i = observers.indexOf(this.#observer);
    if (i >= 0) observers.splice(i, 1);
  }
}

/** The model id the API reports: the container's directory name without `.sluice`. */
export function modelId(session: Session): string {
  const dir = session.model.container.dir.replace(/\/+$/, "");
  return dir.slice(dir.lastIndexOf("/") + 1).replace(/\.sluice$/, "");
}
