/**
 * `mod.ts doctor`: what this machine offers sluice, measured where the container lives: OS, CPU
 * features and cores, RAM and the cgroup limit, free disk, whether O_DIRECT works there, a short
 * sequential and random record-sized read benchmark, a DRAM read figure and the I/O shim's build
 * state; with --model also the recommended budget and preset and the tok/s those figures and the
 * memory plan lead to.
 *
 * @module
 */
import { existsSync, readFileSync, statfsSync, statSync } from "node:fs";
import { cpus, release, totalmem } from "node:os";
import { dirname, resolve } from "node:path";
import { type MemoryPlan, planInput, planMemory } from "../../engine/planner.ts";
import { formatBytes, parseBytes } from "../../engine/units.ts";
import { ensureShim, shimBuildFailure, shimLibraryPath } from "../../io/build_shim.ts";
import { openContainer } from "../../engine/container.ts";
import { type DiskProbe, probeDisk } from "../../io/disk_probe.ts";
import { measureDramNative } from "../../io/dram_probe.ts";
import { resolveModel } from "./models.ts";
import { Session } from "../../engine/session.ts";
import { CTX_FLAG, HELP_FLAG, helpShown, MODEL_FLAG, parseCommandArgs } from "./args.ts";
import { cgroupLimit, recommendedBudget, usableMemory } from "./budget.ts";

const HELP = `sluice doctor — what this machine offers sluice, measured

Usage: deno run -A mod.ts doctor [--model X.sluice] [--dir DIR] [--bench-size 256M] [--json]

  -m, --model PATH    also plan this container: recommended budget/preset and expected tok/s
  --dir DIR           where to measure the disk (default: the container's folder, else .)
  --bench-size SIZE   test file for the disk reads (default 256M; written, read, removed)
  -c, --ctx N         context for the plan (default min(model, 4096))
  --budget SIZE       estimate at this budget instead of the recommended one
  --json              one JSON object instead of the report
  -h, --help          this text

The disk figures are short runs on a possibly busy machine: treat them as a lower bound.
`;

/** CPU features that matter to the kernels (x86 flags or Arm's asimd/sve). */
const CPU_FLAGS = ["sse4_1", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "asimd", "sve"];

function cpuInfo(): { model: string; cores: number; features: string[] } {
  const list = cpus();
  let features: string[] = [];
  try {
    const text = readFileSync("/proc/cpuinfo", "utf8");
    const flags = /^(?:flags|Features)\s*:\s*(.*)$/m.exec(text)?.[1].split(/\s+/) ?? [];
    features = CPU_FLAGS.filter((f) => flags.includes(f));
  } catch {
    // Not Linux: the model name and core count are still known.
  }
  return { model: list[0]?.model ?? "unknown", cores: list.length, features };
}

function freeBytes(dir: string): number | null {
  try {
    const s = statfsSync(dir);
    return Number(s.bavail) * Number(s.bsize);
  } catch {
    return null;
  }
}

/** What a plan under `budget` costs per decoded token, from the measured figures. */
export interface TokenEstimate {
  budget: number;
  /** Bytes read from disk per token: unpinned trunk layers plus expected expert misses. */
  diskBytesPerToken: number;
  /** Bytes the kernels read from memory per token (the working set). */
  memoryBytesPerToken: number;
  /** tok/s with disk and compute one after the other (no overlap). */
  tokPerSecond: number;
  /** tok/s with disk and compute fully overlapped (the ceiling). */
  ceilingTokPerSecond: number;
}

/**
 * Per-token cost of `plan`. With a `probe` (a short run of the model, {@link probeRun}): its
 * compute and I/O wait per token. Without: every unpinned trunk layer read at the sequential
 * rate, an expert missing with probability 1 − cached/total (uniform routing) at the random
 * rate, and the working set streamed at the DRAM rate, a bound that small models are far from
 * (their per-layer dispatch costs more than their bytes; doctor predicted 4,206 tok/s from it
 * where 508 were measured).
 */
