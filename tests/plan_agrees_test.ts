/**
 * `plan` and `generate` agree (issue 28 item 8: once `plan` said 11 expert records at `--budget
 * 4M` on the demo model where `generate` used 9): at the floor, between steps, with a smaller
 * context and with the whole model, the pinned trunk layers, ring slots and expert records `plan
 * --json` reports are those `generate` starts with, on the demo model and on fixtures of three
 * families (skipped without ../shared/models).
 */
import assert from "node:assert/strict";
import { demoModelPath } from "../tools/demo_model.ts";
import { openContainer } from "../engine/container.ts";
import { planRun } from "../engine/model.ts";
import { packCheckpoint } from "../tools/pack.ts";
import { synthCheckpoint } from "../tools/synth.ts";
import { hasFixture, packedFixture, runSluice, tempDir } from "./fixtures.ts";
import { skipIf } from "./skips.ts";

/** What `generate` says it started with (the engine's start-up line). */
function started(stderr: string): { pinned: number; ringSlots: number; expertSlots: number } {
  const m =
    /^sluice: budget [^;]+; trunk (\d+)\/\d+ layers pinned(?:, (\d+) ring slot)?.*expert cache (\d+) records/m
      .exec(stderr);
  assert.ok(m, stderr);
  return { pinned: Number(m[1]), ringSlots: Number(m[2] ?? 0), expertSlots: Number(m[3]) };
}

/** `plan --json` on the container at `model` with `args`. */
async function plan(model: string, args: string[]) {
  const r = await runSluice(["plan", "-m", model, "--json", ...args]);
  assert.equal(r.code, 0, r.stderr);
  return JSON.parse(r.stdout);
}

/** Asserts `generate` starts with what `plan` says at `args`; returns the expert records. */
async function agreeAt(model: string, args: string[]): Promise<number> {
  const p = await plan(model, args);
  const gen = await runSluice(["generate", "-m", model, "--prompt-ids", "1,2", "-n", "1", ...args]);
  assert.equal(gen.code, 0, gen.stderr);
  assert.deepEqual(
    started(gen.stderr),
    { pinned: p.pinned, ringSlots: p.ringSlots, expertSlots: p.expertSlots },
    `${model} ${args.join(" ")}`,
  );
  return p.expertSlots;
}

/** Checks `plan` against `generate` on the container at `model` (see the module doc). */
async function agree(model: string): Promise<void> {
  const { floor, wholeModelBytes } = await plan(model, []);
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
  for (const args of cases) seen.add(await agreeAt(model, args));
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

Deno.test("the default lookahead is weighed: off where its routers would unpin a layer, and generate agrees", async () => {
  // Small records and many experts: the routers (256 KiB) weigh as much as a few trunk layers.
  const out = `${tempDir()}/lookahead-weighed`;
  const ckpt = await synthCheckpoint({
    arch: "qwen3_moe",
    out,
    size: 2e6,
    seed: 5,
    dtype: "f32",
    overrides: { hidden: 64, layers: 4, experts: 256, topK: 4, expertInter: 16, vocab: 512 },
    progress: "off",
    log: () => {},
  });
  const model = `${out}.sluice`;
  await packCheckpoint(ckpt.dir, model, { progress: "off", log: () => {} });
  const c = openContainer(model);
  const whole = planRun(c, { lookahead: 1, quiet: true }).plan;
  let off: number | null = null, on = 0;
  for (let budget = whole.floor; budget < whole.wholeModelBytes; budget += 64 * 1024) {
    const { plan, lookahead, lookaheadWeighing: w } = planRun(c, { budget, quiet: true });
    if (!w) {
      // Every record fits without the routers: nothing to guess.
      assert.equal(plan.expertSlots, plan.totalExperts);
      assert.equal(lookahead, 0);
      continue;
    }
    assert.equal(lookahead, w.on ? 1 : 0);
    const without = planRun(c, { budget, lookahead: 0 }).plan;
    const withIt = planRun(c, { budget, lookahead: 1 }).plan;
    assert.deepEqual(plan, w.on ? withIt : without);
    if (withIt.pinned < without.pinned) {
      assert.equal(w.on, false, `budget ${budget}: ${JSON.stringify(w)}`);
      off ??= budget;
    } else if (w.on) on++;
  }
  assert.ok(off !== null && on > 0, `off first at ${off}, on at ${on} budgets`);
  const shown = await runSluice(["plan", "-m", model, "--budget", `${off}`]);
  assert.equal(shown.code, 0, shown.stderr);
  assert.match(shown.stdout, /^lookahead +off: 1 guess per MoE layer would hide ≈ .* displace /m);
  await agreeAt(model, ["--budget", `${off}`]);
});
