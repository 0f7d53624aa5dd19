/**
 * GGUF exports of GLM-4.5 (glm4moe), gpt-oss, Qwen3.5-MoE (qwen35moe), Qwen3-Next (qwen3next),
 * MiniMax-M2 (minimax-m2), Gemma 4 (gemma4) and DeepSeek-V4 (deepseek4) checked by llama.cpp
 * itself: node-llama-cpp (installed on demand into the bench's cache, as `bench compare` does)
 * loads the f32 export and decodes greedily with an F32 KV cache and no flash attention (its F16
 * paths drift by ~1e-3), and its ids must equal sluice's on the same checkpoint past position 128.
 * llama.cpp always floors/ceils YaRN's correction range, so gpt-oss is compared on a copy of the
 * fixture whose config says `truncate: true` (the real `truncate: false` differs from it; see the
 * README). Skipped when the fixtures or node-llama-cpp's prebuilt CPU binary are not available.
 */
import assert from "node:assert/strict";
import { existsSync, readFileSync, symlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Model } from "../engine/model.ts";
import { argmax } from "../engine/sampler.ts";
import { setupLlamaCpp } from "../tools/dev/bench/llamacpp.ts";
import type { EngineJob, EngineRun } from "../tools/dev/bench/compare_report.ts";
import { exportGguf } from "../tools/dev/export_gguf.ts";
import { packCheckpoint } from "../tools/pack.ts";
import { deepseek4GgufCheckpoint } from "./deepseek4_synth.ts";
import { fixtureDir, hasFixture, QWEN_HYBRID_KNOWN, tempDir } from "./fixtures.ts";
import { LLAMACPP_REASON, LLAMACPP_TESTS, skipIf } from "./skips.ts";

const PROMPT = [1, 403, 407, 261, 378];
/** Generated ids compared: prompt + 150 reaches position 155, past gpt-oss's 128 window. */
const STEPS = 150;
const have = hasFixture("tiny-glm4-moe") && hasFixture("tiny-gpt-oss");
const haveQwen = hasFixture("tiny-qwen3.5-moe") || hasFixture("tiny-qwen3-next") ||
  hasFixture("tiny-minimax-m2") || hasFixture("tiny-gemma4-moe");
const llama = (have || haveQwen) && LLAMACPP_TESTS
  ? await setupLlamaCpp(undefined, () => {})
  : null;
/**
 * Each test's `ignore` (`fixtures`: whether its fixtures are there): why it skips is counted
 * (tests/skips.ts).
 */
const ignore = (fixtures = have) =>
  !fixtures ||
  skipIf(
    !llama?.ok,
    LLAMACPP_TESTS && llama && !llama.ok ? `need llama.cpp (${llama.why})` : LLAMACPP_REASON,
  );
if ((have || haveQwen) && llama && !llama.ok) {
  console.error(`gguf_llamacpp_test skipped: ${llama.why}`);
}

/** sluice's greedy ids after PROMPT on checkpoint `dir`. */
async function sluiceIds(dir: string, name: string): Promise<number[]> {
  const out = join(tempDir(), `${name}-llamacpp.sluice`);
  await packCheckpoint(dir, out, { progress: "off", log: () => {}, force: true });
  const model = await Model.open(out, { quiet: true, ctx: 256 });
  try {
    const ids = [...PROMPT];
    let logits = model.forward(PROMPT, 0);
    for (let i = 0; i <= STEPS; i++) {
      ids.push(argmax(logits));
      logits = model.forward([ids[ids.length - 1]], ids.length - 1);
    }
    return ids.slice(PROMPT.length);
  } finally {
    model.close();
  }
}

