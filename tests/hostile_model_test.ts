/**
 * Floats a container hands the engine (issue 27): an attention scale or rope theta outside any
 * real model's range is refused at open, naming the field; a NaN or infinity that appears in the
 * activations is an error naming the first layer where it shows, never silent token-0 output.
 * Good inputs are untouched: the check only ever throws.
 */
import assert from "node:assert/strict";
import { cpSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { NAN_WEIGHTS_REFUSED } from "../engine/checkpoint_matrix.ts";
import { hasNonFinite } from "../engine/finite_check.ts";
import { Model } from "../engine/model.ts";
import { argmax } from "../engine/sampler.ts";
import { Session } from "../engine/session.ts";
import { MAX_CHAT_TEMPLATE_BYTES, MAX_TOKENIZER_FILE_BYTES } from "../engine/tokenizer_bounds.ts";
import { resumeHint } from "../tools/pack/finite.ts";
import { demoModelPath } from "../tools/demo_model.ts";
import { runSluice, tempDir } from "./fixtures.ts";

const OPTS = { quiet: true, ctx: 64, threads: 1 };

/** A copy of the demo container with `edit` applied to its manifest's config. */
async function withConfig(name: string, edit: (c: Record<string, unknown>) => void) {
  const out = join(tempDir(), name);
  cpSync(await demoModelPath(true), out, { recursive: true });
  const m = JSON.parse(readFileSync(join(out, "manifest.json"), "utf8"));
  edit(m.config);
  writeFileSync(join(out, "manifest.json"), JSON.stringify(m));
  return out;
}

Deno.test("hasNonFinite sees NaN and both infinities, nothing else", () => {
  const v = new Float32Array(1000).map((_, i) => (i - 500) * 1e35);
  assert.ok(!hasNonFinite(v), "large finite values are fine");
  for (const bad of [NaN, Infinity, -Infinity]) {
    const w = v.slice();
    w[777] = bad;
    assert.ok(hasNonFinite(w), String(bad));
  }
});

Deno.test({
  name: "an attention scale or rope theta outside its range is refused at open, naming it",
  sanitizeResources: false,
  fn: async () => {
    for (
      const [name, edit, why] of [
        ["scale", (c: Record<string, unknown>) => (c.attnScale = 1e30), /attention scale 1e\+30/],
        [
          "theta",
          (c: Record<string, unknown>) => ((c.rope as { theta: number }).theta = 1e300),
          /rope_theta 1e\+300 is outside/,
        ],
      ] as const
    ) {
      const path = await withConfig(`range-${name}.sluice`, edit);
      await assert.rejects(() => Model.open(path, OPTS), why);
      const r = await runSluice(["generate", "--model", path, "--prompt", "hi", "-n", "2"]);
      assert.equal(r.code, 1);
      assert.match(r.stderr, why);
    }
  },
});

Deno.test({
  name: "a NaN arising in the activations is an error naming the first layer it reaches",
  sanitizeResources: false,
  fn: async () => {
    const model = await Model.open(await demoModelPath(true), OPTS);
    try {
      const good = model.forward([1, 2, 3], 0);
      assert.ok(!hasNonFinite(good));
      const layer = model.cfg.numLayers - 1;
      // An attention norm weight so large that the layer's activations overflow to infinity.
      const norm = model.trunk.acquire(layer).get("attn_norm");
      model.trunk.release(layer);
      const f = model.arena.f32(norm.ptr, model.cfg.hiddenSize);
      const saved = f.slice();
      f.fill(3e38);
      assert.throws(
        () => model.forward([4], 3),
        new RegExp(
          `logits at position 3 hold NaN or infinity: the hidden state first turns NaN or ` +
            `infinite at layer ${layer} \\(of 0\\.\\.${layer}\\)`,
        ),
      );
      // Restored, the same step gives the same logits as before: nothing else was changed.
      f.set(saved);
      const again = model.forward([1, 2, 3], 0);
      assert.equal(argmax(again), argmax(good));
      assert.deepEqual(again, good);
    } finally {
      model.close();
    }
  },
});

Deno.test({
  name: "an oversized tokenizer.json or chat template is refused before it is parsed",
  sanitizeResources: false,
  fn: async () => {
    const path = join(tempDir(), "big-tokenizer.sluice");
    cpSync(await demoModelPath(true), path, { recursive: true });
    const tok = join(path, "tokenizer.json");
    Deno.truncateSync(tok, MAX_TOKENIZER_FILE_BYTES + 1);
    await assert.rejects(
      () => Session.open(path, OPTS),
      new RegExp(
        `tokenizer\\.json: ${MAX_TOKENIZER_FILE_BYTES + 1} bytes, more than the ` +
          `${MAX_TOKENIZER_FILE_BYTES}-byte limit`,
      ),
    );
    const chat = join(tempDir(), "big-template.sluice");
    cpSync(await demoModelPath(true), chat, { recursive: true });
    writeFileSync(join(chat, "chat_template.jinja"), "x".repeat(MAX_CHAT_TEMPLATE_BYTES + 1));
    await assert.rejects(
      () => Session.open(chat, OPTS),
      /chat_template\.jinja: 1048577 bytes, more than the 1048576-byte limit/,
    );
  },
});

Deno.test("a refused NaN weight says a rerun cannot help; other failures say rerun to resume", () => {
  const nan = new Error(
    `w.safetensors: tensor x: element 3 is NaN or infinite; ${NAN_WEIGHTS_REFUSED}`,
  );
  assert.match(
    resumeHint(nan, "partial pack kept in x.tmp"),
    /the checkpoint itself holds these values, so a rerun fails the same way/,
  );
  assert.ok(!resumeHint(nan, "k").includes("rerun to resume"));
  assert.equal(resumeHint(new Error("disk full"), "k"), " (k; rerun to resume)");
});
