/**
 * The KV cache's unwritten rows lent to the expert cache (engine/kv_lending.ts): tokens are bit
 * for bit those of a run that lends nothing, at any budget and across growth blocks, one sequence
 * or several; the cache's capacity shrinks as the context grows and comes back when a sequence
 * starts over; the plan's lent slots are the engine's; and a read still landing in a slot the KV
 * cache takes back is waited for before the KV rows are written, so no read lands in them.
 *
 * @module
 */
import "./shared_guard.ts";
import assert from "node:assert/strict";
import { Arena, PAGE } from "../engine/arena.ts";
import {
  GROWTH_ROWS,
  KvLender,
  lendableCount,
  lendableSlots,
  pickLent,
  reservedRows,
} from "../engine/kv_lending.ts";
import { Model, type RunOptions } from "../engine/model.ts";
import { planInput, planMemory } from "../engine/planner.ts";
import { argmax } from "../engine/sampler.ts";
import { ExpertCache } from "../engine/stream/expert_cache.ts";
import { ExpertStore } from "../engine/stream/expert_store.ts";
import type { ExpertBank } from "../io/manifest_schema.ts";
import { HeldReader } from "./held_reader.ts";
import { budgetAboveFloor, hasFixture, packedFixture, runSluice } from "./fixtures.ts";

Deno.test("kv lending: slots sit page-aligned at the tops of runs, the last reached first", () => {
  // Two runs of 100 rows of 100 bytes (10,000 bytes each) from offset 4096: pages end at 12288
  // and 20480 (the second run ends at 24096).
  const runs = [{ offset: 4096, rows: 100, rowBytes: 100 }, {
    offset: 14096,
    rows: 100,
    rowBytes: 100,
  }];
  const slots = lendableSlots(runs, PAGE, 3);
  assert.deepEqual(slots, [
    { seq: 3, offset: 8192, firstRow: 40 },
    { seq: 3, offset: 4096, firstRow: 0 },
    { seq: 3, offset: 16384, firstRow: 22 },
  ]);
  for (const s of slots) assert.equal(s.offset % PAGE, 0);
  assert.deepEqual(pickLent(slots, 2).map((s) => s.firstRow), [40, 22]);
  assert.equal(reservedRows(0), 0);
  assert.equal(reservedRows(1), GROWTH_ROWS);
  assert.equal(reservedRows(GROWTH_ROWS + 1), 2 * GROWTH_ROWS);
  // The planner's count, from region-relative runs, is the placed one's per sequence.
  assert.equal(lendableCount([[{ rows: 100, rowBytes: 100 }]], PAGE, 2), 4);
});

Deno.test("kv lending: a retired slot is never admitted into, and restore gives it back", () => {
  const c = new ExpertCache({ slots: 4, policy: "decay" });
  for (const k of [10, 11, 12, 13]) c.access(k);
  const slot = c.slotOf(12)!;
  assert.equal(c.retire(slot), 12);
  assert.equal(c.capacity, 3);
  assert.ok(!c.has(12));
  for (let k = 20; k < 40; k++) {
    assert.notEqual(c.access(k).slot, slot);
    assert.notEqual(c.acquire([k + 100])[0].slot, slot);
    c.release([k + 100]);
  }
  c.pin(c.keyAt((slot + 1) % 4)!);
  assert.throws(() => c.retire((slot + 1) % 4), /pinned/);
  assert.throws(() => c.retire(slot), /retired/);
  c.restore(slot);
  assert.equal(c.capacity, 4);
  assert.equal(c.access(99).slot, slot, "the restored slot is the free one");
});

