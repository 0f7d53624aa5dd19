/**
 * `deno task bench compare`: sluice against llama.cpp (node-llama-cpp's prebuilt CPU binary) on
 * the same synthetic MoE model, threads, greedy decoding and prompt token ids, in RAM and over a
 * memory cap applied to both by one cgroup, with the DRAM and O_DIRECT rooflines measured in the
 * same run. Each engine runs in its own child process. Prints a table; `--json` prints the report.
 * The in-RAM runs' greedy ids are compared at every position both generated; where they first
 * differ, an untimed pass of each engine over the common prefix gives its logit gap between the
 * two ids (a near-tie that summation order can flip, or a real difference).
 *
 * @module
 */
import { existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { cpus, totalmem } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath as fromFileUrl } from "node:url";
import { parseArgs } from "node:util";
import { loadTokenizer } from "../../../engine/tokenizer.ts";
import { exportGguf } from "../export_gguf.ts";
import { packCheckpoint } from "../../pack.ts";
import { parseSize, type SynthArch, synthCheckpoint } from "../../synth.ts";
import { renderBarChart } from "../bar_chart.ts";
import {
  cgroupCommand,
  cgroupPeak,
  createCgroup,
  type MemoryCgroup,
  removeCgroup,
  resetCgroupPeak,
} from "./cgroup.ts";
import {
  activeBytesPerToken,
  buildReport,
  compareIds,
  type CompareReport,
  type EngineJob,
  type EngineRun,
  formatTable,
  type ManifestBytes,
} from "./compare_report.ts";
import { measureDramNative } from "../../../io/dram_probe.ts";
import { benchDisk } from "./disk.ts";
import { dropPageCache } from "../../../io/disk_probe.ts";
import { benchDepsDir, llamaLogitGap, setupLlamaCpp } from "./llamacpp.ts";
import { logitGap } from "./compare_sluice.ts";

const GiB = 2 ** 30;
const REPO = fromFileUrl(new URL("../../../", import.meta.url));
const SLUICE_RUNNER = fromFileUrl(new URL("./compare_sluice.ts", import.meta.url));
const PROMPT_TEXT = "Once upon a time, there was a little girl named Lily. She liked to play " +
  "outside in the park with her friends. One day, she saw a big red ball under a tree. ";

const HELP = `usage: deno task bench compare [options]
  --size SIZE        in-RAM model size (default 0.5G)
  --over-size SIZE   over-cap model size (default 1.5G; must be ≥ 3× --cap)
  --cap SIZE         memory cap (cgroup) of the over-cap regime (default 0.5G)
  --budget SIZE      sluice arena budget under the cap (default: the cap less 320 MiB for the
                     runtime's own memory, measured at 90-120 MiB with small vocabularies and
                     250 MiB with a 248,320-token one, and at least 60%)
  --arch A           qwen3_moe, mixtral, glm4_moe or gpt_oss (MXFP4 experts; default qwen3_moe)
                     to synthesise; ignored with --container
  --threads N        threads of both engines (default: all cores)
  --prompt N         prompt tokens (default 128)
  --tokens N         decode tokens timed in RAM (default 32)
  --over-tokens N    decode tokens timed over the cap (default 16)
  --max-seconds S    per-run decode time limit, from the first token (default 120)
  --svg PATH         chart (default: compare.svg in the bench cache)
  --skip-over-cap    in-RAM and prefill only
  --container PATH   run this packed model in both regimes instead of synthesising (with --gguf:
                     its GGUF export, e.g. a real-width model; --size/--over-size are ignored)
  --gguf PATH        llama.cpp's copy of --container (deno task export-gguf)
  --json             print the report as JSON`;

/**
 * One model in the bench cache: HF checkpoint, sluice container and GGUF, all bf16 — but
 * gpt-oss's routed experts, MXFP4 in both (as shipped in the container, ggml MXFP4 in the GGUF).
 */
interface BenchModel {
  container: string;
  gguf: string;
  bytes: number;
  topK: number;
  /** The container's manifest.json, read once. */
  manifest: Omit<ManifestBytes, "experts"> & {
    config: { modelType?: string; moe?: { topK: number } };
    experts: ((ManifestBytes["experts"][number] & { format: string }) | null)[];
    pack?: { trunk?: string | null };
  };
}

/** The bench's view of a container and its GGUF export. */
function openBenchModel(container: string, gguf: string): BenchModel {
  const manifest = JSON.parse(readFileSync(join(container, "manifest.json"), "utf8"));
  return {
    container,
    gguf,
    bytes: Deno.statSync(gguf).size,
    topK: manifest.config.moe?.topK ?? manifest.source.config.num_experts_per_tok,
    manifest,
  };
}

