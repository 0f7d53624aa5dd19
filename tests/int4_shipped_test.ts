/**
 * Shipped INT4 experts (Kimi-K2-Thinking's compressed-tensors triples, copied as int4g32) run the
 * exact kernel: pack marks their banks `activations: "f32"`, the engine then matches the float64
 * reference on the container's own weights to f32 rounding, and placement (threads, batching)
 * never changes a bit. Containers written with the older `mxfp4Activations` field still run the
 * same bits, and the reader refuses the flag where no exact kernel exists.
 */
import assert from "node:assert/strict";
import { cpSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Model } from "../engine/model.ts";
import { referenceWeightsFromContainer } from "../engine/float_weights.ts";
import { ReferenceModel } from "../engine/reference/forward.ts";
import { openContainer } from "../engine/container.ts";
import { packCheckpoint } from "../tools/pack.ts";
import { assertNearReference, fixtureDir, hasFixture, packedFixture, tempDir } from "./fixtures.ts";
import { writeInt4Checkpoint } from "./int4_checkpoint.ts";
import { EXACT_INPUT_FORMATS } from "../io/format.ts";
import { WEIGHT_FORMATS } from "../engine/quant/mod.ts";

const PROMPT = [1, 403, 407, 261, 378];
const QUIET = { progress: "off", log: () => {} } as const;
let shipped: Promise<string> | undefined;

/** stories260k-moe as a Kimi-style INT4 checkpoint, packed with the defaults, once. */
function shippedInt4(): Promise<string> {
  shipped ??= (async () => {
    const src = join(tempDir(), "int4-shipped-ckpt");
    writeInt4Checkpoint(src, fixtureDir("stories260k-moe"));
    const out = join(tempDir(), "int4-shipped.sluice");
    await packCheckpoint(src, out, QUIET);
    return out;
  })();
  return shipped;
}

/** The part of a manifest the edits below touch. */
type RawManifest = { experts: (Record<string, unknown> | null)[] };

/** A copy of container `dir` whose manifest `edit` changed. */
function withManifest(dir: string, name: string, edit: (m: RawManifest) => void): string {
  const out = join(tempDir(), name);
  cpSync(dir, out, { recursive: true });
  const m = JSON.parse(readFileSync(join(out, "manifest.json"), "utf8"));
  edit(m);
  writeFileSync(join(out, "manifest.json"), JSON.stringify(m));
  return out;
}

/** Logits of every position of `seq` (prefill) with `threads` workers. */
async function logits(dir: string, seq: number[], threads: number, batched = true) {
  const model = await Model.open(dir, { quiet: true, ctx: 32, threads });
  try {
    if (batched) return model.forward(seq, 0, true);
    const parts = seq.map((t, p) => model.forward([t], p));
    const all = new Float32Array(parts.length * parts[0].length);
    parts.forEach((p, i) => all.set(p, i * p.length));
    return all;
  } finally {
    model.close();
  }
}

Deno.test({
  name: "shipped INT4 experts are marked f32-input and match the reference to f32 rounding",
  ignore: !hasFixture("stories260k-moe"),
  async fn() {
    const dir = await shippedInt4();
    const c = openContainer(dir);
    for (const bank of c.manifest.experts) {
      if (!bank) continue;
      assert.equal(bank.format, "int4g32");
      assert.equal(bank.activations, "f32", `layer ${bank.layer}`);
    }
    const { cfg, weight } = referenceWeightsFromContainer(dir);
    // Measured 5.1e-7 (5.9e-3 through the Q8 kernel, 5.7e-7 with the weights stored as f32).
    const run = { ctx: 64, prompt: PROMPT, steps: 40, bound: 1e-6, name: "int4" };
    await assertNearReference(dir, new ReferenceModel(cfg, weight), run);
  },
});

Deno.test({
  name: "shipped INT4: logits do not depend on threads or prefill batching",
  ignore: !hasFixture("stories260k-moe"),
  async fn() {
    const dir = await shippedInt4();
    const seq = [...PROMPT, 300, 301, 302];
    const one = await logits(dir, seq, 1);
    assert.deepEqual(await logits(dir, seq, 2), one, "1 vs 2 threads");
    assert.deepEqual(await logits(dir, seq, 2, false), one, "batched vs one token at a time");
  },
});

Deno.test({
  name: "a container with the older mxfp4Activations field runs the same bits",
  ignore: !hasFixture("tiny-gpt-oss"),
  async fn() {
    const dir = await packedFixture("tiny-gpt-oss");
    const legacy = withManifest(dir, "gpt-oss-legacy.sluice", (m) => {
      for (const b of m.experts) {
        if (!b) continue;
        assert.equal(b.activations, "f32");
        delete b.activations;
        b.mxfp4Activations = "f32";
      }
    });
    const c = openContainer(legacy);
    assert.ok(c.manifest.experts.every((b) => !b || b.activations === "f32"));
    const seq = [1, 2, 3, 4, 5];
    assert.deepEqual(await logits(legacy, seq, 2), await logits(dir, seq, 2));
    // Without the flag the experts run the Q8 kernel: the flag is what decides.
    const q8 = withManifest(dir, "gpt-oss-q8.sluice", (m) => {
      for (const b of m.experts) if (b) delete b.activations;
    });
    assert.notDeepEqual(await logits(q8, seq, 2), await logits(dir, seq, 2));
  },
});

Deno.test("EXACT_INPUT_FORMATS are the registry's formats with an exact kernel", () => {
  assert.deepEqual(
    [...EXACT_INPUT_FORMATS].sort(),
    WEIGHT_FORMATS.filter((f) => f.exactGemv).map((f) => f.id).sort(),
  );
});

Deno.test({
  name: "the reader refuses the activations flag where no exact kernel exists",
  ignore: !hasFixture("stories260k-moe"),
  async fn() {
    const dir = await shippedInt4();
    const bad = withManifest(dir, "int4-legacy-field.sluice", (m) => {
      m.experts[1]!.mxfp4Activations = "f32";
    });
    assert.throws(
      () => openContainer(bad),
      /experts\[1\]\.mxfp4Activations: only "f32", on an mxfp4 bank/,
    );
    const q = withManifest(dir, "int4-bad-value.sluice", (m) => {
      m.experts[1]!.activations = "q8";
    });
    assert.throws(() => openContainer(q), /experts\[1\]\.activations: only "f32"/);
  },
});
