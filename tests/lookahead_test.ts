/**
 * The lookahead's gate: predictions are always scored, and read only while what the store
 * measured they save (precision × the share landed in time × a record's disk time) beats what
 * they cost (disk time reads the engine needed spent behind guesses, and the slots wrong guesses
 * took). Output never depends on it: tokens and logits are the same with it forced open, forced
 * shut and measured (tests/streaming_test.ts also runs the lookahead among the placements).
 */
import assert from "node:assert/strict";
import { Model } from "../engine/model.ts";
import {
  GATE_PROBE_EVERY,
  GATE_WINDOW,
  guessRoom,
  type SpeculationCosts,
  SpeculationGate,
} from "../engine/stream/lookahead.ts";
import { sharedMemory64 } from "../wasm/mod.ts";
import { shimUnavailable } from "../io/shim.ts";
import { evalJson, HAVE_FIXTURES, packedFixture } from "./fixtures.ts";

/** The store's starting costs: a whole record blocked per guess, all of it hidden, no regret. */
const START: SpeculationCosts = { recordMs: 9, hidden: 1, blockedMs: 9, regret: 0 };

/** The gate's precision recomputed from scratch: decayed hits over decayed guesses from 1/2. */
function referencePrecision(records: [number, number][]): number {
  const keep = 1 - 1 / GATE_WINDOW;
  let hits = 0.5, guesses = 1;
  for (const [g, h] of records) {
    hits = hits * keep + h;
    guesses = guesses * keep + g;
  }
  return hits / guesses;
}

/** Routed flags of a prediction of `guessed` guesses whose first `hits` were routed. */
const ranks = (guessed: number, hits: number) =>
  Array.from({ length: guessed }, (_, k) => k < hits);

/** A gate whose precision is `hits` of `guessed` after `n` identical predictions. */
function gateAt(guessed: number, hits: number, n = 600): SpeculationGate {
  const gate = new SpeculationGate();
  for (let i = 0; i < n; i++) gate.record(ranks(guessed, hits));
  return gate;
}

Deno.test("gate: precision is the decayed share of predicted experts that were routed", () => {
  const gate = new SpeculationGate();
  const records: [number, number][] = [];
  for (const [g, h] of [[2, 2], [2, 0], [4, 3], [1, 1], [3, 0], [8, 5]] as [number, number][]) {
    for (let i = 0; i < 7; i++) {
      gate.record(ranks(g, h));
      records.push([g, h]);
      assert.ok(Math.abs(gate.precision - referencePrecision(records)) < 1e-12);
    }
  }
});

Deno.test("gate: reads when the measured saving beats the measured cost, else holds", () => {
  const rec = 6; // ms of disk per record
  // Precision 3/4: a guess saves 0.75 × hidden × 6 ms, and costs 0.25 × (blocked + regret × 6).
  const cases: [SpeculationCosts, boolean, string][] = [
    [{ recordMs: rec, hidden: 1, blockedMs: 0, regret: 0 }, true, "free guesses"],
    [{ recordMs: rec, hidden: 1, blockedMs: 12, regret: 0 }, true, "4.5 saved, 3 lost"],
    [{ recordMs: rec, hidden: 1, blockedMs: 24, regret: 0 }, false, "4.5 saved, 6 lost"],
    [{ recordMs: rec, hidden: 0.1, blockedMs: 4, regret: 0 }, false, "landed too late"],
    [{ recordMs: rec, hidden: 0.5, blockedMs: 1, regret: 1 }, true, "2.25 saved, 1.75 lost"],
    [{ recordMs: rec, hidden: 0.5, blockedMs: 6, regret: 1 }, false, "2.25 saved, 3 lost"],
  ];
  for (const [costs, reads, why] of cases) {
    // Every rank right 3 times in 4, at different predictions.
    const gate = new SpeculationGate();
    for (let i = 0; i < 600; i++) gate.record([0, 1, 2].map((k) => (i + k) % 4 !== 0));
    // A decayed share of a periodic sequence swings a little around its mean.
    assert.ok(Math.abs(gate.precision - 0.75) < 0.04, `precision ${gate.precision}`);
    assert.equal(gate.decide(costs, 3), reads ? 3 : 0, why);
  }
  // The same costs open for good guesses and shut for poor ones (every rank alike).
  const costs = { recordMs: rec, hidden: 0.8, blockedMs: 1.5, regret: 0.3 };
  const uniform = (tenths: number) => {
    const gate = new SpeculationGate();
    for (let i = 0; i < 600; i++) gate.record([0, 1].map((k) => (i + k) % 10 < tenths));
    return gate;
  };
  assert.equal(uniform(9).decide(costs, 2), 2);
  assert.equal(uniform(2).decide(costs, 2), 0);
});

