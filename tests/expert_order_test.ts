/**
 * The feed-forward computes a layer's experts in the order their records land (one already
 * resident first), which depends on the disk's timing; the weighted sum stays in routing order.
 * Here the store's answer to "is this record ready?" is replaced by seeded coin flips, so the
 * compute order is forced away from routing order, and the logits must still be bit-identical to
 * an ordinary run's, under every budget, thread count, prefill chunk, lookahead and reader.
 */
import assert from "node:assert/strict";
import { Model, type RunOptions } from "../engine/model.ts";
import { hasFixture, packedFixture } from "./fixtures.ts";

const TOKENS = [1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426];
const K3_TOKENS = [203, 34, 2, 239, 195, 71, 163, 54, 121, 104, 16, 16, 4, 110, 103, 82];
const PROMPT = 6;

/** xorshift32: the coin flips of one run. */
function coins(seed: number): () => boolean {
  let x = seed | 1;
  return () => {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    return (x & 1) === 1;
  };
}

/**
 * All logits of `tokens` (prompt in chunks, then one at a time). With `seed`, the store's `ready`
 * answers by coin flip; returns how many experts computed before one hinted earlier in routing
 * order (with `seed` null: the engine's own order).
 */
async function run(
  path: string,
  opts: RunOptions,
  tokens: number[],
  seed: number | null,
): Promise<{ logits: Float32Array; outOfOrder: number }> {
  const model = await Model.open(path, { quiet: true, ctx: 64, hotList: false, ...opts });
  let outOfOrder = 0;
  try {
    const store = model.experts!;
    if (seed !== null) {
      const flip = coins(seed);
      store.ready = () => flip();
    }
    // Routing order of the last hint per layer, and what was acquired of it so far.
    const hinted = new Map<number, number[]>();
    const hint = store.hint.bind(store), acquire = store.acquire.bind(store);
    store.hint = (layer, ids) => {
      hinted.set(layer, [...ids]);
      hint(layer, ids);
    };
    store.acquire = (layer, expert) => {
      const ids = hinted.get(layer) ?? [];
      if (ids.length > 0 && ids[0] !== expert) outOfOrder++;
      hinted.set(layer, ids.filter((e) => e !== expert));
      return acquire(layer, expert);
    };
    const out: number[] = [];
    const chunk = model.prefillChunk;
    for (let p = 0; p < PROMPT; p += chunk) {
      out.push(...model.forward(tokens.slice(p, Math.min(p + chunk, PROMPT)), p, true));
    }
    for (let p = PROMPT; p < tokens.length; p++) out.push(...model.forward([tokens[p]], p));
    return { logits: Float32Array.from(out), outOfOrder };
  } finally {
    model.close();
  }
}

const FIXTURES: [string, number[]][] = [
  ["tiny-qwen3.5-moe", TOKENS],
  ["stories260k-moe64", TOKENS],
  ["tiny-deepseek-v3", TOKENS],
  ["tiny-kimi-k3-mxfp4", K3_TOKENS],
];

for (const [name, tokens] of FIXTURES) {
  Deno.test({
    name: `experts computed out of routing order give bit-identical logits: ${name}`,
    ignore: !hasFixture(name),
    fn: async () => {
      const path = await packedFixture(name);
      const base = await run(path, {}, tokens, null);
      const settings: [string, RunOptions][] = [
        ["whole model", {}],
        ["10 expert slots", { expertSlots: 10 }],
        ["12 slots, lookahead 4", { expertSlots: 12, lookahead: 4 }],
        ["1 thread, 10 slots", { threads: 1, expertSlots: 10 }],
        ["prefill chunk 1, read-ahead depth 1", { prefillChunk: 1, readaheadDepth: 1 }],
        ["prefill chunk 5, 1 reader thread", { prefillChunk: 5, ioThreads: 1, expertSlots: 16 }],
        ["node:fs fallback reader", { io: "fallback", expertSlots: 10 }],
      ];
      let reordered = 0;
      for (const [i, [what, opts]] of settings.entries()) {
        const r = await run(path, opts, tokens, 0x9e3779b9 + i);
        reordered += r.outOfOrder;
        assert.deepEqual(r.logits, base.logits, `${name}: ${what}, shuffled order`);
      }
      // The shuffles must have moved experts, or this test proves nothing.
      assert.ok(reordered > 0, `${name}: no expert computed out of routing order`);
    },
  });
}
