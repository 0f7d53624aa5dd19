/**
 * Gemma 4 with the MoE block (gemma4) on ../shared/models/tiny-gemma4-moe: the normalised config
 * (two layer geometries, k = v, proportional RoPE, the layer's features), every text tensor named
 * and shaped from it and the vision tower skipped at pack with a notice, the float64 reference
 * (engine/reference/forward.ts with its features) against the README's known greedy continuation,
 * from the checkpoint and from the packed container, and the softcap shown in the logits; the
 * engine against the known answer (with the BOS stop) and within 1e-4 of the reference past the
 * sliding window (a tolerance the erf GELU would break), bit-identical logits across placements
 * with the sliding layers' KV rings wrapping, and the plan charging those layers their window only.
 */
import assert from "node:assert/strict";
import { loadModelConfig, normalizeConfig } from "../engine/config.ts";
import { findExpertMatrix } from "../engine/checkpoint_matrix.ts";
import {
  referenceWeightsFromCheckpoint,
  referenceWeightsFromContainer,
} from "../engine/float_weights.ts";
import { ReferenceModel } from "../engine/reference/forward.ts";
import { ropeInvFreq } from "../engine/reference/rope.ts";
import { hfGlobalName, hfLayerName, layerTensorsOf } from "../engine/tensor_names.ts";
import { layerTensorSpec } from "../engine/tensor_shapes.ts";
import { openCheckpoint } from "../io/safetensors.ts";
import { inspectContainer } from "../tools/inspect.ts";
import { packCheckpoint } from "../tools/pack.ts";
import { planInput, planMemory } from "../engine/planner.ts";
import { openContainer } from "../engine/container.ts";
import {
  assertKnownContinuation,
  assertNearReference,
  assertPlacementsAgree,
  fixtureDir,
  hasFixture,
  maxRelDiff,
  ONCE_UPON_A_TIME,
  packedFixture,
  referenceGreedy,
  referenceOf,
  runSluice,
  synthVsReference,
  tempDir,
} from "./fixtures.ts";

const NAME = "tiny-gemma4-moe";
const ignore = !hasFixture(NAME);
/** "Once upon a time" and the README's first 20 greedy ids after it (the stop ignored). */
const PROMPT = [...ONCE_UPON_A_TIME];
const KNOWN = [
  ...[346, 448, 452, 452, 404, 348, 1, 333, 452, 452],
  ...[386, 386, 310, 310, 403, 310, 452, 386, 386, 338],
];

Deno.test({
  name: "gemma4: the config normalises as the README describes it",
  ignore,
  fn: () => {
    const cfg = loadModelConfig(fixtureDir(NAME));
    assert.equal(cfg.family, "gemma4");
    assert.deepEqual([cfg.numHeads, cfg.numKvHeads, cfg.headDim], [4, 2, 16]);
    assert.deepEqual(cfg.attention?.windows, [32, 32, 0, 32, 32, 0]);
    assert.equal(cfg.attention?.valueNorm, true);
    assert.deepEqual(cfg.attention?.fullLayers, {
      headDim: 32,
      numKvHeads: 1,
      rope: { theta: 1e6, layout: "half", dim: 32, scaling: { type: "proportional", angles: 4 } },
      kEqV: true,
    });
    assert.deepEqual(cfg.rope, { theta: 1e4, layout: "half", dim: 16, scaling: { type: "none" } });
    assert.equal(cfg.attnScale, 1);
    assert.deepEqual(cfg.residual, { kind: "sandwich", embedScale: 8 });
    assert.deepEqual(cfg.glu, { kind: "gelu_tanh" });
    assert.equal(cfg.logitSoftcap, 30);
    const moe = cfg.moe!;
    assert.deepEqual([moe.numExperts, moe.topK, moe.expertIntermediate], [16, 4, 32]);
    assert.deepEqual([moe.scoring, moe.normTopK, moe.scaledRouterInput, moe.expertScale], [
      "softmax",
      true,
      true,
      true,
    ]);
    assert.equal(moe.denseBeside, true);
    assert.equal(cfg.intermediateSize, 96);
    assert.deepEqual([cfg.bosId, cfg.eosIds], [1, [2]]);
    // README: inv_freq_i = 1e6^(−2i/32) for i < 4, then 0; dims 0..3 pair with 16..19.
    const inv = ropeInvFreq(cfg.attention!.fullLayers!.rope);
    assert.equal(inv.length, 16);
    for (let i = 0; i < 16; i++) assert.equal(inv[i], i < 4 ? 1 / 1e6 ** (2 * i / 32) : 0);
  },
});

