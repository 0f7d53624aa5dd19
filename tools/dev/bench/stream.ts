/**
 * `deno task bench stream [--size 2G | --model PATH] [--no-resident] [--budget-fraction 0.3]
 * [--cap SIZE] [--ab] [--tokens 32] [--json]`: streaming decode under a memory budget, against the disk
 * it streams from.
 *
 * It makes (once, cached under $SLUICE_CACHE or /tmp/sluice-bench) a synthetic Qwen3-MoE-shaped
 * bf16 checkpoint of `--size`, packs it, measures the O_DIRECT read bandwidth
 * (tools/dev/bench/disk.ts, and random records of the container), and runs greedy decode from a
 * fixed prompt under a budget of `--budget-fraction` × the whole model with the engine's defaults
 * (lookahead 1 while experts stream, read only when its gate measures that it pays), with
 * read-ahead off, with the lookahead off, with lookahead 1 and its gate held open, with the
 * lookahead at `--lookahead N`, and once with the whole model resident (the compute-only time).
 * Each run is its own child process (tools/dev/bench/stream_child.ts): with `--cap SIZE` (root)
 * every budget run goes in a memory cgroup of that limit, and the resident run is skipped. `--ab`
 * runs only the defaults and the lookahead off (more repeats in the same minutes). The
 * page cache is dropped before each run when root. It reports decode tok/s, bytes read per token,
 * expert hit rate and the I/O share, and the ratios with their targets:
 * - tok/s ÷ disk roofline (O_DIRECT GB/s ÷ bytes read per token) ≥ 0.85
 * - tok/s ÷ replay roofline (tokens ÷ the time the defaults run's own logged reads take when
 *   replayed right after it with no compute at its queue depth,
 *   tools/dev/bench/replay_roofline.ts) ≥ 0.85
 * - defaults (lookahead on) ÷ lookahead off ≥ 1.0 (and read-ahead on ÷ off, and the lookahead
 *   with its gate held open ÷ off, reported)
 * - time per token ÷ max(disk time, compute time) ≤ 1.10, compute time from the resident run.
 *
 * `--repeat N` (default 3) runs each budget configuration N times from a cold cache, interleaved,
 * and keeps the fastest; `--lookahead N` (default top-k) adds a row with that lookahead.
 * `--baseline TREE` runs the defaults configuration with another source tree's engine too (e.g.
 * an export of main: `git archive main | tar -x -C TREE` and a node_modules link), alternating
 * with this tree's in every repeat, each with its own replay, and reports this tree's tok/s over
 * the baseline's.
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
import { fileURLToPath } from "node:url";
import { planRun, type RunOptions } from "../../../engine/model.ts";
import { openContainer } from "../../../engine/container.ts";
import { openReader, type ReadTicket, waitAll } from "../../../io/reader.ts";
import { REQUEST_BYTES } from "../../../engine/stream/expert_store.ts";
import { packCheckpoint } from "../../pack.ts";
import { parseSize, synthCheckpoint } from "../../synth.ts";
import { benchDisk } from "./disk.ts";
import { median } from "./alternate.ts";
import { dropPageCache } from "../../../io/disk_probe.ts";
import {
  cgroupCommand,
  cgroupPeak,
  createCgroup,
  type MemoryCgroup,
  removeCgroup,
  resetCgroupPeak,
} from "./cgroup.ts";
import { parseChildOutput, type StreamJob, type StreamRun as ChildRun } from "./stream_child.ts";
import type { ReplayRoofline } from "./replay_roofline.ts";
import { PHASES, type PhaseTime } from "../../../engine/stream/timeline.ts";

const CHILD = fileURLToPath(new URL("./stream_child.ts", import.meta.url));

/** The decode measurements of one run, and the cgroup's peak under `--cap`. */
export interface StreamRun extends ChildRun {
  /** Peak memory charged to the cgroup during the run (null without `--cap`). */
  cgroup_peak_bytes: number | null;
}

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
  /** Runs every budget configuration in a memory cgroup of this many bytes (root). */
  cap?: number;
  /** Only the defaults and the lookahead off, and no resident run. */
  ab?: boolean;
  /** Where the packed model is cached (default $SLUICE_CACHE or /tmp/sluice-bench). */
  cacheDir?: string;
  /**
   * Another source tree of sluice (e.g. main's): its engine runs the defaults configuration too,
   * alternating with this tree's in the same repeats, each replayed.
   */
  baseline?: string;
  /** Progress lines on stderr. */
  log?: (line: string) => void;
}

