/**
 * Test helpers: paths of the shared model fixtures, and containers packed from them once per
 * test process into a temporary directory.
 *
 * @module
 */
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { Model, type RunOptions } from "../engine/model.ts";
import { ReferenceModel } from "../engine/reference/forward.ts";
import { argmax } from "../engine/sampler.ts";
import { Session } from "../engine/session.ts";
import { loadSession, saveSession } from "../engine/session_state.ts";
import { packCheckpoint } from "../tools/pack.ts";
import { synthCheckpoint, type SynthOverrides } from "../tools/synth.ts";
import type { SynthArch, SynthDtype } from "../tools/synth/types.ts";
import type { ModelConfig } from "../io/model_config.ts";
import { referenceWeightsFromCheckpoint } from "../engine/float_weights.ts";
import "./shared_guard.ts";

/** Every Hugging Face checkpoint fixture in ../shared/models (all but gguf/). */
export const CHECKPOINT_FIXTURES: readonly string[] = [
  "stories260k",
  "stories260k-moe",
  "stories260k-moe64",
  "stories260k-qwen3moe",
  "tiny-deepseek-v3",
  "tiny-deepseek-v3-fp8",
  "tiny-glm4-moe",
  "tiny-glm5",
  "tiny-glm5-next",
  "tiny-glm5-next-fp8",
  "tiny-kimi-linear",
  "tiny-minimax-m2",
  "tiny-minimax-m2-fp8",
];

/** Absolute path of a fixture (or a file below one) in ../shared/models. */
export function fixtureDir(name: string): string {
  return fileURLToPath(new URL(`../../shared/models/${name}`, import.meta.url));
}

/** Whether ../shared/models is there: tests that need it are ignored (skipped) when it is not. */
export const HAVE_FIXTURES: boolean = (() => {
  try {
    return Deno.statSync(fixtureDir("stories260k")).isDirectory;
  } catch {
    return false;
  }
})();

/** Why tests needing ../shared/models must skip (it is absent), or null when it is there. */
export function sharedMissing(): string | null {
  return existsSync(fixtureDir("README.md")) ? null : `${fixtureDir("")} is absent`;
}

/** What a finished `mod.ts` run printed. */
export interface SluiceRun {
  code: number;
  stdout: string;
  stderr: string;
}

/**
 * Runs `code` by `deno eval` in a process of its own, with `env` added to this one's: for what
 * reads the environment, which belongs to the whole test process while test files run side by side.
 */
export async function denoEval(code: string, env: Record<string, string> = {}): Promise<SluiceRun> {
  const out = await new Deno.Command(Deno.execPath(), { args: ["eval", code], env, stdin: "null" })
    .output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

/**
 * Runs `code` as {@link denoEval} does and parses its last line of output as JSON; a child that
 * fails throws with its stderr. For children that report what they measured as one JSON line.
 */
export async function evalJson<T = Record<string, unknown>>(
  code: string,
  env: Record<string, string> = {},
): Promise<T> {
  const out = await denoEval(code, env);
  if (out.code !== 0) throw new Error(`child exited ${out.code}: ${out.stderr}`);
  return JSON.parse(out.stdout.trim().split("\n").pop()!);
}

/**
 * Runs `deno run -A mod.ts ...args` as a user would, with `stdin` as its input (else none); a
 * run that hangs is killed after `timeoutMs` (and fails on its exit code).
 */
export async function runSluice(
  args: string[],
  stdin?: string,
  timeoutMs = 120_000,
): Promise<SluiceRun> {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", fileURLToPath(new URL("../mod.ts", import.meta.url)), ...args],
    stdin: stdin === undefined ? "null" : "piped",
    stdout: "piped",
    stderr: "piped",
    env: { NO_COLOR: "1" },
  }).spawn();
  if (stdin !== undefined) {
    const w = child.stdin.getWriter();
    await w.write(new TextEncoder().encode(stdin));
    await w.close();
  }
  const watchdog = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
  const out = await child.output();
  clearTimeout(watchdog);
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

/**
 * The Qwen hybrids' known answers (../shared/models/README.md): the first 20 greedy ids after
 * "Once upon a time" of tiny-qwen3.5-moe and tiny-qwen3-next.
 */
