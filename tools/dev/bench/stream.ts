/**
 * `deno task bench stream [--size 2G | --model PATH] [--no-resident] [--budget-fraction 0.3]
 * [--tokens 32] [--json]`: streaming decode under a memory budget, against the disk it streams
 * from.
 *
 * It makes (once, cached under $SLUICE_CACHE or /tmp/sluice-bench) a synthetic Qwen3-MoE-shaped
 * bf16 checkpoint of `--size`, packs it, and then in one process: measures the O_DIRECT read
 * bandwidth (tools/dev/bench/disk.ts), and runs greedy decode from a fixed prompt under a budget of
 * `--budget-fraction` × the whole model with the engine's defaults (lookahead 1 while experts
 * stream), with read-ahead off, with the lookahead off, with the lookahead at `--lookahead N`, and
 * once with the whole model resident (the compute-only time). The page
 * cache is dropped before each run when root. It reports decode tok/s, bytes read per token,
 * expert hit rate and the I/O share, and the ratios with their targets:
 * - tok/s ÷ disk roofline (O_DIRECT GB/s ÷ bytes read per token) ≥ 0.85
 * - tok/s ÷ replay roofline (tokens ÷ the time the defaults run's own logged reads take when
 *   replayed right after it with no compute at its queue depth,
 *   tools/dev/bench/replay_roofline.ts) ≥ 0.85
 * - defaults (lookahead on) ÷ lookahead off ≥ 1.0 (and read-ahead on ÷ off, reported)
 * - time per token ÷ max(disk time, compute time) ≤ 1.10, compute time from the resident run.
 *
 * `--repeat N` (default 3) runs each budget configuration N times from a cold cache, interleaved,
 * and keeps the fastest; `--lookahead N` (default top-k) adds a row with that lookahead.
 * `--model DIR` runs an existing container instead (e.g. a real-width `synth` + `pack`, or a Kimi
 * K3-shaped one from `synth --arch kimi_k3`); `--no-resident` skips the whole-model run, which is
 * also skipped when the whole model does not fit in the arena or in RAM (compute time is then the
 * defaults run's time per token minus its io wait).
 *
 * The roofline's bandwidth is the engine's own access pattern: whole expert records at random
 * places of the container's banks, O_DIRECT, at the reader's queue depth (the sequential figure
 * is reported beside it but is not what decode does).
 *
 * Decode is the engine's forward + argmax per token with no stop ids: what `Session.generate`
 * does greedily with `ignoreEos`, but with the counters read around the decode steps only.
 *
 * @module
 */
import { totalmem } from "node:os";
import { MAX_ARENA_BYTES, sharedMemory64 } from "../../../wasm/mod.ts";
import { existsSync, mkdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { Model, planRun, type RunOptions } from "../../../engine/model.ts";
import { argmax } from "../../../engine/sampler.ts";
import { openContainer } from "../../../engine/container.ts";
import { openReader, type ReadTicket, waitAll } from "../../../io/reader.ts";
import { REQUEST_BYTES } from "../../../engine/stream/expert_store.ts";
import { packCheckpoint } from "../../pack.ts";
import { parseSize, synthCheckpoint } from "../../synth.ts";
import { benchDisk } from "./disk.ts";
import { dropPageCache } from "../../../io/disk_probe.ts";
import { ReadLog } from "../../../io/read_log.ts";
import { type ReplayRoofline, replayRoofline } from "./replay_roofline.ts";

const GiB = 2 ** 30;

/** Options of {@link benchStream}. */
export interface StreamBenchOptions {
  /** Bytes of tensor data of the synthetic model (default 2 GiB). */
  size: number;
  /** An existing container to run instead of the synthetic model. */
  model?: string;
  /** Runs the whole model resident for the compute-only time (default true). */
  resident?: boolean;
  /** Budget as a fraction of the whole-model arena (default 0.3). */
  budgetFraction: number;
  /** Decode tokens per run (default 32). */
  tokens: number;
  /** Speculative reads per MoE layer for the lookahead run (default: top-k). */
  lookahead?: number;
  /** Bytes of the disk-bandwidth test file (default 1 GiB). */
  diskBytes?: number;
  /** Cold runs of each budget configuration; the fastest is kept (default 3). */
  repeat?: number;
  /** Where the packed model is cached (default $SLUICE_CACHE or /tmp/sluice-bench). */
  cacheDir?: string;
  /** Progress lines on stderr. */
  log?: (line: string) => void;
}

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
  /** Milliseconds per token spent waiting for reads (experts and trunk). */
  io_wait_ms_per_token: number;
  /** io wait ÷ decode time. */
  io_share: number;
  speculative_reads: number;
  speculative_used: number;
  /** Lookahead predictions its precision gate kept from being read (whole run). */
  speculative_skipped: number;
  lookahead_recall: number | null;
  trunk_pinned: number;
  expert_slots: number;
  /** Greedy ids decoded (every run must decode the same ones). */
  ids: number[];
}