Deno.test("gate: each rank has its own precision; the leading ranks that pay are read", () => {
  const gate = new SpeculationGate();
  // Rank 0 always routed, rank 1 two times in three, rank 2 one in ten, rank 3 never.
  for (let i = 0; i < 600; i++) gate.record([true, i % 3 !== 0, i % 10 === 0, false]);
  assert.ok(Math.abs(gate.precisionAt(1) - 2 / 3) < 0.02);
  // A guess of precision p saves 6p ms and costs (1 − p) × the blocked time.
  const costs = (blockedMs: number) => ({ recordMs: 6, hidden: 1, blockedMs, regret: 0 });
  assert.equal(gate.decide(costs(0.1), 4), 3, "rank 2 saves about 0.6 ms, rank 3 nothing");
  assert.equal(gate.decide(costs(1), 4), 2, "rank 2 no longer pays");
  assert.equal(gate.decide(costs(1), 1), 1, "never more than asked");
  assert.equal(gate.decide(costs(10), 4), 2, "rank 1 saves about 4 ms and costs 10 / 3");
  assert.equal(gate.decide(costs(14), 4), 1, "rank 1 no longer pays");
  assert.equal(gate.decide({ ...costs(1), hidden: 0 }, 4), 0, "nothing lands in time");
  // With regret, a wrong guess also costs the record it evicted: at full regret rank 1 costs
  // (1/3) × (1 + 6) of its 4 ms, and (1/3) × (7 + 6) at 7 ms blocked.
  assert.equal(gate.decide({ recordMs: 6, hidden: 1, blockedMs: 1, regret: 1 }, 4), 2);
  assert.equal(gate.decide({ recordMs: 6, hidden: 1, blockedMs: 7, regret: 1 }, 4), 1);
});

Deno.test("gate: a floor keeps ranks below it unread even when reads cost nothing", () => {
  const free = { recordMs: 6, hidden: 1, blockedMs: 0, regret: 0 };
  const gate = new SpeculationGate(0.5);
  // Rank 0 right 9 times in 10, rank 1 one in 10, rank 2 two in 3.
  for (let i = 0; i < 600; i++) gate.record([i % 10 !== 0, i % 10 === 0, i % 3 !== 0]);
  assert.equal(gate.decide(free, 3), 1, "rank 1 stops the leading ranks that are read");
  const open = new SpeculationGate();
  for (let i = 0; i < 600; i++) open.record([i % 10 !== 0, i % 10 === 0, i % 3 !== 0]);
  assert.equal(open.decide(free, 3), 3, "without the floor free guesses are all read");
});

Deno.test("gate: before any measurement it reads exactly while precision ≥ 1/2", () => {
  assert.equal(new SpeculationGate().decide(START, 1), 1, "a fresh gate reads its first guess");
  const gateOf = (routed: (i: number) => boolean) => {
    const gate = new SpeculationGate();
    for (let i = 0; i < 600; i++) gate.record([routed(i)]);
    return gate;
  };
  assert.equal(gateOf((i) => i % 10 < 7).decide(START, 1), 1, "precision 0.7");
  assert.equal(gateOf((i) => i % 10 < 3).decide(START, 1), 0, "precision 0.3");
});