Deno.test({
  name: "gemma4: configs of other Gemma 4 sizes and settings are refused by field",
  ignore,
  fn: async () => {
    const base = JSON.parse(await Deno.readTextFile(fixtureDir(`${NAME}/config.json`)));
    const refuse = (change: Record<string, unknown>, field: string) =>
      assert.throws(
        () => normalizeConfig({ ...base, text_config: { ...base.text_config, ...change } }),
        new RegExp(field),
      );
    refuse({ enable_moe_block: false }, "enable_moe_block");
    refuse({ hidden_size_per_layer_input: 256 }, "hidden_size_per_layer_input");
    refuse({ num_kv_shared_layers: 2 }, "num_kv_shared_layers");
    refuse({ hidden_activation: "gelu" }, "hidden_activation");
    refuse({ attn_logit_softcapping: 50 }, "attn_logit_softcapping");
    refuse({ layer_types: ["sliding_attention"] }, "layer_types");
    refuse({
      rope_parameters: {
        ...base.text_config.rope_parameters,
        full_attention: { rope_type: "yarn", rope_theta: 1e6, factor: 8 },
      },
    }, "rope_type");
  },
});

Deno.test({
  name: "gemma4: every text tensor is named and shaped from the config, the experts cut per expert",
  ignore,
  fn: () => {
    const cfg = loadModelConfig(fixtureDir(NAME));
    const ck = openCheckpoint(fixtureDir(NAME));
    try {
      const used = new Set<string>();
      for (const g of ["embed", "final_norm"] as const) used.add(hfGlobalName(cfg, g)!);
      assert.equal(hfGlobalName(cfg, "lm_head"), null, "tied");
      for (let l = 0; l < cfg.numLayers; l++) {
        const tensors = layerTensorsOf(cfg, l);
        assert.equal(tensors.includes("wv"), cfg.attention!.windows[l] > 0, `layer ${l} v_proj`);
        for (const t of tensors) {
          const name = hfLayerName(cfg, l, t)!;
          const info = ck.tensors.get(name);
          assert.ok(info, `layer ${l} ${t}: ${name} is not in the checkpoint`);
          assert.deepEqual(info.shape, layerTensorSpec(cfg, t, l).shape, name);
          used.add(name);
        }
        for (const m of ["gate", "up", "down"] as const) {
          const src = findExpertMatrix(ck, cfg, l, 5, m);
          assert.deepEqual([src.rows, src.cols], m === "down" ? [64, 32] : [32, 64]);
          assert.equal(src.stacked?.first, m === "up" ? 32 : 0, "gate rows, then up rows");
          used.add(src.stacked!.tensor.name);
        }
      }
      const rest = [...ck.tensors.keys()].filter((n) => !used.has(n));
      assert.equal(rest.length, 18);
      assert.ok(rest.every((n) => /^model\.(vision_tower|embed_vision)\./.test(n)), `${rest}`);
    } finally {
      ck.close();
    }
  },
});

Deno.test({
  name: "gemma4: the reference gives the README's known answer, from checkpoint and container",
  ignore,
  fn: async () => {
    assert.deepEqual(referenceGreedy(referenceOf(NAME), PROMPT, 20).ids, KNOWN);
    const lines: string[] = [];
    const out = `${tempDir()}/gemma4.sluice`;
    const res = await packCheckpoint(fixtureDir(NAME), out, {
      progress: "off",
      log: (l) => lines.push(l),
    });
    assert.ok(
      lines.some((l) => l.includes("skipping 17 tensors under model.vision_tower.*")) &&
        lines.some((l) => l.includes("skipping 1 tensors under model.embed_vision.*")),
      `pack output: ${lines.join(" | ")}`,
    );
    assert.equal(res.manifest.experts.length, 6);
    // README: 828,838 parameters in the text model.
    assert.equal(inspectContainer(out).params.total, 828838);
    const { cfg, weight } = referenceWeightsFromContainer(out);
    assert.deepEqual(referenceGreedy(new ReferenceModel(cfg, weight), PROMPT, 20).ids, KNOWN);
  },
});