/** One target of the bench. */
export interface StreamTarget {
  name: string;
  value: number;
  target: string;
  pass: boolean;
}

/** Everything the bench reports. */
export interface StreamBenchResult {
  model: {
    path: string;
    layers: number;
    experts: number;
    top_k: number;
    hidden: number;
    expert_record_bytes: number;
    whole_model_bytes: number;
  };
  budget_bytes: number;
  /** Sequential 1 MiB O_DIRECT reads, one per reader thread in flight (tools/dev/bench/disk.ts). */
  disk_odirect_gbps: number;
  /** Random whole expert records of this container, O_DIRECT, top-k records outstanding. */
  disk_record_gbps: number;
  /** The roofline's bandwidth: the random-record figure (sequential if the shim is missing). */
  disk_gbps: number;
  /** tok/s of every repeat of each configuration, in run order. */
  repeats: Record<string, number[]>;
  /** Drop of the page cache before each run worked (root). */
  page_cache_dropped: boolean;
  load_average: number;
  runs: StreamRun[];
  roofline_tok_s: number;
  /** The defaults run's own reads replayed with no compute after each of its repeats
   * (tools/dev/bench/replay_roofline.ts). */
  replays: ReplayRoofline[];
  /** The fastest replay's tok/s: the roofline of the engine's own access pattern. */
  replay_roofline_tok_s: number;
  /** Disk time per token at the measured bandwidth (ms). */
  disk_ms_per_token: number;
  /** Per-token compute time from the resident run (NaN when skipped), and from the budget run
   * minus io wait. */
  compute_ms_per_token: number;
  compute_ms_per_token_by_subtraction: number;
  targets: StreamTarget[];
  identical_tokens: boolean;
  notes: string[];
}

/** The synthetic model's checkpoint and container paths for a size. */
function modelPaths(cacheDir: string, size: number): { hf: string; packed: string } {
  const tag = `qwen3_moe-${(size / GiB).toFixed(2).replace(/\.?0+$/, "")}G-bf16-seed0`;
  return { hf: join(cacheDir, `stream-${tag}-hf`), packed: join(cacheDir, `stream-${tag}.sluice`) };
}

/** Makes and packs the synthetic model unless the container is already cached. */
export async function ensureStreamModel(
  cacheDir: string,
  size: number,
  log: (line: string) => void,
): Promise<string> {
  const { hf, packed } = modelPaths(cacheDir, size);
  if (existsSync(join(packed, "manifest.json"))) return packed;
  mkdirSync(cacheDir, { recursive: true });
  log(`bench stream: making a ${(size / GiB).toFixed(2)} GiB synthetic qwen3_moe model in ${hf}`);
  await synthCheckpoint({ arch: "qwen3_moe", out: hf, size, dtype: "bf16", force: true, log });
  await packCheckpoint(hf, packed, { log });
  // The checkpoint is only the packer's input; the container is what the runs read.
  rmSync(hf, { recursive: true, force: true });
  return packed;
}

/**
 * O_DIRECT GB/s of the engine's own access pattern: `count` whole expert records at seeded random
 * (layer, expert) places of the container's banks, each split into the expert store's
 * {@link REQUEST_BYTES} requests as it reads them, `inFlight` records outstanding on the reader's
 * default threads (the engine queues a layer's top-k misses at once, so pass top-k). NaN when
 * the direct shim is unavailable.
 */
