/**
 * Placement never changes output: the same tokens give bit-identical logits under every memory
 * budget, ring size, read-ahead and lookahead setting, cache policy, thread count, prefill chunk,
 * hot list and reader kind. Also: the simulator replays the engine's own trace to the same hits,
 * and a corrupted record is caught by verify.
 */
import assert from "node:assert/strict";
import { closeSync, copyFileSync, cpSync, openSync, writeSync } from "node:fs";
import { Model, type RunOptions } from "../engine/model.ts";
import { hotListPath } from "../engine/stream/hot_list.ts";
import { readTrace } from "../io/trace.ts";
import { ENGINE_POLICY, simulate } from "../tools/dev/sim.ts";
import { splitBanks } from "../tools/split_banks.ts";
import { hasFixture, packedFixture, tempDir } from "./fixtures.ts";

/** Greedy-ish fixed token stream: prompt then a story-like continuation from stories260k. */
const TOKENS = [
  1,
  403,
  407,
  261,
  378,
  432,
  383,
  286,
  261,
  376,
  298,
  315,
  421,
  395,
  317,
  426,
  338,
  401,
  396,
  267,
  337,
  410,
  408,
  419,
  292,
  411,
  322,
  265,
];
const PROMPT = 12;
/** Kimi K3's 256-id vocabulary: the oracle prompt, then tiny-kimi-k3-mxfp4's continuation. */
const K3_TOKENS = [
  203,
  34,
  2,
  239,
  195,
  71,
  163,
  54,
  121,
  104,
  16,
  16,
  4,
  110,
  103,
  82,
  242,
  183,
  37,
  90,
  209,
  87,
  28,
  154,
];

/** All logits of `tokens`: the prompt in chunks (all positions' logits), then one at a time. */
async function run(
  path: string,
  opts: RunOptions,
  tokens = TOKENS,
): Promise<{ logits: Float32Array; model: Model }> {
  const model = await Model.open(path, { quiet: true, ctx: 64, ...opts });
  const out: Float32Array[] = [];
  const chunk = model.prefillChunk;
  for (let p = 0; p < PROMPT; p += chunk) {
    out.push(model.forward(tokens.slice(p, Math.min(p + chunk, PROMPT)), p, true));
  }
  for (let p = PROMPT; p < tokens.length; p++) out.push(model.forward([tokens[p]], p));
  const logits = new Float32Array(out.reduce((a, b) => a + b.length, 0));
  let o = 0;
  for (const l of out) {
    logits.set(l, o);
    o += l.length;
  }
  return { logits, model };
}

async function logitsOf(path: string, opts: RunOptions, tokens = TOKENS): Promise<Float32Array> {
  const { logits, model } = await run(path, opts, tokens);
  model.close();
  return logits;
}

/** Fixtures and their tokens. The prefill chunk is a placement setting for all of them. */
const PLACEMENT_FIXTURES: [string, number[]][] = [
  ["stories260k-moe64", TOKENS],
  ["tiny-deepseek-v3", TOKENS],
  ["tiny-glm4-moe", TOKENS],
  ["tiny-kimi-k3-mxfp4", K3_TOKENS],
];

for (const [name, tokens] of PLACEMENT_FIXTURES) {
  Deno.test({
    name: `bit-identical logits across placement settings: ${name}`,
    ignore: !hasFixture(name),
    fn: async () => {
      const path = await packedFixture(name);
      const base = await logitsOf(path, {}, tokens);
      const one = { prefillChunk: 1 };
      const probe = await Model.open(path, { quiet: true, ctx: 64, ...one });
      const { floor, wholeModelBytes } = probe.plan;
      const ring = Math.max(...probe.container.manifest.trunk.layers.map((l) => l.bytes));
      probe.close();
      // The default chunk's activation buffers raise its floor above the one-token floor.
      const chunked = await Model.open(path, { quiet: true, ctx: 64 });
      const chunkedFloor = chunked.plan.floor;
      chunked.close();
      const settings: [string, RunOptions][] = [
        ["budget = floor (1 ring slot)", { budget: floor, ...one }],
        ["floor + one more ring slot", { budget: floor + ring, ...one }],
        ["half the model", { budget: Math.floor((chunkedFloor + wholeModelBytes) / 2) }],
        ["no read-ahead", {
          budget: floor + ring,
          readaheadDepth: 0,
          trunkReadahead: false,
          ...one,
        }],
        ["lookahead 4", { expertSlots: 12, lookahead: 4 }],
        ["LRU cache", { cache: "lru", expertSlots: 12 }],
        ["1 thread", { threads: 1 }],
        ["prefill one token at a time", { prefillChunk: 1 }],
        ["prefill chunk 5", { prefillChunk: 5 }],
        ["node:fs fallback reader", { io: "fallback", expertSlots: 10 }],
        ["buffered reader, verify", { io: "buffered", verify: true, expertSlots: 10 }],
      ];
      // Bank shards in two directories, read with a small cache.
      const shards = [0, 1].map((i) => `${tempDir()}/${name}-shard${i}`);
      splitBanks(path, shards, { progress: "off", log: () => {} });
      settings.push(["bank shards", { shards, expertSlots: 10 }]);
      for (const [what, opts] of settings) {
        assert.deepEqual(
          await logitsOf(path, opts, tokens),
          base,
          `${name}: ${what} changed the logits`,
        );
      }
    },
  });
}