Deno.test("kv lending: a read landing in a slot the KV cache takes back lands before the rows are written", () => {
  const experts = 16, rowBytes = 16, rows = 4 * GROWTH_ROWS;
  const entry = { dtype: "bf16" as const, shape: [8, 8], offset: 0, bytes: 128 };
  const bank = {
    layer: 0,
    file: "experts-L0.bin",
    count: experts,
    stride: PAGE,
    format: "bf16",
    matrices: { gate: entry, up: entry, down: entry },
  } as unknown as ExpertBank;
  const arena = new Arena(4 << 20);
  const kv = arena.alloc("kv cache", rows * rowBytes);
  const reader = new HeldReader(arena);
  const run = [{ offset: kv, rows, rowBytes }];
  const lent = pickLent(lendableSlots(run, PAGE), 100);
  assert.equal(lent.length, 4);
  const cache = new ExpertCache({ slots: 2 + lent.length, policy: "lru" });
  const store = new ExpertStore(
    arena,
    reader,
    [{ bank, handles: [0], paths: ["experts-L0.bin"] }],
    cache,
    { readaheadDepth: 8, check: () => {}, lentSlots: lent.length },
  );
  store.lend(lent.map((s) => s.offset));
  const lender = new KvLender(store, lent, 2);
  lender.reserve(0, 0);
  assert.equal(cache.capacity, 6);
  // Guesses fill every slot and stay in flight: the lent ones too.
  assert.equal(store.speculate(0, [0, 1, 2, 3, 4, 5], 6), 6);
  assert.equal(reader.pending.size, 6);
  const lentRange = (i: number) => [lent[i].offset, lent[i].offset + PAGE];
  const inFlightIn = (lo: number, hi: number) =>
    [...reader.pending.values()].filter(([at, n]) => at < hi && at + n > lo).length;
  assert.ok(lent.some((_, i) => inFlightIn(lentRange(i)[0], lentRange(i)[1]) > 0));
  // The context grows over two blocks: the slots there are taken back; their reads have landed.
  lender.reserve(0, GROWTH_ROWS + 1);
  const taken = kv + 2 * GROWTH_ROWS * rowBytes;
  assert.equal(inFlightIn(kv, taken), 0, "a read is still in flight in rows the KV cache took");
  assert.equal(cache.capacity, 4);
  assert.equal(lender.stats.reclaimed, 2);
  // The pass writes its rows; everything else in flight lands afterwards.
  arena.u8(kv, taken - kv).fill(0x11);
  const before = reader.submitted.length;
  reader.release();
  for (let e = 6; e < experts; e++) {
    store.acquire(0, e);
    store.release(0, e);
  }
  store.drain();
  assert.ok(arena.u8(kv, taken - kv).every((b) => b === 0x11), "a read landed in KV rows");
  for (const [at, n] of reader.submitted.slice(before)) {
    assert.ok(at + n <= kv || at >= taken, `a read at ${at} was put in rows the KV cache holds`);
  }
  // A record in use cannot be taken back: that would be a bug in the caller's order.
  const key = [...Array(experts).keys()].find((e) => cache.slotOf(e) === 2 + 1)!;
  store.hint(0, [key]);
  assert.throws(() => lender.reserve(0, 3 * GROWTH_ROWS + 1), /in use/);
  store.release(0, key);
  // Starting over gives every slot back.
  lender.reserve(0, 1);
  assert.equal(cache.capacity, 2 + 3);
  assert.ok(lender.stats.restored >= 1);
});

/** A 1,100-token prompt (past four growth blocks) over a 2048-position context. */
const CTX = 2048, PROMPT = 1100;

/**
 * The last prompt logits and `decode` greedy steps' logits of one sequence, with the cache's
 * capacity after every pass.
 */
