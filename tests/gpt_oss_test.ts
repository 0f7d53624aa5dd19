/**
 * gpt-oss on ../shared/models/tiny-gpt-oss (MXFP4 experts fused as OpenAI ships them): the
 * README's known greedy continuation; the engine against the float64 reference past position
 * 128, where the sliding window starts to matter; the window and the sinks each shown to change
 * the answer; the MXFP4 bytes copied into the records unchanged and decoded by the README's
 * nibble/scale rule; bit-identical logits across placements with the ring-buffer KV cache
 * wrapping; YaRN with truncate false.
 */
import assert from "node:assert/strict";
import { loadModelConfig } from "../engine/config.ts";
import { Model } from "../engine/model.ts";
import type { ModelConfig } from "../io/model_config.ts";
import { containerExpertBias, containerExpertF32 } from "../engine/float_weights.ts";
import { ropeInvFreq } from "../engine/reference/rope.ts";
import { openContainer } from "../engine/container.ts";
import { readExpertRecord } from "../io/container.ts";
import { type Checkpoint, openCheckpoint } from "../io/safetensors.ts";
import { findFusedMxfp4 } from "../engine/checkpoint_matrix.ts";
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
} from "./fixtures.ts";

const NAME = "tiny-gpt-oss";
const ignore = !hasFixture(NAME);
/** "Once upon a time" and the README's first 20 greedy ids after it. */
const PROMPT = [...ONCE_UPON_A_TIME];
const KNOWN = [
  ...[472, 477, 477, 477, 477, 477, 477, 477, 477, 472],
  ...[472, 332, 332, 285, 451, 428, 340, 451, 435, 331],
];
/** Positions run by the long tests: past the 128-position window. */
const LONG = 200;

Deno.test({
  name: "gpt_oss: config (YaRN truncate false, windows, routing) as the README states",
  ignore,
  fn: () => {
    const cfg = loadModelConfig(fixtureDir(NAME));
    assert.deepEqual(cfg.attention, { sinks: true, outputBias: true, windows: [128, 0, 128, 0] });
    assert.equal(cfg.moe?.scoring, "topk_softmax");
    assert.deepEqual(cfg.moe?.clampedSwiglu, { limit: 7, alpha: 1.702 });
    const inv = ropeInvFreq(cfg.rope);
    const want = [1, 0.225418, 0.050813275, 0.0067949595, 0.00045648392, 1.8188337e-5];
    want.forEach((v, i) => assert.ok(Math.abs(inv[i] / v - 1) < 1e-6, `inv_freq[${i}] ${inv[i]}`));
    const truncated = ropeInvFreq({
      ...cfg.rope,
      scaling: { ...cfg.rope.scaling, truncate: true } as ModelConfig["rope"]["scaling"],
    });
    assert.ok(Math.abs(truncated[3] / 0.0077555 - 1) < 1e-4, "truncate: true floors/ceils");
  },
});

Deno.test({
  name: "gpt_oss: the known greedy continuation of the fixture's README",
  ignore,
  fn: async () => {
    await assertKnownContinuation(await packedFixture(NAME), "Once upon a time", PROMPT, KNOWN);
  },
});

Deno.test({
  name: "gpt_oss: the sinks change the known answer (a pass without them fails it)",
  ignore,
  fn: () => {
    assert.deepEqual(referenceGreedy(referenceOf(NAME), PROMPT, 20).ids, KNOWN);
    const noSinks = referenceGreedy(
      referenceOf(NAME, (c) => ({ ...c, attention: { ...c.attention!, sinks: false } })),
      PROMPT,
      20,
    );
    assert.notDeepEqual(noSinks.ids, KNOWN, "dropping the sinks left the answer as is");
  },
});

Deno.test({
  name: `gpt_oss: engine within 1e-4 of the float64 reference for ${LONG} positions`,
  ignore,
  fn: async () => {
    const run = { ctx: 256, prompt: PROMPT, steps: LONG, bound: 1e-4, name: NAME };
    await assertNearReference(await packedFixture(NAME), referenceOf(NAME), run);
  },
});

Deno.test({
  name: "gpt_oss: the sliding window matters past position 128 and the engine keeps it",
  ignore,
  fn: async () => {
    // Teacher-forced on the windowed reference's own greedy path.
    const path = [
      ...PROMPT,
      ...referenceGreedy(referenceOf(NAME), PROMPT, LONG - PROMPT.length).ids,
    ];
    const windowed = referenceOf(NAME);
    const full = referenceOf(NAME, (c) => ({
      ...c,
      attention: { ...c.attention!, windows: [0, 0, 0, 0] },
    }));
    const model = await Model.open(await packedFixture(NAME), { quiet: true, ctx: 256 });
    try {
      let fullGap = 0, engineGap = 0;
      for (let pos = 0; pos < LONG; pos++) {
        const want = windowed.forward64(path[pos], pos);
        const other = full.forward64(path[pos], pos);
        const got = model.forward([path[pos]], pos);
        if (pos < 128) assert.equal(maxRelDiff(other, want), 0, `window acts at ${pos} < 128`);
        fullGap = Math.max(fullGap, maxRelDiff(other, want));
        engineGap = Math.max(engineGap, maxRelDiff(got, want));
      }
      assert.ok(fullGap > 1e-2, `full attention only moved the logits by ${fullGap}`);
      assert.ok(engineGap <= 1e-4, `engine off the windowed reference by ${engineGap}`);
    } finally {
      model.close();
    }
  },
});

