/**
 * The stream timeline charges each span between two marks to the phase and layer that opened it,
 * with the disk's busy time over the span (never more than the span itself).
 */
import assert from "node:assert/strict";
import { Timeline } from "../engine/stream/timeline.ts";

/** Spins for `ms` milliseconds (the timeline reads the wall clock). */
function spin(ms: number): void {
  const end = performance.now() + ms;
  while (performance.now() < end) { /* wait */ }
}

Deno.test("timeline: spans go to the phase and layer that opened them, disk time bounded", () => {
  let busy = 0;
  const t = new Timeline(() => busy);
  t.mark("mixer", 0);
  spin(4);
  busy += 1; // the disk worked 1 ms of the mixer's span
  t.mark("wait", 0);
  spin(2);
  busy += 1000; // more than the span: clipped to it
  t.mark("expert", 1);
  spin(1);
  t.countWait(true);
  t.countWait(false);
  t.mark("tail", -1);
  spin(1);
  t.mark("mixer", 0);
  const r = t.totals;
  assert.ok(r.phases.mixer.wallMs >= 4);
  assert.equal(r.phases.mixer.diskMs, 1);
  assert.ok(r.phases.wait.wallMs >= 2);
  assert.equal(r.phases.wait.diskMs, r.phases.wait.wallMs);
  assert.equal(r.phases.expert.diskMs, 0);
  assert.ok(r.phases.tail.wallMs >= 1);
  assert.equal(r.layers.length, 2, "the tail has no layer");
  assert.equal(r.layers[0].mixer.wallMs, r.phases.mixer.wallMs);
  assert.equal(r.layers[1].expert.wallMs, r.phases.expert.wallMs);
  assert.equal(r.layers[1].mixer.wallMs, 0);
  assert.deepEqual([r.waits, r.waitsWithReady], [2, 1]);
  t.reset();
  t.mark("route", 0);
  assert.equal(t.totals.waits, 0);
  assert.ok(t.totals.phases.mixer.wallMs < r.phases.mixer.wallMs, "reset zeroes the totals");
});
