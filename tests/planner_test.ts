/**
 * The memory plan: within budget, a floor that is refused below, the pinned-prefix fixed point,
 * and budget parsing.
 */
import assert from "node:assert/strict";
import type { ModelConfig } from "../io/model_config.ts";
import {
  GUESS_PRECISION,
  type MemoryPlan,
  type PlanInput,
  planMemory,
  readBytesPerToken,
  weighLookahead,
} from "../engine/planner.ts";
import { parseBytes } from "../engine/units.ts";
import { LONG_CONTEXT, prefillChunkOf } from "../engine/run_limits.ts";
import { loadModelConfig } from "../engine/config.ts";
import { fixtureDir, HAVE_FIXTURES } from "./fixtures.ts";

// Without ../shared the tests that read it are skipped (tests/shared_guard.ts): load nothing then.
const cfg: ModelConfig = HAVE_FIXTURES
  ? loadModelConfig(fixtureDir("stories260k-moe64"))
  : ({} as ModelConfig);
const MiB = 2 ** 20;
const input: PlanInput = {
  cfg,
  globalsBytes: 256 * 1024,
  layerBytes: [1, 2, 3, 4, 5].map((i) => (i + 2) * 64 * 1024),
  expertStride: 136 * 1024,
  totalExperts: 320,
  routerBytes: 5 * 64 * 64 * 4,
};

Deno.test("plans stay within the budget and pin the longest prefix that fits", () => {
  const whole = planMemory(input, { ctx: 128, maxBatch: 8 });
  assert.equal(whole.pinned, 5);
  assert.equal(whole.expertSlots, 320);
  for (let budget = whole.floor; budget <= whole.wholeModelBytes; budget += 512 * 1024) {
    const p = planMemory(input, { ctx: 128, maxBatch: 8, budget });
    assert.ok(p.arenaBytes <= budget, `arena ${p.arenaBytes} > budget ${budget}`);
    assert.ok(p.expertSlots >= 2 * cfg.moe!.topK);
    assert.equal(p.trunkHitRate, p.pinned / 5);
    if (p.pinned < 5) {
      assert.ok(p.ringSlots >= 1);
      assert.equal(p.ringSlotBytes, Math.max(...input.layerBytes.slice(p.pinned)));
      // Pinning one more layer must not have fitted.
      const n = p.pinned + 1;
      const more = input.layerBytes.slice(0, n).reduce((a, b) => a + b, 0) +
        Math.min(p.ringSlots, 5 - n) * (n < 5 ? Math.max(...input.layerBytes.slice(n)) : 0);
      const minExperts = 2 * cfg.moe!.topK * input.expertStride;
      assert.ok(more > budget - p.fixedBytes - minExperts);
    }
  }
});

Deno.test("a budget below the floor is refused with the floor in the message", () => {
  const p = planMemory(input, { ctx: 128, maxBatch: 8 });
  assert.throws(
    () => planMemory(input, { ctx: 128, maxBatch: 8, budget: p.floor - 1 }),
    /is below the floor of .*KiB|is below the floor of .*MiB/,
  );
});

Deno.test("a context that outgrows the budget is refused with the longest one it holds", () => {
  const short = planMemory(input, { ctx: 128, maxBatch: 8 });
  // Room for the short context's floor but not the long one's: the KV cache is what is short.
  const budget = Math.ceil((short.floor + 1) / 65536) * 65536;
  let message = "";
  try {
    planMemory(input, { ctx: 65536, maxBatch: 8, budget });
  } catch (e) {
    message = (e as Error).message;
  }
  const m = message.match(
    /KV cache .* at a context of 65536.*this budget holds a context of at most (\d+) \(-c \1\)/,
  );
  assert.ok(m, message);
  const most = Number(m[1]);
  assert.ok(most >= 128 && most < 65536);
  planMemory(input, { ctx: most, maxBatch: 8, budget });
  assert.throws(() => planMemory(input, { ctx: most + 1, maxBatch: 8, budget }), /below the floor/);
  // Below even a one-position context's floor, no context would do: no such hint.
  assert.throws(
    () => planMemory(input, { ctx: 65536, maxBatch: 8, budget: 65536 }),
    (e: Error) => /below the floor/.test(e.message) && !/holds a context/.test(e.message),
  );
});

Deno.test("the lookahead's resident routers are part of the fixed bytes", () => {
  const off = planMemory(input, { ctx: 128, maxBatch: 8 });
  const on = planMemory(input, { ctx: 128, maxBatch: 8, lookahead: true });
  assert.ok(on.fixedBytes >= off.fixedBytes + input.routerBytes);
});

