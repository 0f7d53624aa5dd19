/**
 * The engine on synthetic bf16 checkpoints of every architecture the synthesiser writes (wider
 * shapes than the fixtures: q_lora MLA with several groups, GQA with q/k norm, Mixtral), against
 * the float64 reference forward reading the same checkpoint: logits within 1e-4 relative and the
 * same greedy tokens, decoding and in prefill chunks.
 */
import assert from "node:assert/strict";
import { Model } from "../engine/model.ts";
import { referenceWeightsFromCheckpoint } from "../engine/float_weights.ts";
import { ReferenceModel } from "../engine/reference/forward.ts";
import { argmax } from "../engine/sampler.ts";
import { packCheckpoint } from "../tools/pack.ts";
import { type SynthArch, synthCheckpoint } from "../tools/synth.ts";
import { maxRelDiff, tempDir } from "./fixtures.ts";

const SHAPE = {
  hidden: 128,
  layers: 3,
  experts: 16,
  topK: 4,
  expertInter: 48,
  denseInter: 160,
  vocab: 320,
  heads: 4,
  kvHeads: 2,
  headDim: 32,
  qLoraRank: 48,
  kvLoraRank: 32,
  ropeDim: 16,
  nopeDim: 16,
  vDim: 24,
  nGroup: 4,
  topkGroup: 2,
  maxPositions: 256,
};

for (const arch of ["qwen3_moe", "deepseek_v3", "mixtral"] as SynthArch[]) {
  Deno.test(`engine matches the reference on a synthetic bf16 ${arch}`, async () => {
    const out = `${tempDir()}/synth-${arch}`;
    const ckpt = await synthCheckpoint({
      arch,
      out,
      size: 4e6,
      seed: 3,
      overrides: SHAPE,
      progress: "off",
      log: () => {},
    });
    await packCheckpoint(ckpt.dir, `${out}.sluice`, { progress: "off", log: () => {} });
    const { cfg, weight } = referenceWeightsFromCheckpoint(ckpt.dir);
    const ref = new ReferenceModel(cfg, weight);
    const tokens = [1, 17, 250, 33, 101, 7];
    const want: Float64Array[] = [];
    for (let pos = 0; pos < 24; pos++) {
      want.push(ref.forward64(tokens[pos], pos));
      if (pos >= tokens.length - 1) tokens.push(argmax(want[pos]));
    }
    for (const prefillChunk of [1, 8]) {
      const model = await Model.open(`${out}.sluice`, {
        quiet: true,
        ctx: 64,
        prefillChunk,
        expertSlots: 12,
      });
      try {
        for (let p0 = 0; p0 < 8; p0 += prefillChunk) {
          const got = model.forward(tokens.slice(p0, p0 + prefillChunk), p0, true);
          for (let i = 0; i < prefillChunk; i++) {
            const row = got.subarray(i * cfg.vocabSize, (i + 1) * cfg.vocabSize);
            const d = maxRelDiff(row, want[p0 + i]);
            assert.ok(d <= 1e-4, `${arch} chunk ${prefillChunk} position ${p0 + i}: ${d}`);
          }
        }
        for (let pos = 8; pos < 24; pos++) {
          const row = model.forward([tokens[pos]], pos);
          assert.ok(
            maxRelDiff(row, want[pos]) <= 1e-4,
            `${arch} position ${pos}: ${maxRelDiff(row, want[pos])}`,
          );
          assert.equal(argmax(row), argmax(want[pos]), `${arch}: greedy token at ${pos}`);
        }
      } finally {
        model.close();
      }
    }
  });
}
