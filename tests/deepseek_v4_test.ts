/**
 * DeepSeek-V4 (../shared/models/README.md, tiny-deepseek-v4): the config normaliser reads the
 * release's keys and refuses what it cannot run by name; the float64 reference and the engine
 * give the README's known continuation; the engine stays within 1e-4 of the reference past the
 * first HCA entry (position 127); chunked prefill, the prompt cache and saved sessions equal
 * token-by-token runs; placements give bit-identical logits. The synthesiser's deepseek_v4 recipe
 * writes the fixture's layout and, at another tiny width, a model the engine runs as the float64
 * reference does.
 */
import assert from "node:assert/strict";
import { findMatrix } from "../engine/checkpoint_matrix.ts";
import { normalizeConfig } from "../engine/config.ts";
import { openContainer } from "../engine/container.ts";
import { referenceWeightsFromCheckpoint } from "../engine/float_weights.ts";
import { Model, type RunOptions } from "../engine/model.ts";
import { ReferenceModel } from "../engine/reference/forward.ts";
import { argmax } from "../engine/sampler.ts";
import { hfExpertName } from "../engine/tensor_names.ts";
import { decodeDtypeToF32, readF32 } from "../io/checkpoint_weights.ts";
import { readExpertRecord } from "../io/container.ts";
import { type Checkpoint, openCheckpoint } from "../io/safetensors.ts";
import { synthCheckpoint, synthShape, synthTensors } from "../tools/synth.ts";
import { DEEPSEEK4_FIXTURE_DIMS } from "./deepseek4_synth.ts";
import {
  assertNearReference,
  checkPromptCache,
  engineGreedy,
  fixtureConfig,
  fixtureDir,
  hasFixture,
  logitsOfRun,
  packedFixture,
  referenceOf,
  synthVsReference,
  tempDir,
} from "./fixtures.ts";

const V4 = "tiny-deepseek-v4";
const V4_FP8 = "tiny-deepseek-v4-fp8";
/** README "Known answer": "Once upon a time" and its first 20 greedy ids. */
const PROMPT = [1, 403, 407, 261, 378];
const KNOWN = [
  277,
  386,
  483,
  299,
  299,
  332,
  407,
  416,
  494,
  430,
  401,
  313,
  426,
  401,
  406,
  428,
  377,
  292,
  450,
  314,
];

/** README "tiny-deepseek-v4-fp8 … Known answer": a different function, the same prompt. */
const KNOWN_FP8 = [
  465,
  428,
  426,
  312,
  469,
  287,
  485,
  343,
  287,
  293,
  378,
  13,
  340,
  388,
  428,
  340,
  367,
  325,
  372,
  325,
];

Deno.test({
  name: "DeepSeek-V4 config: the release's keys, refusals naming the key or architecture",
  ignore: !hasFixture(V4),
  fn() {
    const base = fixtureConfig(V4);
    const cfg = normalizeConfig(base);
    assert.equal(cfg.family, "deepseek_v4");
    assert.deepEqual(cfg.csa!.layers.map((l) => l.ratio), [0, 0, 4, 128, 4, 128]);
    assert.deepEqual(cfg.csa!.layers.map((l) => l.indexed), [
      false,
      false,
      true,
      false,
      true,
      false,
    ]);
    assert.deepEqual(cfg.residual, { kind: "hyper", streams: 4, sinkhornIters: 20, eps: 1e-6 });
    assert.equal(cfg.moe!.hashLayers, 3);
    assert.equal(cfg.moe!.swigluLimit, 10);
    const v41 = { ...base, architectures: ["DeepseekV41ForCausalLM"] };
    assert.throws(() => normalizeConfig(v41), /DeepseekV41ForCausalLM.*Engram/);
    assert.throws(
      () => normalizeConfig({ ...v41, model_type: "deepseek_v41" }),
      /DeepseekV41ForCausalLM/,
    );
    assert.throws(
      () => normalizeConfig({ ...base, compress_ratios: [0, 0, 4, 64, 4, 128, 0] }),
      /compress_ratios\[3\] is 64/,
    );
    assert.throws(
      () => normalizeConfig({ ...base, compress_ratios: [0, 0, 4] }),
      /compress_ratios has 3 entries for 6 layers/,
    );
    assert.throws(() => normalizeConfig({ ...base, scoring_func: "sigmoid" }), /scoring_func/);
    for (
      const key of ["hc_mult", "o_groups", "index_topk", "swiglu_limit", "compress_rope_theta"]
    ) {
      const broken = { ...base };
      delete broken[key];
      assert.throws(() => normalizeConfig(broken), new RegExp(`required field ${key} is missing`));
    }
    assert.throws(
      () => normalizeConfig({ ...base, num_key_value_heads: 2 }),
      /num_key_value_heads/,
    );
    // Keys transformers defaults: absent, they take its defaults; set otherwise, refused.
    const { num_hash_layers: _h, attention_bias: _a, topk_method: _t, ...bare } = base;
    assert.equal(normalizeConfig(bare).moe!.hashLayers, 3);
    assert.throws(() => normalizeConfig({ ...base, attention_bias: true }), /attention_bias/);
    assert.throws(() => normalizeConfig({ ...base, topk_method: "greedy" }), /topk_method/);
  },
});