/** Synthesises, packs and exports a model of `size` bytes unless the cache has it. */
async function ensureModel(cache: string, arch: SynthArch, size: number): Promise<BenchModel> {
  const experts = arch === "gpt_oss" ? "mxfp4" : "bf16";
  const dir = join(cache, `${arch}-${(size / GiB).toFixed(2)}G-${experts}`);
  const hf = join(dir, "hf"), container = join(dir, "model.sluice"), gguf = join(dir, "model.gguf");
  const done = join(dir, "done.json");
  if (!existsSync(done)) {
    console.error(`bench compare: building ${arch} ${(size / GiB).toFixed(2)} GiB in ${dir}`);
    await synthCheckpoint({
      arch,
      out: hf,
      size,
      dtype: "bf16",
      force: true,
      overrides: { vocab: 512 },
      progress: "off",
      log: () => {},
    });
    await packCheckpoint(hf, container, { force: true, progress: "off", log: () => {} });
    exportGguf(hf, gguf, { type: experts, force: true, progress: "off" });
    Deno.removeSync(hf, { recursive: true });
    writeFileSync(`${done}.tmp`, JSON.stringify({ arch, size }));
    renameSync(`${done}.tmp`, done);
  }
  return openBenchModel(container, gguf);
}

/** A packed model and its GGUF export given on the command line. */
function givenModel(container: string, gguf: string): BenchModel {
  for (const p of [join(container, "manifest.json"), gguf]) {
    if (!existsSync(p)) throw new Error(`bench compare: ${p} does not exist`);
  }
  return openBenchModel(container, gguf);
}

/** What a given container stores, as the report's precision line. */
function givenPrecision(m: BenchModel): string {
  const formats = [...new Set(m.manifest.experts.flatMap((e) => e ? [e.format] : []))];
  return `given model ${m.container}: experts ${formats.join("/") || "none"}, trunk ` +
    `${m.manifest.pack?.trunk ?? "as shipped"}; GGUF ${m.gguf}`;
}

/** Runs one engine process (inside `cg` when given) and parses its JSON line. */
async function runEngine(
  cmd: string,
  args: string[],
  cg: MemoryCgroup | null,
  hardLimitS: number,
): Promise<EngineRun | string> {
  const [c, a] = cg ? cgroupCommand(cg, cmd, args) : [cmd, args];
  const ac = new AbortController();
  const timer = setTimeout(() => ac.abort(), hardLimitS * 1000);
  try {
    const out = await new Deno.Command(c, {
      args: a,
      cwd: REPO,
      stdout: "piped",
      stderr: "piped",
      signal: ac.signal,
    }).output();
    const text = new TextDecoder().decode(out.stdout).trim().split("\n").pop() ?? "";
    if (!out.success || !text.startsWith("{")) {
      const err = new TextDecoder().decode(out.stderr).trim().slice(-500);
      return `${cmd} exited ${out.code}${out.signal ? ` (${out.signal})` : ""}: ${err}`;
    }
    return JSON.parse(text) as EngineRun;
  } finally {
    clearTimeout(timer);
  }
}

/** Runs sluice and llama.cpp on one regime; returns the runs and a note for anything missing. */
async function runPair(
  sluiceJob: EngineJob,
  llamaJob: EngineJob,
  llama: Awaited<ReturnType<typeof setupLlamaCpp>>,
  cg: MemoryCgroup | null,
): Promise<{ sluice: EngineRun | null; llamacpp: EngineRun | null; notes: string[] }> {
  const notes: string[] = [];
  const hard = sluiceJob.maxSeconds * 3 + 180;
  const take = (r: EngineRun | string, who: string) => {
    if (typeof r === "string") {
      notes.push(`${who}: ${r}`);
      return null;
    }
    if (cg) r.notes += `, cgroup peak ${cgroupPeak(cg)}`;
    return r;
  };
  if (cg) {
    dropPageCache();
    resetCgroupPeak(cg);
  }
  const sluice = take(
    await runEngine(
      Deno.execPath(),
      ["run", "-A", SLUICE_RUNNER, JSON.stringify(sluiceJob)],
      cg,
      hard,
    ),
    "sluice",
  );
  let llamacpp: EngineRun | null = null;
  if (llama.ok) {
    if (cg) {
      dropPageCache();
      resetCgroupPeak(cg);
    }
    llamacpp = take(
      await runEngine("node", [llama.script, JSON.stringify(llamaJob)], cg, hard),
      "llama.cpp",
    );
  } else notes.push(`llama.cpp skipped: ${llama.why}`);
  return { sluice, llamacpp, notes };
}