export function estimateTokens(
  plan: MemoryPlan,
  layerBytes: number[],
  expertStride: number,
  moeReadsPerToken: number,
  disk: { sequentialGbps: number; randomGbps: number },
  dramGbps: number,
  probe?: RunProbe,
): TokenEstimate {
  const trunk = layerBytes.slice(plan.pinned).reduce((a, b) => a + b, 0);
  const missRate = plan.totalExperts > 0 ? 1 - plan.expertSlots / plan.totalExperts : 0;
  const expertBytes = moeReadsPerToken * missRate * expertStride;
  const diskSeconds = probe
    ? probe.ioWaitMs / 1000
    : trunk / (disk.sequentialGbps * 1e9) + expertBytes / (disk.randomGbps * 1e9);
  const memSeconds = probe ? probe.computeMs / 1000 : plan.workingSetBytes / (dramGbps * 1e9);
  return {
    budget: plan.budget,
    diskBytesPerToken: trunk + expertBytes,
    memoryBytesPerToken: plan.workingSetBytes,
    tokPerSecond: 1 / (diskSeconds + memSeconds),
    ceilingTokPerSecond: 1 / Math.max(diskSeconds, memSeconds),
  };
}

/** Tokens of doctor's compute probe. */
const PROBE_TOKENS = 33;

/** What a short run of the model measured. */
export interface RunProbe {
  /** Compute per forward pass (I/O wait excluded, sampling included), in milliseconds. */
  computeMs: number;
  /** I/O wait per forward pass over the first run, from a cold cache, in milliseconds. */
  ioWaitMs: number;
}

/** One generation of the probe: its forward passes and their compute and I/O wait in ms. */
export interface ProbeSample {
  passes: number;
  computeMs: number;
  ioWaitMs: number;
}

/**
 * The probe from its generations: compute per pass over all of them (a shared machine's load is
 * part of what a run gets), I/O wait per pass of the first, the one from a cold cache.
 */
export function probeOf(runs: readonly ProbeSample[]): RunProbe {
  const passes = runs.reduce((n, r) => n + r.passes, 0);
  const compute = runs.reduce((n, r) => n + r.computeMs, 0);
  return { computeMs: compute / passes, ioWaitMs: runs[0].ioWaitMs / runs[0].passes };
}

/**
 * Runs the model at `budget` on this machine: three short greedy generations from BOS, measured
 * as {@link probeOf} combines them, this model's real routing on this disk.
 */
export async function probeRun(
  path: string,
  budget: number | undefined,
  ctx: number,
): Promise<RunProbe> {
  const session = await Session.open(path, { budget, ctx, quiet: true });
  try {
    const start = [session.tokenizer.bosId ?? session.model.cfg.bosId ?? 0];
    const opts = { maxTokens: PROBE_TOKENS, ignoreEos: true, temperature: 0 };
    const runs: ProbeSample[] = [];
    // io_wait_ms counts from the load; the rest, per generation.
    let waited = session.stats().io_wait_ms;
    for (let run = 0; run < 3; run++) {
      for await (const _ of session.generate(start, opts)) {
        // Only the timings count.
      }
      const s = session.stats();
      const ioWaitMs = s.io_wait_ms - waited;
      waited = s.io_wait_ms;
      runs.push({
        // The last sampled token is not run: prompt + generated − 1 forward passes.
        passes: Math.max(1, s.prompt_tokens + s.generated_tokens - 1),
        computeMs: s.compute_ms,
        ioWaitMs,
      });
    }
    return probeOf(runs);
  } finally {
    session.close();
  }
}

/** The preset field when the whole model fits. */
const WHOLE = "none";

