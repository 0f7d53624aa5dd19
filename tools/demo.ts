/**
 * `deno task demo`: the main job on a default model. Packs the stories260k Mixtral fixture from
 * ../shared/models when it is there (else uses the synthetic demo model, random weights), then
 * generates a story under a budget between the model's floor and its whole size, derived from
 * the memory plan, so expert streaming is visible whichever model it is.
 *
 * @module
 */
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { planInput, planMemory } from "../engine/planner.ts";
import { formatBytes } from "../engine/units.ts";
import { CONTAINER_VERSION } from "../io/container.ts";
import { openContainer } from "../engine/container.ts";
import { main } from "./cli/mod.ts";
import { cacheDir, demoModelPath } from "./demo_model.ts";
import { packCheckpoint } from "./pack.ts";

/** Context the demo runs at: the default of `generate` (min(model, 4096)). */
const CTX = 4096;

/**
 * The demo's budget: halfway between the plan's floor and the whole model, rounded down to the
 * arena's 64 KiB pages, so the trunk fits but only part of the experts stay cached.
 */
export function demoBudget(path: string): { budget: number; text: string } {
  const c = openContainer(path);
  const input = planInput(c);
  const ctx = Math.min(CTX, c.config.maxPositions);
  const whole = planMemory(input, { ctx, maxBatch: 64 });
  const budget = Math.floor((whole.floor + (whole.wholeModelBytes - whole.floor) / 2) / 65536) *
    65536;
  const plan = planMemory(input, { budget, ctx, maxBatch: 64 });
  const trunk = plan.pinned === c.config.numLayers
    ? "the trunk pinned"
    : `${plan.pinned}/${c.config.numLayers} trunk layers pinned, the rest streamed`;
  const text = `demo: budget ${formatBytes(budget)} (floor ${formatBytes(plan.floor)}, whole ` +
    `model ${formatBytes(plan.wholeModelBytes)}): ${trunk}, ${plan.expertSlots} of ` +
    `${plan.totalExperts} expert records cached, the others read from disk as the router picks them`;
  return { budget, text };
}

/** What `deno task demo --help` prints. */
const USAGE = `usage: deno task demo [generate options]
Packs the stories260k Mixtral fixture from ../shared/models (or makes the synthetic demo model when
that folder is absent) into the cache, then runs generate on it with the prompt "Once upon a time",
200 tokens and a budget halfway between the plan's floor and the whole model. Options given here
are passed to generate after those and win (e.g. -n 50 --temp 0.8 --budget 4M); see
\`deno run -A mod.ts generate --help\`.`;

if (import.meta.main && (Deno.args.includes("--help") || Deno.args.includes("-h"))) {
  console.log(USAGE);
} else if (import.meta.main) {
  const fixture = fileURLToPath(new URL("../../shared/models/stories260k-moe", import.meta.url));

  let model: string;
  if (existsSync(`${fixture}/config.json`)) {
    model = `${cacheDir()}/stories260k-moe-v${CONTAINER_VERSION}.sluice`;
    if (!existsSync(model)) {
      Deno.mkdirSync(cacheDir(), { recursive: true });
      console.error(`demo: packing ${fixture} → ${model}`);
      await packCheckpoint(fixture, model, {});
    }
  } else {
    model = await demoModelPath(true);
    console.error(
      `demo: ${fixture} is absent, so the demo runs the synthetic demo model ${model} ` +
        `(random weights: its text is gibberish; the streaming is real)`,
    );
  }
  const { budget, text } = demoBudget(model);
  console.error(text);
  Deno.exit(
    await main([
      "generate",
      "--model",
      model,
      "--prompt",
      "Once upon a time",
      "-n",
      "200",
      "--budget",
      String(budget),
      ...Deno.args,
    ]),
  );
}
