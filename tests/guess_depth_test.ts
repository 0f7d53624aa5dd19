/**
 * A lookahead at top-k ranks every routed expert of the next layer and reads the leading ranks
 * its gate allows (here all: the gate is held open), each guess in several GUESS_REQUEST_BYTES requests (this model's records are
 * 1.5 of them), so a guess its layer does not use may be withdrawn with some of its requests
 * already read. Output must not move: the logits of every placement, with the guesses' reads held
 * until their layer routes (all settle unstarted), delayed (some settle half read) or left to the
 * disk's timing, are bit-identical to a run without the lookahead.
 */
import assert from "node:assert/strict";
import { packCheckpoint } from "../tools/pack.ts";
import { synthCheckpoint } from "../tools/synth.ts";
import { GUESS_REQUEST_BYTES } from "../engine/stream/expert_store.ts";
import { sharedMemory64 } from "../wasm/mod.ts";
import { shimUnavailable } from "../io/shim.ts";
import { evalJson, tempDir } from "./fixtures.ts";

const MODEL_TS = new URL("../engine/model.ts", import.meta.url).href;

/** A streaming Qwen3-MoE whose bf16 records are 768 KiB: 1.5 guess-sized requests each. */
async function model(): Promise<string> {
  const out = `${tempDir()}/guess-depth`;
  const ckpt = await synthCheckpoint({
    arch: "qwen3_moe",
    out,
    size: 2e7,
    seed: 3,
    dtype: "bf16",
    overrides: { hidden: 256, layers: 4, experts: 16, topK: 4, expertInter: 512, vocab: 512 },
    progress: "off",
    log: () => {},
  });
  const path = `${out}.sluice`;
  await packCheckpoint(ckpt.dir, path, { progress: "off", log: () => {} });
  return path;
}

/** Decodes 24 tokens in a child (SLUICE_FAULTS is read once per process); prints logits and
 * counts. */
const CHILD = (path: string, opts: Record<string, unknown>) => `
import { Model } from "${MODEL_TS}";
const m = await Model.open(${JSON.stringify(path)}, { quiet: true, ctx: 64, io: "direct",
  hotList: false, ...${JSON.stringify(opts)} });
const la = m.observers.lookahead;
if (la) la.gate.mode = "always";
const logits = [Array.from(m.forward([1, 7, 9], 0))];
for (let i = 0; i < 24; i++) logits.push(Array.from(m.forward([(37 * i) % 500 + 3], 3 + i)));
const s = m.experts.stats;
console.log(JSON.stringify({ logits, ranks: la?.gate.ranks.length ?? 0, spec: s.speculative, used: s.speculativeUsed, cancelled: s.speculativeCancelled,
  stride: m.experts.stride }));
m.close();
Deno.exit(0);
`;

/** What the child prints: its logits per step and the expert store's guess counters. */
interface GuessRun {
  logits: number[][];
  ranks: number;
  spec: number;
  used: number;
  cancelled: number;
  stride: number;
}

async function decode(path: string, opts: Record<string, unknown>, faults: string | null) {
  const env: Record<string, string> = { NO_COLOR: "1" };
  if (faults) env.SLUICE_FAULTS = faults;
  return await evalJson<GuessRun>(CHILD(path, opts), env);
}

Deno.test({
  name: "guesses of every rank, read in several requests each, change no bit under any placement",
  ignore: shimUnavailable(sharedMemory64(1 << 16)) !== null,
  fn: async () => {
    const path = await model();
    const off = await decode(path, { expertSlots: 12, lookahead: 0 }, null);
    assert.ok(off.stride > GUESS_REQUEST_BYTES && off.stride < 2 * GUESS_REQUEST_BYTES);
    const placements: [string, Record<string, unknown>, string | null][] = [
      ["12 slots, guesses held until routed", { expertSlots: 12, lookahead: 4 }, "hold@experts-L"],
      ["12 slots, expert reads delayed", { expertSlots: 12, lookahead: 4 }, "delay=3@experts-L"],
      [
        "6 slots, 1 reader thread, delayed",
        { expertSlots: 6, ioThreads: 1, lookahead: 4 },
        "delay=2@experts-L",
      ],
      ["30 slots, read-ahead depth 1", { expertSlots: 30, readaheadDepth: 1, lookahead: 4 }, null],
      ["12 slots, 1 compute thread", { expertSlots: 12, threads: 1, lookahead: 4 }, null],
    ];
    for (const [what, opts, faults] of placements) {
      const r = await decode(path, opts, faults);
      assert.equal(r.logits.length, off.logits.length);
      r.logits.forEach((l: number[], i: number) =>
        assert.ok(l.every((x, j) => Object.is(x, off.logits[i][j])), `${what}: step ${i} differs`)
      );
      assert.ok(r.spec > 0, `${what}: no guess was read`);
      assert.equal(r.ranks, 4, `${what}: every top-k expert is ranked`);
      if (faults?.startsWith("hold")) {
        assert.ok(
          r.cancelled > 0 && r.used > 0,
          `${what}: ${r.used} used, ${r.cancelled} withdrawn`,
        );
        assert.equal(r.used + r.cancelled, r.spec, `${what}: every guess settled unstarted`);
      }
    }
  },
});
