/**
 * `deno task demo`: the main job on a default model. Packs the stories260k Mixtral fixture from
 * ../shared/models when it is there (else uses the synthetic demo model, random weights), then
 * generates a story under a memory budget of half the model, so expert streaming is visible.
 *
 * @module
 */
import { existsSync } from "node:fs";
import { homedir } from "node:os";
import { fileURLToPath } from "node:url";
import { main } from "./cli/mod.ts";
import { CONTAINER_VERSION } from "../io/container.ts";
import { packCheckpoint } from "./pack.ts";

const fixture = fileURLToPath(new URL("../../shared/models/stories260k-moe", import.meta.url));
const cache = Deno.env.get("SLUICE_CACHE") ?? `${homedir()}/.cache/sluice`;

let model: string | undefined;
if (existsSync(`${fixture}/config.json`)) {
  model = `${cache}/stories260k-moe-v${CONTAINER_VERSION}.sluice`;
  if (!existsSync(model)) {
    Deno.mkdirSync(cache, { recursive: true });
    console.error(`demo: packing ${fixture} → ${model}`);
    await packCheckpoint(fixture, model, {});
  }
}
const args = [
  "generate",
  "--prompt",
  "Once upon a time",
  "-n",
  "200",
  "--budget",
  "4M",
  ...Deno.args,
];
Deno.exit(await main(model ? ["generate", "--model", model, ...args.slice(1)] : args));