export const QWEN_HYBRID_KNOWN = {
  "tiny-qwen3.5-moe": [
    460,
    163,
    50,
    473,
    473,
    473,
    473,
    79,
    456,
    275,
    133,
    506,
    299,
    304,
    304,
    277,
    375,
    466,
    466,
    465,
  ],
  "tiny-qwen3-next": [
    378,
    364,
    462,
    330,
    227,
    332,
    465,
    465,
    403,
    310,
    363,
    465,
    362,
    465,
    465,
    465,
    465,
    465,
    362,
    362,
  ],
} as const;

/**
 * tiny-kimi-linear's known answer (../shared/models/README.md): the ids of "Once upon a time" and
 * the README's ids_no_stop, greedy; the sampled BOS (1) comes at generated position 10.
 */
export const KIMI_LINEAR_KNOWN: { prompt: readonly number[]; ids: readonly number[] } = {
  prompt: [1, 403, 407, 261, 378],
  ids: [
    310,
    65,
    407,
    377,
    407,
    361,
    386,
    367,
    316,
    407,
    1,
    369,
    469,
    451,
    345,
    207,
    256,
    222,
    202,
    256,
  ],
};

/** "Once upon a time" as the fixtures' tokenizer gives it, BOS first: the known answers' prompt. */
export const ONCE_UPON_A_TIME: readonly number[] = [1, 403, 407, 261, 378];

/** The raw config.json of ../shared/models/`name`, as the checkpoint has it. */
export function fixtureConfig(name: string): Record<string, unknown> {
  return JSON.parse(Deno.readTextFileSync(fixtureDir(`${name}/config.json`)));
}

/** Whether fixture `name` is present (tests that need it are skipped when it is not). */
export function hasFixture(name: string): boolean {
  return existsSync(fixtureDir(name));
}

let tmp: string | undefined;
const packed = new Map<string, Promise<string>>();

/** A temporary directory removed when the process exits. */
export function tempDir(): string {
  if (!tmp) {
    tmp = Deno.makeTempDirSync({ prefix: "sluice-test-" });
    const dir = tmp;
    globalThis.addEventListener("unload", () => Deno.removeSync(dir, { recursive: true }));
  }
  return tmp;
}

/**
 * The budget `extra` bytes above the memory plan's floor of the container at `path` under `opts`
 * (default: the run's defaults, what `generate` plans with no options), so a test streams
 * whatever the engine's defaults cost.
 */
export async function budgetAboveFloor(
  path: string,
  extra: number,
  opts: RunOptions = {},
): Promise<number> {
  const probe = await Model.open(path, { quiet: true, hotList: false, ...opts });
  try {
    return probe.plan.floor + extra;
  } finally {
    probe.close();
  }
}

/** The fixture `name` packed into a container (once per process). */
export function packedFixture(
  name: string,
  opts: { convert?: "f32" | "bf16" } = {},
): Promise<string> {
  const key = `${name}:${opts.convert ?? ""}`;
  let p = packed.get(key);
  if (!p) {
    const out = `${tempDir()}/${name}${opts.convert ? `-${opts.convert}` : ""}.sluice`;
    p = packCheckpoint(fixtureDir(name), out, { progress: "off", log: () => {}, ...opts }).then(
      () => out,
    );
    packed.set(key, p);
  }
  return p;
}