/** Runs the doctor command; returns the exit code. */
export async function doctorCommand(args: string[]): Promise<number> {
  const a = parseCommandArgs("doctor", args, {
    ...MODEL_FLAG,
    dir: { type: "string" },
    "bench-size": { type: "string" },
    budget: { type: "string" },
    ...CTX_FLAG,
    json: { type: "boolean" },
    ...HELP_FLAG,
  });
  const given = a.str("model");
  const v = {
    model: given === undefined ? undefined : await resolveModel(given),
    dir: a.str("dir"),
    benchSize: a.str("bench-size"),
    ctx: a.int("ctx", 1),
    json: a.bool("json"),
  };
  if (helpShown(a, HELP)) return 0;
  const container = v.model ? openContainer(v.model) : null;
  const dir = resolve(v.dir ?? (v.model ? dirname(resolve(v.model)) : "."));
  if (!existsSync(dir) || !statSync(dir).isDirectory()) {
    throw new Error(`--dir ${dir}: not a directory`);
  }
  const log = v.json ? () => {} : (line: string) => console.error(`doctor: ${line}`);
  const cpu = cpuInfo();
  const limit = cgroupLimit();
  const hadShim = existsSync(shimLibraryPath());
  const shim = ensureShim();
  const shimState = shim === null
    ? `not available: ${shimBuildFailure()} (reads fall back to node:fs)`
    : `${hadShim ? "built" : "built now"}: ${shim}`;
  const input = container ? planInput(container) : null;
  const recordBytes = input && input.expertStride > 0 ? input.expertStride : 1 << 20;
  const benchBytes = parseBytes(v.benchSize ?? "256M");
  log(`measuring disk reads in ${dir} (${formatBytes(benchBytes)} test file)`);
  let disk: DiskProbe | null = null;
  let diskError: string | null = null;
  try {
    disk = probeDisk(dir, benchBytes, recordBytes, log);
  } catch (e) {
    // A read-only or full folder: report it and go on with the rest.
    diskError = `cannot write and read a test file there (${(e as Error).message})`;
  }
  log("measuring DRAM read bandwidth");
  const threads = [...new Set([1, cpu.cores])];
  const dram = await measureDramNative({ bytes: 256 << 20, threads, passes: 3 });
  const dramGbps = dram ? Math.max(...dram.points.map((p) => p.gbps)) : null;

  let model: Record<string, unknown> | null = null;
  if (container && input) {
    const cfg = container.config;
    const ctx = Math.min(v.ctx ?? 4096, cfg.maxPositions);
    const whole = planMemory(input, { ctx, maxBatch: 64 });
    const asked = a.str("budget");
    const budget = asked === undefined
      ? recommendedBudget(whole.wholeModelBytes)
      : Math.min(parseBytes(asked), whole.wholeModelBytes);
    // The whole model planned without a budget: the planner rounds budgets down to pages.
    const plan = budget >= whole.wholeModelBytes
      ? whole
      : planMemory(input, { budget: Math.max(budget, whole.floor), ctx, maxBatch: 64 });
    const moeLayers = cfg.layerKinds.filter((k) => k === "moe").length;
    log(`measuring compute: 3 × ${PROBE_TOKENS} tokens of the model`);
    const probe = budget >= whole.floor
      ? await probeRun(v.model!, plan === whole ? undefined : plan.budget, ctx)
      : undefined;
    const estimate = dramGbps === null || disk === null ? null : estimateTokens(
      plan,
      input.layerBytes,
      input.expertStride,
      moeLayers * (cfg.moe?.topK ?? 0),
      { sequentialGbps: disk.sequentialGbps, randomGbps: disk.random.gbps },
      dramGbps,
      probe,
    );
    model = {
      path: container.dir,
      modelType: cfg.modelType,
      floor: whole.floor,
      wholeModelBytes: whole.wholeModelBytes,
      recommendedBudget: plan.budget,
      // The recommended budget is ¾ of usable memory, which is what --preset auto asks for.
      preset: plan === whole ? WHOLE : "auto",
      fits: budget >= whole.floor,
      pinned: plan.pinned,
      layers: cfg.numLayers,
      expertSlots: plan.expertSlots,
      totalExperts: plan.totalExperts,
      probe: probe ?? null,
      estimate,
    };
  }
  const report = {
    os: `${Deno.build.os} ${release()} ${Deno.build.arch}`,
    deno: Deno.version.deno,
    cpu,
    ramBytes: totalmem(),
    cgroupLimitBytes: limit,
    usableBytes: usableMemory(),
    dir,
    freeDiskBytes: freeBytes(dir),
    shim: shimState,
    disk,
    diskError,
    dram: dram ? { method: dram.method, points: dram.points } : null,
    load1: Deno.loadavg()[0],
    model,
  };
  if (v.json) {
    console.log(JSON.stringify(report));
    return 0;
  }
  console.log(formatReport(report, dramGbps));
  return 0;
}

