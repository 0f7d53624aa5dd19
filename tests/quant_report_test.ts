/**
 * The quality report: KL divergence against a hand-computed value, weight errors against
 * independent round trips through the quantisers, and the model-quality table's invariants on
 * stories260k-moe (reference row exact, every KL ≥ 0, top-1 in [0, 1], int8 closer than 4-bit).
 */
import assert from "node:assert/strict";
import { dequantizeInt8Row, quantizeInt8Row, relativeError } from "../engine/quant/int8.ts";
import { dequantizeMxfp4, quantizeMxfp4 } from "../engine/quant/mxfp4.ts";
import { hfExpertName, hfLayerName } from "../engine/tensor_names.ts";
import { loadModelConfig } from "../engine/config.ts";
import { readF32 } from "../io/checkpoint_weights.ts";
import { openCheckpoint } from "../io/safetensors.ts";
import { formatReport, klDivergence, quantReport } from "../tools/dev/quant_report.ts";
import { fixtureDir, packedFixture } from "./fixtures.ts";

const MOE = fixtureDir("stories260k-moe");

Deno.test("klDivergence matches KL of two known distributions", () => {
  // p = (1/3, 2/3), q = (1/2, 1/2): KL = 1/3 ln(2/3) + 2/3 ln(4/3).
  const want = (1 / 3) * Math.log(2 / 3) + (2 / 3) * Math.log(4 / 3);
  assert.ok(Math.abs(klDivergence([0, Math.log(2)], [5, 5]) - want) < 1e-12);
  assert.equal(klDivergence([1, 2, 3], [1, 2, 3]), 0);
});

Deno.test("weight errors equal independent quantise/dequantise round trips", async () => {
  const r = await quantReport(MOE, {
    weightsOnly: true,
    expertsSampled: 1,
    vq3r: { sampleSize: 2048, iterations: 2 },
    log: () => {},
  });
  const cfg = loadModelConfig(MOE);
  const ckpt = openCheckpoint(MOE);
  try {
    const wq = readF32(ckpt, hfLayerName(cfg, 1, "wq")!);
    const row = r.weights.find((w) => w.matrix === "L1 wq")!;
    const int8 = relativeError(wq, dequantizeInt8Row(quantizeInt8Row(wq, 64, 64)));
    assert.ok(Math.abs(row.errors.int8! - int8) < 1e-9, `${row.errors.int8} vs ${int8}`);
    assert.equal(row.errors.vq3r, null);
    const gate = readF32(ckpt, hfExpertName(cfg, 3, 0, "gate"));
    const g = r.weights.find((w) => w.matrix === "L3 experts.gate")!;
    const mx = relativeError(gate, dequantizeMxfp4(quantizeMxfp4(gate, 172, 64)));
    assert.ok(Math.abs(g.errors.mxfp4! - mx) < 1e-9, `${g.errors.mxfp4} vs ${mx}`);
    assert.ok(g.errors.vq3r! > 0 && g.errors.vq3r! < 0.5);
    // 172 columns: no 32-blocks.
    assert.equal(r.weights.find((w) => w.matrix === "L3 experts.down")!.errors.mxfp4, null);
    assert.match(formatReport(r), /L3 experts\.down +64×172 +— +— /);
  } finally {
    ckpt.close();
  }
});

Deno.test("a container input gets the weight errors of its stored weights", async () => {
  const r = await quantReport(await packedFixture("stories260k-moe"), {
    expertsSampled: 1,
    vq3r: { sampleSize: 2048, iterations: 2 },
    log: () => {},
  });
  assert.equal(r.quality.length, 0);
  assert.equal(r.weights.length, 5 * (4 + 3));
});

Deno.test("model quality: the reference is exact, int8 beats the 4-bit formats", async () => {
  const r = await quantReport(MOE, {
    prompts: ["Once upon a time"],
    steps: 12,
    expertsSampled: 1,
    vq3r: { sampleSize: 2048, iterations: 2 },
    log: () => {},
  });
  const by = new Map(r.quality.map((q) => [q.variant, q]));
  assert.deepEqual(
    [...by.keys()],
    [
      "reference",
      "experts mxfp4",
      "experts int4",
      "experts int8",
      "experts fp8",
      "experts vq3r",
      "trunk int8",
    ],
  );
  assert.equal(by.get("reference")!.kl, 0);
  for (const q of r.quality) {
    assert.ok(q.kl >= 0 && q.klMax >= q.kl && q.top1 >= 0 && q.top1 <= 1, q.variant);
    assert.equal(q.positions, r.sequences[0].length);
  }
  assert.ok(by.get("experts int8")!.kl < by.get("experts mxfp4")!.kl);
  assert.ok(by.get("experts int8")!.kl < by.get("experts int4")!.kl);
});