/** Prompt ids: the fixed story text, repeated, tokenised by the model's tokenizer, cut to n. */
async function promptIds(container: string, n: number): Promise<number[]> {
  const tok = await loadTokenizer(container);
  let text = PROMPT_TEXT;
  while (tok.encode(text).length < n) text += PROMPT_TEXT;
  return tok.encode(text).slice(0, n);
}

function chart(r: CompareReport): string {
  return renderBarChart({
    title: `sluice vs llama.cpp (${r.arch}, ${r.precision}, ${r.machine.threads} threads)`,
    yLabel: "tokens/s",
    groups: ["in RAM decode", "over cap decode", "prefill ÷ 10"],
    series: [
      {
        name: "sluice",
        color: "#1f77b4",
        values: [
          r.in_ram.sluice_tok_s,
          r.over_cap.sluice_tok_s,
          r.prefill.sluice_tok_s === null ? null : r.prefill.sluice_tok_s / 10,
        ],
      },
      {
        name: "llama.cpp (node-llama-cpp)",
        color: "#d62728",
        values: [
          r.in_ram.llamacpp_tok_s,
          r.over_cap.llamacpp_tok_s,
          r.prefill.llamacpp_tok_s === null ? null : r.prefill.llamacpp_tok_s / 10,
        ],
      },
      {
        name: "roofline (DRAM / O_DIRECT)",
        color: "#999999",
        values: [r.in_ram.dram_roofline_tok_s, r.over_cap.disk_roofline_tok_s, null],
      },
    ],
  });
}