export function recordReadGbps(path: string, count: number, inFlight = 2): number {
  const c = openContainer(path);
  const banks = c.manifest.experts.filter((b) => b !== null);
  const stride = Math.max(...banks.map((b) => b.stride));
  const memory = sharedMemory64(inFlight * stride);
  const reader = openReader(memory, { direct: true, quiet: true });
  try {
    if (reader.kind !== "shim-direct") return NaN;
    const handles = banks.map((b) => reader.open(c.expertBankPath(b.layer)));
    let x = 0x9e3779b9;
    const next = () => {
      x ^= x << 13;
      x ^= x >>> 17;
      x ^= x << 5;
      return (x >>> 0) / 4294967296;
    };
    const queue: ReadTicket[][] = [];
    let bytes = 0;
    const t0 = performance.now();
    for (let i = 0; i < count; i++) {
      if (queue.length === inFlight) waitAll(reader, queue.shift()!, `${path}: random record read`);
      const b = Math.floor(next() * banks.length);
      const e = Math.floor(next() * banks[b].count);
      const slot = (i % inFlight) * stride, n = banks[b].stride;
      const tickets: ReadTicket[] = [];
      for (let o = 0; o < n; o += REQUEST_BYTES) {
        const len = Math.min(REQUEST_BYTES, n - o);
        tickets.push(reader.submit(handles[b], slot + o, len, e * n + o));
      }
      queue.push(tickets);
      bytes += n;
    }
    while (queue.length) waitAll(reader, queue.shift()!, `${path}: random record read`);
    return bytes / ((performance.now() - t0) / 1000) / 1e9;
  } finally {
    reader.close();
  }
}

/** A fixed prompt of ordinary token ids (the BOS id is not needed by a synthetic model). */
export function fixedPrompt(vocab: number): number[] {
  return Array.from({ length: 8 }, (_, i) => (1000 + 37 * i) % vocab);
}

interface Counters {
  expertBytes: number;
  trunkBytes: number;
  waitMs: number;
  hits: number;
  misses: number;
  spec: number;
  specUsed: number;
}

function counters(m: Model): Counters {
  const s = m.experts?.stats, c = m.experts?.cache.stats;
  return {
    expertBytes: s?.bytesRead ?? 0,
    trunkBytes: m.trunk.stats.bytes,
    waitMs: (s?.waitMs ?? 0) + m.trunk.stats.waitMs,
    hits: c?.hits ?? 0,
    misses: c?.misses ?? 0,
    spec: s?.speculative ?? 0,
    specUsed: s?.speculativeUsed ?? 0,
  };
}

/** Prefills `prompt`, then decodes `tokens` greedy tokens; returns the decode-step numbers. */
export function decode(m: Model, label: string, prompt: number[], tokens: number): StreamRun {
  let logits: Float32Array = new Float32Array(0);
  for (let p = 0; p < prompt.length; p += m.prefillChunk) {
    logits = m.forward(prompt.slice(p, p + m.prefillChunk), p);
  }
  const a = counters(m);
  const ids: number[] = [];
  const t0 = performance.now();
  for (let n = 0; n < tokens; n++) {
    const id = argmax(logits);
    ids.push(id);
    logits = m.forward([id], prompt.length + n);
  }
  const ms = performance.now() - t0;
  const b = counters(m);
  const bytes = b.expertBytes - a.expertBytes + b.trunkBytes - a.trunkBytes;
  const hits = b.hits - a.hits, misses = b.misses - a.misses;
  const wait = b.waitMs - a.waitMs;
  return {
    label,
    tok_s: (tokens * 1000) / ms,
    ms_per_token: ms / tokens,
    bytes_per_token: bytes / tokens,
    expert_bytes_per_token: (b.expertBytes - a.expertBytes) / tokens,
    expert_hit_rate: hits + misses > 0 ? hits / (hits + misses) : 1,
    io_wait_ms_per_token: wait / tokens,
    io_share: wait / ms,
    speculative_reads: b.spec - a.spec,
    speculative_used: b.specUsed - a.specUsed,
    speculative_skipped: m.observers.lookahead?.stats.skipped ?? 0,
    lookahead_recall: m.observers.lookahead?.recall ?? null,
    trunk_pinned: m.plan.pinned,
    expert_slots: m.plan.expertSlots,
    ids,
  };
}

/**
 * Opens the model under `opts` and decodes `passes` times from position 0 (the KV cache is
 * simply overwritten); returns every pass. `warm` runs one unmeasured pass first.
 */
