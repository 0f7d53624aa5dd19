/**
 * The budget's steps: generate's mode line (all resident / experts streamed / trunk streamed
 * too), the warning below one token's working set naming a next step that does hold it, and
 * `--preset auto`'s whole working-set steps under its cap.
 */
import assert from "node:assert/strict";
import { openContainer } from "../engine/container.ts";
import { planRun, runFloor } from "../engine/model.ts";
import { autoBudget, workingSetRecords } from "../tools/cli/modes.ts";
import { demoModelPath } from "../tools/demo_model.ts";
import { runSluice } from "./fixtures.ts";

const MiB = 2 ** 20;

/** The mode and warning lines of a short generate at `budget` (none: the whole model). */
async function modeOf(model: string, ...budget: string[]) {
  const r = await runSluice(["generate", "-m", model, "-p", "Once", "-n", "2", ...budget]);
  assert.equal(r.code, 0, r.stderr);
  return {
    mode: /^mode: (.*)$/m.exec(r.stderr)?.[1] ?? "",
    warning: /^warning: (.*)$/m.exec(r.stderr)?.[1] ?? null,
  };
}

Deno.test("generate names its mode and warns below one working set with a next step that holds it", async () => {
  const model = await demoModelPath(true);
  const whole = await modeOf(model);
  assert.match(whole.mode, /^all resident/);
  assert.equal(whole.warning, null);
  const streamed = await modeOf(model, "--budget", "24M");
  assert.match(streamed.mode, /^experts streamed \(trunk resident; expert cache \d+ of 64 records/);
  // At the floor the trunk streams too (a fixed budget would drift with the run's scratch).
  const floor = runFloor(openContainer(model), { ctx: 2048 });
  const low = await modeOf(model, "--budget", `${floor}`, "-c", "2048");
  assert.match(low.mode, /^trunk streamed too \([0-3]\/4 layers pinned; expert cache \d of 64/);
  assert.match(low.warning!, /below one token's working set \(8 = top-2 × 4 MoE layers\)/);
  const next = /the next step up is --budget (\d+)M/.exec(low.warning!)![1];
  const at = await modeOf(model, "--budget", `${next}M`);
  assert.equal(at.warning, null, `at the named step ${next}M: ${at.mode}`);
  assert.match(at.mode, /= 1\.\d working sets of 8|= 2\.\d working sets/);
  const below = await modeOf(model, "--budget", `${Number(next) - 1}M`);
  assert.notEqual(below.warning, null, "one MiB less is below the step: it is the next one up");
});

Deno.test("--preset auto: the whole model when it fits, else the least budget of whole working sets", async () => {
  const c = openContainer(await demoModelPath(true));
  const run = { ctx: 2048 };
  const ws = workingSetRecords(c);
  assert.equal(ws, 8);
  const plan = (budget?: number) => planRun(c, { ...run, budget }).plan;
  assert.equal(autoBudget(c, run, plan().wholeModelBytes), undefined);
  for (const cap of [16 * MiB, 20 * MiB, 30 * MiB]) {
    const b = autoBudget(c, run, cap)!;
    const k = Math.floor(plan(cap).expertSlots / ws);
    assert.ok(b <= cap && k >= 1, `cap ${cap}`);
    assert.ok(plan(b).expertSlots >= k * ws, `${plan(b).expertSlots} records at ${b}`);
    assert.ok(plan(b - 65536).expertSlots < k * ws, `${b} is the least such budget`);
  }
  // Below one working set there is no step to take: the cap itself.
  assert.equal(autoBudget(c, run, 12 * MiB), 12 * MiB);
});