/**
 * The DeepSeek-V4-shaped bench model of docs/PERFORMANCE.md (its lookahead cost 0.92× at a 0.077
 * budget): trunk layers of 140 MiB, records of 13.37 MB, 256 per layer, 8.4 MB of routers, on the
 * fixture's layers.
 */
const V4ISH: PlanInput = {
  cfg,
  globalsBytes: 64 * MiB,
  layerBytes: [140, 140, 140, 140, 140].map((m) => m * MiB),
  expertStride: 13.37e6,
  totalExperts: 5 * 256,
  routerBytes: 8.4e6,
};

/** The plans without and with the lookahead's routers at `budget`, and their weighing. */
function weigh(
  input: PlanInput,
  budget: number,
): [MemoryPlan, MemoryPlan, ReturnType<typeof weighLookahead>] {
  const opts = { ctx: 128, maxBatch: 8, budget };
  const off = planMemory(input, opts), on = planMemory(input, { ...opts, lookahead: true });
  return [off, on, weighLookahead(input, off, on, 1)];
}

Deno.test("lookahead: off where its routers unpin a trunk layer, on where they take a few records", () => {
  // From the floor with the routers resident (below it the engine plans no lookahead).
  const whole = planMemory(V4ISH, { ctx: 128, maxBatch: 8, lookahead: true });
  const moe = cfg.layerKinds.filter((k) => k === "moe").length;
  let unpinned = 0, onSeen = 0;
  for (let budget = whole.floor; budget < whole.wholeModelBytes; budget += 4 * MiB) {
    const [off, on, w] = weigh(V4ISH, budget);
    // What it weighs, from the two plans: reads per token (unpinned trunk, expected misses).
    const read = (p: MemoryPlan) =>
      V4ISH.layerBytes.slice(p.pinned).reduce((a, b) => a + b, 0) +
      moe * cfg.moe!.topK * (1 - p.expertSlots / p.totalExperts) * V4ISH.expertStride;
    assert.equal(readBytesPerToken(V4ISH, off), read(off));
    assert.ok(Math.abs(w.displacedBytes - Math.max(0, read(on) - read(off))) < 1);
    assert.ok(w.hiddenBytes <= moe * GUESS_PRECISION * V4ISH.expertStride);
    assert.equal(w.routerBytes, on.fixedBytes - off.fixedBytes);
    assert.equal(w.on, w.hiddenBytes > w.displacedBytes);
    if (on.pinned < off.pinned) {
      // A 140 MiB layer read every token against at most one record per MoE layer hidden.
      unpinned++;
      assert.equal(w.on, false, `budget ${budget}: ${JSON.stringify(w)}`);
    } else if (on.pinned === off.pinned && on.ringSlots === off.ringSlots) {
      // The routers' 8.4 MB take at most one record: less than a guess per layer hides while a
      // tenth of the routed records miss (near the whole model too little misses to pay).
      assert.ok(off.expertSlots - on.expertSlots <= 1);
      if (on.expertSlots <= 0.9 * on.totalExperts) {
        assert.equal(w.on, true, `budget ${budget}: ${JSON.stringify(w)}`);
        onSeen++;
      }
    }
    // Sizes only: the same inputs weigh the same.
    assert.deepEqual(weigh(V4ISH, budget)[2], w);
  }
  assert.ok(unpinned > 0 && onSeen > 0, `${unpinned} budgets unpinned a layer, ${onSeen} kept it`);
});

Deno.test("sizes parse with binary units", () => {
  assert.equal(parseBytes("6G"), 6 * 2 ** 30);
  assert.equal(parseBytes("512M"), 512 * MiB);
  assert.equal(parseBytes("1.5GiB"), 1.5 * 2 ** 30);
  assert.equal(parseBytes("4096"), 4096);
  assert.throws(() => parseBytes("lots"), /cannot read "lots" as a size/);
});

Deno.test("prefill chunk: 128 by default, 512 from a context of LONG_CONTEXT, a given one kept", () => {
  assert.equal(prefillChunkOf(undefined), 128);
  assert.equal(prefillChunkOf(undefined, LONG_CONTEXT - 1), 128);
  assert.equal(prefillChunkOf(undefined, LONG_CONTEXT), 512);
  assert.equal(prefillChunkOf(64, 32768), 64);
  assert.throws(() => prefillChunkOf(513, 32768), /1\.\.512/);
});
