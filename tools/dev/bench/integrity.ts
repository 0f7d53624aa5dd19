/**
 * `deno task bench integrity [--size 512M] [--budget-fraction 0.3] [--tokens 32] [--repeat 3]
 * [--json]`: what the run-time integrity checks cost during streaming decode, measured side by
 * side in one process on the synthetic Qwen3-MoE of `bench stream` (cached the same way):
 * - header: the always-on record header check only (magic, layer, expert, placement);
 * - sampled: plus the payload CRC32 of a random 1/64 of record landings (the default);
 * - verify: `--verify`, the payload CRC of every landing and the CRC of every trunk region read.
 *
 * Each configuration decodes twice from a cold start (cold pass, then steady state); repeats are
 * interleaved and the fastest kept. The report gives ms/token and the cost relative to
 * header-only; the sampled check is the default (RunOptions.crcSample) because its cost stays
 * under 2% of decode time.
 *
 * @module
 */
import { parseArgs } from "node:util";
import { DEFAULT_CRC_SAMPLE, Model, type RunOptions } from "../../../engine/model.ts";
import { parseSize } from "../../synth.ts";
import { dropPageCache } from "../../../io/disk_probe.ts";
import { ensureStreamModel, fixedPrompt } from "./stream.ts";
import { decode } from "./stream_child.ts";

interface ModeResult {
  mode: string;
  cold_ms_per_token: number;
  steady_ms_per_token: number;
  cold_cost: number;
  steady_cost: number;
}

const MODES: [string, RunOptions][] = [
  ["header", { crcSample: 0 }],
  ["sampled", { crcSample: DEFAULT_CRC_SAMPLE }],
  ["verify", { verify: true }],
  ["header (again)", { crcSample: 0 }],
];

/** Runs the bench; prints a table (or JSON). */
export async function main(args: string[]): Promise<void> {
  const { values: v } = parseArgs({
    args,
    options: {
      size: { type: "string", default: "512M" },
      "budget-fraction": { type: "string", default: "0.3" },
      tokens: { type: "string", default: "32" },
      repeat: { type: "string", default: "3" },
      json: { type: "boolean" },
    },
  });
  const log = (line: string) => console.error(line);
  const cacheDir = Deno.env.get("SLUICE_CACHE") ?? "/tmp/sluice-bench";
  const path = await ensureStreamModel(cacheDir, parseSize(v.size!), log);
  const tokens = Number(v.tokens), repeat = Number(v.repeat);
  const whole = await Model.open(path, { quiet: true, hotList: false, ctx: 64 });
  const budget = Math.floor(Number(v["budget-fraction"]) * whole.plan.wholeModelBytes);
  const prompt = fixedPrompt(whole.cfg.vocabSize);
  whole.close();
  const best = new Map<string, { cold: number; steady: number }>();
  for (let r = 0; r < repeat; r++) {
    for (const [mode, opts] of MODES) {
      dropPageCache();
      const m = await Model.open(path, { quiet: true, hotList: false, ctx: 64, budget, ...opts });
      try {
        const cold = decode(m, mode, prompt, tokens).ms_per_token;
        const steady = decode(m, mode, prompt, tokens).ms_per_token;
        const b = best.get(mode);
        best.set(mode, {
          cold: Math.min(b?.cold ?? Infinity, cold),
          steady: Math.min(b?.steady ?? Infinity, steady),
        });
      } finally {
        m.close();
      }
      log(`bench integrity: repeat ${r + 1}/${repeat} ${mode} done`);
    }
  }
  const base = best.get("header")!;
  const rows: ModeResult[] = MODES.map(([mode]) => {
    const b = best.get(mode)!;
    return {
      mode,
      cold_ms_per_token: b.cold,
      steady_ms_per_token: b.steady,
      cold_cost: b.cold / base.cold - 1,
      steady_cost: b.steady / base.steady - 1,
    };
  });
  const load = Deno.loadavg()[0];
  // On a loaded machine the sampled row's own cost drowns in noise (the repeated header row shows
  // how much); the CRC work it adds is the verify row's share times the sampling rate.
  const verify = rows.find((r) => r.mode === "verify")!;
  const expected = verify.steady_cost * DEFAULT_CRC_SAMPLE;

  if (v.json) {
    console.log(JSON.stringify({
      model: path,
      budget,
      tokens,
      repeat,
      load_avg: load,
      rows,
      sampled_expected_cost: expected,
    }));
    return;
  }
  const pct = (x: number) => `${x >= 0 ? "+" : ""}${(100 * x).toFixed(1)}%`;
  console.log(`integrity checks, ${path}, budget ${budget} B, ${tokens} tokens, load ${load}`);
  console.log("| mode            | cold ms/tok | cost   | steady ms/tok | cost   |");
  console.log("|-----------------|-------------|--------|---------------|--------|");
  for (const r of rows) {
    console.log(
      `| ${r.mode.padEnd(15)} | ${r.cold_ms_per_token.toFixed(2).padStart(11)} | ` +
        `${pct(r.cold_cost).padStart(6)} | ${r.steady_ms_per_token.toFixed(2).padStart(13)} | ` +
        `${pct(r.steady_cost).padStart(6)} |`,
    );
  }
  console.log(
    `sampled CRC work: verify's steady cost × ${DEFAULT_CRC_SAMPLE.toFixed(4)} = ${pct(expected)}` +
      ` of decode time (target < 2%)`,
  );
}
