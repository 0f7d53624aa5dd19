/**
 * One configuration of `deno task bench stream`, in its own process: `deno run -A
 * tools/dev/bench/stream_child.ts JOB_JSON` opens the container under the job's run options,
 * decodes from the job's prompt and prints one JSON line, `{"runs": [StreamRun, ...]}`. One model
 * per process: V8 frees a closed arena's memory only when it collects it, so a second model opened
 * in the same process would be charged beside the first and break a memory cap.
 *
 * @module
 */
import { Model, type RunOptions } from "../../../engine/model.ts";
import { argmax } from "../../../engine/sampler.ts";
import type { SpeculationGate } from "../../../engine/stream/lookahead.ts";
import { peakRss } from "../../../engine/stats.ts";
import { ReadLog } from "../../../io/read_log.ts";
import type { TimelineTotals } from "../../../engine/stream/timeline.ts";
import { type ReplayRoofline, replayRoofline } from "./replay_roofline.ts";

/** The decode measurements of one run. */
export interface StreamRun {
  label: string;
  /** Decode tokens per second. */
  tok_s: number;
  ms_per_token: number;
  /** Bytes read from disk per decode token: expert records, trunk ring and speculative reads. */
  bytes_per_token: number;
  expert_bytes_per_token: number;
  expert_hit_rate: number;
  /** Bytes of trunk layers read per decode token (the ring's reads and read-ahead). */
  trunk_bytes_per_token: number;
  /** Trunk layer visits served by a pinned layer, of all visits (the rest went through the ring). */
  trunk_hit_rate: number;
  /** Milliseconds per token spent waiting for reads (experts and trunk). */
  io_wait_ms_per_token: number;
  /** io wait ÷ decode time. */
  io_share: number;
  speculative_reads: number;
  speculative_used: number;
  /** Guesses withdrawn because their layer did not use them. */
  speculative_cancelled: number;
  /** Lookahead predictions its gate kept from being read (whole run). */
  speculative_skipped: number;
  lookahead_recall: number | null;
  /**
   * Each kind of lookahead prediction (the next layer's; the first layer's from the embedding,
   * from the guessed next token's embedding in the tail, and the tail's from recent routes):
   * predictions made and the decayed precision of the top guess.
   */
  lookahead_gates?: { name: string; predictions: number; precision: number }[];
  /** The next layer's guesses over the whole run, by rank: guesses scored and the share routed. */
  lookahead_ranks?: { n: number; precision: number }[];
  /** Disk busy (a read running) and disk time guesses held from urgent reads, ms per token. */
  disk_busy_ms_per_token?: number | null;
  disk_blocked_ms_per_token?: number | null;
  trunk_pinned: number;
  expert_slots: number;
  /** Peak resident set size of the process that ran it (VmHWM). */
  peak_rss_bytes: number;
  /** Greedy ids decoded (every run must decode the same ones). */
  ids: number[];
  /** With `StreamJob.replay`: this run's own reads replayed with no compute right after it. */
  replay?: ReplayRoofline;
  /** With `StreamJob.timeline`: where the decode's time went, in milliseconds per token. */
  timeline?: TimelineTotals;
}

/** What one child process runs. */
export interface StreamJob {
  path: string;
  label: string;
  opts: RunOptions;
  /** How the lookahead's gate decides (default: measured). */
  gate?: SpeculationGate["mode"];
  prompt: number[];
  tokens: number;
  /** Measured decode passes from position 0 (the KV cache is simply overwritten). */
  passes: number;
  /** One unmeasured pass first (the resident run's warm-up). */
  warm: boolean;
  /** Log the (single) pass's reads and replay them after it (tools/dev/bench/replay_roofline.ts). */
  replay?: boolean;
  /** Keep the engine's timeline (engine/stream/timeline.ts) over the decode steps. */
  timeline?: boolean;
}

interface Counters {
  expertBytes: number;
  trunkBytes: number;
  trunkHits: number;
  trunkReads: number;
  waitMs: number;
  hits: number;
  misses: number;
  spec: number;
  specUsed: number;
  specCancelled: number;
}

function counters(m: Model): Counters {
  const s = m.experts?.stats, c = m.experts?.cache.stats;
  return {
    expertBytes: s?.bytesRead ?? 0,
    trunkBytes: m.trunk.stats.bytes,
    trunkHits: m.trunk.stats.hits,
    trunkReads: m.trunk.stats.reads,
    waitMs: (s?.waitMs ?? 0) + m.trunk.stats.waitMs,
    hits: c?.hits ?? 0,
    misses: c?.misses ?? 0,
    spec: s?.speculative ?? 0,
    specUsed: s?.speculativeUsed ?? 0,
    specCancelled: s?.speculativeCancelled ?? 0,
  };
}

