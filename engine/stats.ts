/**
 * The numbers a run reports: timings, expert-cache and trunk-ring counters, bytes read, peak RSS.
 * One snapshot type for the stderr block and `--json`.
 *
 * @module
 */
import { formatBytes } from "./units.ts";
import type { Model } from "./model.ts";
import type { DecodeCounters } from "./speculate.ts";

/**
 * Why the last generation stopped: an end-of-sequence or stop id, the token limit, a full
 * context (no room for another token), or an abort (Ctrl-C, a client gone).
 */
export type StopReason = "eos" | "max_tokens" | "context" | "aborted";

/** Timings measured by the generate loop. */
export interface Timings {
  loadMs: number;
  promptTokens: number;
  /** Prompt tokens reused from the prompt cache (not run again). */
  cachedTokens: number;
  promptMs: number;
  generatedTokens: number;
  generateMs: number;
  /** Forward passes and speculation counters of the decode loop. */
  decode: DecodeCounters;
  /** Why the last generation stopped (null before the first). */
  stopReason: StopReason | null;
  /** The model's I/O wait ({@link ioWaitMs}) when the last generation began. */
  ioWaitAtStart: number;
}

/**
 * Everything the stats block prints, and what `generate --json` writes as `stats`. Field names
 * are snake_case, as llama.cpp's server reports its timings; times are milliseconds, sizes bytes,
 * rates per second, and counts cover the last generate call (prompt and generated tokens).
 */
export interface RunStats {
  /** Opening the container: plan, arena, workers, reads of the resident weights. */
  load_ms: number;
  /** Prompt tokens of the last generate call. */
  prompt_tokens: number;
  /** Of those, the ones reused from the prompt cache (not run again). */
  prompt_cached_tokens: number;
  /** Time of the prefill. */
  prompt_ms: number;
  /** Tokens generated after the prompt. */
  generated_tokens: number;
  /** Time of the generated tokens (decode), sampling included. */
  generate_ms: number;
  /** Prompt tokens run (prompt_tokens − prompt_cached_tokens) per second of prompt_ms. */
  prompt_tok_s: number;
  /** generated_tokens per second of generate_ms. */
  generate_tok_s: number;
  /** Target forward passes of the decode (verify passes and recurrent-state re-runs included). */
  decode_passes: number;
  /** generated_tokens per decode pass (counting the first token, sampled from the prompt's). */
  tokens_per_pass: number;
  /** Tokens drafted by speculative decoding and verified. */
  draft_tokens: number;
  /** Drafted tokens the model kept. */
  draft_accepted: number;
  /** Decode steps run without drafting because drafting measured slower (the gate). */
  draft_gated_steps: number;
  /** Expert uses found in the cache (prefetched records included). */
  expert_hits: number;
  /** Expert uses that had to wait for a read. */
  expert_misses: number;
  /** expert_hits / (hits + misses); 1 when no expert was used. */
  expert_hit_rate: number;
  /** Records the expert cache holds now, lent slots included (0 for a dense model). */
  expert_cache_slots: number;
  /** Of those, slots lent by the KV cache's unwritten rows (engine/kv_lending.ts). */
  expert_cache_lent: number;
  /** Lent slots the KV cache took back as contexts grew, since the model was opened. */
  kv_reclaimed_slots: number;
  /** Records the lookahead read speculatively. */
  speculative_reads: number;
  /** Speculatively read records that were then used. */
  speculative_used: number;
  /** Speculative reads withdrawn before they ran because their layer did not use them. */
  speculative_cancelled: number;
  /** Lookahead predictions not read because the gate measured that reading would not pay. */
  speculative_skipped: number;
  /** Share of routed experts the lookahead had predicted; null when it was off or idle. */
  lookahead_recall: number | null;
  /** Bytes read after the model was open (load bytes excluded). */
  bytes_read: number;
  /** Bytes read while opening (globals, pinned layers, warmed experts). */
  load_bytes: number;
  /** bytes_read per prompt or generated token. */
  bytes_read_per_token: number;
  /** Time the forward pass waited for trunk layers and expert records since the model was opened
   * (a running count, as the byte counters are). */
  io_wait_ms: number;
  /** prompt_ms + generate_ms − the part of io_wait_ms the last generate call waited. */
  compute_ms: number;
  /** Fraction of layer visits served by pinned trunk layers. */
  trunk_hit_rate: number;
  /** Trunk layers pinned in the arena. */
  trunk_pinned: number;
  /** Layers of the model. */
  trunk_layers: number;
  /** The memory plan's budget. */
  budget_bytes: number;
  /** Size of the arena (one shared wasm memory). */
  arena_bytes: number;
  /** Peak resident set size of the process (VmHWM). */
  peak_rss_bytes: number;
  /** Why the last generation stopped: eos, max_tokens, context (full) or aborted. */
  stop_reason: StopReason | null;
  /** Compute threads, the main thread included. */
  threads: number;
  /** The reader: direct (O_DIRECT shim), buffered or fallback. */
  reader: string;
}

/** Peak resident set size of this process (VmHWM), or the current RSS where that is unknown. */
export function peakRss(): number {
  try {
    const m = /VmHWM:\s+(\d+) kB/.exec(Deno.readTextFileSync("/proc/self/status"));
    if (m) return Number(m[1]) * 1024;
  } catch {
    // Not Linux: fall through to the current RSS.
  }
  return Deno.memoryUsage().rss;
}

/** Time `model`'s forward passes have waited for trunk layers and expert records, in ms. */
export function ioWaitMs(model: Model): number {
  return (model.experts?.stats.waitMs ?? 0) + model.trunk.stats.waitMs;
}