Deno.test({
  name: 'DeepSeek-V4 reference: the README\'s known continuation of "Once upon a time"',
  ignore: !hasFixture(V4),
  fn() {
    const { cfg, weight } = referenceWeightsFromCheckpoint(fixtureDir(V4));
    const ref = new ReferenceModel(cfg, weight);
    const tokens = [...PROMPT];
    for (let pos = 0; tokens.length < PROMPT.length + KNOWN.length; pos++) {
      const logits = ref.forward64(tokens[pos], pos);
      if (pos >= PROMPT.length - 1) tokens.push(argmax(logits));
    }
    assert.deepEqual(tokens.slice(PROMPT.length), KNOWN);
  },
});

Deno.test({
  name: "DeepSeek-V4 engine: the known continuation, in any prefill chunking",
  ignore: !hasFixture(V4),
  async fn() {
    const dir = await packedFixture(V4);
    for (const prefillChunk of [64, 1, 3]) {
      const got = await engineGreedy(dir, PROMPT, KNOWN.length, { prefillChunk }, 256);
      assert.deepEqual(got, KNOWN, `prefill chunk ${prefillChunk}`);
    }
  },
});

Deno.test({
  name: "DeepSeek-V4 engine: within 1e-4 of the float64 reference past the first HCA entry",
  ignore: !hasFixture(V4),
  async fn() {
    await assertNearReference(await packedFixture(V4), referenceOf(V4), {
      ctx: 256,
      prompt: PROMPT,
      steps: 150,
      bound: 1e-4,
      name: V4,
    });
  },
});

for (const name of [V4, V4_FP8]) {
  Deno.test({
    name:
      `DeepSeek-V4 engine: bit-identical logits across placements, chunks and threads (${name})`,
    ignore: !hasFixture(name),
    async fn() {
      const path = await packedFixture(name);
      const tokens = [...PROMPT, ...await engineGreedy(path, PROMPT, 135, {}, 256)];
      const base = await logitsOfRun(
        path,
        { prefillChunk: 1, threads: 2 },
        tokens,
        tokens.length,
        256,
      );
      const probe = await Model.open(path, { quiet: true, ctx: 256, prefillChunk: 1 });
      const floor = probe.plan.floor;
      probe.close();
      const settings: [string, RunOptions, number][] = [
        ["prefill chunk 64", { prefillChunk: 64 }, 133],
        ["prefill chunk 7", { prefillChunk: 7 }, 130],
        ["budget = floor", { budget: floor, prefillChunk: 1 }, 20],
        ["1 thread", { threads: 1 }, 20],
        ["lookahead 4, LRU", { expertSlots: 10, lookahead: 4, cache: "lru" }, 20],
        ["node:fs fallback reader, verify", { io: "fallback", verify: true, expertSlots: 8 }, 20],
      ];
      for (const [what, opts, prompt] of settings) {
        assert.deepEqual(
          await logitsOfRun(path, opts, tokens, prompt, 256),
          base,
          `${what} changed the logits`,
        );
      }
    },
  });
}

Deno.test({
  name: "DeepSeek-V4 prompt cache and saved sessions: the same tokens as cold runs",
  ignore: !hasFixture(V4),
  async fn() {
    // Extending what the cache holds crosses CSA entries (every 4 positions); a prompt sharing a
    // prefix only rewinds the cache to it.
    const g1 = await checkPromptCache(await packedFixture(V4), PROMPT, {
      extend: [40, 77, 9],
      diverge: [250, 9, 31],
      resume: [120],
      ctx: 256,
    });
    assert.deepEqual(g1, KNOWN.slice(0, 8));
  },
});