async function measure(
  path: string,
  label: string,
  opts: RunOptions,
  prompt: number[],
  tokens: number,
  passes: number,
  warm = false,
): Promise<StreamRun[]> {
  const m = await Model.open(path, { quiet: true, hotList: false, ...opts });
  try {
    if (warm) decode(m, label, prompt, tokens);
    return Array.from({ length: passes }, () => decode(m, label, prompt, tokens));
  } finally {
    m.close();
  }
}

/** Runs the whole bench. */
export async function benchStream(opts: StreamBenchOptions): Promise<StreamBenchResult> {
  const log = opts.log ?? ((line: string) => console.error(line));
  const cacheDir = opts.cacheDir ?? Deno.env.get("SLUICE_CACHE") ?? "/tmp/sluice-bench";
  const path = opts.model ?? await ensureStreamModel(cacheDir, opts.size, log);
  const withResident = opts.resident ?? true;
  // The context only needs the prompt and the decoded tokens; a smaller KV cache leaves the
  // budget to the trunk and the experts.
  const prompt = fixedPrompt(Number.MAX_SAFE_INTEGER);
  const ctx = Math.max(64, 2 ** Math.ceil(Math.log2(prompt.length + opts.tokens + 1)));
  // The whole-model plan without loading the model, which may not fit in RAM.
  const container = openContainer(path);
  const cfg = container.config, plan = planRun(container, { ctx }).plan;
  const stride = container.manifest.experts.find((b) => b)?.stride ?? 0;
  const residentFits = plan.wholeModelBytes <= Math.min(MAX_ARENA_BYTES, 0.6 * totalmem());
  const moe = cfg.moe!;
  const budget = Math.floor(opts.budgetFraction * plan.wholeModelBytes);
  const promptIds = fixedPrompt(cfg.vocabSize);
  const lookahead = opts.lookahead ?? moe.topK;
  const repeat = opts.repeat ?? 3;

  log(`bench stream: disk O_DIRECT bandwidth (${((opts.diskBytes ?? GiB) / GiB).toFixed(1)} GiB)`);
  const disk = await benchDisk({ bytes: opts.diskBytes ?? GiB, runs: 2, quiet: true });
  dropPageCache();
  // About 1 GiB of records (at least 96), whatever the record size of the format, with top-k
  // records outstanding: the store queues a layer's misses together before any expert computes.
  const records = stride > 0 ? Math.max(96, Math.ceil(GiB / stride)) : 96;
  const recordGbps = recordReadGbps(path, records, moe.topK);
  const gbps = Number.isNaN(recordGbps) ? disk.odirect_gbps : recordGbps;

  // Budget runs start cold, so each repeat reopens the model; the repeats are interleaved so
  // that noise from other processes hits every configuration alike. The best repeat is kept.
  const configs: [string, RunOptions][] = [
    ["budget, defaults", { budget }],
    ["budget, read-ahead off", { budget, readaheadDepth: 0, trunkReadahead: false }],
    ["budget, lookahead off", { budget, lookahead: 0 }],
    [`budget, lookahead ${lookahead}`, { budget, lookahead }],
  ];
  const best = new Map<string, StreamRun>();
  const all: StreamRun[] = [];
  let dropped = true;
  const keep = (r: StreamRun) => {
    all.push(r);
    const b = best.get(r.label);
    if (!b || r.tok_s > b.tok_s) best.set(r.label, r);
  };
  const replays: ReplayRoofline[] = [];
  for (let rep = 0; rep < repeat; rep++) {
    for (const [label, o] of configs) {
      dropped = dropPageCache() && dropped;
      log(`bench stream: run "${label}" (${rep + 1}/${repeat})`);
      const readLog = label === configs[0][0] ? new ReadLog() : undefined;
      (await measure(path, label, { ctx, ...o, readLog }, promptIds, opts.tokens, 1)).forEach(keep);
      if (readLog) replays.push(replayRoofline(readLog, promptIds.length, opts.tokens));
    }
  }
  const residentLabel = "whole model resident (warm)";
  if (withResident && residentFits) {
    log(`bench stream: run "whole model resident" (1 warm-up + ${repeat} passes)`);
    (await measure(path, residentLabel, { ctx }, promptIds, opts.tokens, repeat, true))
      .forEach(keep);
  }
  const resident = best.get(residentLabel);
  const runs = [...best.values()];
  const base = best.get(configs[0][0])!;
  const noAhead = best.get(configs[1][0])!;
  const noLook = best.get("budget, lookahead off")!;

  const roofline = (gbps * 1e9) / base.bytes_per_token;
  const replayTokS = Math.max(...replays.map((r) => r.tok_s));
  const diskMs = (base.bytes_per_token / (gbps * 1e9)) * 1000;
  const computeSub = base.ms_per_token - base.io_wait_ms_per_token;
  const computeMs = resident?.ms_per_token ?? computeSub;
  const overlap = base.ms_per_token / Math.max(diskMs, computeMs);
  const targets: StreamTarget[] = [
    { name: "tok/s ÷ disk roofline", value: base.tok_s / roofline, target: ">= 0.85", pass: false },
    {
      name: "tok/s ÷ replay roofline",
      value: base.tok_s / replayTokS,
      target: ">= 0.85",
      pass: false,
    },
    {
      name: "lookahead on ÷ off (tok/s)",
      value: base.tok_s / noLook.tok_s,
      target: ">= 1.00",
      pass: false,
    },
    {
      name: "time/token ÷ max(disk, compute)",
      value: overlap,
      target: "<= 1.10",
      pass: false,
    },
  ];
  targets[0].pass = targets[0].value >= 0.85;
  targets[1].pass = targets[1].value >= 0.85;
  targets[2].pass = targets[2].value >= 1.0;
  targets[3].pass = targets[3].value <= 1.1;
  const identical = all.every((r) => r.ids.join() === base.ids.join());
  return {
    model: {
      path,
      layers: cfg.numLayers,
      experts: moe.numExperts,
      top_k: moe.topK,
      hidden: cfg.hiddenSize,
      expert_record_bytes: stride,
      whole_model_bytes: plan.wholeModelBytes,
    },
    budget_bytes: budget,
    disk_odirect_gbps: disk.odirect_gbps,
    disk_record_gbps: recordGbps,
    disk_gbps: gbps,
    repeats: Object.fromEntries(
      [...best.keys()].map((k) => [k, all.filter((r) => r.label === k).map((r) => r.tok_s)]),
    ),
    page_cache_dropped: dropped,
    load_average: Deno.loadavg()[0],
    runs,
    roofline_tok_s: roofline,
    replays,
    replay_roofline_tok_s: replayTokS,
    disk_ms_per_token: diskMs,
    compute_ms_per_token: computeMs,
    compute_ms_per_token_by_subtraction: computeSub,
    targets: [
      ...targets,
      {
        name: "read-ahead on ÷ off (tok/s), reported",
        value: base.tok_s / noAhead.tok_s,
        target: "(none)",
        pass: true,
      },
    ],
    identical_tokens: identical,
    notes: [
      "Random routers route near-uniformly: expert hit rates are about the cached share of " +
      "experts, the worst case for caching. Real routers are skewed and hit more.",
      resident
        ? "Compute time is the per-token time of the whole-model-resident run, measured on a " +
          "second pass over the same tokens (every expert already in memory, no reads)."
        : "The resident run was skipped: compute time is the defaults run minus its io wait.",
      "Roofline = O_DIRECT GB/s of random whole expert records of this container, top-k " +
      "outstanding as the store queues them, measured in this run ÷ bytes read per decode token " +
      "of the defaults run.",
      "Replay roofline = decode tokens ÷ the time the defaults run's own logged reads take when " +
      "replayed right after it from a dropped page cache, same reader and threads, in its " +
      "order and at its most reads in flight, no compute (fastest of its repeats). The " +
      "ordered replay also waits where the run waited.",
    ],
  };
}