async function run(
  path: string,
  opts: RunOptions,
  decode = 4,
): Promise<{ logits: Float32Array[]; capacity: number[]; model: Model }> {
  const model = await Model.open(path, { quiet: true, ctx: CTX, hotList: false, ...opts });
  const vocab = model.cfg.vocabSize;
  const prompt = Array.from({ length: PROMPT }, (_, i) => (i * 7919 + 3) % vocab);
  const logits: Float32Array[] = [];
  const capacity: number[] = [];
  let last: Float32Array = new Float32Array(0);
  for (let p = 0; p < PROMPT; p += model.prefillChunk) {
    last = model.forward(prompt.slice(p, p + model.prefillChunk), p);
    capacity.push(model.experts!.cache.capacity);
  }
  logits.push(last.slice());
  for (let i = 0; i < decode; i++) {
    last = model.forward([argmax(last)], PROMPT + i);
    logits.push(last.slice());
    capacity.push(model.experts!.cache.capacity);
  }
  return { logits, capacity, model };
}

// GQA; GQA with sliding-window rings and sinks; MLA with an indexer's rows; Gemma 4's rings and
// global layers.
const MODELS = ["tiny-glm4-moe", "tiny-gpt-oss", "tiny-glm5", "tiny-gemma4-moe"];
for (const name of MODELS) {
  Deno.test({
    name: `kv lending: ${name}: tokens are bit-identical with and without lending at every budget`,
    ignore: !hasFixture(name),
    fn: async () => {
      const path = await packedFixture(name);
      const probe = await Model.open(path, { quiet: true, ctx: CTX, hotList: false });
      const { floor, wholeModelBytes } = probe.plan;
      const stride = probe.experts!.stride;
      probe.close();
      const budgets = [floor, floor + 8 * stride, Math.floor((floor + wholeModelBytes) / 2)];
      for (const budget of budgets) {
        const off = await run(path, { budget, lendKv: false });
        off.model.close();
        const on = await run(path, { budget });
        const plan = on.model.plan;
        on.model.close();
        assert.deepEqual(on.logits, off.logits, `lending changed the logits at ${budget} B`);
        assert.ok(off.capacity.every((c) => c === plan.expertSlots));
        if (plan.lentSlots === 0) continue;
        // The plan's lent slots are the engine's: the cache starts at expertSlots + lentSlots
        // (the first pass reserves only its first block), and shrinks as the context grows.
        assert.ok(on.capacity[0] > plan.expertSlots);
        assert.ok(on.capacity[0] <= plan.expertSlots + plan.lentSlots);
        for (let i = 1; i < on.capacity.length; i++) {
          assert.ok(on.capacity[i] <= on.capacity[i - 1], `capacity grew: ${on.capacity}`);
        }
        assert.ok(on.capacity.at(-1)! >= plan.expertSlots);
        if (budget === floor) {
          assert.ok(on.capacity.at(-1)! < on.capacity[0], `capacity never shrank: ${on.capacity}`);
        }
      }
    },
  });
}

Deno.test({
  name:
    "kv lending: the plan's lent slots are the engine's, and a sliding window's ring lends its top",
  ignore: !hasFixture("tiny-gpt-oss"),
  fn: async () => {
    const path = await packedFixture("tiny-gpt-oss");
    const floor = await budgetAboveFloor(path, 0, { ctx: CTX });
    const model = await Model.open(path, { quiet: true, ctx: CTX, hotList: false, budget: floor });
    try {
      const plan = model.plan;
      assert.ok(plan.lentSlots > 0);
      assert.equal(model.experts!.cache.capacity, plan.expertSlots + plan.lentSlots);
      assert.equal(model.lender!.lent, plan.lentSlots);
      const again = planMemory(planInput(model.container), {
        budget: floor,
        ctx: CTX,
        maxBatch: model.prefillChunk,
        lendKv: false,
      });
      assert.equal(again.lentSlots, 0);
      assert.equal(again.expertSlots, plan.expertSlots);
    } finally {
      model.close();
    }
  },
});