Deno.test({
  name: "DeepSeek-V4 FP8/FP4 release storage: known answer, 1e-4 of the reference on its decode",
  ignore: !hasFixture(V4_FP8),
  async fn() {
    const dir = await packedFixture(V4_FP8);
    assert.deepEqual(
      await engineGreedy(dir, PROMPT, KNOWN_FP8.length, { prefillChunk: 3 }, 256),
      KNOWN_FP8,
    );
    const run = { ctx: 256, prompt: PROMPT, steps: 40, bound: 1e-4, name: V4_FP8 };
    await assertNearReference(dir, referenceOf(V4_FP8), run);
  },
});

Deno.test({
  name: "DeepSeek-V4 pack: FP4 experts keep the shipped bytes as mxfp4, FP8 stays FP8",
  ignore: !hasFixture(V4_FP8),
  async fn() {
    const c = openContainer(await packedFixture(V4_FP8));
    const ckpt = openCheckpoint(fixtureDir(V4_FP8));
    try {
      const cfg = c.config;
      for (const [layer, expert] of [[0, 0], [3, 7], [5, 15]]) {
        const bank = c.manifest.experts[layer]!;
        assert.equal(bank.format, "mxfp4");
        assert.equal(bank.activations, "f32", "shipped FP4 multiplies f32 activations");
        const { record } = readExpertRecord(c, layer, expert);
        for (const m of ["gate", "up", "down"] as const) {
          const name = hfExpertName(cfg, layer, expert, m);
          const e = bank.matrices[m];
          assert.deepEqual(record.subarray(e.offset, e.offset + e.bytes), ckpt.read(name), name);
          const scale = name.replace(/\.weight$/, ".scale");
          assert.deepEqual(
            record.subarray(e.scale!.offset, e.scale!.offset + e.scale!.bytes),
            ckpt.read(scale),
            scale,
          );
        }
      }
      assert.equal(c.manifest.trunk.layers[2].tensors.wq_b.dtype, "f8_e4m3");
    } finally {
      ckpt.close();
    }
  },
});

Deno.test({
  name: "DeepSeek-V4 storage refusals name the tensor: a missing .scale, an E8M0 NaN scale",
  ignore: !hasFixture(V4_FP8),
  fn() {
    const real = openCheckpoint(fixtureDir(V4_FP8));
    try {
      const w1 = "layers.3.ffn.experts.0.w1.weight", s1 = "layers.3.ffn.experts.0.w1.scale";
      const without = (name: string): Checkpoint => {
        const tensors = new Map(real.tensors);
        tensors.delete(name);
        return { ...real, tensors };
      };
      assert.throws(() => findMatrix(without(s1), w1, "expert"), new RegExp(w1));
      const wq = "layers.0.attn.wq_a.weight";
      assert.throws(
        () => readF32(without("layers.0.attn.wq_a.scale"), wq),
        /layers\.0\.attn\.wq_a\.weight.*layers\.0\.attn\.wq_a\.scale/,
      );
      assert.throws(
        () => decodeDtypeToF32("F8_E8M0", Uint8Array.of(127, 0xff), `tensor ${s1}`),
        new RegExp(`${s1.replaceAll(".", "\\.")}: element 1 is the E8M0 NaN code`),
      );
    } finally {
      real.close();
    }
  },
});

Deno.test({
  name: "synth deepseek_v4 at the fixture's sizes: tiny-deepseek-v4-fp8's names, dtypes, shapes",
  ignore: !hasFixture(V4_FP8),
  async fn() {
    const out = `${tempDir()}/synth-v4-layout`;
    const res = await synthCheckpoint({
      arch: "deepseek_v4",
      out,
      size: 1e6,
      overrides: DEEPSEEK4_FIXTURE_DIMS,
      progress: "off",
      log: () => {},
    });
    const got = openCheckpoint(res.dir), want = openCheckpoint(fixtureDir(V4_FP8));
    try {
      const layout = (c: Checkpoint) =>
        [...c.tensors.values()].map((t) => `${t.name} ${t.dtype} [${t.shape}]`).sort();
      assert.deepEqual(layout(got), layout(want));
      // The hash tables hold top-k distinct experts per token id.
      const table = new BigInt64Array(got.read("layers.0.ffn.gate.tid2eid").slice().buffer);
      for (let row = 0; row < 512; row++) {
        const ids = [...table.subarray(4 * row, 4 * row + 4)].map(Number);
        assert.equal(new Set(ids).size, 4, `tid2eid row ${row}: ${ids}`);
        assert.ok(ids.every((e) => e >= 0 && e < 16), `tid2eid row ${row}: ${ids}`);
      }
    } finally {
      got.close();
      want.close();
    }
    // Config: the release's keys (the fixture's but the MTP layer, which synth does not write).
    const cfg = JSON.parse(Deno.readTextFileSync(`${res.dir}/config.json`));
    const fixture = fixtureConfig(V4_FP8);
    assert.deepEqual(Object.keys(cfg).sort(), Object.keys(fixture).sort());
    assert.deepEqual(cfg.compress_ratios, (fixture.compress_ratios as number[]).slice(0, 6));
    assert.deepEqual(cfg.quantization_config, fixture.quantization_config);
  },
});