Deno.test("gate: a closed gate still reads one guess every GATE_PROBE_EVERY predictions", () => {
  const gate = gateAt(4, 0);
  const costs = { recordMs: 6, hidden: 1, blockedMs: 3, regret: 0 };
  const reads = Array.from({ length: 3 * GATE_PROBE_EVERY }, () => gate.decide(costs, 4));
  assert.deepEqual(
    reads.map((n, i) => [i, n]).filter(([, n]) => n > 0),
    [[GATE_PROBE_EVERY - 1, 1], [2 * GATE_PROBE_EVERY - 1, 1], [3 * GATE_PROBE_EVERY - 1, 1]],
  );
  gate.mode = "always";
  assert.equal(gate.decide(costs, 4), 4);
  gate.mode = "never";
  assert.equal(gate.decide({ ...costs, blockedMs: 0 }, 4), 0);
});

/**
 * Decodes the fixture's tokens with the gate in `mode`; returns the logits and the counts. With
 * `costs` the gate decides from those instead of the store's measurements (which follow the
 * machine's load), so what it reads is the same on every run.
 */
async function decodeWith(
  lookahead: number,
  mode: SpeculationGate["mode"],
  costs?: SpeculationCosts,
) {
  const path = await packedFixture("stories260k-moe64");
  const model = await Model.open(path, { quiet: true, ctx: 64, expertSlots: 80, lookahead });
  try {
    const la = model.observers.lookahead;
    la?.setMode(mode);
    if (la && costs) la.costs = () => costs;
    const logits: number[][] = [Array.from(model.forward([1, 403, 407], 0))];
    const tokens = [261, 378, 432, 383, 286, 261, 376, 298];
    tokens.forEach((t, i) => logits.push(Array.from(model.forward([t], 3 + i))));
    return { logits, la, spec: model.experts!.stats.speculative };
  } finally {
    model.close();
  }
}

Deno.test("guessing every expert (precision 4/64) reads only the leading ranks", async () => {
  const r = await decodeWith(64, "measured", START);
  const la = r.la!;
  assert.ok(la.gate.precision < 0.1);
  assert.equal(la.recall, 1, "a guess of every expert contains every routed one");
  // The router's own top guesses are right far more often than its last ones, and only the first
  // prediction (every rank at its starting precision of 1/2) may read all 64.
  assert.ok(la.gate.precisionAt(0) > 0.5 && la.gate.precisionAt(63) < 0.05);
  // 5 MoE layers: layers 1..4 are predicted from 0..3, layer 0 from the embedding (its own gate).
  assert.equal(la.gate.decisions, 8 * 4);
  assert.equal(la.embeddingGate.decisions, 8);
  const predictions = la.gates.reduce((n, g) => n + g.decisions, 0);
  assert.ok(r.spec < 4 * 64 + 8 * predictions, `${r.spec} reads in ${predictions} predictions`);
});

Deno.test("costs that never pay leave only the probes: one guess every GATE_PROBE_EVERY", async () => {
  // A guess blocks demand reads for far longer than it could save, at any precision below 1.
  const r = await decodeWith(4, "measured", { ...START, blockedMs: 1e6 });
  const la = r.la!;
  const probes = la.gates.reduce((n, g) => n + Math.floor(g.decisions / GATE_PROBE_EVERY), 0);
  const predictions = la.gates.reduce((n, g) => n + g.decisions, 0);
  assert.equal(la.stats.skipped, predictions - probes);
  assert.ok(r.spec <= probes, `${r.spec} reads in ${probes} probes`);
});

Deno.test("guess room: one guess, plus the records the layers' wait would read in", () => {
  assert.equal(guessRoom(START), Infinity, "no wait measured: no bound");
  assert.equal(guessRoom({ ...START, waitMs: 0 }), 1);
  assert.equal(guessRoom({ ...START, waitMs: 8.9 }), 1);
  assert.equal(guessRoom({ ...START, waitMs: 27 }), 4);
});