/** Prefills `prompt`, then decodes `tokens` greedy tokens; returns the decode-step numbers. */
export function decode(m: Model, label: string, prompt: number[], tokens: number): StreamRun {
  let logits: Float32Array = new Float32Array(0);
  for (let p = 0; p < prompt.length; p += m.prefillChunk) {
    logits = m.forward(prompt.slice(p, p + m.prefillChunk), p);
  }
  const a = counters(m), diskA = m.reader.diskStats();
  const ids: number[] = [];
  const timeline = m.transformer.timeline;
  const t0 = performance.now();
  timeline?.reset();
  for (let n = 0; n < tokens; n++) {
    const id = argmax(logits);
    ids.push(id);
    logits = m.forward([id], prompt.length + n);
  }
  timeline?.mark("tail", -1);
  const ms = performance.now() - t0;
  const b = counters(m), diskB = m.reader.diskStats();
  const bytes = b.expertBytes - a.expertBytes + b.trunkBytes - a.trunkBytes;
  const hits = b.hits - a.hits, misses = b.misses - a.misses;
  const wait = b.waitMs - a.waitMs;
  const trunkHits = b.trunkHits - a.trunkHits, trunkReads = b.trunkReads - a.trunkReads;
  return {
    label,
    tok_s: (tokens * 1000) / ms,
    ms_per_token: ms / tokens,
    bytes_per_token: bytes / tokens,
    expert_bytes_per_token: (b.expertBytes - a.expertBytes) / tokens,
    expert_hit_rate: hits + misses > 0 ? hits / (hits + misses) : 1,
    trunk_bytes_per_token: (b.trunkBytes - a.trunkBytes) / tokens,
    trunk_hit_rate: trunkHits + trunkReads > 0 ? trunkHits / (trunkHits + trunkReads) : 1,
    io_wait_ms_per_token: wait / tokens,
    io_share: wait / ms,
    speculative_reads: b.spec - a.spec,
    speculative_used: b.specUsed - a.specUsed,
    speculative_cancelled: b.specCancelled - a.specCancelled,
    speculative_skipped: m.observers.lookahead?.stats.skipped ?? 0,
    lookahead_recall: m.observers.lookahead?.recall ?? null,
    lookahead_gates: m.observers.lookahead?.gates.map((g, i) => ({
      name: ["next layer", "embedding", "next token", "recent"][i],
      predictions: g.decisions,
      precision: g.precisionAt(0),
    })),
    lookahead_ranks: m.observers.lookahead?.gate.ranks.map((r) => ({
      n: r.n,
      precision: r.n > 0 ? r.hits / r.n : 0,
    })),
    disk_busy_ms_per_token: diskA && diskB ? (diskB.busyMs - diskA.busyMs) / tokens : null,
    disk_blocked_ms_per_token: diskA && diskB ? (diskB.blockedMs - diskA.blockedMs) / tokens : null,
    trunk_pinned: m.plan.pinned,
    expert_slots: m.plan.expertSlots,
    peak_rss_bytes: peakRss(),
    ids,
    ...(timeline ? { timeline: perToken(timeline.totals, tokens) } : {}),
  };
}

/** `t` with every time divided by `tokens`. */
function perToken(t: TimelineTotals, tokens: number): TimelineTotals {
  const scale = (p: TimelineTotals["phases"]) => {
    for (const v of Object.values(p)) {
      v.wallMs /= tokens;
      v.diskMs /= tokens;
    }
    return p;
  };
  scale(t.phases);
  t.layers.forEach(scale);
  return t;
}

/** Opens the model of `job`, decodes its passes (and replays their reads if asked), closes it. */
export async function runJob(job: StreamJob): Promise<StreamRun[]> {
  const readLog = job.replay ? new ReadLog() : undefined;
  const m = await Model.open(job.path, {
    quiet: true,
    hotList: false,
    ...job.opts,
    readLog,
    timeline: job.timeline,
  });
  try {
    if (job.gate && m.observers.lookahead) m.observers.lookahead.setMode(job.gate);
    if (job.warm) decode(m, job.label, job.prompt, job.tokens);
    const runs = Array.from(
      { length: job.passes },
      () => decode(m, job.label, job.prompt, job.tokens),
    );
    // Into the model's own arena, now that decoding is over: a second one would double what a
    // --cap cgroup is charged.
    if (readLog) {
      runs[runs.length - 1].replay = replayRoofline(
        readLog,
        job.prompt.length,
        job.tokens,
        m.arena.memory,
      );
    }
    return runs;
  } finally {
    m.close();
  }
}

/**
 * The runs a child printed, from its exit code and output; an Error naming the configuration and
 * the cause (a signal such as the cgroup's OOM kill, the tail of its stderr) when it has none.
 */
export function parseChildOutput(
  label: string,
  status: { code: number; signal: string | null },
  stdout: string,
  stderr: string,
): StreamRun[] {
  const line = stdout.trim().split("\n").pop() ?? "";
  let runs: unknown = null;
  if (line.startsWith("{")) {
    try {
      runs = (JSON.parse(line) as { runs?: unknown }).runs;
    } catch {
      runs = null;
    }
  }
  if (status.code === 0 && Array.isArray(runs) && runs.length > 0) return runs as StreamRun[];
  const how = status.signal
    ? `was killed by ${status.signal}${status.signal === "SIGKILL" ? " (out of memory?)" : ""}`
    : status.code !== 0
    ? `exited with code ${status.code}`
    : "printed no runs";
  const tail = stderr.trim().split("\n").slice(-3).join(" | ");
  throw new Error(`bench stream: run "${label}" ${how}${tail ? `: ${tail}` : ""}`);
}

if (import.meta.main) {
  const job = JSON.parse(Deno.args[0]) as StreamJob;
  console.log(JSON.stringify({ runs: await runJob(job) }));
  // Pool workers can keep the event loop alive after close; the result is out.
  Deno.exit(0);
}
