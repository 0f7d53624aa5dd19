/**
 * MiniMax-M2 (minimax_m2) on ../shared/models/tiny-minimax-m2 and tiny-minimax-m2-fp8: the
 * normalised config (whole-projection q/k norm, partial RoPE, a query wider than the hidden size,
 * sigmoid routing with a selection-only bias beside the router), the README's known greedy
 * continuation, the engine against the float64 reference on both (the FP8 one is another
 * function: its weights are decoded by the README's rule, checked here byte for byte), and
 * bit-identical logits across placements.
 */
import assert from "node:assert/strict";
import { loadModelConfig } from "../engine/config.ts";
import { openContainer } from "../engine/container.ts";
import { containerExpertF32, containerTrunkF32 } from "../engine/float_weights.ts";
import { hfLayerName } from "../engine/tensor_names.ts";
import { openCheckpoint } from "../io/safetensors.ts";
import { inspectContainer } from "../tools/inspect.ts";
import {
  assertKnownContinuation,
  assertNearReference,
  assertPlacementsAgree,
  fixtureDir,
  hasFixture,
  ONCE_UPON_A_TIME,
  packedFixture,
  referenceGreedy,
  referenceOf,
  synthVsReference,
} from "./fixtures.ts";

const NAME = "tiny-minimax-m2";
const FP8 = "tiny-minimax-m2-fp8";
const ignore = !hasFixture(NAME) || !hasFixture(FP8);
/** "Once upon a time" and the README's first 20 greedy ids after it (tiny-minimax-m2). */
const PROMPT = [...ONCE_UPON_A_TIME];
const KNOWN = [
  ...[264, 264, 341, 412, 448, 444, 264, 264, 264, 264],
  ...[264, 441, 448, 356, 295, 428, 434, 448, 356, 356],
];

Deno.test({
  name: "minimax_m2: the config normalises as the README describes it",
  ignore,
  fn: () => {
    for (const name of [NAME, FP8]) {
      const cfg = loadModelConfig(fixtureDir(name));
      assert.equal(cfg.family, "llama");
      assert.equal(cfg.qkNorm, true);
      assert.equal(cfg.qkNormWhole, true, "qk_norm_type per_layer: over the whole projection");
      assert.equal(cfg.rope.dim, 8, "rotary_dim 8 of head_dim 16");
      assert.equal(cfg.rope.theta, 5e6);
      assert.equal(cfg.numHeads * cfg.headDim, 96, "the query is wider than hidden 64");
      assert.equal(cfg.attnScale, 1 / 4);
      assert.deepEqual(cfg.layerKinds, ["moe", "moe", "moe", "moe"]);
      assert.deepEqual(cfg.moe, {
        numExperts: 16,
        topK: 4,
        expertIntermediate: 32,
        scoring: "sigmoid",
        normTopK: true,
        routedScaling: 1,
        nGroup: 1,
        topkGroup: 1,
        selectionBias: true,
        sharedIntermediate: 0,
      });
      assert.equal(
        hfLayerName(cfg, 2, "router_bias"),
        "model.layers.2.block_sparse_moe.e_score_correction_bias",
      );
      assert.equal(cfg.eosIds[0], 2);
    }
  },
});

Deno.test({
  name: "minimax_m2: configs it cannot run are refused by field",
  ignore,
  fn: async () => {
    const base = JSON.parse(await Deno.readTextFile(fixtureDir(`${NAME}/config.json`)));
    const { normalizeConfig } = await import("../engine/config.ts");
    const refuse = (change: Record<string, unknown>, field: string) =>
      assert.throws(() => normalizeConfig({ ...base, ...change }), new RegExp(field));
    refuse({ qk_norm_type: "per_head" }, "qk_norm_type");
    refuse({ attn_type_list: [1, 0, 1, 1] }, "attn_type_list");
    refuse({ rotary_dim: 7 }, "rotary_dim");
    refuse({ rotary_dim: 32 }, "rotary_dim");
    refuse({ shared_intermediate_size: 64 }, "shared_intermediate_size");
    refuse({ scoring_func: "softmax" }, "scoring_func");
  },
});