Deno.test("the next layer's guesses read no more than the room, held ones skipped", async () => {
  // Every rank held open: with no wait each prediction of the next layer starts one read, with a
  // long wait up to all four; the embedding's guesses are not bounded by it.
  const tight = await decodeWith(4, "always", { ...START, waitMs: 0 });
  const wide = await decodeWith(4, "always", { ...START, waitMs: 1e6 });
  const la = tight.la!;
  const embedding = 4 * la.embeddingGate.decisions;
  assert.ok(tight.spec <= la.gate.decisions + embedding, `${tight.spec} reads`);
  assert.ok(
    tight.spec < wide.spec,
    `${tight.spec} reads with no wait, ${wide.spec} with a long one`,
  );
  assert.deepEqual(tight.logits, wide.logits);
});

Deno.test("logits are bit-identical with the gate forced open, forced shut and measured", async () => {
  const off = await decodeWith(0, "measured");
  for (const mode of ["always", "never", "measured"] as const) {
    const r = await decodeWith(4, mode);
    assert.deepEqual(r.logits, off.logits, `gate ${mode}`);
    if (mode === "always") assert.ok(r.spec > 0 && r.la!.stats.skipped === 0);
    if (mode === "never") assert.equal(r.spec, 0);
  }
});

const MODEL_TS = new URL("../engine/model.ts", import.meta.url).href;

/**
 * How each gate of the child's lookahead decides: the next layer's, the embedding's, the guessed
 * next token's, the recent routes'.
 */
type GateModes = SpeculationGate["mode"][];

/**
 * A child that decodes `path` (8 tokens over and over) with `slots` expert slots and the lookahead's gates pinned to `modes` (SLUICE_FAULTS is read
 * once per process), then runs a two-token prompt chunk, which predicts nothing and settles the
 * last token's tail guesses: prints every step's logits and the store's speculative counts.
 */
const DECODE_CHILD = (path: string, lookahead: number, modes: GateModes, slots: number) => `
import { Model } from "${MODEL_TS}";
const m = await Model.open(${JSON.stringify(path)}, { quiet: true, ctx: 64, expertSlots: ${slots},
  lookahead: ${lookahead}, io: "direct" });
const modes = ${JSON.stringify(modes)};
m.observers.lookahead?.gates.forEach((g, i) => g.mode = modes[i]);
const logits = [Array.from(m.forward([1, 403, 407], 0))];
for (let i = 0; i < 40; i++) logits.push(Array.from(m.forward([31 * (i % 8) + 261], 3 + i)));
logits.push(Array.from(m.forward([286, 298], 43)));
const s = m.experts.stats;
m.close();
console.log(JSON.stringify({ logits, used: s.speculativeUsed, cancelled: s.speculativeCancelled,
  spec: s.speculative }));
Deno.exit(0);
`;

/** What the decode child prints: its logits per step and the speculative read counters. */
interface DecodeRun {
  logits: number[][];
  used: number;
  cancelled: number;
  spec: number;
}

async function decodeChild(
  path: string,
  lookahead: number,
  faults: string | null,
  modes: GateModes = ["always", "always", "always", "always"],
  slots = 200,
) {
  const env: Record<string, string> = { NO_COLOR: "1" };
  if (faults) env.SLUICE_FAULTS = faults;
  return await evalJson<DecodeRun>(DECODE_CHILD(path, lookahead, modes, slots), env);
}

/** Asserts two children's logits are the same bits, step by step. */
function assertSameLogits(got: { logits: number[][] }, want: { logits: number[][] }): void {
  assert.equal(got.logits.length, want.logits.length);
  // Compared token by token: a whole-run diff of 42 × 512 floats takes minutes to print.
  got.logits.forEach((l, i) => {
    assert.ok(l.every((x, j) => Object.is(x, want.logits[i][j])), `logits of step ${i} differ`);
  });
}