/** The README's rule, written out: low nibble first, E2M1 table, 2^(scale − 127). */
function readmeDecode(blocks: Uint8Array, scales: Uint8Array, rows: number, cols: number) {
  const table = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0, -0.5, -1, -1.5, -2, -3, -4, -6];
  const out = new Float64Array(rows * cols);
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < cols; c++) {
      const byte = blocks[r * (cols / 2) + (c >> 1)];
      const code = c % 2 === 0 ? byte & 15 : byte >> 4;
      out[r * cols + c] = table[code] * 2 ** (scales[r * (cols / 32) + (c >> 5)] - 127);
    }
  }
  return out;
}

Deno.test({
  name: "gpt_oss: records hold the shipped MXFP4 bytes, gate/up de-interleaved, plus biases",
  ignore,
  fn: async () => {
    const c = openContainer(await packedFixture(NAME));
    const ck = openCheckpoint(fixtureDir(NAME));
    try {
      const bank = c.manifest.experts[1]!;
      assert.equal(bank.format, "mxfp4");
      const E = 16, I = 64, H = 64;
      const gu = ck.read("model.layers.1.mlp.experts.gate_up_proj_blocks");
      const gus = ck.read("model.layers.1.mlp.experts.gate_up_proj_scales");
      const dn = ck.read("model.layers.1.mlp.experts.down_proj_blocks");
      const bias = new Uint16Array(
        ck.read("model.layers.1.mlp.experts.gate_up_proj_bias").slice().buffer,
      );
      for (const e of [0, 7, E - 1]) {
        const { record } = readExpertRecord(c, 1, e);
        const g = bank.matrices.gate, u = bank.matrices.up, d = bank.matrices.down;
        const rowBytes = H / 2;
        for (let m = 0; m < I; m++) {
          const src = (row: number) =>
            gu.subarray((e * 2 * I + row) * rowBytes, (e * 2 * I + row + 1) * rowBytes);
          assert.deepEqual(
            record.subarray(g.offset + m * rowBytes, g.offset + (m + 1) * rowBytes),
            src(2 * m),
          );
          assert.deepEqual(
            record.subarray(u.offset + m * rowBytes, u.offset + (m + 1) * rowBytes),
            src(2 * m + 1),
          );
          assert.equal(record[u.scale!.offset + m * 2], gus[(e * 2 * I + 2 * m + 1) * 2]);
        }
        assert.deepEqual(
          record.subarray(d.offset, d.offset + d.bytes),
          dn.subarray(e * H * (I / 2), (e + 1) * H * (I / 2)),
        );
        // The decoded matrices are the README's values exactly.
        const gate = containerExpertF32(c, 1, e, "gate");
        const want = readmeDecode(
          record.subarray(g.offset, g.offset + g.bytes),
          record.subarray(g.scale!.offset, g.scale!.offset + g.scale!.bytes),
          I,
          H,
        );
        assert.deepEqual(Array.from(gate), Array.from(want));
        // Biases: bf16 widened exactly, gate = even entries, up = odd entries.
        const up = containerExpertBias(c, 1, e, "up");
        for (let m = 0; m < I; m++) {
          const bits = new Uint32Array([bias[e * 2 * I + 2 * m + 1] << 16]);
          assert.equal(up[m], new Float32Array(bits.buffer)[0]);
        }
      }
    } finally {
      ck.close();
    }
  },
});

Deno.test({
  name: "gpt_oss: bit-identical logits across placements, past the window's ring wrap",
  ignore,
  fn: async () => {
    const path = await packedFixture(NAME);
    const tokens = [
      ...PROMPT,
      ...referenceGreedy(referenceOf(NAME), PROMPT, 170 - PROMPT.length).ids,
    ];
    await assertPlacementsAgree(path, tokens, 40, 256);
  },
});

Deno.test({
  name: "gpt_oss: a fused expert tensor of the wrong shape or dtype is an error naming it",
  ignore,
  fn: () => {
    const cfg = loadModelConfig(fixtureDir(NAME));
    const real = openCheckpoint(fixtureDir(NAME));
    try {
      const blocks = "model.layers.2.mlp.experts.down_proj_blocks";
      const broken = (change: (t: Checkpoint["tensors"]) => void): Checkpoint => {
        const tensors = new Map(real.tensors);
        change(tensors);
        return { ...real, tensors };
      };
      const wrongShape = broken((t) =>
        t.set(blocks, { ...t.get(blocks)!, shape: [16, 64, 1, 16] })
      );
      assert.throws(
        () => findFusedMxfp4(wrongShape, cfg, 2, 3, "down"),
        (e: Error) => e.message.includes(blocks) && e.message.includes("expected U8 [16,64,2,16]"),
      );
      const bias = "model.layers.2.mlp.experts.gate_up_proj_bias";
      const wrongDtype = broken((t) => t.set(bias, { ...t.get(bias)!, dtype: "I32" }));
      assert.throws(() => findFusedMxfp4(wrongDtype, cfg, 2, 0, "up"), new RegExp(bias));
      const missing = broken((t) => t.delete("model.layers.0.mlp.experts.gate_up_proj_scales"));
      assert.throws(
        () => findFusedMxfp4(missing, cfg, 0, 0, "gate"),
        /gate_up_proj_scales, which is missing/,
      );
    } finally {
      real.close();
    }
  },
});
