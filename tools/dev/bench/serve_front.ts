/**
 * `deno task bench serve-front [--model X.sluice] [--ctx N] [--prefill-chunk N] [--tokens N]
 * [--repeat N] [--threads N] [--json]`: what running the engine in a worker buys and costs, the
 * in-process server (tools/serve/server.ts `startServer`) and the worker server (tools/serve/
 * front.ts, what `mod.ts serve` runs) side by side on one model:
 *
 * - `/health` latency while a prompt filling most of the context prefills: asked again and
 *   again (10 ms apart) until the completion returns; answers counted, median and worst.
 * - The prefill's own wall time, and greedy decode through a JSON completion (tok/s), whose
 *   worker ÷ in-process ratios are what the hop to the worker costs.
 *
 * Every repeat sends new prompts, so no prompt cache helps either server; the configurations
 * take turns, and the fastest prefill and decode of each is kept.
 *
 * @module
 */
import { parseArgs } from "node:util";
import { Session, type SessionOptions } from "../../../engine/session.ts";
import { loadTokenizer } from "../../../engine/tokenizer.ts";
import { startWorkerServer } from "../../serve/front.ts";
import { startServer } from "../../serve/server.ts";

/** One server's figures. */
export interface FrontRun {
  label: "in-process" | "worker";
  /** /health answers received while the long prompt prefilled. */
  answers: number;
  health_p50_ms: number;
  health_max_ms: number;
  prefill_ms: number;
  prompt_tokens: number;
  decode_tok_s: number;
}

/** Everything `bench serve-front` measures. */
export interface FrontBenchResult {
  model: string;
  runs: FrontRun[];
  /** Worker ÷ in-process decode tok/s, and in-process ÷ worker prefill time. */
  decode_ratio: number;
  prefill_ratio: number;
}

async function post(url: string, body: unknown): Promise<Record<string, unknown>> {
  const r = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  if (!r.ok) throw new Error(`bench serve-front: ${url}: HTTP ${r.status} ${await r.text()}`);
  return await r.json();
}

function quantile(xs: number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s[Math.min(s.length - 1, Math.floor(q * s.length))];
}

/** One round on a listening server: the long prompt with /health polled, then a decode. */
async function round(url: string, round: number, prompt: string, tokens: number) {
  const latencies: number[] = [];
  let done = false;
  const t0 = performance.now();
  // A new first word each round: no prompt cache helps.
  const answer = post(`${url}/v1/completions`, {
    prompt: `Round ${round}: ${prompt}`,
    max_tokens: 1,
  })
    .finally(() => done = true);
  while (!done) {
    const h0 = performance.now();
    await (await fetch(`${url}/health`)).body?.cancel();
    if (!done) latencies.push(performance.now() - h0);
    await new Promise((r) => setTimeout(r, 10));
  }
  const usage = (await answer).usage as { prompt_tokens: number };
  const prefillMs = performance.now() - t0;
  const d0 = performance.now();
  await post(`${url}/v1/completions`, {
    prompt: `Story ${round}: once upon a time`,
    max_tokens: tokens,
    temperature: 0,
    ignore_eos: true,
  });
  const decodeTokS = (1000 * tokens) / (performance.now() - d0);
  return { latencies, prefillMs, promptTokens: usage.prompt_tokens, decodeTokS };
}