/** Entry point of `deno task bench compare`. */
export async function main(args: string[]): Promise<void> {
  const { values: v } = parseArgs({
    args,
    options: {
      size: { type: "string", default: "0.5G" },
      "over-size": { type: "string", default: "1.5G" },
      cap: { type: "string", default: "0.5G" },
      budget: { type: "string" },
      arch: { type: "string", default: "qwen3_moe" },
      threads: { type: "string" },
      prompt: { type: "string", default: "128" },
      tokens: { type: "string", default: "32" },
      "over-tokens": { type: "string", default: "16" },
      "max-seconds": { type: "string", default: "120" },
      svg: { type: "string" },
      "skip-over-cap": { type: "boolean", default: false },
      container: { type: "string" },
      gguf: { type: "string" },
      json: { type: "boolean", default: false },
      help: { type: "boolean", default: false },
    },
  });
  if (v.help) {
    console.log(HELP);
    return;
  }
  const arch = v.arch as SynthArch;
  const archs: SynthArch[] = ["qwen3_moe", "mixtral", "glm4_moe", "gpt_oss"];
  if (v.container === undefined && !archs.includes(arch)) {
    throw new Error(
      `--arch must be one of ${archs.join(", ")} (what GGUF export writes), got ${arch}`,
    );
  }
  const threads = Number(v.threads ?? navigator.hardwareConcurrency);
  const cap = parseSize(v.cap!), overSize = parseSize(v["over-size"]!);
  const budget = v.budget
    ? parseSize(v.budget)
    : Math.floor(Math.max(cap * 0.6, cap - 320 * 2 ** 20));
  const maxSeconds = Number(v["max-seconds"]);
  const cache = join(dirname(benchDepsDir()), "bench-compare");
  const log = (s: string) => console.error(`bench compare: ${s}`);

  const llama = await setupLlamaCpp();
  if (!llama.ok) log(llama.why);
  if ((v.container === undefined) !== (v.gguf === undefined)) {
    throw new Error("bench compare: --container and --gguf go together");
  }
  const given = v.container ? givenModel(v.container, v.gguf!) : null;
  const inRam = given ?? await ensureModel(cache, arch, parseSize(v.size!));
  const ids = await promptIds(inRam.container, Number(v.prompt));

  log(`measuring DRAM and O_DIRECT bandwidth (${threads} threads)`);
  const dramOpts = { bytes: GiB, threads: [threads], passes: 3 };
  const dramBefore = await measureDramNative(dramOpts);
  const disk = await benchDisk({ bytes: GiB, runs: 2, quiet: true });

  const job = (model: string, n: number, warmup: boolean, b: number | null): EngineJob => ({
    model,
    threads,
    promptIds: ids,
    decodeTokens: n,
    budget: b,
    warmup,
    maxSeconds,
  });
  log(`in RAM: ${(inRam.bytes / GiB).toFixed(2)} GiB model`);
  const ir = await runPair(
    job(inRam.container, Number(v.tokens), true, null),
    job(inRam.gguf, Number(v.tokens), true, null),
    llama,
    null,
  );
  let gaps = { sluice: null as number | null, llamacpp: null as number | null };
  const at = ir.sluice && ir.llamacpp
    ? compareIds(ir.sluice.ids, ir.llamacpp.ids).firstDivergence
    : null;
  if (at !== null) {
    const [s, l] = [ir.sluice!.ids[at], ir.llamacpp!.ids[at]];
    log(`in RAM greedy ids differ at generated position ${at}: each engine's logit gap there`);
    const prefix = [...ids, ...ir.sluice!.ids.slice(0, at)];
    gaps = {
      sluice: await logitGap(inRam.container, prefix, s, l, threads),
      llamacpp: llama.ok
        ? await llamaLogitGap(llama.script, inRam.gguf, prefix, l, s, threads)
        : null,
    };
  }
  // A second DRAM reading right after the in-RAM runs: on a shared host the figure moves by up to
  // 2× between minutes, and the roofline is the best the machine showed around the runs.
  const dramAfter = await measureDramNative(dramOpts);
  const dramGbps = Math.max(dramBefore?.points[0]?.gbps ?? 0, dramAfter?.points[0]?.gbps ?? 0);

  let oc: { sluice: EngineRun | null; llamacpp: EngineRun | null; notes: string[] } = {
    sluice: null,
    llamacpp: null,
    notes: [],
  };
  let overBytes = given?.bytes ?? overSize;
  if (v["skip-over-cap"]) oc.notes.push("skipped by --skip-over-cap");
  else if (overBytes < 3 * cap * 0.999) {
    oc.notes.push(`the over-cap model must be ≥ 3 × --cap`);
  } else {
    const cg = createCgroup("sluice-bench-compare", cap);
    if (typeof cg === "string") oc.notes.push(`skipped: ${cg}`);
    else {
      try {
        const over = given ?? await ensureModel(cache, arch, overSize);
        overBytes = over.bytes;
        log(
          `over cap: ${(over.bytes / GiB).toFixed(2)} GiB model, cgroup v${cg.version} cap ` +
            `${(cap / GiB).toFixed(2)} GiB, sluice budget ${(budget / GiB).toFixed(2)} GiB`,
        );
        const n = Number(v["over-tokens"]);
        oc = await runPair(
          job(over.container, n, false, budget),
          job(over.gguf, n, false, null),
          llama,
          cg,
        );
      } finally {
        removeCgroup(cg);
      }
    }
  }
  for (const n of [...ir.notes, ...oc.notes]) log(n);

  const report = buildReport({
    precision: given
      ? givenPrecision(given)
      : arch === "gpt_oss"
      ? "MXFP4 experts in both (sluice: as shipped, exact f32 activations; llama.cpp: Q8 " +
        "activations), bf16 trunk, norms/routers f32"
      : "bf16 weights in both (sluice container bf16, GGUF BF16; norms/routers f32)",
    // A given container names its own architecture; --arch only picks what to synthesise.
    arch: given?.manifest.config.modelType ?? arch,
    machine: {
      dram_gbps: dramGbps > 0 ? dramGbps : null,
      odirect_gbps: Number.isFinite(disk.odirect_gbps) ? disk.odirect_gbps : null,
      threads,
      cpu: cpus()[0]?.model ?? "unknown",
      ram_bytes: totalmem(),
    },
    in_ram_active_bytes: activeBytesPerToken(inRam.manifest, inRam.topK),
    in_ram_logit_gaps: gaps,
    in_ram: { model_bytes: inRam.bytes, ...ir, skipped: ir.notes.join("; ") || null },
    over_cap: {
      model_bytes: overBytes,
      cap_bytes: cap,
      budget_bytes: budget,
      ...oc,
      skipped: oc.notes.join("; ") || null,
    },
  });
  const svg = v.svg ?? join(cache, "compare.svg");
  // With --container nothing was synthesised, so the cache may not exist yet.
  mkdirSync(dirname(svg), { recursive: true });
  writeFileSync(svg, chart(report));
  if (v.json) console.log(JSON.stringify(report, null, 2));
  else {
    console.log(formatTable(report));
    console.log(`chart: ${svg}`);
  }
}

if (import.meta.main) await main(Deno.args);
