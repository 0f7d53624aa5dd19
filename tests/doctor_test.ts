/**
 * `mod.ts doctor` on the synthetic demo model: it measures real reads in the directory it is
 * given and leaves nothing there; its recommendation follows the plan; its tok/s estimate obeys
 * the plan's arithmetic (nothing from disk when everything is cached, more disk bytes and fewer
 * tok/s as the budget shrinks) and is computed from its probe run's measurements as stated. How
 * close the estimate comes to a run is a timing, measured by `deno task bench doctor`.
 */
import assert from "node:assert/strict";
import { readdirSync } from "node:fs";
import { join } from "node:path";
import { planInput, planMemory } from "../engine/planner.ts";
import { openContainer } from "../engine/container.ts";
import { estimateTokens, probeOf } from "../tools/cli/doctor.ts";
import { demoModelPath } from "../tools/demo_model.ts";
import { tempDir } from "./fixtures.ts";

const MOD = new URL("../mod.ts", import.meta.url).pathname;
const CACHE = join(tempDir(), "cache");

Deno.test("doctor --json measures the disk where asked and plans the model", async () => {
  const model = await demoModelPath(true, CACHE);
  const dir = Deno.makeTempDirSync({ dir: tempDir(), prefix: "doctor-" });
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      MOD,
      "doctor",
      "--model",
      model,
      "--dir",
      dir,
      "--bench-size",
      "8M",
      "--json",
    ],
    stdin: "null",
    env: { NO_COLOR: "1" },
  }).output();
  const stderr = new TextDecoder().decode(out.stderr);
  assert.equal(out.code, 0, stderr);
  const r = JSON.parse(new TextDecoder().decode(out.stdout));
  assert.deepEqual(readdirSync(dir), [], "the test file is removed");
  assert.equal(r.dir, dir);
  assert.ok(r.cpu.cores >= 1);
  assert.ok(r.freeDiskBytes > 0);
  assert.ok(r.disk.sequentialGbps > 0 && r.disk.random.gbps > 0);
  const stride = planInput(openContainer(model)).expertStride;
  assert.equal(r.disk.recordBytes, stride, "random reads are one expert record each");
  assert.ok(r.model.recommendedBudget >= r.model.floor);
  assert.equal(r.model.totalExperts, 64);
  // The estimate (null without a DRAM figure) is the probe's compute and I/O wait per pass, one
  // after the other.
  const { probe, estimate } = r.model;
  assert.ok(probe.computeMs > 0 && probe.ioWaitMs >= 0);
  const near = (x: number, y: number) => Math.abs(x - y) <= 1e-9 * y;
  if (estimate !== null) {
    assert.ok(near(estimate.tokPerSecond, 1000 / (probe.computeMs + probe.ioWaitMs)));
    assert.ok(
      near(estimate.ceilingTokPerSecond, 1000 / Math.max(probe.computeMs, probe.ioWaitMs)),
    );
  }
});

Deno.test("doctor's probe: compute per pass over every run, I/O wait per pass of the first", () => {
  const runs = [
    { passes: 32, computeMs: 80, ioWaitMs: 48 },
    { passes: 32, computeMs: 64, ioWaitMs: 4 },
    { passes: 16, computeMs: 16, ioWaitMs: 0 },
  ];
  assert.deepEqual(probeOf(runs), { computeMs: 160 / 80, ioWaitMs: 48 / 32 });
});

Deno.test("doctor's estimate from a probe: its times per pass, the disk bytes from the plan", async () => {
  const c = openContainer(await demoModelPath(true, CACHE));
  const input = planInput(c);
  const plan = planMemory(input, { ctx: 256, maxBatch: 64 });
  const moeReads = c.config.layerKinds.filter((k) => k === "moe").length * c.config.moe!.topK;
  const disk = { sequentialGbps: 2, randomGbps: 1 };
  const plain = estimateTokens(plan, input.layerBytes, input.expertStride, moeReads, disk, 20);
  const probed = estimateTokens(plan, input.layerBytes, input.expertStride, moeReads, disk, 20, {
    computeMs: 3,
    ioWaitMs: 1,
  });
  assert.equal(probed.tokPerSecond, 1000 / 4);
  assert.equal(probed.ceilingTokPerSecond, 1000 / 3);
  assert.equal(probed.diskBytesPerToken, plain.diskBytesPerToken);
  assert.equal(probed.memoryBytesPerToken, plan.workingSetBytes);
});

Deno.test("doctor's estimate: disk bytes and tok/s follow the plan", async () => {
  const c = openContainer(await demoModelPath(true, CACHE));
  const input = planInput(c);
  const moeReads = c.config.layerKinds.filter((k) => k === "moe").length * c.config.moe!.topK;
  const disk = { sequentialGbps: 2, randomGbps: 1 };
  const at = (budget?: number) =>
    estimateTokens(
      planMemory(input, { budget, ctx: 256, maxBatch: 64 }),
      input.layerBytes,
      input.expertStride,
      moeReads,
      disk,
      20,
    );
  const whole = at();
  assert.equal(whole.diskBytesPerToken, 0);
  assert.equal(whole.tokPerSecond, whole.ceilingTokPerSecond);
  const floor = planMemory(input, { ctx: 256, maxBatch: 64 }).floor;
  const tight = at(floor);
  const mid = at((floor + whole.budget) / 2);
  assert.ok(tight.diskBytesPerToken > mid.diskBytesPerToken && mid.diskBytesPerToken > 0);
  assert.ok(tight.tokPerSecond < mid.tokPerSecond && mid.tokPerSecond < whole.tokPerSecond);
  assert.ok(tight.tokPerSecond <= tight.ceilingTokPerSecond);
  // At the floor only 2 × top_k records are cached: almost every routed expert is read.
  const plan = planMemory(input, { budget: floor, ctx: 256, maxBatch: 64 });
  const miss = 1 - plan.expertSlots / plan.totalExperts;
  const trunk = input.layerBytes.slice(plan.pinned).reduce((a, b) => a + b, 0);
  assert.equal(tight.diskBytesPerToken, trunk + moeReads * miss * input.expertStride);
});