/** Collects a snapshot of `model`'s counters with the loop's timings. */
export function collectStats(model: Model, t: Timings, lookaheadRecall: number | null): RunStats {
  const cache = model.experts?.cache.stats;
  const store = model.experts?.stats;
  const hits = cache?.hits ?? 0, misses = cache?.misses ?? 0;
  const bytes = (store?.bytesRead ?? 0) + model.trunk.stats.bytes;
  const ioWait = ioWaitMs(model);
  const tokens = t.promptTokens + t.generatedTokens;
  return {
    load_ms: t.loadMs,
    prompt_tokens: t.promptTokens,
    prompt_cached_tokens: t.cachedTokens,
    prompt_ms: t.promptMs,
    generated_tokens: t.generatedTokens,
    generate_ms: t.generateMs,
    prompt_tok_s: t.promptMs > 0 ? ((t.promptTokens - t.cachedTokens) * 1000) / t.promptMs : 0,
    generate_tok_s: t.generateMs > 0 ? (t.generatedTokens * 1000) / t.generateMs : 0,
    decode_passes: t.decode.passes,
    tokens_per_pass: t.generatedTokens / (t.decode.passes + 1),
    draft_tokens: t.decode.drafted,
    draft_accepted: t.decode.accepted,
    draft_gated_steps: t.decode.gated,
    expert_hits: hits,
    expert_misses: misses,
    expert_hit_rate: hits + misses > 0 ? hits / (hits + misses) : 1,
    expert_cache_slots: model.experts?.cache.capacity ?? 0,
    expert_cache_lent: model.lender?.lent ?? 0,
    kv_reclaimed_slots: model.lender?.stats.reclaimed ?? 0,
    speculative_reads: store?.speculative ?? 0,
    speculative_used: store?.speculativeUsed ?? 0,
    speculative_cancelled: store?.speculativeCancelled ?? 0,
    speculative_skipped: model.observers.lookahead?.stats.skipped ?? 0,
    lookahead_recall: lookaheadRecall,
    bytes_read: bytes,
    load_bytes: model.loadBytes,
    bytes_read_per_token: tokens > 0 ? bytes / tokens : 0,
    io_wait_ms: ioWait,
    // Only this generation's wait: the load's and earlier turns' are in the running count too.
    compute_ms: Math.max(0, t.promptMs + t.generateMs - (ioWait - t.ioWaitAtStart)),
    trunk_hit_rate: model.plan.trunkHitRate,
    trunk_pinned: model.plan.pinned,
    trunk_layers: model.plan.trunkLayers,
    budget_bytes: model.plan.budget,
    arena_bytes: model.arena.capacity,
    peak_rss_bytes: peakRss(),
    stop_reason: t.stopReason,
    threads: model.pool.threads,
    reader: model.reader.kind,
  };
}

/** How the stats block says why a generation stopped. */
const STOP_TEXT: Record<StopReason, string> = {
  eos: "end of sequence",
  max_tokens: "token limit",
  context: "context full",
  aborted: "interrupted",
};

/** The human-readable stats block (stderr). */
export function formatStats(s: RunStats): string {
  const pct = (x: number) => `${(100 * x).toFixed(1)}%`;
  const lines = [
    `load          ${(s.load_ms / 1000).toFixed(2)} s`,
    `prompt        ${s.prompt_tokens} tokens${
      s.prompt_cached_tokens > 0 ? ` (${s.prompt_cached_tokens} from the prompt cache)` : ""
    }, ${s.prompt_tok_s.toFixed(2)} tok/s`,
    `generated     ${s.generated_tokens} tokens, ${s.generate_tok_s.toFixed(2)} tok/s` +
    (s.stop_reason ? ` (stopped: ${STOP_TEXT[s.stop_reason]})` : "") +
    `, ${s.tokens_per_pass.toFixed(2)} tokens per pass`,
    ...(s.draft_tokens > 0 || s.draft_gated_steps > 0
      ? [
        `drafts        ${s.draft_tokens} drafted, ${s.draft_accepted} accepted (${
          pct(s.draft_tokens > 0 ? s.draft_accepted / s.draft_tokens : 0)
        })${s.draft_gated_steps > 0 ? `, ${s.draft_gated_steps} steps undrafted by the gate` : ""}`,
      ]
      : []),
    `experts       ${s.expert_hits} hits, ${s.expert_misses} misses (hit rate ${
      pct(s.expert_hit_rate)
    }); cache ${s.expert_cache_slots} records` +
    (s.expert_cache_lent > 0 || s.kv_reclaimed_slots > 0
      ? ` (${s.expert_cache_lent} lent by the KV cache, ${s.kv_reclaimed_slots} taken back)`
      : ""),
    `speculative   ${s.speculative_reads} reads, ${s.speculative_used} used, ` +
    `${s.speculative_cancelled} withdrawn` +
    (s.speculative_skipped
      ? `, ${s.speculative_skipped} predictions not read (they would not pay)`
      : "") +
    (s.lookahead_recall === null ? "" : `, lookahead recall ${pct(s.lookahead_recall)}`),
    `read          ${formatBytes(s.bytes_read)} (${formatBytes(s.bytes_read_per_token)}/token) ` +
    `via ${s.reader}, ${formatBytes(s.load_bytes)} at load`,
    `time          io wait ${(s.io_wait_ms / 1000).toFixed(2)} s, compute ${
      (s.compute_ms / 1000).toFixed(2)
    } s`,
    `trunk         ${s.trunk_pinned}/${s.trunk_layers} layers pinned (hit rate ${
      pct(s.trunk_hit_rate)
    })`,
    `memory        budget ${formatBytes(s.budget_bytes)}, arena ${formatBytes(s.arena_bytes)}, ` +
    `peak RSS ${formatBytes(s.peak_rss_bytes)}, ${s.threads} threads`,
  ];
  return lines.join("\n");
}