const pct = (x: number) => `${(100 * x).toFixed(1)}%`;
const mib = (x: number) => `${(x / 2 ** 20).toFixed(1)} MiB`;

/** The human-readable report. */
export function formatStreamReport(r: StreamBenchResult): string {
  const m = r.model;
  const lines = [
    `model   ${m.path}: ${m.layers} layers × ${m.experts} experts top-${m.top_k}, hidden ` +
    `${m.hidden}, expert record ${mib(m.expert_record_bytes)}, whole ${mib(m.whole_model_bytes)}`,
    `budget  ${mib(r.budget_bytes)} (${
      (r.budget_bytes / m.whole_model_bytes).toFixed(2)
    } of the model); disk O_DIRECT ${r.disk_odirect_gbps.toFixed(2)} GB/s sequential, ${
      r.disk_record_gbps.toFixed(2)
    } GB/s random records; page cache ${
      r.page_cache_dropped ? "dropped" : "NOT dropped (not root)"
    }; load average ${r.load_average.toFixed(2)}`,
    "",
    "| run | tok/s (all repeats) | ms/token | read/token | expert hit rate | io wait/token | io share | " +
    "spec reads (used, not read) | recall |",
    "|---|---|---|---|---|---|---|---|---|",
    ...r.runs.map((x) =>
      `| ${x.label} | ${x.tok_s.toFixed(2)} (${
        (r.repeats[x.label] ?? []).map((t) => t.toFixed(2)).join(", ")
      }) | ${x.ms_per_token.toFixed(1)} | ` +
      `${mib(x.bytes_per_token)} | ${pct(x.expert_hit_rate)} | ` +
      `${x.io_wait_ms_per_token.toFixed(1)} ms | ${pct(x.io_share)} | ` +
      `${x.speculative_reads} (${x.speculative_used}, ${x.speculative_skipped}) | ` +
      `${x.lookahead_recall === null ? "-" : pct(x.lookahead_recall)} |`
    ),
    "",
    `roofline ${r.roofline_tok_s.toFixed(2)} tok/s; disk ${r.disk_ms_per_token.toFixed(1)} ` +
    `ms/token; compute ${
      Number.isNaN(r.compute_ms_per_token)
        ? "(resident run skipped)"
        : `${r.compute_ms_per_token.toFixed(1)} ms/token resident`
    } ` +
    `(${r.compute_ms_per_token_by_subtraction.toFixed(1)} by subtracting io wait)`,
    `replay roofline ${r.replay_roofline_tok_s.toFixed(2)} tok/s: the defaults run's own ` +
    `reads with no compute, queued at its depth (${r.replays[0]?.max_in_flight} reads, ` +
    `${r.replays[0]?.threads} reader threads) ${
      r.replays.map((x) => `${x.tok_s.toFixed(2)} tok/s at ${x.gbps.toFixed(2)} GB/s`).join(", ")
    }; in its order of waits ${
      r.replays.map((x) => `${x.ordered_tok_s.toFixed(2)} at ${x.ordered_gbps.toFixed(2)}`)
        .join(", ")
    }`,
    "",
    "| ratio | value | target | |",
    "|---|---|---|---|",
    ...r.targets.map((t) =>
      `| ${t.name} | ${t.value.toFixed(2)} | ${t.target} | ${
        t.target === "(none)" ? "" : t.pass ? "PASS" : "MISS"
      } |`
    ),
    "",
    `greedy tokens identical across runs: ${r.identical_tokens ? "yes" : "NO"}`,
    ...r.notes.map((n) => `note: ${n}`),
  ];
  return lines.join("\n");
}