Deno.test({
  name: "kv lending: several sequences lend their own rows; one starting over gives them back",
  ignore: !hasFixture("tiny-glm4-moe"),
  fn: async () => {
    const path = await packedFixture("tiny-glm4-moe");
    const opts = { quiet: true, ctx: 1024, hotList: false, parallel: 2, prefillChunk: 64 } as const;
    const budget = await budgetAboveFloor(path, 0, opts);
    const passes = async (lendKv: boolean) => {
      const m = await Model.open(path, { ...opts, budget, lendKv });
      const vocab = m.cfg.vocabSize, chunk = m.prefillChunk / 2;
      const a = Array.from({ length: 3 * GROWTH_ROWS }, (_, i) => (i * 31 + 5) % vocab);
      const b = Array.from({ length: 40 }, (_, i) => (i * 17 + 9) % vocab);
      const out: Float32Array[] = [];
      const capacity: number[] = [];
      for (let p = 0; p < a.length; p += chunk) {
        const rows = [{ seq: 0, tokens: a.slice(p, p + chunk), pos: p }];
        if (p < b.length) rows.push({ seq: 1, tokens: b.slice(p, p + chunk), pos: p });
        out.push(...m.forwardBatch(rows).map((l) => l.slice()));
        capacity.push(m.experts!.cache.capacity);
      }
      // Sequence 0 starts a new prompt: the rows above it come back to the cache.
      out.push(m.forward(b.slice(0, 8), 0).slice());
      capacity.push(m.experts!.cache.capacity);
      const restored = m.lender?.stats.restored ?? 0;
      m.close();
      return { out, capacity, restored };
    };
    const off = await passes(false), on = await passes(true);
    assert.deepEqual(on.out, off.out);
    const n = on.capacity.length;
    assert.ok(on.capacity[n - 2] < on.capacity[0], `capacity never shrank: ${on.capacity}`);
    assert.ok(on.capacity[n - 1] > on.capacity[n - 2], `nothing came back: ${on.capacity}`);
    assert.ok(on.restored > 0);
  },
});

Deno.test({
  name:
    "kv lending: plan shows the KV cache and what it lends; the stats show the cache at the end",
  ignore: !hasFixture("tiny-glm4-moe"),
  fn: async () => {
    const path = await packedFixture("tiny-glm4-moe");
    const plan = await runSluice(["plan", "-m", path, "-c", "2048", "--budget", "4.6M"]);
    assert.equal(plan.code, 0, plan.stderr);
    assert.match(plan.stdout, /KV 2\.00 MiB at ctx 2048/);
    const lent = /lent by KV +(\d+) more records \(.* of the KV cache's 2\.00 MiB\)/.exec(
      plan.stdout,
    );
    assert.ok(lent, plan.stdout);
    const json = await runSluice(["plan", "-m", path, "-c", "2048", "--budget", "4.6M", "--json"]);
    const p = JSON.parse(json.stdout);
    assert.equal(p.lentSlots, Number(lent[1]));
    const off = await runSluice([
      "plan",
      "-m",
      path,
      "-c",
      "2048",
      "--budget",
      "4.6M",
      "--no-kv-lend",
    ]);
    assert.match(off.stdout, /expert cache +\d+ of \d+ records/);
    assert.doesNotMatch(off.stdout, /lent by KV/);
    // A 1,000-token prompt reaches four growth blocks: the stats show what was taken back.
    const prompt = "hello world ".repeat(170);
    const gen = await runSluice([
      "generate",
      "-m",
      path,
      "-c",
      "2048",
      "--budget",
      "4.6M",
      "-n",
      "4",
      "--json",
      "-p",
      prompt,
    ]);
    assert.equal(gen.code, 0, gen.stderr);
    const s = JSON.parse(gen.stdout).stats;
    assert.ok(s.prompt_tokens > 3 * GROWTH_ROWS, `${s.prompt_tokens} prompt tokens`);
    assert.ok(s.kv_reclaimed_slots > 0);
    assert.equal(s.expert_cache_slots, p.expertSlots + s.expert_cache_lent);
    assert.equal(s.expert_cache_lent, p.lentSlots - s.kv_reclaimed_slots);
  },
});
