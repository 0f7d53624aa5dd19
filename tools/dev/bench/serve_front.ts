/**
 * `deno task bench serve-front [--model X.sluice] [--ctx N] [--prefill-chunk N] [--tokens N]
 * [--repeat N] [--threads N] [--json]`: what running the engine in a worker buys and costs, the
 * in-process server (tools/serve/server.ts `startServer`) and the worker server (tools/serve/
 * front.ts, what `mod.ts serve` runs) side by side on one model:
 *
 * - `/health` latency while a prompt of 90% of the context prefills, and while the longest text
 *   the server takes (the context × 128 bytes) is tokenized and refused as too long: asked
 *   again and again (10 ms apart) until the request returns; answers counted, median and worst
 *   (a /health that waits for the whole request counts with all its wait).
 * - The prefill's own wall time, and greedy decode as a JSON completion and as an SSE stream
 *   (tok/s), whose worker ÷ in-process ratios are what the hop to the worker costs (the prefill's
 *   with the /health requests, which only the worker server answers as they come).
 *
 * Every repeat sends new prompts, so no prompt cache helps either server; the configurations
 * take turns, and the fastest prefill and decode of each is kept.
 *
 * @module
 */
import { parseArgs } from "node:util";
import { Session, type SessionOptions } from "../../../engine/session.ts";
import { loadTokenizer } from "../../../engine/tokenizer.ts";
import { MAX_TOKEN_BYTES } from "../../../engine/chat.ts";
import { startWorkerServer } from "../../serve/front.ts";
import { startServer } from "../../serve/server.ts";

/** /health while one request runs. */
export interface HealthFigures {
  /** /health answers to requests sent while it ran (fewest of the repeats). */
  answers: number;
  p50_ms: number;
  /** Worst latency, counting a /health sent while it ran and answered only after. */
  max_ms: number;
  /** The request's own wall time (fastest of the repeats). */
  ms: number;
}

/** One server's figures. */
export interface FrontRun {
  label: "in-process" | "worker";
  /** During the prefill of a prompt of most of the context. */
  prefill: HealthFigures;
  /** During the tokenization of the longest text the server takes, refused as too long. */
  tokenize: HealthFigures;
  prompt_tokens: number;
  /** Greedy decode (prompt included) as one JSON completion and as an SSE stream. */
  decode_tok_s: number;
  sse_tok_s: number;
}

/** Everything `bench serve-front` measures. */
export interface FrontBenchResult {
  model: string;
  /** Characters of the refused text. */
  text_chars: number;
  runs: FrontRun[];
  /** Worker ÷ in-process decode tok/s (JSON, SSE), and in-process ÷ worker prefill time. */
  decode_ratio: number;
  sse_ratio: number;
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

/** Asks /health every 10 ms while `request` runs: latencies and the request's wall time. */
async function during<T>(url: string, request: () => Promise<T>) {
  const latencies: number[] = [];
  let done = false;
  const t0 = performance.now();
  const result = request().finally(() => done = true);
  while (!done) {
    const h0 = performance.now();
    await (await fetch(`${url}/health`)).body?.cancel();
    latencies.push(performance.now() - h0);
    await new Promise((r) => setTimeout(r, 10));
  }
  return { latencies, ms: performance.now() - t0, result: await result };
}

/** One round on a listening server: the long prompt, the refused text, a decode. */
async function round(url: string, round: number, prompt: string, text: string, tokens: number) {
  // A new first word each round: no prompt cache helps.
  const prefill = await during(
    url,
    () => post(`${url}/v1/completions`, { prompt: `Round ${round}: ${prompt}`, max_tokens: 1 }),
  );
  const tokenize = await during(url, async () => {
    const r = await fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: text, max_tokens: 1 }),
    });
    const code = (await r.json()).error?.code;
    if (code !== "context_length_exceeded") {
      throw new Error(`bench serve-front: the long text got HTTP ${r.status} ${code}`);
    }
  });
  const decode = async (stream: boolean) => {
    const d0 = performance.now();
    const r = await fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        prompt: `Story ${round}${stream ? " streamed" : ""}: once upon a time`,
        max_tokens: tokens,
        temperature: 0,
        ignore_eos: true,
        stream,
      }),
    });
    await r.text();
    return (1000 * tokens) / (performance.now() - d0);
  };
  return {
    prefill,
    tokenize,
    promptTokens: (prefill.result.usage as { prompt_tokens: number }).prompt_tokens,
    decodeTokS: await decode(false),
    sseTokS: await decode(true),
  };
}