/** llama.cpp's greedy ids after PROMPT on the GGUF export (f32 unless `type`) of `dir`. */
async function llamaIds(dir: string, name: string, type?: "mxfp4"): Promise<number[]> {
  if (!llama?.ok) throw new Error("node-llama-cpp is not set up");
  const gguf = join(tempDir(), `${name}.gguf`);
  exportGguf(dir, gguf, { progress: "off", force: true, type });
  const job: EngineJob = {
    model: gguf,
    threads: 2,
    promptIds: PROMPT,
    decodeTokens: STEPS,
    budget: null,
    warmup: false,
    maxSeconds: 300,
    kvF32: true,
  };
  const out = await new Deno.Command("node", {
    args: [llama.script, JSON.stringify(job)],
    cwd: llama.dir,
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout);
  assert.ok(out.success, `llama.cpp failed: ${new TextDecoder().decode(out.stderr).slice(-800)}`);
  const run = JSON.parse(text.trim().split("\n").pop()!) as EngineRun;
  assert.equal(run.stopped_early, false);
  return run.ids;
}

Deno.test({
  name: "glm4moe GGUF export: llama.cpp's greedy ids equal sluice's",
  ignore: ignore(),
  fn: async () => {
    const dir = fixtureDir("tiny-glm4-moe");
    const [want, got] = [await sluiceIds(dir, "glm"), await llamaIds(dir, "glm")];
    assert.equal(want.length, STEPS + 1);
    assert.deepEqual(got, want);
  },
});

/** A copy of tiny-gpt-oss (symlinks) whose config says `truncate: true`, as llama.cpp computes. */
function truncatedGptOss(): string {
  const src = fixtureDir("tiny-gpt-oss");
  const dir = join(tempDir(), "gpt-oss-truncate");
  if (existsSync(join(dir, "config.json"))) return dir;
  Deno.mkdirSync(dir, { recursive: true });
  for (const f of Deno.readDirSync(src)) {
    if (f.name !== "config.json") symlinkSync(join(src, f.name), join(dir, f.name));
  }
  const cfg = JSON.parse(readFileSync(join(src, "config.json"), "utf8"));
  cfg.rope_scaling.truncate = true;
  writeFileSync(join(dir, "config.json"), JSON.stringify(cfg));
  return dir;
}

Deno.test({
  name: "gpt-oss GGUF export: llama.cpp's greedy ids equal sluice's (YaRN truncated for both)",
  ignore: ignore(),
  fn: async () => {
    const dir = truncatedGptOss();
    const [want, got] = [await sluiceIds(dir, "oss"), await llamaIds(dir, "oss")];
    assert.deepEqual(got, want);
    // The real config (truncate false) gives other ids: the variant is not a no-op.
    assert.notDeepEqual(await sluiceIds(fixtureDir("tiny-gpt-oss"), "oss-real"), want);
  },
});

Deno.test({
  name: "gpt-oss MXFP4 GGUF export runs in llama.cpp's native MXFP4 path",
  ignore: ignore(),
  fn: async () => {
    const dir = truncatedGptOss();
    const got = await llamaIds(dir, "oss-mxfp4", "mxfp4");
    assert.equal(got.length, STEPS + 1);
    // llama.cpp multiplies MXFP4 with Q8 activations, so only the start of the path is shared
    // (it leaves sluice's exact path at generated token 28 here).
    assert.deepEqual(got.slice(0, 10), (await sluiceIds(dir, "oss-mx")).slice(0, 10));
  },
});

/** The Qwen hybrids, llama.cpp's name for each, and the README's first 20 generated ids. */
const QWEN_HYBRIDS: [string, string, readonly number[]][] = [
  ["tiny-qwen3.5-moe", "qwen35moe", QWEN_HYBRID_KNOWN["tiny-qwen3.5-moe"]],
  ["tiny-qwen3-next", "qwen3next", QWEN_HYBRID_KNOWN["tiny-qwen3-next"]],
];

for (const [name, arch, known] of QWEN_HYBRIDS) {
  Deno.test({
    name: `${arch} GGUF export: llama.cpp's greedy ids equal sluice's and the README's`,
    ignore: ignore(hasFixture(name)),
    fn: async () => {
      const dir = fixtureDir(name);
      const [want, got] = [await sluiceIds(dir, arch), await llamaIds(dir, arch)];
      // ../shared/models/README.md: on this prompt llama.cpp follows transformers past the
      // compared positions (its log-probabilities differ by up to 3.6e-3, cause unknown).
      assert.deepEqual(got.slice(0, 20), known);
      assert.deepEqual(got, want);
    },
  });
}

Deno.test({
  name: "minimax-m2 GGUF export: llama.cpp's greedy ids equal sluice's",
  ignore: ignore(hasFixture("tiny-minimax-m2")),
  fn: async () => {
    // Whole-projection q/k norms, a rotary slice of half the head and sigmoid routing whose bias
    // only selects: a wrong norm shape, rope dimension or gating function changes the ids.
    const dir = fixtureDir("tiny-minimax-m2");
    assert.deepEqual(await llamaIds(dir, "minimax-m2"), await sluiceIds(dir, "minimax-m2"));
  },
});

Deno.test({
  name: "gemma4 GGUF export: llama.cpp's greedy ids equal sluice's and the README's",
  ignore: ignore(hasFixture("tiny-gemma4-moe")),
  fn: async () => {
    // Two attention geometries, k = v, the proportional RoPE's factors, sandwich norms, layer
    // scalars, the router's and experts' scales and the dense MLP beside the experts: each
    // changes the ids (../shared/models/README.md); 151 ids reach position 155, past the window
    // of 32. √64 is exact, so llama.cpp's f32 embedding scale is the fixture's.
    const dir = fixtureDir("tiny-gemma4-moe");
    const [want, got] = [await sluiceIds(dir, "gemma4"), await llamaIds(dir, "gemma4")];
    assert.deepEqual(got.slice(0, 20), [
      ...[346, 448, 452, 452, 404, 348, 1, 333, 452, 452],
      ...[386, 386, 310, 310, 403, 310, 452, 386, 386, 338],
    ]);
    assert.deepEqual(got, want);
  },
});

Deno.test({
  name: "deepseek4 GGUF export: llama.cpp's greedy ids equal sluice's (release storage, f32)",
  ignore: ignore(true),
  fn: async () => {
    // tiny-deepseek-v4's sizes and layers with a 64-wide indexer head (llama.cpp stops on the
    // fixture's 16): window-only, CSA (the indexer keeps 4 of up to 38 entries from position 20
    // on) and HCA layers (one entry from position 127), hash and sqrt(softplus) routing,
    // hyper-connections; the FP8 / FP4 / BF16 storage exported exactly as f32.
    const dir = await deepseek4GgufCheckpoint();
    const [want, got] = [await sluiceIds(dir, "deepseek4"), await llamaIds(dir, "deepseek4")];
    assert.equal(want.length, STEPS + 1);
    assert.deepEqual(got, want);
  },
});
