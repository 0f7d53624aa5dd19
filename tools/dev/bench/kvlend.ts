/**
 * `deno task bench kvlend --model X.sluice --budget SIZE`: what lending the KV cache's unwritten
 * rows to the expert cache (engine/kv_lending.ts) saves when the context is short of its maximum.
 * Runs a prompt and greedy decode with lending off and on, alternating, and reports per run the
 * expert cache's records at start and end, the hit rate and the bytes read per token in prefill
 * and decode, and the ratio of the medians; the ids must agree.
 *
 * @module
 */
import { parseArgs } from "node:util";
import { Model } from "../../../engine/model.ts";
import { argmax } from "../../../engine/sampler.ts";
import { formatBytes, parseBytes } from "../../../engine/units.ts";
import { Args } from "../../cli/args.ts";
import { median } from "./alternate.ts";

const HELP = `usage: deno task bench kvlend --model X.sluice --budget SIZE [--ctx N] [--prompt N]
  [--tokens N] [--repeat N] [--json]
  --model X.sluice  the container
  --budget SIZE     arena budget (over the model's size, so experts stream)
  --ctx N           context the KV cache is sized for (default 32768)
  --prompt N        prompt tokens (default 2048)
  --tokens N        greedy decode tokens after it (default 32)
  --repeat N        runs of each setting, alternating off and on (default 2)
  --json            print the report as JSON`;

/** One run's counters. */
interface LendRun {
  lend: boolean;
  slots_start: number;
  slots_end: number;
  reclaimed: number;
  prefill_bytes_per_token: number;
  decode_bytes_per_token: number;
  decode_hit_rate: number;
  prefill_s: number;
  decode_tok_s: number;
  ids: number[];
}

/** Bytes the model has read since it opened (experts and trunk). */
function readBytes(m: Model): number {
  return (m.experts?.stats.bytesRead ?? 0) + m.trunk.stats.bytes;
}

/** One run: the prompt in the engine's chunks, then `tokens` greedy steps. */
async function run(
  path: string,
  budget: number,
  ctx: number,
  prompt: number,
  tokens: number,
  lend: boolean,
): Promise<LendRun> {
  const m = await Model.open(path, { budget, ctx, lendKv: lend, quiet: true, hotList: false });
  try {
    const ids = Array.from({ length: prompt }, (_, i) => (i * 7919 + 11) % m.cfg.vocabSize);
    const slotsStart = m.experts?.cache.capacity ?? 0;
    let t0 = performance.now();
    let logits: Float32Array = new Float32Array(0);
    for (let p = 0; p < prompt; p += m.prefillChunk) {
      logits = m.forward(ids.slice(p, p + m.prefillChunk), p);
    }
    const prefillS = (performance.now() - t0) / 1000;
    const afterPrompt = readBytes(m);
    const c = m.experts!.cache.stats;
    const hits0 = c.hits, misses0 = c.misses;
    const out: number[] = [];
    t0 = performance.now();
    for (let i = 0; i < tokens; i++) {
      out.push(argmax(logits));
      logits = m.forward([out[i]], prompt + i);
    }
    const decodeS = (performance.now() - t0) / 1000;
    const hits = c.hits - hits0, misses = c.misses - misses0;
    return {
      lend,
      slots_start: slotsStart,
      slots_end: m.experts?.cache.capacity ?? 0,
      reclaimed: m.lender?.stats.reclaimed ?? 0,
      prefill_bytes_per_token: afterPrompt / prompt,
      decode_bytes_per_token: (readBytes(m) - afterPrompt) / tokens,
      decode_hit_rate: hits / Math.max(1, hits + misses),
      prefill_s: prefillS,
      decode_tok_s: tokens / decodeS,
      ids: out,
    };
  } finally {
    m.close();
  }
}

