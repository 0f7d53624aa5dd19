/**
 * GLM-5 (glm_moe_dsa) on ../shared/models/tiny-glm5: the README's known greedy continuation, the
 * engine against the float64 reference (MLA with interleaved RoPE and latent norms at 1e-6, the
 * DeepSeek Sparse Attention indexer picking 16 keys, sigmoid routing with the selection bias,
 * routed scaling, shared expert, one dense layer), attending densely failing the known answer,
 * chunked prefill, the prompt cache and saved sessions, and placements, all bit for bit.
 */
import assert from "node:assert/strict";
import { normalizeConfig } from "../engine/config.ts";
import { Model } from "../engine/model.ts";
import { Session } from "../engine/session.ts";
import { openContainer } from "../engine/container.ts";
import { packCheckpoint } from "../tools/pack.ts";
import {
  assertDenseAttentionFails,
  assertNearReference,
  budgetAboveFloor,
  checkPromptCache,
  fixtureConfig,
  fixtureDir,
  hasFixture,
  packedFixture,
  referenceOf,
  tempDir,
} from "./fixtures.ts";

const NAME = "tiny-glm5";
const ignore = !hasFixture(NAME);
/** "Once upon a time" and the README's first 20 greedy ids after it. */
const PROMPT = [1, 403, 407, 261, 378];
const KNOWN = [
  ...[431, 430, 343, 462, 388, 468, 331, 292, 449, 428],
  ...[386, 388, 465, 340, 462, 420, 293, 380, 456, 287],
];

/** Greedy ids of `n` tokens after `prompt`. */
async function greedy(s: Session, prompt: number[], n: number): Promise<number[]> {
  const ids: number[] = [];
  for await (const t of s.generate(prompt, { maxTokens: n, ignoreEos: true })) ids.push(t.id);
  return ids;
}

Deno.test({
  name: "glm_moe_dsa: the config's indexer, latent eps and MoE are read, and checked",
  ignore,
  fn() {
    const raw = fixtureConfig(NAME);
    const cfg = normalizeConfig(raw);
    assert.deepEqual(cfg.mla?.indexer, { numHeads: 16, headDim: 16, topK: 16 });
    assert.equal(cfg.mla?.latentNormEps, 1e-6);
    assert.equal(cfg.rmsNormEps, 1e-5);
    assert.equal(cfg.rope.layout, "interleaved");
    assert.deepEqual(cfg.layerKinds, ["dense", "moe", "moe", "moe"]);
    assert.equal(cfg.moe?.routedScaling, 2.5);
    assert.equal(cfg.moe?.selectionBias, true);
    assert.equal(cfg.moe?.sharedIntermediate, 32);
    assert.throws(
      () => normalizeConfig({ ...raw, index_topk_freq: 4 }),
      /index_topk_freq \(a shared indexer\) is not supported/,
    );
    assert.throws(
      () => normalizeConfig({ ...raw, indexer_rope_interleave: false }),
      /indexer_rope_interleave must equal rope_interleave/,
    );
    assert.throws(() => normalizeConfig({ ...raw, index_head_dim: 4 }), /index_head_dim/);
  },
});

Deno.test({
  name: "glm_moe_dsa: the known greedy continuation of the fixture's README",
  ignore,
  fn: async () => {
    const session = await Session.open(await packedFixture(NAME), { quiet: true });
    try {
      assert.deepEqual(session.tokenize("Once upon a time"), PROMPT);
      assert.deepEqual(await greedy(session, PROMPT, 20), KNOWN);
    } finally {
      session.close();
    }
  },
});

Deno.test({
  name: "glm_moe_dsa: attending densely (the indexer ignored) fails the known answer",
  ignore,
  fn() {
    // The same up to the first position with more than 16 keys (generated index 12).
    assertDenseAttentionFails(NAME, PROMPT, KNOWN, 12);
  },
});

