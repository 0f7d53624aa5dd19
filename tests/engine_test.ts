/**
 * The WASM engine (kernels on the worker pool, packed container) against the scalar float64
 * reference forward (engine/reference/, reading the Hugging Face checkpoint directly): logits
 * within 1e-5 relative at every position, and identical greedy tokens, on every fixture.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { Model } from "../engine/model.ts";
import { argmax } from "../engine/sampler.ts";
import { Session } from "../engine/session.ts";
import {
  assertNearReference,
  fixtureDir,
  maxRelDiff,
  packedFixture,
  referenceOf,
} from "./fixtures.ts";

const FIXTURES = [
  "stories260k",
  "stories260k-moe",
  "stories260k-qwen3moe",
  "stories260k-moe64",
  "tiny-deepseek-v3",
  "tiny-deepseek-v3-fp8",
];
const PROMPT = [1, 403, 407, 261, 378];
const STEPS = 48;

for (const name of FIXTURES) {
  Deno.test(`engine matches the reference forward: ${name}`, async () => {
    const run = { ctx: 128, prompt: PROMPT, steps: STEPS, bound: 1e-5, name };
    await assertNearReference(await packedFixture(name), referenceOf(name), run);
  });
}

Deno.test("engine reproduces llama2.c's known answer for stories260k", async () => {
  const known = JSON.parse(readFileSync(`${fixtureDir("stories260k")}/reference.json`, "utf8"));
  const session = await Session.open(await packedFixture("stories260k"), { quiet: true });
  try {
    const ids = session.tokenize(known.prompt);
    assert.deepEqual(ids, known.prompt_ids);
    const generated: number[] = [];
    // llama2.c counts 200 forward passes from position 0, prompt included.
    for await (const t of session.generate(ids, { maxTokens: 200 - ids.length + 1 })) {
      generated.push(t.id);
    }
    assert.deepEqual(generated, known.generated_ids);
  } finally {
    session.close();
  }
});

// The FP8 kernel applies each block scale to a partial sum rather than to every weight, so the
// logits agree within float tolerance, not bit for bit.
Deno.test("FP8 and float32 DeepSeek containers agree", async () => {
  const a = await Model.open(await packedFixture("tiny-deepseek-v3"), { quiet: true, ctx: 64 });
  const b = await Model.open(await packedFixture("tiny-deepseek-v3-fp8"), { quiet: true, ctx: 64 });
  try {
    for (let pos = 0; pos < PROMPT.length; pos++) {
      const fa = a.forward([PROMPT[pos]], pos), fb = b.forward([PROMPT[pos]], pos);
      assert.ok(maxRelDiff(fb, fa) <= 1e-5, `position ${pos}: ${maxRelDiff(fb, fa)}`);
      assert.equal(argmax(fb), argmax(fa));
    }
  } finally {
    a.close();
    b.close();
  }
});