Deno.test({
  name: "gemma4: the final softcap shows in the logits, not in the ids",
  ignore,
  fn: () => {
    const capped = referenceGreedy(referenceOf(NAME), PROMPT, 6);
    const raw = referenceGreedy(
      referenceOf(NAME, (c) => ({ ...c, logitSoftcap: undefined })),
      PROMPT,
      6,
    );
    assert.deepEqual(raw.ids, capped.ids, "a monotonic cap keeps the argmax");
    // README: the largest first-position logit is about 16.6, where the cap lowers it by ~10%.
    const top = Math.max(...raw.first), cappedTop = Math.max(...capped.first);
    assert.ok(Math.abs(cappedTop - 16.6) < 0.05, `largest capped logit ${cappedTop}`);
    assert.equal(cappedTop, 30 * Math.tanh(top / 30));
    assert.ok(top / cappedTop > 1.1, `the cap lowered ${top} to ${cappedTop}`);
    assert.ok(maxRelDiff(capped.first, raw.first) > 0.05);
  },
});

Deno.test({
  name: "gemma4: the engine generates the known answer and stops at the sampled BOS",
  ignore,
  fn: async () => {
    // README: BOS is sampled at generated position 6, so the continuation is the first 6 ids.
    const path = await packedFixture(NAME);
    await assertKnownContinuation(path, "Once upon a time", PROMPT, KNOWN.slice(0, 6), 20);
  },
});

/** erf by its Maclaurin series (|x| < 3) or continued fraction, to ~1e-15: exact GELU's. */
function erf(x: number): number {
  const t = Math.abs(x);
  if (t < 3) {
    let sum = 0, term = t;
    for (let n = 0; n < 100; n++) {
      sum += term / (2 * n + 1);
      term *= -t * t / (n + 1);
    }
    return Math.sign(x) * 2 / Math.sqrt(Math.PI) * sum;
  }
  let f = 0;
  for (let k = 60; k >= 1; k--) f = k / 2 / (t + f);
  return Math.sign(x) * (1 - Math.exp(-t * t) / Math.sqrt(Math.PI) / (t + f));
}

Deno.test({
  name: "gemma4: engine within 1e-4 of the reference for 100 positions; erf GELU would not be",
  ignore,
  fn: async () => {
    // Past the 32-position window: the sliding layers' rings wrap.
    const run = { ctx: 128, prompt: PROMPT, steps: 100, bound: 1e-4, name: NAME };
    await assertNearReference(await packedFixture(NAME), referenceOf(NAME), run);
    // The same teacher-forced prompt through references that differ only in the GELU or the cap.
    const { cfg, weight } = referenceWeightsFromCheckpoint(fixtureDir(NAME));
    const erfGelu = new ReferenceModel(
      cfg,
      weight,
      (g, u) => 0.5 * g * (1 + erf(g / Math.SQRT2)) * u,
    );
    const uncapped = referenceOf(NAME, (c) => ({ ...c, logitSoftcap: undefined }));
    const exact = referenceOf(NAME);
    let gelu = 0, cap = 0;
    PROMPT.forEach((t, pos) => {
      const want = exact.forward64(t, pos);
      gelu = Math.max(gelu, maxRelDiff(erfGelu.forward64(t, pos), want));
      cap = Math.max(cap, maxRelDiff(uncapped.forward64(t, pos), want));
    });
    assert.ok(gelu > 3e-4, `the erf GELU moved the logits by only ${gelu}`);
    assert.ok(cap > 1e-2, `dropping the softcap moved the logits by only ${cap}`);
  },
});

Deno.test({
  name: "gemma4: bit-identical logits across placements, past the sliding rings' wrap",
  ignore,
  fn: async () => {
    const path = await packedFixture(NAME);
    // The reference's own greedy path, ignoring the BOS stop, 75 positions.
    const tokens = [...PROMPT, ...referenceGreedy(referenceOf(NAME), PROMPT, 70).ids];
    await assertPlacementsAgree(path, tokens, 40, 96);
  },
});