function formatReport(
  r: {
    os: string;
    deno: string;
    cpu: ReturnType<typeof cpuInfo>;
    ramBytes: number;
    cgroupLimitBytes: number | null;
    usableBytes: number;
    dir: string;
    freeDiskBytes: number | null;
    shim: string;
    disk: DiskProbe | null;
    diskError: string | null;
    load1: number;
    model: Record<string, unknown> | null;
  },
  dramGbps: number | null,
): string {
  const d = r.disk;
  const gb = (x: number) => `${x.toFixed(2)} GB/s`;
  const direct = d === null
    ? "unknown (no test file could be written)"
    : d.direct === null
    ? "unknown (no I/O shim to try it)"
    : d.direct
    ? "yes"
    : "no: the filesystem refuses it, reads go through the page cache";
  const lines = [
    `os             ${r.os}, Deno ${r.deno}`,
    `cpu            ${r.cpu.model}, ${r.cpu.cores} cores, features ${
      r.cpu.features.join(" ") || "none found"
    }`,
    `memory         RAM ${formatBytes(r.ramBytes)}, cgroup limit ${
      r.cgroupLimitBytes === null ? "none" : formatBytes(r.cgroupLimitBytes)
    }, usable ${formatBytes(r.usableBytes)}`,
    `disk           ${r.dir}: ${
      r.freeDiskBytes === null ? "free space unknown" : `${formatBytes(r.freeDiskBytes)} free`
    }`,
    `O_DIRECT       ${direct}`,
    d === null
      ? `disk reads     n/a: ${r.diskError}`
      : `disk reads     sequential 1 MiB × ${d.inFlight} in flight ${gb(d.sequentialGbps)}; ` +
        `random ${formatBytes(d.recordBytes)} records × ${d.inFlight} in flight ${
          gb(d.random.gbps)
        } (${d.random.readsPerSecond.toFixed(0)} reads/s, ${
          d.random.meanMs.toFixed(2)
        } ms each) via ${d.reader}${d.cacheDropped ? "" : "; page cache not dropped (not root)"}`,
    `dram           ${dramGbps === null ? "n/a (no C compiler)" : `${gb(dramGbps)} read`}`,
    `io shim        ${r.shim}`,
    `load           ${r.load1.toFixed(2)} (1-minute average; a busy machine lowers every figure)`,
  ];
  const m = r.model;
  if (m) {
    lines.push(
      `model          ${m.path} (${m.modelType}): floor ${formatBytes(m.floor as number)}, ` +
        `whole model ${formatBytes(m.wholeModelBytes as number)}`,
    );
    if (!m.fits) {
      lines.push(`recommended    does not fit: ¾ of usable memory is below the floor`);
    } else {
      lines.push(
        `recommended    ${
          m.preset === WHOLE
            ? "no --budget: the whole model fits in ¾ of usable memory"
            : `--budget ${formatBytes(m.recommendedBudget as number)} (or --preset ${m.preset})`
        }:` +
          ` ${m.pinned}/${m.layers} trunk layers pinned, ${m.expertSlots} of ${m.totalExperts} ` +
          `expert records cached`,
      );
      const e = m.estimate as TokenEstimate | null;
      lines.push(
        e === null
          ? `expected       n/a (no ${dramGbps === null ? "DRAM" : "disk"} figure)`
          : `expected       ≈ ${e.tokPerSecond.toFixed(1)} tok/s decode (up to ${
            e.ceilingTokPerSecond.toFixed(1)
          } with I/O fully overlapped): ${formatBytes(e.diskBytesPerToken)} from disk per ` +
            `token, and the compute and I/O wait of ${PROBE_TOKENS}-token runs`,
      );
    }
  }
  return lines.join("\n");
}