Deno.test({
  name: "logits are bit-identical when unstarted guesses are promoted and withdrawn",
  ignore: !HAVE_FIXTURES || shimUnavailable(sharedMemory64(1 << 16)) !== null,
  fn: async () => {
    const path = await packedFixture("stories260k-moe64");
    const off = await decodeChild(path, 0, null);
    // Held guesses (SLUICE_FAULTS "hold": a speculative expert read starts only once it is waited
    // for or promoted) are all still queued when their layer is routed, whatever the machine's
    // load: each is promoted or withdrawn. With most experts cached, a withdrawn guess left in the
    // cache would be hit (and computed on) before it is evicted.
    const slow = await decodeChild(path, 4, "hold@experts-L");
    assertSameLogits(slow, off);
    assert.ok(slow.used > 0, "some guesses were used");
    assert.ok(slow.cancelled > 0, "some wrong guesses were withdrawn before they ran");
    assert.equal(slow.used + slow.cancelled, slow.spec, "every guess was settled unstarted");
  },
});

Deno.test({
  name: "the next token's first-layer guesses change no bit and all settle",
  ignore: !HAVE_FIXTURES || shimUnavailable(sharedMemory64(1 << 16)) !== null,
  fn: async () => {
    const path = await packedFixture("stories260k-moe64");
    const off = await decodeChild(path, 0, null);
    // Only one kind of guess at a time, each held unstarted until its layer routes: the first
    // MoE layer's from the token's embedding, from the guessed next token's embedding during the
    // tail (the child's tokens repeat with period 8, so from the ninth on the guess is the right
    // token), then from recent tokens' routes during the tail (in a cache of 2 tokens' experts,
    // which evicts some of them).
    const kinds: GateModes[] = [
      ["never", "always", "never", "never"],
      ["never", "never", "always", "never"],
      ["never", "never", "never", "always"],
    ];
    for (const modes of kinds) {
      const r = await decodeChild(path, 4, "hold@experts-L", modes, 40);
      assertSameLogits(r, off);
      assert.ok(r.spec > 0, `${modes}: guesses were read`);
      assert.ok(
        r.used > 0 && r.cancelled > 0,
        `${modes}: ${r.used} used, ${r.cancelled} withdrawn`,
      );
      assert.equal(r.used + r.cancelled, r.spec, `${modes}: every guess was settled unstarted`);
    }
  },
});

Deno.test("a batched pass predicts for each decoding sequence, never for a prompt chunk's rows", async () => {
  const path = await packedFixture("stories260k-moe64");
  const model = await Model.open(path, {
    quiet: true,
    ctx: 64,
    expertSlots: 80,
    lookahead: 4,
    parallel: 3,
  });
  try {
    const la = model.observers.lookahead!;
    la.setMode("always");
    // 5 MoE layers: layers 1..4 are predicted from 0..3 and layer 0 from the embedding, each
    // against top-4.
    const scored = (rows: number) => rows * 5 * 4;
    model.forwardBatch([{ seq: 0, tokens: [1, 403, 407], pos: 0 }]);
    model.forwardBatch([{ seq: 1, tokens: [1, 261, 378], pos: 0 }]);
    assert.equal(la.stats.routed, 0, "prompt chunks predict nothing");
    const spec = model.experts!.stats.speculative;
    model.forwardBatch([{ seq: 0, tokens: [261], pos: 3 }, { seq: 1, tokens: [432], pos: 3 }]);
    assert.equal(la.stats.routed, scored(2), "both decoding sequences are predicted");
    assert.ok(model.experts!.stats.speculative > spec, "their guesses are read");
    // A decode row beside a prompt chunk: only the decode row is predicted.
    model.forwardBatch([
      { seq: 0, tokens: [383], pos: 4 },
      { seq: 2, tokens: [1, 286, 261, 376], pos: 0 },
      { seq: 1, tokens: [298], pos: 4 },
    ]);
    assert.equal(la.stats.routed, scored(4), "the decode rows, not the chunk's");
  } finally {
    model.close();
  }
});