for (
  const [name, tokens] of [["stories260k-moe64", TOKENS], [
    "tiny-kimi-k3-mxfp4",
    K3_TOKENS,
  ]] as const
) {
  Deno.test({
    name: `a learned hot list warms the cache and changes nothing: ${name}`,
    ignore: !hasFixture(name),
    fn: async () => {
      const src = await packedFixture(name);
      const path = `${tempDir()}/hot-${name}.sluice`;
      cpSync(src, path, { recursive: true });
      const t = [...tokens];
      // Hits are compared, so no lookahead: its guesses follow measured timings, and h53's
      // first-layer guesses made a run's hits vary by more than the hot list's gain.
      const opts = { expertSlots: 40, lookahead: 0 };
      const base = await logitsOf(path, opts, t);
      await logitsOf(path, { ...opts, learn: true }, t);
      const warm = await run(path, opts, t);
      const warmedHits = warm.model.experts!.cache.stats.hits;
      warm.model.close();
      assert.deepEqual(warm.logits, base);
      const cold = await run(path, { ...opts, hotList: false }, t);
      const coldHits = cold.model.experts!.cache.stats.hits;
      cold.model.close();
      assert.ok(warmedHits > coldHits, `hot list: ${warmedHits} hits vs ${coldHits} cold`);
      Deno.removeSync(hotListPath(path));
    },
  });
}

// The simulator replays demand accesses only, so the engine runs without the lookahead here.
for (const cache of [undefined, "lfru"] as const) {
  const policy = cache ?? ENGINE_POLICY;
  Deno.test(`the simulator replays the engine's trace to its hit count: ${cache ?? "default"}`, async () => {
    const path = await packedFixture("stories260k-moe64");
    const trace = `${tempDir()}/trace-${policy}.jsonl`;
    const slots = 20;
    const { model } = await run(path, {
      expertSlots: slots,
      prefillChunk: 1,
      lookahead: 0,
      trace,
      cache,
    });
    const engine = model.experts!.cache.stats;
    assert.equal(model.experts!.cache.policy, policy);
    model.close();
    const events = readTrace(trace);
    assert.equal(events.length, TOKENS.length * 5);
    const sim = simulate(events, policy, slots / 5, "global", {
      shape: { nLayers: 5, nExperts: 64 },
    });
    assert.equal(sim.slots, slots);
    assert.ok(engine.misses > slots, `the cache must evict: ${engine.misses} misses`);
    assert.equal(sim.hits, engine.hits);
    assert.equal(sim.accesses, engine.hits + engine.misses);
  });
}

Deno.test("verify catches a corrupted expert record", async () => {
  const src = await packedFixture("stories260k-moe64");
  const path = `${tempDir()}/corrupt.sluice`;
  cpSync(src, path, { recursive: true });
  const bank = `${path}/experts-L2.bin`;
  copyFileSync(bank, `${bank}.orig`);
  const stride = await Model.open(path, { quiet: true, ctx: 16 }).then((m) => {
    const s = m.container.manifest.experts[2]!.stride;
    m.close();
    return s;
  });
  const fd = openSync(bank, "r+");
  for (let e = 0; e < 64; e++) writeSync(fd, new Uint8Array([0x5a]), 0, 1, e * stride + 1000);
  closeSync(fd);
  await assert.rejects(
    () => logitsOf(path, { verify: true, expertSlots: 10 }),
    /expert \d+ of layer 2: checksum mismatch \(.*experts-L2\.bin offset \d+\)/,
  );
});