Deno.test("synth deepseek_v4 at an awkward tiny width: packs, and the engine equals the float64 reference", () =>
  // Window 4 and index top-2 so that compressed entries and the indexer's choice matter within
  // the 12 tokens; 128-wide FP8 blocks narrower than a tensor in wq_b and the indexer's wq_b.
  synthVsReference("deepseek_v4", "synth-v4-run", 5, {
    hidden: 192,
    layers: 5,
    experts: 24,
    topK: 3,
    expertInter: 96,
    vocab: 320,
    heads: 6,
    headDim: 48,
    ropeDim: 6,
    qLoraRank: 40,
    oGroups: 3,
    oLoraRank: 20,
    window: 4,
    indexHeads: 5,
    indexHeadDim: 12,
    indexTopK: 2,
    hashLayers: 2,
    hcMult: 3,
    maxPositions: 256,
  }));

Deno.test("synth deepseek_v4 at the release's width: DeepSeek-V4-Flash's config and expert bytes", () => {
  const s = synthShape("deepseek_v4", 150e9, {
    hidden: 4096,
    layers: 43,
    experts: 256,
    vocab: 129280,
  });
  const cfg = normalizeConfig(s.config);
  assert.equal(cfg.hiddenSize, 4096);
  assert.deepEqual([cfg.numHeads, cfg.headDim, cfg.rope.dim], [64, 512, 64]);
  const csa = cfg.csa!;
  assert.deepEqual([csa.qLoraRank, csa.oGroups, csa.oLoraRank, csa.window], [1024, 8, 1024, 128]);
  assert.deepEqual(csa.indexer, { heads: 64, headDim: 128, topK: 512 });
  assert.deepEqual(csa.layers.slice(0, 6).map((l) => l.ratio), [0, 0, 4, 128, 4, 128]);
  assert.equal(csa.layers.filter((l) => l.ratio === 4).length, 21);
  assert.equal(csa.layers.filter((l) => l.ratio === 128).length, 20);
  assert.deepEqual([cfg.moe!.numExperts, cfg.moe!.topK, cfg.moe!.expertIntermediate], [
    256,
    6,
    2048,
  ]);
  assert.equal(cfg.moe!.hashLayers, 3);
  // One expert: three 2048 × 4096 FP4 matrices, two codes a byte, one scale byte per 32.
  const expert = synthTensors("deepseek_v4", s.dims, "bf16").filter((t) =>
    t.name.startsWith("layers.5.ffn.experts.7.")
  );
  const bytes = expert.reduce((n, t) => n + t.shape.reduce((a, b) => a * b, 1), 0);
  assert.equal(bytes, 3 * (2048 * 4096 / 2 + 2048 * 4096 / 32));
  // Sizes the solver chooses: within 10% of the target, a CSA and an HCA layer at least.
  for (const target of [64e6, 2 ** 31]) {
    const small = synthShape("deepseek_v4", target);
    const c = normalizeConfig(small.config);
    assert.ok(Math.abs(small.dataBytes / target - 1) <= 0.1, `${target}: ${small.dataBytes}`);
    assert.deepEqual(c.csa!.layers.slice(0, 4).map((l) => l.ratio), [0, 0, 4, 128]);
    const sum = synthTensors("deepseek_v4", small.dims, "bf16").reduce(
      (n, t) =>
        n +
        t.shape.reduce((a, b) => a * b, 1) *
          (t.dtype === "I64" ? 8 : t.dtype === "F32" ? 4 : t.dtype === "BF16" ? 2 : 1),
      0,
    );
    assert.equal(sum, small.dataBytes, `${target}: the solver's byte count`);
  }
});