Deno.test({
  name: "gemma4: the plan charges sliding layers their window, full layers the context",
  ignore,
  fn: async () => {
    const path = await packedFixture(NAME);
    const input = planInput(openContainer(path));
    const at = (ctx: number) => planMemory(input, { ctx, maxBatch: 64 }).layerStateBytes;
    const [small, large] = [at(1024), at(4096)];
    // Per position: K and V of 2 heads of 16 (sliding) or of 1 head of 32 (full), f32.
    for (const l of [0, 1, 3, 4]) {
      assert.equal(small[l], (32 + 63) * 2 * 2 * 16 * 4, `sliding layer ${l}`);
      assert.equal(large[l], small[l]);
    }
    for (const l of [2, 5]) {
      assert.equal(small[l], 1024 * 2 * 32 * 4, `full layer ${l}`);
      assert.equal(large[l], 4 * small[l]);
    }
    // `plan` lists every layer's state: the sliding layers' rings the same at any context. A ring
    // also holds a pass's rows, so the chunk is fixed (by default it grows at -c 8192).
    const lines = async (ctx: number) => {
      const run = await runSluice([
        "plan",
        "-m",
        path,
        "-c",
        String(ctx),
        "--prefill-chunk",
        "128",
      ]);
      assert.equal(run.code, 0, run.stderr);
      return run.stdout.split("\n").filter((l) => l.startsWith("layer "));
    };
    const [at4k, at8k] = [await lines(4096), await lines(8192)];
    assert.equal(at4k.length, 6, at4k.join("\n"));
    for (const l of [0, 1, 3, 4]) {
      assert.match(at4k[l], /GQA +state [\d.]+ KiB \(window 32, any context\)$/);
      assert.equal(at8k[l], at4k[l]);
    }
    for (const l of [2, 5]) {
      assert.match(at4k[l], /GQA +state 1\.00 MiB at ctx 4096$/);
      assert.match(at8k[l], /GQA +state 2\.00 MiB at ctx 8192$/);
    }
  },
});

Deno.test({
  name: "gemma4: a manifest whose full layers' geometry is off its bounds is refused at open",
  ignore,
  fn: async () => {
    const src = await packedFixture(NAME);
    const manifest = JSON.parse(Deno.readTextFileSync(`${src}/manifest.json`));
    const broken = (change: (full: Record<string, unknown>) => void, why: RegExp) => {
      const dir = Deno.makeTempDirSync({ dir: tempDir(), prefix: "gemma4-bad-" });
      for (const e of Deno.readDirSync(src)) {
        Deno.copyFileSync(`${src}/${e.name}`, `${dir}/${e.name}`);
      }
      const m = structuredClone(manifest);
      change(m.config.attention.fullLayers);
      Deno.writeTextFileSync(`${dir}/manifest.json`, JSON.stringify(m));
      assert.throws(() => openContainer(dir), why);
    };
    broken((f) => (f.rope as { scaling: { angles: number } }).scaling.angles = 99, /rotates 99/);
    broken((f) => (f.rope as { layout: string }).layout = "spiral", /fullLayers\.rope\.layout/);
    broken((f) => f.numKvHeads = 3, /KV heads divide/);
  },
});

Deno.test("a synthetic gemma4 at awkward sizes matches the float64 reference", async () => {
  // The real-width bench's recipe (tools/synth/recipes.ts) at small sizes: full attention at
  // layers 2 and 5 with their own head dim (20) and one kv head, sliding layers 3 heads on 3 kv
  // heads × 12, 7 experts top-3 of width 26 beside a dense MLP of 30.
  await synthVsReference("gemma4", "gemma4-awkward", 5, {
    hidden: 44,
    layers: 6,
    fullEvery: 3,
    experts: 7,
    topK: 3,
    expertInter: 26,
    denseInter: 30,
    heads: 3,
    kvHeads: 3,
    headDim: 12,
    globalHeadDim: 20,
    globalKvHeads: 1,
    vocab: 300,
    maxPositions: 256,
  });
});