/** max |a − b| ÷ max |b| over two equally long arrays. */
export function maxRelDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let diff = 0, scale = 0;
  for (let i = 0; i < a.length; i++) {
    diff = Math.max(diff, Math.abs(a[i] - b[i]));
    scale = Math.max(scale, Math.abs(b[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

/** What {@link assertNearReference} decodes and how close it must stay. */
export interface NearReference {
  /** Positions the model is opened for. */
  ctx: number;
  prompt: number[];
  /** Positions decoded, prompt included. */
  steps: number;
  /** Largest relative logit difference allowed at any position. */
  bound: number;
  /** Names the run in messages (default: the container's path). */
  name?: string;
}

/**
 * Opens the container at `path`, decodes it beside `ref` with {@link decodeAgainstReference}
 * (the same greedy token at every generated position), closes it, and asserts the worst relative
 * logit difference is within `run.bound`. Returns that difference.
 */
export async function assertNearReference(
  path: string,
  ref: Pick<ReferenceModel, "forward64">,
  run: NearReference,
): Promise<number> {
  const name = run.name ?? path;
  const model = await Model.open(path, { quiet: true, ctx: run.ctx });
  try {
    const worst = decodeAgainstReference(model, ref, run.prompt, run.steps, name);
    assert.ok(
      worst <= run.bound,
      `${name}: logits differ by ${worst} relative (bound ${run.bound})`,
    );
    return worst;
  } finally {
    model.close();
  }
}

/**
 * Decodes `steps` positions with the engine and the float64 reference side by side: `prompt`
 * first, then the reference's greedy tokens, asserting the engine picks the same token at every
 * generated position. Returns the worst relative logit difference seen.
 */
function decodeAgainstReference(
  model: Model,
  ref: Pick<ReferenceModel, "forward64">,
  prompt: number[],
  steps: number,
  name: string,
): number {
  const tokens = [...prompt];
  let worst = 0;
  for (let pos = 0; pos < steps; pos++) {
    const want = ref.forward64(tokens[pos], pos);
    const got = model.forward([tokens[pos]], pos);
    worst = Math.max(worst, maxRelDiff(got, want));
    if (pos >= tokens.length - 1) {
      const next = argmax(want);
      assert.equal(argmax(got), next, `${name}: greedy token differs at position ${pos}`);
      tokens.push(next);
    }
  }
  return worst;
}

/**
 * Asserts that fixture `name`'s float64 reference gives `known` after `prompt` with its
 * sparse-attention indexer, and that attending densely (the indexer keeping every key) does not,
 * while it agrees on the first `sparseFrom` ids (those made before any query was thinned).
 */
export function assertDenseAttentionFails(
  name: string,
  prompt: readonly number[],
  known: readonly number[],
  sparseFrom: number,
): void {
  const { cfg, weight } = referenceWeightsFromCheckpoint(fixtureDir(name));
  const run = (topK: number) => {
    const ref = new ReferenceModel(
      { ...cfg, mla: { ...cfg.mla!, indexer: { ...cfg.mla!.indexer!, topK } } },
      weight,
    );
    const tokens = [...prompt];
    for (let pos = 0; tokens.length < prompt.length + known.length; pos++) {
      const logits = ref.forward64(tokens[pos], pos);
      if (pos >= prompt.length - 1) tokens.push(argmax(logits));
    }
    return tokens.slice(prompt.length);
  };
  assert.deepEqual(run(cfg.mla!.indexer!.topK), known, "the reference gives the known answer");
  const dense = run(1 << 20);
  assert.notDeepEqual(dense, known);
  assert.deepEqual(dense.slice(0, sparseFrom), known.slice(0, sparseFrom));
}

/** What a prompt-cache check appends to its prompt, and how (see {@link checkPromptCache}). */
export interface PromptCacheCheck {
  /** Appended after the first generation: the prompt then extends all the cache holds. */
  extend: number[];
  /** Appended to the first {@link shared} ids of the extended prompt: a prompt sharing a prefix. */
  diverge: number[];
  /** Appended after the diverging generation, to continue a saved session. */
  resume: number[];
  /** Ids the diverging prompt keeps (default 3). */
  shared?: number;
  /** Tokens of the first generation (default 8). */
  first?: number;
  /** The sessions' context (default 128). */
  ctx?: number;
  /** A recurrent state (KDA, DeltaNet) cannot rewind: a diverging prompt runs from position 0. */
  recurrent?: boolean;
}

/**
 * Checks a model's prompt cache and saved sessions against cold runs: a prompt that extends all
 * the cache holds reuses it, one sharing only a prefix reuses that prefix (none of it when the
 * state is recurrent and cannot rewind), and a saved session continues as the original does.
 * Returns the first generation's greedy ids of `prompt`.
 */
export async function checkPromptCache(
  path: string,
  prompt: readonly number[],
  check: PromptCacheCheck,
): Promise<number[]> {
  const { shared = 3, first = 8, ctx = 128, recurrent = false } = check;
  const opts = { quiet: true, ctx, threads: 1 };
  const warm = await Session.open(path, opts);
  const cold = await Session.open(path, opts);
  const run = async (s: Session, p: number[], n: number) => {
    const out: number[] = [];
    for await (const t of s.generate(p, { maxTokens: n, ignoreEos: true })) out.push(t.id);
    return out;
  };
  const coldRun = (p: number[], n: number) => {
    cold.resetCache();
    return run(cold, p, n);
  };
  try {
    const g1 = await run(warm, [...prompt], first);
    // The last sampled token was never run, so it is prefilled with the new ones.
    const p2 = [...prompt, ...g1, ...check.extend];
    const g2 = await run(warm, p2, 8);
    assert.equal(warm.timings.cachedTokens, prompt.length + g1.length - 1);
    assert.deepEqual(g2, await coldRun(p2, 8));
    const p3 = [...p2.slice(0, shared), ...check.diverge];
    const g3 = await run(warm, p3, 8);
    assert.equal(warm.timings.cachedTokens, recurrent ? 0 : shared);
    assert.deepEqual(g3, await coldRun(p3, 8));
    const file = `${tempDir()}/cache-${Math.random().toString(36).slice(2)}.session`;
    saveSession(warm, file);
    const p4 = [...p3, ...g3, ...check.resume];
    const continued = await run(warm, p4, 8);
    const resumed = await Session.open(path, opts);
    try {
      loadSession(resumed, file);
      assert.deepEqual(await run(resumed, p4, 8), continued);
      assert.equal(resumed.timings.cachedTokens, p3.length + g3.length - 1);
    } finally {
      resumed.close();
    }
    return g1;
  } finally {
    warm.close();
    cold.close();
  }
}

/**
 * Text of a cold greedy generation of `n` tokens after `ids` on a reference session (special
 * tokens kept when `keepSpecial`, as the server reads a chat's output for its markers).
 */
export async function coldText(
  ref: Session,
  ids: number[],
  n: number,
  keepSpecial = false,
): Promise<string> {
  ref.resetCache();
  let text = "";
  for await (const t of ref.generate(ids, { maxTokens: n, temperature: 0, keepSpecial })) {
    text += t.text;
  }
  return text;
}

/**
 * A chat template whose generation prompt opens `<think>`, or writes an empty think block when
 * enable_thinking is false: Qwen3's habit, reduced to it (written for the tests).
 */
export const THINK_TEMPLATE = `{%- for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% else %}<think>
{% endif %}{% endif %}`;

/**
 * Opens the container at `path` and asserts that `text` tokenizes to `prompt` and that greedy
 * generation after `prompt`, for at most `maxTokens`, gives `known` (a README's known answer).
 */
export async function assertKnownContinuation(
  path: string,
  text: string,
  prompt: number[],
  known: number[],
  maxTokens = known.length,
): Promise<void> {
  const session = await Session.open(path, { quiet: true });
  try {
    assert.deepEqual(session.tokenize(text), prompt);
    const ids: number[] = [];
    for await (const t of session.generate(prompt, { maxTokens })) ids.push(t.id);
    assert.deepEqual(ids, known);
  } finally {
    session.close();
  }
}

/** Story openings the family tests tokenize: ASCII, punctuation, an emoji and an accent. */
export const STORY_PROMPTS: readonly string[] = [
  "Once upon a time",
  "One day, Timmy went to the park.",
  'The little dog said, "Hello!"',
  "Lily saw a 🐶 and a café.",
  "The sun was hot",
  "Tom and Sue played",
  "Hi",
];

/** The float64 reference of ../shared/models/`name`, its config first passed through `change`. */
export function referenceOf(
  name: string,
  change: (c: ModelConfig) => ModelConfig = (c) => c,
): ReferenceModel {
  const { cfg, weight } = referenceWeightsFromCheckpoint(fixtureDir(name));
  return new ReferenceModel(change(cfg), weight);
}

/**
 * The first `n` greedy ids after `prompt` of a reference pass (one position at a time), and the
 * logits that chose the first of them.
 */
export function referenceGreedy(
  ref: ReferenceModel,
  prompt: readonly number[],
  n: number,
): { ids: number[]; first: Float64Array } {
  const tokens = [...prompt];
  let first: Float64Array = new Float64Array();
  for (let pos = 0; tokens.length < prompt.length + n; pos++) {
    const logits = ref.forward64(tokens[pos], pos);
    if (pos === prompt.length - 1) first = logits;
    if (pos >= prompt.length - 1) tokens.push(argmax(logits));
  }
  return { ids: tokens.slice(prompt.length), first };
}

/**
 * The engine's first `n` greedy ids after `prompt` from the container at `path` opened with
 * `opts` (and `ctx` positions): the prompt in the run's prefill chunks, then one token at a time.
 */
export async function engineGreedy(
  path: string,
  prompt: readonly number[],
  n: number,
  opts: RunOptions = {},
  ctx = 64,
): Promise<number[]> {
  const model = await Model.open(path, { quiet: true, ctx, ...opts });
  try {
    const chunk = model.prefillChunk;
    let logits: Float32Array = new Float32Array(0);
    for (let p = 0; p < prompt.length; p += chunk) {
      logits = model.forward(prompt.slice(p, p + chunk), p);
    }
    const out: number[] = [];
    for (let i = 0; i < n; i++) {
      out.push(argmax(logits));
      logits = model.forward([out[i]], prompt.length + i);
    }
    return out;
  } finally {
    model.close();
  }
}

/**
 * A long sequence for the chunking and placement tests: the first 40 ids of four
 * {@link STORY_PROMPTS} and the engine's 12 greedy ids after them, decoded token by token.
 */
export async function longSequence(path: string): Promise<{ tokens: number[]; prompt: number }> {
  const session = await Session.open(path, { quiet: true });
  const prompt = session.tokenize(STORY_PROMPTS.slice(0, 4).join(" ")).slice(0, 40);
  session.close();
  const tokens = [...prompt, ...await engineGreedy(path, prompt, 12, { prefillChunk: 1 })];
  return { tokens, prompt: prompt.length };
}

/**
 * The logits of every position of `tokens` from the container at `path` opened with `opts` (and
 * `ctx` positions): the first `prefilled` tokens in chunks of the run's prefill chunk, the rest
 * one at a time, as a run with a prompt would. Placement tests compare these bit for bit.
 */
export async function logitsOfRun(
  path: string,
  opts: RunOptions,
  tokens: number[],
  prefilled: number,
  ctx: number,
): Promise<Float32Array> {
  const model = await Model.open(path, { quiet: true, ctx, ...opts });
  try {
    const vocab = model.cfg.vocabSize;
    const out = new Float32Array(tokens.length * vocab);
    const chunk = model.prefillChunk;
    for (let p = 0; p < prefilled; p += chunk) {
      const n = Math.min(chunk, prefilled - p);
      out.set(model.forward(tokens.slice(p, p + n), p, true), p * vocab);
    }
    for (let p = prefilled; p < tokens.length; p++) {
      out.set(model.forward([tokens[p]], p), p * vocab);
    }
    return out;
  } finally {
    model.close();
  }
}

/**
 * Asserts that the engine stays within 1e-4 of the float64 reference on each of the
 * {@link STORY_PROMPTS} of ../shared/models/`name` and 32 greedy tokens after it.
 */
export async function assertStoryPromptsMatchReference(name: string): Promise<void> {
  const { cfg, weight } = referenceWeightsFromCheckpoint(fixtureDir(name));
  const model = await Model.open(await packedFixture(name), { quiet: true, ctx: 96 });
  const session = await Session.open(await packedFixture(name), { quiet: true });
  try {
    for (const prompt of STORY_PROMPTS) {
      const ids = session.tokenize(prompt);
      const ref = new ReferenceModel(cfg, weight);
      const worst = decodeAgainstReference(model, ref, ids, ids.length + 32, prompt);
      assert.ok(worst <= 1e-4, `${prompt}: logits differ by ${worst} relative`);
    }
  } finally {
    model.close();
    session.close();
  }
}

/**
 * Asserts that the usual placements give the logits of the defaults bit for bit on `tokens`
 * (the first `prefilled` as a prompt, `ctx` positions): the budget at the plan's floor with one
 * thread and one-token prefill, two threads, prefill chunks of 7, a small LRU expert cache with
 * lookahead 4, and the node:fs fallback reader with verification.
 */
export async function assertPlacementsAgree(
  path: string,
  tokens: number[],
  prefilled: number,
  ctx: number,
): Promise<void> {
  const base = await logitsOfRun(path, {}, tokens, prefilled, ctx);
  const probe = await Model.open(path, { quiet: true, ctx, prefillChunk: 1 });
  const floor = probe.plan.floor;
  probe.close();
  const settings: [string, RunOptions][] = [
    ["budget = floor, 1 thread", { budget: floor, prefillChunk: 1, threads: 1 }],
    ["2 threads", { threads: 2 }],
    ["prefill chunk 7", { prefillChunk: 7 }],
    ["lookahead 4, LRU", { expertSlots: 10, lookahead: 4, cache: "lru" }],
    ["node:fs fallback reader, verify", { io: "fallback", verify: true, expertSlots: 8 }],
  ];
  for (const [what, opts] of settings) {
    assert.deepEqual(
      await logitsOfRun(path, opts, tokens, prefilled, ctx),
      base,
      `${what} changed the logits`,
    );
  }
}

/**
 * Asserts that budgets from the floor (one trunk ring slot) to half the model, no read-ahead, the
 * lookahead, an LRU cache, 1 and 2 threads and the node:fs fallback reader give the defaults'
 * logits bit for bit on `tokens` (the first `prefilled` as a prompt, 64 positions); the expert
 * cache holds `slots` records where a setting names it (one fewer for the fallback reader).
 */
export async function assertRingPlacementsAgree(
  path: string,
  tokens: number[],
  prefilled: number,
  slots: number,
): Promise<void> {
  const base = await logitsOfRun(path, {}, tokens, prefilled, 64);
  const probe = await Model.open(path, { quiet: true, ctx: 64 });
  const { floor, wholeModelBytes } = probe.plan;
  const ring = Math.max(...probe.container.manifest.trunk.layers.map((l) => l.bytes));
  probe.close();
  const settings: [string, RunOptions][] = [
    ["budget = floor, 1 thread", { budget: floor, threads: 1 }],
    ["budget = floor (1 ring slot)", { budget: floor }],
    ["floor + one more ring slot", { budget: floor + ring }],
    ["half the model", { budget: Math.floor((floor + wholeModelBytes) / 2) }],
    ["no read-ahead", { budget: floor + ring, readaheadDepth: 0, trunkReadahead: false }],
    ["lookahead 4", { expertSlots: slots, lookahead: 4 }],
    ["LRU cache", { cache: "lru", expertSlots: slots }],
    ["1 thread", { threads: 1 }],
    ["2 threads", { threads: 2 }],
    ["node:fs fallback reader, verify", { io: "fallback", verify: true, expertSlots: slots - 1 }],
  ];
  for (const [what, opts] of settings) {
    assert.deepEqual(
      await logitsOfRun(path, opts, tokens, prefilled, 64),
      base,
      `${what} changed the logits`,
    );
  }
}

/**
 * Runs `tokens` through the engine (prefill in chunks of `chunk`, then one at a time) and the
 * float64 reference; returns the worst relative logit difference and asserts the greedy ids match.
 */
export async function engineVsReference(
  dir: string,
  ckpt: string,
  tokens: number[],
  chunk: number,
): Promise<number> {
  const { cfg, weight } = referenceWeightsFromCheckpoint(ckpt);
  const ref = new ReferenceModel(cfg, weight);
  const want = tokens.map((t, p) => ref.forward64(t, p));
  const model = await Model.open(dir, { quiet: true, ctx: 64, prefillChunk: chunk });
  try {
    let worst = 0;
    for (let p = 0; p < tokens.length; p += chunk) {
      const part = tokens.slice(p, p + chunk);
      const got = model.forward(part, p, true);
      part.forEach((_, i) => {
        const g = got.subarray(i * cfg.vocabSize, (i + 1) * cfg.vocabSize);
        worst = Math.max(worst, maxRelDiff(g, want[p + i]));
        assert.equal(argmax(g), argmax(want[p + i]), `greedy id at position ${p + i}`);
      });
    }
    return worst;
  } finally {
    model.close();
  }
}

/**
 * Synthesises an `arch` checkpoint of the sizes `overrides` give (`dtype`, f32 unless given; seed
 * `seed`), packs it, and checks the engine against the float64 reference within 1e-4 at prefill
 * chunks 1 and 5.
 */
export async function synthVsReference(
  arch: SynthArch,
  name: string,
  seed: number,
  overrides: SynthOverrides,
  dtype: SynthDtype = "f32",
): Promise<void> {
  const out = `${tempDir()}/${name}`;
  const ckpt = await synthCheckpoint({
    arch,
    out,
    size: 2e6,
    seed,
    dtype,
    overrides,
    progress: "off",
    log: () => {},
  });
  await packCheckpoint(ckpt.dir, `${out}.sluice`, { progress: "off", log: () => {} });
  const tokens = [1, 17, 250, 33, 101, 7, 9, 44, 8, 120, 3, 299];
  for (const chunk of [1, 5]) {
    const worst = await engineVsReference(`${out}.sluice`, ckpt.dir, tokens, chunk);
    assert.ok(worst < 1e-4, `prefill chunk ${chunk}: logits differ by ${worst} relative`);
  }
}