/** Runs the bench with its command-line arguments. */
export async function main(args: string[]): Promise<void> {
  const { values: v } = parseArgs({
    args,
    options: {
      model: { type: "string" },
      budget: { type: "string" },
      ctx: { type: "string" },
      prompt: { type: "string" },
      tokens: { type: "string" },
      repeat: { type: "string" },
      json: { type: "boolean", default: false },
      help: { type: "boolean", short: "h", default: false },
    },
  });
  if (v.help) return console.log(HELP);
  if (!v.model || !v.budget) throw new Error("--model and --budget are required\n" + HELP);
  const a = new Args("bench kvlend", v, []);
  const ctx = a.int("ctx", 1) ?? 32768, prompt = a.int("prompt", 1) ?? 2048;
  const tokens = a.int("tokens", 1) ?? 32, repeat = a.int("repeat", 1) ?? 2;
  const budget = parseBytes(v.budget);
  const runs: LendRun[] = [];
  const load = [Deno.loadavg()[0]];
  for (let r = 0; r < repeat; r++) {
    for (const lend of [false, true]) {
      const x = await run(v.model, budget, ctx, prompt, tokens, lend);
      runs.push(x);
      load.push(Deno.loadavg()[0]);
      if (!v.json) {
        console.error(
          `lending ${lend ? "on " : "off"}: cache ${x.slots_start} → ${x.slots_end} records, ` +
            `prefill ${formatBytes(x.prefill_bytes_per_token)}/token in ${
              x.prefill_s.toFixed(1)
            } s, decode ${formatBytes(x.decode_bytes_per_token)}/token, hit rate ${
              (100 * x.decode_hit_rate).toFixed(1)
            }%, ${x.decode_tok_s.toFixed(2)} tok/s`,
        );
      }
    }
  }
  const of = (lend: boolean, k: keyof LendRun) =>
    median(runs.filter((x) => x.lend === lend).map((x) => x[k] as number));
  const sameIds = runs.every((x) => x.ids.join() === runs[0].ids.join());
  const report = {
    model: v.model,
    budget,
    ctx,
    prompt,
    tokens,
    repeat,
    load_average: [Math.min(...load), Math.max(...load)],
    same_ids: sameIds,
    decode_bytes_ratio: of(true, "decode_bytes_per_token") / of(false, "decode_bytes_per_token"),
    prefill_bytes_ratio: of(true, "prefill_bytes_per_token") / of(false, "prefill_bytes_per_token"),
    decode_tok_s_ratio: of(true, "decode_tok_s") / of(false, "decode_tok_s"),
    runs,
  };
  if (v.json) return console.log(JSON.stringify(report));
  const pct = (x: number) => `${(100 * x).toFixed(1)}%`;
  console.log(
    `kv lending, -c ${ctx}, ${prompt}-token prompt + ${tokens} decode, budget ${
      formatBytes(budget)
    } (load ${report.load_average.map((x) => x.toFixed(1)).join("–")}):
  cache records at end   off ${of(false, "slots_end")}, on ${of(true, "slots_end")} (on: ${
      of(true, "slots_start")
    } at start)
  decode hit rate        off ${pct(of(false, "decode_hit_rate"))}, on ${
      pct(of(true, "decode_hit_rate"))
    }
  decode bytes/token     off ${formatBytes(of(false, "decode_bytes_per_token"))}, on ${
      formatBytes(of(true, "decode_bytes_per_token"))
    }  (on ÷ off ${report.decode_bytes_ratio.toFixed(3)})
  prefill bytes/token    off ${formatBytes(of(false, "prefill_bytes_per_token"))}, on ${
      formatBytes(of(true, "prefill_bytes_per_token"))
    }  (on ÷ off ${report.prefill_bytes_ratio.toFixed(3)})
  decode tok/s           on ÷ off ${report.decode_tok_s_ratio.toFixed(3)}
  ids                    ${sameIds ? "equal" : "DIFFER"} in every run`,
  );
  if (!sameIds) throw new Error("bench kvlend: lending changed the ids");
}
