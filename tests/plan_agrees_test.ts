/**
 * `plan` and `generate` agree (issue 28 item 8: once `plan` said 11 expert records at `--budget
 * 4M` on the demo model where `generate` used 9): at the floor, between steps, with a smaller
 * context and with the whole model, the pinned trunk layers, ring slots and expert records `plan
 * --json` reports are those `generate` starts with, on the demo model and on fixtures of three
 * families (skipped without ../shared/models).
 */
import assert from "node:assert/strict";
import { demoModelPath } from "../tools/demo_model.ts";
import { hasFixture, packedFixture, runSluice } from "./fixtures.ts";
import { skipIf } from "./skips.ts";

/** What `generate` says it started with (the engine's start-up line). */
function started(stderr: string): { pinned: number; ringSlots: number; expertSlots: number } {
  const m =
    /^sluice: budget [^;]+; trunk (\d+)\/\d+ layers pinned(?:, (\d+) ring slot)?.*expert cache (\d+) records/m
      .exec(stderr);
  assert.ok(m, stderr);
  return { pinned: Number(m[1]), ringSlots: Number(m[2] ?? 0), expertSlots: Number(m[3]) };
}

/** Checks `plan` against `generate` on the container at `model` (see the module doc). */
async function agree(model: string): Promise<void> {
  const plan = async (args: string[]) => {
    const r = await runSluice(["plan", "-m", model, "--json", ...args]);
    assert.equal(r.code, 0, r.stderr);
    return JSON.parse(r.stdout);
  };
  const { floor, wholeModelBytes } = await plan([]);
  const at = (share: number) => `${Math.round(floor + share * (wholeModelBytes - floor))}`;
  const cases: string[][] = [
    ["--budget", `${floor}`],
    ["--budget", at(0.1)],
    ["--budget", at(0.3)],
    ["--budget", at(0.6)],
    ["--budget", at(0.2), "-c", "256"],
    [],
  ];
  const seen = new Set<number>();
  for (const args of cases) {
    const p = await plan(args);
    const gen = await runSluice([
      "generate",
      "-m",
      model,
      "--prompt-ids",
      "1,2",
      "-n",
      "1",
      ...args,
    ]);
    assert.equal(gen.code, 0, gen.stderr);
    assert.deepEqual(
      started(gen.stderr),
      { pinned: p.pinned, ringSlots: p.ringSlots, expertSlots: p.expertSlots },
      `${model} ${args.join(" ")}`,
    );
    seen.add(p.expertSlots);
  }
  // The budgets reach different plans, streamed and whole.
  assert.ok(seen.size >= 3, `expert records seen: ${[...seen]}`);
}

Deno.test("plan and generate: the same pinned layers, ring slots and expert records, demo model", async () => {
  await agree(await demoModelPath(true));
});

for (const name of ["stories260k-moe", "tiny-qwen3.5-moe", "tiny-deepseek-v3"]) {
  Deno.test({
    name: `plan and generate: the same pinned layers, ring slots and expert records, ${name}`,
    ignore: skipIf(!hasFixture(name), "need ../shared/models"),
    fn: async () => await agree(await packedFixture(name)),
  });
}
