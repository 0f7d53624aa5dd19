/**
 * The lookahead's precision gate: predictions are always scored, but read only while their recent
 * precision is at least 1/2. Output never depends on it (tests/streaming_test.ts runs the
 * lookahead among the placement settings); here, that the gate opens and closes on counts alone.
 */
import assert from "node:assert/strict";
import { Model } from "../engine/model.ts";
import { GATE_THRESHOLD, GATE_WINDOW, PrecisionGate } from "../engine/stream/lookahead.ts";
import { packedFixture } from "./fixtures.ts";

/** The gate's precision recomputed from scratch: decayed hits over decayed guesses. */
function referencePrecision(records: [number, number][]): number {
  const keep = 1 - 1 / GATE_WINDOW;
  let hits = GATE_THRESHOLD, guesses = 1;
  for (const [g, h] of records) {
    hits = hits * keep + h;
    guesses = guesses * keep + g;
  }
  return hits / guesses;
}

Deno.test("precision gate: starts open, closes after misses, reopens after hits", () => {
  const gate = new PrecisionGate();
  assert.ok(gate.open, "a fresh gate reads its first guesses");
  const records: [number, number][] = [];
  const add = (g: number, h: number) => {
    gate.record(g, h);
    records.push([g, h]);
    assert.ok(Math.abs(gate.precision - referencePrecision(records)) < 1e-12);
    assert.equal(gate.open, gate.precision >= GATE_THRESHOLD);
  };
  for (let i = 0; i < 10; i++) add(2, 2);
  assert.ok(gate.open);
  let closedAfter = -1;
  for (let i = 0; i < 100 && closedAfter < 0; i++) {
    add(2, 0);
    if (!gate.open) closedAfter = i + 1;
  }
  // Ten perfect guesses hold the gate open for a few misses, not for a window of them.
  assert.ok(closedAfter > 1 && closedAfter < GATE_WINDOW, `closed after ${closedAfter} misses`);
  let reopenedAfter = -1;
  for (let i = 0; i < 100 && reopenedAfter < 0; i++) {
    add(4, 3);
    if (gate.open) reopenedAfter = i + 1;
  }
  assert.ok(reopenedAfter > 0 && reopenedAfter < GATE_WINDOW, `reopened after ${reopenedAfter}`);
});

Deno.test("guessing every expert (precision 4/64) reads only the first guess", async () => {
  const path = await packedFixture("stories260k-moe64");
  const model = await Model.open(path, { quiet: true, ctx: 64, expertSlots: 80, lookahead: 64 });
  try {
    model.forward([1, 403, 407], 0);
    const tokens = [261, 378, 432, 383, 286, 261, 376, 298];
    tokens.forEach((t, i) => model.forward([t], 3 + i));
    const la = model.observers.lookahead!;
    // 5 MoE layers: each decode token predicts layers 1..4 from 0..3.
    const predictions = tokens.length * 4;
    assert.equal(la.stats.skipped, predictions - 1);
    assert.ok(model.experts!.stats.speculative <= 64, `${model.experts!.stats.speculative} reads`);
    assert.ok(la.gate.precision < 0.1);
    assert.equal(la.recall, 1, "a guess of every expert contains every routed one");
  } finally {
    model.close();
  }
});