/** The /health figures of one phase over the repeats. */
function figures(phases: { latencies: number[]; ms: number }[]): HealthFigures {
  const latencies = phases.flatMap((x) => x.latencies);
  return {
    answers: Math.min(...phases.map((x) => x.latencies.length)),
    p50_ms: quantile(latencies, 0.5),
    max_ms: Math.max(...latencies),
    ms: Math.min(...phases.map((x) => x.ms)),
  };
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
  // The longest text the server tokenizes before refusing it (tools/serve/server.ts).
  const text = unit.repeat(Math.floor(((run.ctx ?? 2048) * MAX_TOKEN_BYTES) / unit.length));
  const all = new Map<FrontRun["label"], Awaited<ReturnType<typeof round>>[]>();
  // Both stay up for every round, so each keeps its warm JIT (the worker is an isolate of its
  // own) and its caches; the model is open twice.
  const session = await Session.open(model, run);
  const inProcess = startServer(session, { port: 0, log: () => {} });
  const worker = await startWorkerServer({ path: model, options: run }, {
    port: 0,
    log: () => {},
  }).catch(async (e) => {
    await inProcess.close();
    session.close();
    throw e;
  });
  try {
    for (let r = 0; r <= opts.repeat; r++) {
      for (const [label, url] of [["in-process", inProcess.url], ["worker", worker.url]] as const) {
        const result = await round(url, r, prompt, text, opts.tokens);
        // Round 0 warms the JIT and the caches and is not kept.
        if (r > 0) all.set(label, [...all.get(label) ?? [], result]);
      }
    }
  } finally {
    await inProcess.close();
    session.close();
    await worker.close();
  }
  const runs = [...all].map(([label, rs]): FrontRun => ({
    label,
    prefill: figures(rs.map((x) => x.prefill)),
    tokenize: figures(rs.map((x) => x.tokenize)),
    prompt_tokens: rs[0].promptTokens,
    decode_tok_s: Math.max(...rs.map((x) => x.decodeTokS)),
    sse_tok_s: Math.max(...rs.map((x) => x.sseTokS)),
  }));
  const [a, b] = runs;
  return {
    model: model.replace(/\/+$/, "").split("/").at(-1)!,
    text_chars: text.length,
    runs,
    decode_ratio: b.decode_tok_s / a.decode_tok_s,
    sse_ratio: b.sse_tok_s / a.sse_tok_s,
    prefill_ratio: a.prefill.ms / b.prefill.ms,
  };
}

/** The report of {@link benchServeFront}. */
export function formatServeFront(r: FrontBenchResult): string {
  const phase = (f: HealthFigures) =>
    `${String(f.answers).padStart(4)} answers, p50 ${f.p50_ms.toFixed(1)} ms, ` +
    `max ${f.max_ms.toFixed(1)} ms; request ${f.ms.toFixed(0)} ms (fastest)`;
  return [
    `bench serve-front: ${r.model}; /health asked every 10 ms during a ` +
    `${r.runs[0].prompt_tokens}-token prefill and the tokenization of ${r.text_chars} ` +
    `characters refused as too long`,
    ...r.runs.flatMap((x) => [
      `  ${x.label.padEnd(10)} prefill:  ${phase(x.prefill)}`,
      `  ${"".padEnd(10)} tokenize: ${phase(x.tokenize)}`,
      `  ${"".padEnd(10)} decode ${x.decode_tok_s.toFixed(1)} tok/s JSON, ` +
      `${x.sse_tok_s.toFixed(1)} tok/s SSE`,
    ]),
    `  worker ÷ in-process: decode JSON ${r.decode_ratio.toFixed(2)}, SSE ` +
    `${r.sse_ratio.toFixed(2)}, prefill speed ${r.prefill_ratio.toFixed(2)} (with /health asked)`,
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