/** Entry point of `deno task bench stream`. */
export async function main(args: string[]): Promise<void> {
  const { values } = parseArgs({
    args,
    options: {
      size: { type: "string", default: "2G" },
      "budget-fraction": { type: "string", default: "0.3" },
      tokens: { type: "string", default: "32" },
      lookahead: { type: "string" },
      repeat: { type: "string", default: "3" },
      "disk-gib": { type: "string", default: "1" },
      model: { type: "string" },
      "no-resident": { type: "boolean", default: false },
      json: { type: "boolean", default: false },
    },
  });
  const fraction = Number(values["budget-fraction"]);
  const tokens = Number(values.tokens);
  if (!(fraction > 0 && fraction <= 1)) {
    throw new Error(`--budget-fraction must be in (0, 1], got ${values["budget-fraction"]}`);
  }
  for (const k of ["tokens", "repeat", "lookahead"] as const) {
    const v = values[k];
    if (v !== undefined && !(Number.isInteger(Number(v)) && Number(v) >= 1)) {
      throw new Error(`--${k} must be a positive integer, got ${v}`);
    }
  }
  const result = await benchStream({
    size: parseSize(values.size!),
    budgetFraction: fraction,
    tokens,
    lookahead: values.lookahead === undefined ? undefined : Number(values.lookahead),
    diskBytes: Number(values["disk-gib"]) * GiB,
    repeat: Number(values.repeat),
    model: values.model,
    resident: !values["no-resident"],
  });
  if (values.json) console.log(JSON.stringify(result, null, 2));
  else console.log(formatStreamReport(result));
}

if (import.meta.main) {
  await main(Deno.args);
}
