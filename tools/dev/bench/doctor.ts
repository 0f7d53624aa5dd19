/**
 * `deno task bench doctor [--repeat 3] [--tokens 100] [--json]`: `doctor`'s tok/s estimate
 * against the decode tok/s `generate` measures at the same budget, side by side in one run
 * (issue 28 item 8). Models: the synthetic demo model at the demo's budget and, with
 * ../shared/models, the stories260k-moe fixture at the demo's budget and whole. Every run is its
 * own `mod.ts … --json` process; the measured figure is the median of `--repeat` generations.
 * Target: estimate ÷ measured within 1.5× either way.
 *
 * @module
 */
import { parseArgs } from "node:util";
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { planInput, planMemory } from "../../../engine/planner.ts";
import { openContainer } from "../../../engine/container.ts";
import { demoModelPath } from "../../demo_model.ts";
import { demoBudget } from "../../demo.ts";
import { packed, SHARED } from "./spec.ts";
import { median } from "./alternate.ts";

const MOD = fileURLToPath(new URL("../../../mod.ts", import.meta.url));

/** How far the estimate may stray from the measured speed, either way. */
const TARGET = 1.5;

/** One model at one budget. */
export interface DoctorRow {
  model: string;
  budget_bytes: number;
  estimate_tok_s: number;
  measured_tok_s: number;
  ratio: number;
  pass: boolean;
}

/** Runs `mod.ts command … --model model --budget budget --json`; returns its JSON. */
async function run(command: string, model: string, budget: number, args: string[]) {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", MOD, command, ...args, "--model", model, "--budget", `${budget}`, "--json"],
    stdin: "null",
    env: { NO_COLOR: "1" },
  }).output();
  if (out.code !== 0) {
    throw new Error(`${command} exited ${out.code}: ${new TextDecoder().decode(out.stderr)}`);
  }
  return JSON.parse(new TextDecoder().decode(out.stdout).trim().split("\n").at(-1)!);
}

/** doctor's estimate and the median measured decode tok/s of `model` at `budget`. */
async function measure(
  model: string,
  budget: number,
  repeat: number,
  tokens: number,
): Promise<DoctorRow> {
  const doctor = await run("doctor", model, budget, ["--bench-size", "8M"]);
  const tokS: number[] = [];
  for (let i = 0; i < repeat; i++) {
    const gen = await run("generate", model, budget, [
      "-p",
      "Once upon a time",
      "-n",
      `${tokens}`,
      "--ignore-eos",
    ]);
    tokS.push(gen.stats.generate_tok_s);
  }
  if (!doctor.model?.estimate) {
    throw new Error(`doctor gave no estimate for ${model} (no DRAM or disk figure, or no fit)`);
  }
  const estimate = doctor.model.estimate.tokPerSecond;
  const measured = median(tokS);
  const ratio = estimate / measured;
  return {
    model,
    budget_bytes: budget,
    estimate_tok_s: estimate,
    measured_tok_s: measured,
    ratio,
    pass: ratio > 1 / TARGET && ratio < TARGET,
  };
}

/** Runs the bench with command-line `args`. */
export async function main(args: string[]): Promise<void> {
  const { values: v } = parseArgs({
    args,
    options: {
      repeat: { type: "string", default: "3" },
      tokens: { type: "string", default: "100" },
      json: { type: "boolean", default: false },
    },
  });
  const repeat = Number(v.repeat), tokens = Number(v.tokens);
  if (!(repeat >= 1 && tokens >= 8)) throw new Error("--repeat ≥ 1 and --tokens ≥ 8 expected");
  const log = (s: string) => console.error(s);
  const cases: [string, number][] = [];
  const demo = await demoModelPath(true);
  cases.push([demo, demoBudget(demo).budget]);
  if (existsSync(`${SHARED}stories260k-moe`)) {
    const cacheDir = Deno.env.get("SLUICE_CACHE") ?? "/tmp/sluice-bench";
    const fixture = await packed(cacheDir, "stories260k-moe", log);
    const whole = planMemory(planInput(openContainer(fixture)), { ctx: 512, maxBatch: 64 });
    cases.push([fixture, demoBudget(fixture).budget], [fixture, whole.wholeModelBytes]);
  } else {
    log(`bench doctor: no ${SHARED}stories260k-moe, the demo model only`);
  }
  const rows: DoctorRow[] = [];
  for (const [model, budget] of cases) {
    log(`bench doctor: ${model} at ${(budget / 2 ** 20).toFixed(1)} MiB`);
    rows.push(await measure(model, budget, repeat, tokens));
  }
  const load = Deno.loadavg();
  if (v.json) {
    console.log(JSON.stringify({ repeat, tokens, load_average: load, target: TARGET, rows }));
    return;
  }
  console.log(
    `bench doctor: estimate ÷ measured decode tok/s (median of ${repeat} × ${tokens} tokens); ` +
      `load ${load.map((x) => x.toFixed(1)).join(" ")}`,
  );
  for (const r of rows) {
    console.log(
      `  ${r.model} at ${(r.budget_bytes / 2 ** 20).toFixed(1)} MiB: estimate ${
        r.estimate_tok_s.toFixed(0)
      } tok/s, measured ${r.measured_tok_s.toFixed(0)} tok/s, ${r.ratio.toFixed(2)}× ` +
        `(target within ${TARGET}×) ${r.pass ? "PASS" : "FAIL"}`,
    );
  }
}
