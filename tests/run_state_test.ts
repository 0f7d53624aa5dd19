/**
 * The run state sizes itself from the parts: what every part declares is what the engine
 * allocates (an open model's arena ends within the planner's slack of its plan, never past it),
 * and `plan` agrees with the run: the floor it prints is the budget `generate` starts at and
 * refuses below, and the expert records it shows at a budget are the ones the run gets.
 */
import assert from "node:assert/strict";
import { PAGE } from "../engine/arena.ts";
import { Model } from "../engine/model.ts";
import { hasFixture, packedFixture, runSluice } from "./fixtures.ts";

/**
 * One fixture of each set of parts: GQA, MLA, KDA + MLA, sinks and windows, K3's parts, Gated
 * DeltaNet + gated GQA (flat and fused per key head), Gemma 4's (two attention geometries,
 * sandwich norms, a dense MLP beside the MoE), MiniMax-M2's FP8, MLA with a sparse-attention indexer,
 * and KDA + NoPE MLA with the k-pool indexer under hyper-connections.
 */
const FIXTURES = [
  "stories260k",
  "stories260k-moe",
  "tiny-deepseek-v3",
  "tiny-glm5",
  "tiny-glm5-next",
  "tiny-kimi-linear",
  "tiny-gpt-oss",
  "tiny-kimi-k3",
  "tiny-qwen3.5-moe",
  "tiny-qwen3-next",
  "tiny-gemma4-moe",
  "tiny-minimax-m2-fp8",
].filter(hasFixture);

/** The planner's pages for regions made on first use (engine/planner.ts SLACK_PAGES). */
const SLACK = 32 * PAGE;

for (const name of FIXTURES) {
  Deno.test(`${name}: the arena after a forward pass is the plan less at most its slack`, async () => {
    const path = await packedFixture(name);
    for (const budget of [undefined, "floor"] as const) {
      const probe = await Model.open(path, { quiet: true, hotList: false, lookahead: 0 });
      const floor = probe.plan.floor;
      probe.close();
      const m = await Model.open(path, {
        quiet: true,
        hotList: false,
        lookahead: 0,
        budget: budget === "floor" ? floor : undefined,
      });
      try {
        m.forward([1, 2, 3], 0);
        m.forward([4], 3);
        const unused = m.plan.arenaBytes - m.arena.used;
        assert.ok(unused >= 0, `${name}: the arena used ${-unused} bytes past its plan`);
        assert.ok(
          unused <= SLACK,
          `${name} at ${budget ?? "the whole model"}: ${unused} bytes of the plan were never ` +
            `allocated (declared scratch larger than what the parts allocate)`,
        );
      } finally {
        m.close();
      }
    }
  });
}

for (const name of ["tiny-kimi-linear", "stories260k-moe"].filter(hasFixture)) {
  Deno.test(`${name}: plan's floor and expert records are generate's`, async () => {
    const path = await packedFixture(name);
    const plan = async (...args: string[]) => {
      const r = await runSluice(["plan", "-m", path, "--json", ...args]);
      assert.equal(r.code, 0, r.stderr);
      return JSON.parse(r.stdout);
    };
    const gen = (budget: number) =>
      runSluice([
        "generate",
        "-m",
        path,
        "--prompt-ids",
        "1,2,3",
        "-n",
        "2",
        "--budget",
        `${budget}`,
      ]);
    const { floor } = await plan();
    const at = await gen(floor);
    assert.equal(at.code, 0, `generate at plan's floor ${floor}: ${at.stderr}`);
    const below = await gen(floor - 65536);
    assert.equal(below.code, 1);
    assert.match(below.stderr, /below the floor/);
    const budget = floor + 1024 * 1024;
    const { expertSlots } = await plan("--budget", `${budget}`);
    const run = await gen(budget);
    assert.equal(run.code, 0, run.stderr);
    assert.match(run.stderr, new RegExp(`expert cache ${expertSlots} records`));
  });
}