/**
 * Where one run's time per token went: compute (its time less its io wait), disk (its bytes read
 * at the bench's measured GB/s, as if nothing else ran) and how much of that disk time the run hid
 * behind compute. The larger of compute and disk is the limit a perfect overlap would reach.
 */
export interface TokenSplit {
  compute_ms: number;
  disk_ms: number;
  /** Share of the disk time not waited for: 1 − io wait ÷ disk time, within [0, 1]. */
  overlap: number;
  /** Which of the two bounds the run: "disk" or "compute". */
  limit: "disk" | "compute";
}

/** The {@link TokenSplit} of `run` at `gbps` GB/s. */
export function tokenSplit(run: ChildRun, gbps: number): TokenSplit {
  const diskMs = (run.bytes_per_token / (gbps * 1e9)) * 1000;
  const computeMs = run.ms_per_token - run.io_wait_ms_per_token;
  const overlap = diskMs > 0 ? Math.min(1, Math.max(0, 1 - run.io_wait_ms_per_token / diskMs)) : 1;
  return {
    compute_ms: computeMs,
    disk_ms: diskMs,
    overlap,
    limit: diskMs > computeMs ? "disk" : "compute",
  };
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
  /** The memory cgroup's limit under `--cap`, or null. */
  cap_bytes: number | null;
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
  /** The GB/s the splits' disk times are taken at (the fastest replay's, else the probe's). */
  split_gbps: number;
  /** Per run (same order as `runs`): compute and disk ms per token and their overlap. */
  splits: TokenSplit[];
  roofline_tok_s: number;
  /** The defaults run's own reads replayed with no compute after each of its repeats
   * (tools/dev/bench/replay_roofline.ts). */
  replays: ReplayRoofline[];
  /** The fastest replay's tok/s: the roofline of the engine's own access pattern. */
  replay_roofline_tok_s: number;
  /** With `--baseline`: the other source tree, and its defaults runs' replays. */
  baseline: string | null;
  baseline_replays: ReplayRoofline[];
  /** Disk time per token at the measured bandwidth (ms). */
  disk_ms_per_token: number;
  /** Per-token compute time from the resident run (NaN when skipped), and from the budget run
   * minus io wait. */
  compute_ms_per_token: number;
  compute_ms_per_token_by_subtraction: number;
  targets: StreamTarget[];
  identical_tokens: boolean;
  /** Runs whose ids differ from the best defaults run's, with their ids. */
  differing_runs: string[];
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

/** The cgroup the runs go in under `--cap`, or null. */
type Cap = MemoryCgroup | null;

/**
 * Runs `job` in a child process (inside `cap` when given: the child joins the cgroup before the
 * engine allocates anything) and returns its runs, each with the cgroup's peak when capped.
 */
export async function runChild(job: StreamJob, cap: Cap, child = CHILD): Promise<StreamRun[]> {
  const args = ["run", "-A", child, JSON.stringify(job)];
  const [cmd, argv] = cap ? cgroupCommand(cap, Deno.execPath(), args) : [Deno.execPath(), args];
  if (cap) resetCgroupPeak(cap);
  const out = await new Deno.Command(cmd, { args: argv, stdout: "piped", stderr: "piped" })
    .output();
  const dec = new TextDecoder();
  const runs = parseChildOutput(
    job.label,
    { code: out.code, signal: out.signal },
    dec.decode(out.stdout),
    dec.decode(out.stderr),
  );
  const peak = cap ? cgroupPeak(cap) : null;
  return runs.map((r) => ({ ...r, cgroup_peak_bytes: peak }));
}

/** Runtime memory beside the arena, as bench compare measured it (90-120 MiB). */
const RUNTIME_BYTES = 160 * 2 ** 20;

/** The memory cgroup of `--cap`; refuses a budget the cap cannot hold beside the runtime. */
function openCap(capBytes: number, budget: number): MemoryCgroup {
  if (budget + RUNTIME_BYTES > capBytes) {
    throw new Error(
      `bench stream: the budget (${mib(budget)}) plus the runtime's ${mib(RUNTIME_BYTES)} does ` +
        `not fit under --cap ${mib(capBytes)}; lower --budget-fraction`,
    );
  }
  const cg = createCgroup("sluice-bench-stream", capBytes);
  if (typeof cg === "string") throw new Error(`bench stream: --cap: ${cg}`);
  return cg;
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
  const DEFAULTS = "budget, defaults", NO_AHEAD = "budget, read-ahead off";
  const NO_LOOK = "budget, lookahead off", HELD = "budget, lookahead 1, gate held open";
  const BASELINE = "baseline, defaults";
  const allConfigs: [string, RunOptions, StreamJob["gate"]?][] = [
    [DEFAULTS, { budget }],
    ...(opts.baseline ? [[BASELINE, { budget }] as [string, RunOptions]] : []),
    [NO_AHEAD, { budget, readaheadDepth: 0, trunkReadahead: false }],
    [NO_LOOK, { budget, lookahead: 0 }],
    [HELD, { budget, lookahead: 1 }, "always"],
    [`budget, lookahead ${lookahead}`, { budget, lookahead }],
  ];
  // --ab: the lookahead's on/off pair alone, so more repeats fit in the same minutes.
  const configs = opts.ab
    ? allConfigs.filter(([l]) => l === DEFAULTS || l === NO_LOOK || l === BASELINE)
    : allConfigs;
  const baselineChild = opts.baseline
    ? join(opts.baseline, "tools", "dev", "bench", "stream_child.ts")
    : CHILD;
  if (!existsSync(baselineChild)) {
    throw new Error(`bench stream: --baseline ${opts.baseline}: no ${baselineChild}`);
  }
  const cap = opts.cap === undefined ? null : openCap(opts.cap, budget);
  const best = new Map<string, StreamRun>();
  const all: StreamRun[] = [];
  let dropped = true;
  const keep = (r: StreamRun) => {
    all.push(r);
    const b = best.get(r.label);
    if (!b || r.tok_s > b.tok_s) best.set(r.label, r);
  };
  const job = (label: string, o: RunOptions, passes: number, warm: boolean): StreamJob => ({
    path,
    label,
    opts: { ctx, ...o },
    prompt: promptIds,
    tokens: opts.tokens,
    passes,
    warm,
  });
  try {
    for (let rep = 0; rep < repeat; rep++) {
      for (const [label, o, gate] of configs) {
        dropped = dropPageCache() && dropped;
        log(`bench stream: run "${label}" (${rep + 1}/${repeat})`);
        const replay = label === DEFAULTS || label === BASELINE;
        const child = label === BASELINE ? baselineChild : CHILD;
        (await runChild({ ...job(label, o, 1, false), gate, replay, timeline: true }, cap, child))
          .forEach(keep);
      }
    }
  } finally {
    if (cap) removeCgroup(cap);
  }
  const residentLabel = "whole model resident (warm)";
  // A capped bench measures the over-cap regime only: the whole model would not fit under it.
  if (withResident && residentFits && !cap && !opts.ab) {
    log(`bench stream: run "whole model resident" (1 warm-up + ${repeat} passes)`);
    (await runChild(job(residentLabel, {}, repeat, true), null)).forEach(keep);
  }
  const resident = best.get(residentLabel);
  const runs = [...best.values()];
  const base = best.get(DEFAULTS)!;
  const noLook = best.get(NO_LOOK)!;
  const medianOf = (label: string) =>
    median(all.filter((r) => r.label === label).map((r) => r.tok_s));

  const roofline = (gbps * 1e9) / base.bytes_per_token;
  const replaysOf = (label: string) =>
    all.flatMap((r) => r.label === label && r.replay ? [r.replay] : []);
  const replays = replaysOf(DEFAULTS);
  const replayTokS = Math.max(...replays.map((r) => r.tok_s));
  const baseReplays = replaysOf(BASELINE);
  const baseReplayTokS = Math.max(...baseReplays.map((r) => r.tok_s));
  // The splits' disk time: the run's bytes at the rate its own reads replayed at (the fastest
  // replay), the figure the replay roofline uses; the probe's when nothing was replayed.
  const splitGbps = replays.length ? Math.max(...replays.map((r) => r.gbps)) : gbps;
  const splits = runs.map((r) => tokenSplit(r, splitGbps));
  const baseSplit = splits[runs.indexOf(base)];
  const diskMs = (base.bytes_per_token / (gbps * 1e9)) * 1000;
  const computeSub = base.ms_per_token - base.io_wait_ms_per_token;
  const computeMs = resident?.ms_per_token ?? computeSub;
  const overlap = base.ms_per_token / Math.max(diskMs, computeMs);
  const target = (name: string, value: number, goal: string, pass: boolean): StreamTarget => ({
    name,
    value,
    target: goal,
    pass,
  });
  const reported = (name: string, over: string, under: string): StreamTarget[] =>
    best.has(over) && best.has(under)
      ? [target(name, best.get(over)!.tok_s / best.get(under)!.tok_s, "(none)", true)]
      : [];
  const onOff = base.tok_s / noLook.tok_s;
  const baseline = best.get(BASELINE);
  const vsBaseline: StreamTarget[] = baseline
    ? [
      target(
        "baseline tok/s ÷ its replay roofline, reported",
        baseline.tok_s / baseReplayTokS,
        "(none)",
        true,
      ),
      ...reported("defaults ÷ baseline defaults (tok/s), reported", DEFAULTS, BASELINE),
      target(
        "defaults ÷ baseline defaults (median tok/s of the repeats), reported",
        medianOf(DEFAULTS) / medianOf(BASELINE),
        "(none)",
        true,
      ),
    ]
    : [];
  const targets: StreamTarget[] = [
    target(
      "tok/s ÷ disk roofline",
      base.tok_s / roofline,
      ">= 0.85",
      base.tok_s / roofline >= 0.85,
    ),
    target(
      "tok/s ÷ replay roofline",
      base.tok_s / replayTokS,
      ">= 0.85",
      base.tok_s / replayTokS >= 0.85,
    ),
    // Below 1 the run is compute-bound and the replay ratio cannot pass this, however it overlaps.
    target(
      "disk ÷ compute ms per token (the replay ratio's ceiling below 1), reported",
      baseSplit.disk_ms / baseSplit.compute_ms,
      "(none)",
      true,
    ),
    target("lookahead on ÷ off (tok/s)", onOff, ">= 1.00", onOff >= 1.0),
    target(
      "lookahead on ÷ off (median tok/s of the repeats), reported",
      medianOf(DEFAULTS) / medianOf(NO_LOOK),
      "(none)",
      true,
    ),
    ...reported("lookahead, gate held open ÷ off (tok/s), reported", HELD, NO_LOOK),
    target("time/token ÷ max(disk, compute)", overlap, "<= 1.10", overlap <= 1.1),
    ...reported("read-ahead on ÷ off (tok/s), reported", DEFAULTS, NO_AHEAD),
    ...vsBaseline,
  ];
  const differing = all.filter((r) => r.ids.join() !== base.ids.join())
    .map((r) => `${r.label}: ${r.ids.join(" ")}`);
  const identical = differing.length === 0;
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
    cap_bytes: opts.cap ?? null,
    disk_odirect_gbps: disk.odirect_gbps,
    disk_record_gbps: recordGbps,
    disk_gbps: gbps,
    repeats: Object.fromEntries(
      [...best.keys()].map((k) => [k, all.filter((r) => r.label === k).map((r) => r.tok_s)]),
    ),
    page_cache_dropped: dropped,
    load_average: Deno.loadavg()[0],
    runs,
    split_gbps: splitGbps,
    splits,
    roofline_tok_s: roofline,
    replays,
    replay_roofline_tok_s: replayTokS,
    baseline: opts.baseline ?? null,
    baseline_replays: baseReplays,
    disk_ms_per_token: diskMs,
    compute_ms_per_token: computeMs,
    compute_ms_per_token_by_subtraction: computeSub,
    targets,
    identical_tokens: identical,
    differing_runs: differing,
    notes: [
      "Random routers route near-uniformly: expert hit rates are about the cached share of " +
      "experts, the worst case for caching. Real routers are skewed and hit more.",
      "Each budget configuration runs in its own process (one model per process: V8 frees a " +
      "closed arena late), so a --cap cgroup holds one engine at a time.",
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

/**
 * The defaults run's timeline: per phase and per layer, wall and disk-busy ms per token, and where
 * one side idled while the other worked.
 */
function formatTimeline(run: StreamRun | undefined, replayTokS: number): string[] {
  const t = run?.timeline;
  if (!t) return [];
  const ms = (x: number) => x.toFixed(1);
  const compute = PHASES.filter((p) => p !== "wait");
  const idle = compute.reduce((n, p) => n + t.phases[p].wallMs - t.phases[p].diskMs, 0);
  const both = compute.reduce((n, p) => n + t.phases[p].diskMs, 0);
  const cell = (x: PhaseTime) => `${ms(x.wallMs)} (${ms(x.diskMs)})`;
  // Before a layer is routed its reads cannot start, only guesses: the disk idle then is lost
  // whatever the schedule of the experts' reads and compute.
  const serial = (["mixer", "route", "tail"] as const)
    .reduce((n, p) => n + t.phases[p].wallMs - t.phases[p].diskMs, 0);
  const disk = 1000 / replayTokS;
  return [
    "",
    `Timeline of "${run!.label}" (ms per token; in brackets the part of it the disk was busy): ` +
    `the CPU worked while the disk idled ${ms(idle)} ms, both worked ${ms(both)} ms, the CPU ` +
    `waited for reads ${ms(t.phases.wait.wallMs)} ms (${t.waits} waits, ${t.waitsWithReady} ` +
    `while another of the layer's experts was ready). The disk idled ${ms(serial)} ms in ` +
    `mixers, routing and the tail, where a layer's reads cannot have started (guesses aside): ` +
    `with all else overlapped, tok/s ÷ replay roofline could reach at most ${
      (disk / (disk + serial)).toFixed(2)
    } (the replay's ${ms(disk)} ms ÷ (that + ${ms(serial)} ms)).`,
    "",
    `| layer | ${PHASES.join(" | ")} |`,
    `|---|${PHASES.map(() => "---").join("|")}|`,
    ...t.layers.map((l, i) => `| ${i} | ${PHASES.map((p) => cell(l[p])).join(" | ")} |`),
    `| all | ${PHASES.map((p) => cell(t.phases[p])).join(" | ")} |`,
    ...(run!.lookahead_gates
      ? [
        "",
        `Lookahead predictions (whole run; precision of the top guess): ${
          run!.lookahead_gates.map((g) => `${g.name} ${g.predictions} (${pct(g.precision)})`)
            .join(", ")
        }`,
      ]
      : []),
    ...(run!.lookahead_ranks?.length
      ? [
        `Next-layer guesses by rank (whole run; routed ÷ scored): ${
          run!.lookahead_ranks.map((r, k) => `${k + 1}: ${pct(r.precision)} of ${r.n}`).join(", ")
        }`,
      ]
      : []),
    ...(run!.disk_blocked_ms_per_token != null
      ? [
        `Disk busy ${ms(run!.disk_busy_ms_per_token ?? 0)} ms per token, of it disk time guesses ` +
        `held while a demand or read-ahead read was queued or running ${
          ms(run!.disk_blocked_ms_per_token)
        } ms.`,
      ]
      : []),
  ];
}

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
    } GB/s random records; ${
      r.cap_bytes === null ? "no cap" : `each run in a memory cgroup capped at ${mib(r.cap_bytes)}`
    }; page cache ${r.page_cache_dropped ? "dropped" : "NOT dropped (not root)"}; load average ${
      r.load_average.toFixed(2)
    }`,
    "",
    "| run | tok/s (all repeats) | ms/token | read/token (trunk) | expert hit rate | trunk hit rate | " +
    "io wait/token | io share | spec reads (used, withdrawn, not read) | recall | peak RSS (cgroup) |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
    ...r.runs.map((x) =>
      `| ${x.label} | ${x.tok_s.toFixed(2)} (${
        (r.repeats[x.label] ?? []).map((t) => t.toFixed(2)).join(", ")
      }) | ${x.ms_per_token.toFixed(1)} | ` +
      `${mib(x.bytes_per_token)} (${mib(x.trunk_bytes_per_token)}) | ${pct(x.expert_hit_rate)} | ` +
      `${pct(x.trunk_hit_rate)} | ` +
      `${x.io_wait_ms_per_token.toFixed(1)} ms | ${pct(x.io_share)} | ` +
      `${x.speculative_reads} (${x.speculative_used}, ${x.speculative_cancelled}, ` +
      `${x.speculative_skipped}) | ` +
      `${x.lookahead_recall === null ? "-" : pct(x.lookahead_recall)} | ${mib(x.peak_rss_bytes)}` +
      `${x.cgroup_peak_bytes === null ? "" : ` (${mib(x.cgroup_peak_bytes)})`} |`
    ),
    "",
    `Per token: compute = ms/token less io wait; disk = read/token at ${
      r.split_gbps.toFixed(2)
    } GB/s (the run's own reads replayed); overlap = the share of that disk time not waited for.`,
    "",
    "| run | compute ms/token | disk ms/token | io wait ms/token | overlap | limit |",
    "|---|---|---|---|---|---|",
    ...r.runs.map((x, i) => {
      const s = r.splits[i];
      return `| ${x.label} | ${s.compute_ms.toFixed(1)} | ${s.disk_ms.toFixed(1)} | ` +
        `${x.io_wait_ms_per_token.toFixed(1)} | ${pct(s.overlap)} | ${s.limit} |`;
    }),
    "",
    `roofline ${r.roofline_tok_s.toFixed(2)} tok/s; disk ${r.disk_ms_per_token.toFixed(1)} ` +
    `ms/token; compute ${
      r.runs.some((x) => x.label.startsWith("whole model resident"))
        ? `${r.compute_ms_per_token.toFixed(1)} ms/token resident`
        : "(resident run skipped)"
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
    ...(r.baseline
      ? [
        `baseline ${r.baseline}: its defaults run's reads replayed the same way ${
          r.baseline_replays.map((x) => `${x.tok_s.toFixed(2)} tok/s at ${x.gbps.toFixed(2)} GB/s`)
            .join(", ")
        }`,
      ]
      : []),
    ...formatTimeline(
      r.runs.find((x) => x.label === "budget, defaults"),
      r.replay_roofline_tok_s,
    ),
    // A baseline tree keeps a timeline only when its engine has one.
    ...formatTimeline(
      r.runs.find((x) => x.label === "baseline, defaults"),
      Math.max(...r.baseline_replays.map((x) => x.tok_s)),
    ),
    "",
    "| ratio | value | target | |",
    "|---|---|---|---|",
    ...r.targets.map((t) =>
      `| ${t.name} | ${t.value.toFixed(2)} | ${t.target} | ${
        t.target === "(none)" ? "" : t.pass ? "PASS" : "MISS"
      } |`
    ),
    "",
    `greedy tokens identical across runs: ${
      r.identical_tokens
        ? "yes"
        : `NO; the defaults decoded ${
          r.runs.find((x) => x.label === "budget, defaults")?.ids
            .join(" ")
        }, these differ: ${r.differing_runs.join("; ")}`
    }`,
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
      cap: { type: "string" },
      ab: { type: "boolean", default: false },
      baseline: { type: "string" },
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
    cap: values.cap === undefined ? undefined : parseSize(values.cap),
    ab: values.ab,
    baseline: values.baseline,
  });
  if (values.json) console.log(JSON.stringify(result, null, 2));
  else console.log(formatStreamReport(result));
}

if (import.meta.main) {
  await main(Deno.args);
}