/** Runs both servers `repeat` times each, taking turns (after one warm-up round each). */
export async function benchServeFront(
  model: string,
  run: SessionOptions,
  opts: { tokens: number; repeat: number },
): Promise<FrontBenchResult> {
  // Text of about 90% of the context, tokenized in the engine as a client's would be.
  const tokenizer = await loadTokenizer(model);
  const unit = "the fox ran over a hill and ";
  const units = Math.floor((0.9 * (run.ctx ?? 2048)) / tokenizer.encode(unit).length);
  const prompt = unit.repeat(units);
  const all = new Map<FrontRun["label"], Awaited<ReturnType<typeof round>>[]>();
  for (let r = 0; r <= opts.repeat; r++) {
    for (const label of ["in-process", "worker"] as const) {
      let url: string, close: () => Promise<void>;
      if (label === "in-process") {
        const session = await Session.open(model, run);
        const server = startServer(session, { port: 0, log: () => {} });
        url = server.url;
        close = async () => {
          await server.close();
          session.close();
        };
      } else {
        const server = await startWorkerServer({ path: model, options: run }, {
          port: 0,
          log: () => {},
        });
        url = server.url;
        close = server.close;
      }
      try {
        const result = await round(url, r, prompt, opts.tokens);
        // Round 0 warms the JIT and the caches and is not kept.
        if (r > 0) all.set(label, [...all.get(label) ?? [], result]);
      } finally {
        await close();
      }
    }
  }
  const runs = [...all].map(([label, rs]): FrontRun => {
    const latencies = rs.flatMap((x) => x.latencies);
    return {
      label,
      answers: Math.min(...rs.map((x) => x.latencies.length)),
      health_p50_ms: quantile(latencies, 0.5),
      health_max_ms: Math.max(...latencies, NaN),
      prefill_ms: Math.min(...rs.map((x) => x.prefillMs)),
      prompt_tokens: rs[0].promptTokens,
      decode_tok_s: Math.max(...rs.map((x) => x.decodeTokS)),
    };
  });
  const [inProcess, worker] = runs;
  return {
    model: model.replace(/\/+$/, "").split("/").at(-1)!,
    runs,
    decode_ratio: worker.decode_tok_s / inProcess.decode_tok_s,
    prefill_ratio: inProcess.prefill_ms / worker.prefill_ms,
  };
}

/** The report of {@link benchServeFront}. */
export function formatServeFront(r: FrontBenchResult): string {
  const ms = (x: number) => (Number.isFinite(x) ? `${x.toFixed(1)} ms` : "none");
  return [
    `bench serve-front: ${r.model}; /health asked every 10 ms during a ` +
    `${r.runs[0].prompt_tokens}-token prefill`,
    ...r.runs.map((x) =>
      `  ${x.label.padEnd(10)} /health answers ${String(x.answers).padStart(4)} (fewest), ` +
      `p50 ${ms(x.health_p50_ms)}, max ${ms(x.health_max_ms)}; prefill ` +
      `${x.prefill_ms.toFixed(0)} ms; decode ${x.decode_tok_s.toFixed(1)} tok/s`
    ),
    `  worker ÷ in-process: decode ${r.decode_ratio.toFixed(2)}, prefill speed ` +
    r.prefill_ratio.toFixed(2),
  ].join("\n");
}

/** `deno task bench serve-front` entry point. */
export async function main(args: string[]): Promise<void> {
  const { values: v } = parseArgs({
    args,
    options: {
      model: { type: "string" },
      ctx: { type: "string", default: "2048" },
      "prefill-chunk": { type: "string" },
      tokens: { type: "string", default: "256" },
      repeat: { type: "string", default: "3" },
      threads: { type: "string" },
      json: { type: "boolean", default: false },
    },
  });
  const n = (k: "ctx" | "prefill-chunk" | "tokens" | "repeat" | "threads") => {
    if (v[k] === undefined) return undefined;
    const x = Number(v[k]);
    if (!Number.isInteger(x) || x < 1) throw new Error(`--${k} must be a positive integer`);
    return x;
  };
  const model = v.model ?? await (await import("../../demo_model.ts")).demoModelPath(true);
  const run = {
    quiet: true,
    ctx: n("ctx"),
    threads: n("threads"),
    prefillChunk: n("prefill-chunk"),
  };
  const result = await benchServeFront(model, run, { tokens: n("tokens")!, repeat: n("repeat")! });
  console.log(v.json ? JSON.stringify(result) : formatServeFront(result));
}
