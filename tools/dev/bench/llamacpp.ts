/**
 * llama.cpp for `deno task bench compare`: the npm package node-llama-cpp (pinned) installed on
 * demand into a cache directory, never into the project, and a small Node.js script that loads a
 * GGUF with its prebuilt CPU binary (default mmap), feeds prompt token ids, decodes greedily and
 * prints one EngineRun JSON line. The script refuses to build or download binaries.
 *
 * @module
 */
import { existsSync, mkdirSync, writeFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";

/** The pinned node-llama-cpp version. */
export const NODE_LLAMA_CPP_VERSION = "3.21.1";

/** The bench's dependency cache: $SLUICE_CACHE/bench-deps or ~/.cache/sluice/bench-deps. */
export function benchDepsDir(env: (k: string) => string | undefined = Deno.env.get): string {
  const base = env("SLUICE_CACHE") ?? join(env("HOME") ?? homedir(), ".cache", "sluice");
  return join(base, "bench-deps");
}

/*
 * Runs in Node.js next to the installed package. Timing: the first yield of evaluate() is the
 * prompt pass plus one sample; each later yield is one decode step (evaluate one token, sample).
 */
const RUNNER_MJS = `
import { getLlama } from "node-llama-cpp";
const job = JSON.parse(process.argv[2]);
const t0 = performance.now();
const llama = await getLlama({
  gpu: false, build: "never", skipDownload: true, usePrebuiltBinaries: true,
  progressLogs: false, logLevel: "error", maxThreads: job.threads,
});
const model = await llama.loadModel({ modelPath: job.model, gpuLayers: 0 });
const ctxSize = job.promptIds.length + job.decodeTokens + 16;
const context = await model.createContext({
  contextSize: ctxSize, batchSize: Math.max(job.promptIds.length, 32),
  threads: { ideal: job.threads, min: job.threads },
  ...(job.kvF32
    ? { experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32", flashAttention: false }
    : {}),
});
const loadMs = performance.now() - t0;
if (job.probe) {
  // Untimed: after the prompt and the ids both engines agreed on, llama.cpp's logit of its own id
  // less its logit of sluice's, from the full softmax (ln of the probabilities' ratio).
  const seq = context.getSequence();
  let gap = null;
  for await (const r of seq.evaluateWithMetadata(job.promptIds, { probabilities: true })) {
    const [own, other] = [r.probabilities.get(job.probe.own), r.probabilities.get(job.probe.other)];
    if (own > 0 && other > 0) gap = Math.log(own / other);
    break;
  }
  seq.dispose();
  console.log(JSON.stringify({ gap }));
  await context.dispose();
  await model.dispose();
  await llama.dispose();
  process.exit(0);
}
async function pass(ids, steps, maxMs) {
  const seq = context.getSequence();
  const out = [];
  // The limit is on decode, from the first token: a long prompt's prefill does not count.
  let tStart = performance.now(), tFirst = 0, tLast = 0, stopped = false, deadline = Infinity;
  for await (const tok of seq.evaluate(ids, { temperature: 0 })) {
    tLast = performance.now();
    out.push(tok);
    if (out.length === 1) [tFirst, deadline] = [tLast, tLast + maxMs];
    if (out.length >= steps + 1) break;
    if (tLast > deadline) { stopped = true; break; }
  }
  await seq.clearHistory();
  seq.dispose();
  return { out, tStart, tFirst, tLast, stopped };
}
if (job.warmup) await pass(job.promptIds.slice(0, 8), 3, Infinity);
const r = await pass(job.promptIds, job.decodeTokens, job.maxSeconds * 1000);
const steps = r.out.length - 1;
let rss = null;
try {
  const m = /VmHWM:\\s+(\\d+) kB/.exec((await import("node:fs")).readFileSync("/proc/self/status", "utf8"));
  if (m) rss = Number(m[1]) * 1024;
} catch {}
console.log(JSON.stringify({
  engine: "llama.cpp",
  prompt_tokens: job.promptIds.length,
  prefill_tok_s: job.promptIds.length * 1000 / (r.tFirst - r.tStart),
  decode_tokens: steps,
  decode_tok_s: steps > 0 ? steps * 1000 / (r.tLast - r.tFirst) : 0,
  ids: r.out.map(Number),
  load_ms: loadMs,
  decode_bytes_read_per_token: null,
  decode_io_wait_ms: null,
  peak_rss_bytes: rss,
  threads: context.currentThreads,
  stopped_early: r.stopped,
  notes: "node-llama-cpp ${NODE_LLAMA_CPP_VERSION}, prebuilt CPU binary, mmap, gpu " + llama.gpu,
}));
await context.dispose();
await model.dispose();
await llama.dispose();
`;

/**
 * llama.cpp's logit of token \`own\` less its logit of token \`other\` after \`ids\` (the prompt and
 * the generated ids both engines agreed on), from the full softmax it reports: an untimed run of
 * the runner, or null where it failed or a probability was zero.
 */
export async function llamaLogitGap(
  script: string,
  gguf: string,
  ids: readonly number[],
  own: number,
  other: number,
  threads: number,
): Promise<number | null> {
  const job = {
    model: gguf,
    threads,
    promptIds: ids,
    decodeTokens: 0,
    probe: { own, other },
  };
  const [ok, text] = await run("node", [script, JSON.stringify(job)], Deno.cwd());
  const line = text.trim().split("\n").find((l) => l.startsWith("{"));
  return ok && line ? JSON.parse(line).gap ?? null : null;
}

/** Where the runner lives, or why llama.cpp is unavailable. */
export type LlamaCppSetup = { ok: true; dir: string; script: string } | { ok: false; why: string };

async function run(cmd: string, args: string[], cwd: string): Promise<[boolean, string]> {
  try {
    const out = await new Deno.Command(cmd, { args, cwd, stdout: "piped", stderr: "piped" })
      .output();
    const text = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
    return [out.success, text];
  } catch (e) {
    return [false, (e as Error).message];
  }
}

/**
 * Installs node-llama-cpp into the cache directory when missing (`npm install --no-save
 * --prefix`), writes the runner script, and checks that the prebuilt CPU binary loads without
 * building or downloading anything.
 */
export async function setupLlamaCpp(dir = benchDepsDir(), log = console.error): Promise<
  LlamaCppSetup
> {
  mkdirSync(dir, { recursive: true });
  const pkg = join(dir, "node_modules", "node-llama-cpp", "package.json");
  const installed = existsSync(pkg) &&
    JSON.parse(Deno.readTextFileSync(pkg)).version === NODE_LLAMA_CPP_VERSION;
  if (!installed) {
    log(`bench compare: installing node-llama-cpp@${NODE_LLAMA_CPP_VERSION} into ${dir}`);
    const [ok, text] = await run("npm", [
      "install",
      "--no-save",
      "--no-audit",
      "--no-fund",
      "--prefix",
      dir,
      `node-llama-cpp@${NODE_LLAMA_CPP_VERSION}`,
    ], dir);
    if (!ok) return { ok: false, why: `npm install node-llama-cpp failed: ${text.slice(-400)}` };
  }
  const script = join(dir, "sluice_llamacpp_runner.mjs");
  writeFileSync(script, RUNNER_MJS);
  const probe = join(dir, "sluice_llamacpp_probe.mjs");
  writeFileSync(
    probe,
    `import { getLlama } from "node-llama-cpp";
const l = await getLlama({ gpu: false, build: "never", skipDownload: true, progressLogs: false,
  logLevel: "error" });
console.log(JSON.stringify({ gpu: l.gpu, cpu: l.cpuMathCores }));
await l.dispose();`,
  );
  const [ok, text] = await run("node", [probe], dir);
  if (!ok) {
    return {
      ok: false,
      why: "node-llama-cpp's prebuilt CPU binary does not load here (the bench will not build " +
        `or download one): ${text.trim().slice(-400)}`,
    };
  }
  return { ok: true, dir, script };
}