Deno.test({
  name: "minimax_m2: the known greedy continuation of the fixture's README",
  ignore,
  fn: async () => {
    assert.deepEqual(
      referenceGreedy(referenceOf(NAME), PROMPT, 20).ids,
      KNOWN,
      "the float64 reference",
    );
    await assertKnownContinuation(await packedFixture(NAME), "Once upon a time", PROMPT, KNOWN);
  },
});

for (const name of [NAME, FP8]) {
  Deno.test({
    name: `minimax_m2: ${name}: engine logits within 1e-4 of the float64 reference, 160 positions`,
    ignore,
    fn: async () => {
      const run = { ctx: 192, prompt: PROMPT, steps: 160, bound: 1e-4, name };
      await assertNearReference(await packedFixture(name), referenceOf(name), run);
    },
  });
}

/** OCP E4M3 ("e4m3fn"): bias 7, 3 mantissa bits, no infinities, S.1111.111 NaN. */
function e4m3(code: number): number {
  const sign = code & 0x80 ? -1 : 1;
  const exp = (code >> 3) & 15, man = code & 7;
  if (exp === 15 && man === 7) return NaN;
  return sign * (exp === 0 ? (man / 8) * 2 ** -6 : (1 + man / 8) * 2 ** (exp - 7));
}

Deno.test({
  name: "minimax_m2: the FP8 container's weights are the README's fp8 × scale_inv, norms widened",
  ignore,
  fn: async () => {
    const c = openContainer(await packedFixture(FP8));
    const ck = openCheckpoint(fixtureDir(FP8));
    const cfg = c.config;
    try {
      // README: 529,536 parameters, the same in both storages.
      assert.equal(inspectContainer(await packedFixture(FP8)).params.total, 529536);
      assert.equal(inspectContainer(await packedFixture(NAME)).params.total, 529536);
      const rule = (name: string) => {
        const codes = ck.read(name);
        const s = new Float32Array(ck.read(`${name}_scale_inv`).slice().buffer);
        assert.equal(s.length, 1, `${name}: one 128×128 block`);
        return Float32Array.from(codes, (b) => e4m3(b) * s[0]);
      };
      const wq = hfLayerName(cfg, 1, "wq")!;
      assert.equal(ck.tensors.get(wq)?.dtype, "F8_E4M3");
      assert.deepEqual(containerTrunkF32(c, 1, "wq"), rule(wq));
      const w2 = "model.layers.3.block_sparse_moe.experts.11.w2.weight";
      assert.deepEqual(containerExpertF32(c, 3, 11, "down"), rule(w2));
      const norm = hfLayerName(cfg, 0, "q_norm")!;
      assert.equal(ck.tensors.get(norm)?.dtype, "BF16");
      const bits = new Uint16Array(ck.read(norm).slice().buffer);
      const widened = new Float32Array(new Uint32Array(Array.from(bits, (b) => b << 16)).buffer);
      assert.deepEqual(containerTrunkF32(c, 0, "q_norm"), widened);
    } finally {
      ck.close();
    }
  },
});

for (const name of [NAME, FP8]) {
  Deno.test({
    name: `minimax_m2: ${name}: bit-identical logits across placements`,
    ignore,
    fn: async () => {
      const path = await packedFixture(name);
      const tokens = [...PROMPT, ...referenceGreedy(referenceOf(name), PROMPT, 75).ids];
      await assertPlacementsAgree(path, tokens, 40, 96);
    },
  });
}

for (const dtype of ["f32", "fp8"] as const) {
  Deno.test(`a synthetic ${dtype} minimax_m2 at awkward sizes matches the float64 reference`, async () => {
    // The real-width bench's recipe (tools/synth/recipes.ts) at small sizes: 6 heads on 2 kv heads
    // × 16 with a rotary slice of 6, 7 experts top-3 of width 136 (under fp8 a partial second
    // 128-row scale block).
    await synthVsReference("minimax_m2", `minimax-m2-awkward-${dtype}`, 9, {
      hidden: 40,
      layers: 3,
      experts: 7,
      topK: 3,
      expertInter: 136,
      heads: 6,
      kvHeads: 2,
      headDim: 16,
      ropeDim: 6,
      vocab: 300,
      maxPositions: 256,
    }, dtype);
  });
}