Deno.test({
  name: "glm_moe_dsa: engine logits within 1e-4 of the float64 reference over 120 positions",
  ignore,
  fn: async () => {
    const run = { ctx: 128, prompt: PROMPT, steps: 120, bound: 1e-4, name: NAME };
    await assertNearReference(await packedFixture(NAME), referenceOf(NAME), run);
  },
});

Deno.test({
  name: "glm_moe_dsa: prefill in chunks of 32 and 7 gives the same bits as token by token",
  ignore,
  fn: async () => {
    const dir = await packedFixture(NAME);
    const tokens = [...PROMPT, ...KNOWN, ...KNOWN];
    const run = async (chunk: number) => {
      const model = await Model.open(dir, { quiet: true, ctx: 64, prefillChunk: chunk });
      try {
        const parts: number[] = [];
        for (let p = 0; p < tokens.length; p += chunk) {
          parts.push(...model.forward(tokens.slice(p, p + chunk), p, true));
        }
        return Float32Array.from(parts);
      } finally {
        model.close();
      }
    };
    const one = await run(1);
    for (const chunk of [32, 7]) {
      assert.deepEqual(await run(chunk), one, `prefill chunk ${chunk}: logits differ from chunk 1`);
    }
  },
});

Deno.test({
  name: "glm_moe_dsa: the prompt cache and a saved session give a cold run's tokens",
  ignore,
  fn: async () => {
    // 24 tokens first, past 16 keys, so the cached indexer keys choose what every later query
    // attends to; then a prompt sharing the first 20 ids rewinds the caches to there.
    await checkPromptCache(await packedFixture(NAME), PROMPT, {
      first: 24,
      extend: [300, 301],
      shared: 20,
      diverge: [410, 411, 412],
      resume: [420],
    });
  },
});

Deno.test({
  name:
    "glm_moe_dsa: the same tokens on every placement, budgets down to the floor, 1 or 2 threads",
  ignore,
  fn: async () => {
    const path = await packedFixture(NAME);
    const run = async (opts: { budget?: number; threads: number }) => {
      const s = await Session.open(path, { quiet: true, ctx: 96, ...opts });
      try {
        return await greedy(s, PROMPT, 60);
      } finally {
        s.close();
      }
    };
    const want = await run({ threads: 2 });
    assert.deepEqual(want.slice(0, 20), KNOWN);
    for (const threads of [1, 2]) {
      for (const extra of [0, 64 * 1024, 512 * 1024]) {
        const budget = await budgetAboveFloor(path, extra, { ctx: 96, threads });
        assert.deepEqual(
          await run({ budget, threads }),
          want,
          `budget floor + ${extra}, ${threads} threads`,
        );
      }
    }
  },
});

Deno.test({
  name: "glm_moe_dsa: open refuses a manifest whose indexer section is out of bounds",
  ignore,
  fn: async () => {
    const out = `${tempDir()}/glm5-tamper.sluice`;
    await packCheckpoint(fixtureDir(NAME), out, { progress: "off", log: () => {} });
    const path = `${out}/manifest.json`;
    const original = Deno.readTextFileSync(path);
    // deno-lint-ignore no-explicit-any
    const tamper = (edit: (m: any) => void, want: RegExp) => {
      const m = JSON.parse(original);
      edit(m);
      Deno.writeTextFileSync(path, JSON.stringify(m));
      assert.throws(() => openContainer(out), want);
    };
    tamper((m) => m.config.mla.indexer.topK = 0, /mla\.indexer\.topK/);
    tamper((m) => m.config.mla.indexer.numHeads = 2 ** 20, /mla\.indexer\.numHeads/);
    tamper((m) => m.config.mla.indexer.headDim = 4, /headDim ≥ qkRopeHeadDim/);
    tamper((m) => m.config.mla.indexer.pool = 17, /mla\.indexer\.pool/);
    tamper((m) => m.config.mla.latentNormEps = 2, /latentNormEps/);
    tamper((m) => delete m.config.mla.indexer, /tensors: expected exactly attn_norm/);
    Deno.writeTextFileSync(path, original);
    openContainer(out);
  },
});
