/**
 * GLM-4.5 (glm4_moe) on ../shared/models/tiny-glm4-moe: the README's known greedy continuation,
 * the engine against the float64 reference (partial rotary, q/k/v biases, q/k norm, noaux_tc with
 * the correction bias, shared expert, one dense layer), and the MTP layer packed apart.
 */
import assert from "node:assert/strict";
import { referenceWeightsFromCheckpoint } from "../engine/float_weights.ts";
import { ReferenceModel } from "../engine/reference/forward.ts";
import { packCheckpoint } from "../tools/pack.ts";
import {
  assertKnownContinuation,
  assertNearReference,
  fixtureDir,
  hasFixture,
  ONCE_UPON_A_TIME,
  packedFixture,
  tempDir,
} from "./fixtures.ts";

const NAME = "tiny-glm4-moe";
const ignore = !hasFixture(NAME);
/** "Once upon a time" and the README's first 20 greedy ids after it. */
const PROMPT = [...ONCE_UPON_A_TIME];
const KNOWN = [
  ...[431, 372, 403, 403, 403, 403, 403, 403, 403, 403],
  ...[403, 403, 407, 407, 407, 407, 407, 407, 407, 407],
];

Deno.test({
  name: "glm4_moe: the known greedy continuation of the fixture's README",
  ignore,
  fn: async () => {
    await assertKnownContinuation(await packedFixture(NAME), "Once upon a time", PROMPT, KNOWN);
  },
});

Deno.test({
  name: "glm4_moe: engine logits within 1e-4 of the float64 reference over 160 positions",
  ignore,
  fn: async () => {
    const { cfg, weight } = referenceWeightsFromCheckpoint(fixtureDir(NAME));
    assert.equal(cfg.rope.dim, 8, "partial_rotary_factor 0.5 of head_dim 16");
    assert.deepEqual(cfg.layerKinds, ["dense", "moe", "moe", "moe"]);
    assert.equal(cfg.moe?.routedScaling, 2.5);
    assert.equal(cfg.moe?.selectionBias, true);
    assert.equal(cfg.moe?.sharedIntermediate, 32);
    const run = { ctx: 192, prompt: PROMPT, steps: 160, bound: 1e-4, name: NAME };
    await assertNearReference(await packedFixture(NAME), new ReferenceModel(cfg, weight), run);
  },
});

Deno.test({
  name: "glm4_moe: the MTP layer is packed apart from the main layers",
  ignore,
  fn: async () => {
    const lines: string[] = [];
    const out = `${tempDir()}/glm-mtp.sluice`;
    const res = await packCheckpoint(fixtureDir(NAME), out, {
      progress: "off",
      log: (l) => lines.push(l),
    });
    assert.ok(!lines.some((l) => l.includes("skipping layer 4")), `pack: ${lines.join(" | ")}`);
    assert.equal(res.manifest.trunk.layers.length, 4);
    assert.equal(res.manifest.experts.length, 4);
    // 20 trunk tensors and 16 experts × 3 matrices: the checkpoint's 68.
    assert.equal(Object.keys(res.manifest.mtp!.layers[0].tensors).length, 20);
    assert.equal(res.manifest.mtp!.experts[0]!.count, 16);
    assert.equal(res.manifest.experts[0], null, "layer 0 is dense (first_k_dense_replace 1)");
  },
});
