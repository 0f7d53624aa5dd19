/**
 * `deno task bench serve [--model X.sluice] [--tokens 512] [--turns 4] [--repeat 3]
 * [--threads N] [--json]`:
 * what the HTTP server costs and what the prompt cache saves, measured side by side in one run on
 * one model (default: the demo model). The server is what `mod.ts serve` runs: the front, and the
 * engine in its worker (tools/serve/front.ts), with a control channel that empties the engine's
 * prompt cache between runs (tools/dev/serve_control.ts); the direct runs use a second copy of
 * the model opened in this process, with the same options. `bench serve-front` compares the worker
 * server with the in-process one.
 *
 * - Decode through the server against `Session.generate` itself: the same greedy prompt and token
 *   count, run directly, as one JSON completion, and as an SSE stream (wall time, prefill
 *   included, from an empty prompt cache each time). Target: server ÷ direct ≥ 0.90.
 * - The prompt cache: a conversation of `--turns` text completions, each prompt the previous one
 *   plus its answer plus a few words, run warm (the server's cache kept) and each turn again cold
 *   (cache emptied first). Reported: prompt tokens run (as the server counts them) and wall time,
 *   warm ÷ cold, and that the texts are identical (they must be). Saved prefixes are off
 *   (`cacheBytes` 0), so a cold turn finds nothing to restore.
 *
 * `--repeat N` interleaves the configurations N times (after one warm-up round) and keeps each
 * one's fastest run.
 *
 * @module
 */
import { parseArgs } from "node:util";
import { Session, type SessionOptions } from "../../../engine/session.ts";
import { modelId } from "../../serve/live.ts";
import { startControlledServer } from "../serve_control.ts";

/** One measured configuration. */
export interface ServeRun {
  label: string;
  tok_s: number;
  ms: number;
}

/** Everything `bench serve` measures. */
export interface ServeBenchResult {
  model: string;
  tokens: number;
  runs: ServeRun[];
  /** Server tok/s ÷ direct tok/s (JSON and SSE). */
  json_ratio: number;
  sse_ratio: number;
  conversation: {
    turns: number;
    warm_prefilled: number;
    cold_prefilled: number;
    warm_ms: number;
    cold_ms: number;
    identical: boolean;
  };
}

async function post(url: string, body: unknown): Promise<Response> {
  const r = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  if (!r.ok) throw new Error(`bench serve: ${url}: HTTP ${r.status} ${await r.text()}`);
  return r;
}

/**
 * Runs the measurements on the model at `path`: directly on a session opened here, and through a
 * worker server of its own, both with `options`.
 */
export async function benchServe(
  path: string,
  options: SessionOptions,
  opts: { tokens: number; turns: number; repeat: number },
): Promise<ServeBenchResult> {
  const session = await Session.open(path, options);
  const controlled = await startControlledServer({ path, options }, {
    port: 0,
    log: () => {},
    cacheBytes: 0,
  }).catch((e) => {
    session.close();
    throw e;
  });
  const url = `${controlled.server.url}/v1/completions`;
  const prompt = "Once upon a time, in a small village by the sea,";
  const ids = session.tokenize(prompt);
  const body = { prompt: ids, max_tokens: opts.tokens, temperature: 0, ignore_eos: true };
  const best = new Map<string, number>();
  const keepBest = (label: string, ms: number) =>
    best.set(label, Math.min(best.get(label) ?? ms, ms));
  try {
    // Round 0 warms the JIT and the caches and is not kept.
    for (let r = 0; r <= opts.repeat; r++) {
      const keep = r === 0 ? () => {} : keepBest;
      session.resetCache();
      let t0 = performance.now();
      const greedy = { maxTokens: opts.tokens, temperature: 0, ignoreEos: true };
      for await (const _ of session.generate(ids, greedy));
      keep("direct Session.generate", performance.now() - t0);
      await controlled.resetCache();
      t0 = performance.now();
      await (await post(url, body)).json();
      keep("server, JSON completion", performance.now() - t0);
      await controlled.resetCache();
      t0 = performance.now();
      await (await post(url, { ...body, stream: true })).text();
      keep("server, SSE stream", performance.now() - t0);
    }
    const runs = [...best].map(([label, ms]) => ({ label, ms, tok_s: (1000 * opts.tokens) / ms }));
    // The conversation: warm first (cache kept from turn to turn), then each turn cold.
    const turns: string[] = [];
    let text = prompt;
    let warmPrefilled = 0, warmMs = 0;
    const warmAnswers: string[] = [];
    await controlled.resetCache();
    for (let k = 0; k < opts.turns; k++) {
      turns.push(text);
      const t0 = performance.now();
      const out = await (await post(url, { ...body, prompt: text, max_tokens: 32 })).json();
      warmMs += performance.now() - t0;
      warmPrefilled += out.usage.prompt_tokens - out.usage.prompt_tokens_details.cached_tokens;
      warmAnswers.push(out.choices[0].text);
      text = `${text}${out.choices[0].text} And then the fox said hello.`;
    }
    let coldPrefilled = 0, coldMs = 0;
    let identical = true;
    for (let k = 0; k < turns.length; k++) {
      await controlled.resetCache();
      const t0 = performance.now();
      const out = await (await post(url, { ...body, prompt: turns[k], max_tokens: 32 })).json();
      coldMs += performance.now() - t0;
      coldPrefilled += out.usage.prompt_tokens - out.usage.prompt_tokens_details.cached_tokens;
      identical &&= out.choices[0].text === warmAnswers[k];
    }
    const direct = runs[0].tok_s;
    return {
      model: modelId(session),
      tokens: opts.tokens,
      runs,
      json_ratio: runs[1].tok_s / direct,
      sse_ratio: runs[2].tok_s / direct,
      conversation: {
        turns: opts.turns,
        warm_prefilled: warmPrefilled,
        cold_prefilled: coldPrefilled,
        warm_ms: warmMs,
        cold_ms: coldMs,
        identical,
      },
    };
  } finally {
    await controlled.close();
    session.close();
  }
}

/** The report of {@link benchServe}. */
export function formatServe(r: ServeBenchResult): string {
  const c = r.conversation;
  const pass = (ok: boolean) => (ok ? "ok" : "BELOW TARGET");
  return [
    `bench serve: ${r.model}, ${r.tokens} greedy tokens (prefill included), fastest of the runs`,
    ...r.runs.map((x) =>
      `  ${x.label.padEnd(26)} ${x.tok_s.toFixed(1).padStart(8)} tok/s  ${x.ms.toFixed(0)} ms`
    ),
    `  server JSON ÷ direct ${r.json_ratio.toFixed(2)} (target ≥ 0.90: ${
      pass(r.json_ratio >= 0.9)
    })`,
    `  server SSE ÷ direct  ${r.sse_ratio.toFixed(2)} (target ≥ 0.90: ${pass(r.sse_ratio >= 0.9)})`,
    `prompt cache over ${c.turns} turns: ${c.warm_prefilled} prompt tokens run warm vs ` +
    `${c.cold_prefilled} cold (${(c.warm_prefilled / c.cold_prefilled).toFixed(2)}×), ` +
    `${c.warm_ms.toFixed(0)} ms vs ${c.cold_ms.toFixed(0)} ms ` +
    `(${(c.warm_ms / c.cold_ms).toFixed(2)}×); answers identical: ${c.identical ? "yes" : "NO"}`,
  ].join("\n");
}

/** `deno task bench serve` entry point. */
export async function main(args: string[]): Promise<void> {
  const { values: v } = parseArgs({
    args,
    options: {
      model: { type: "string" },
      tokens: { type: "string", default: "512" },
      turns: { type: "string", default: "4" },
      repeat: { type: "string", default: "3" },
      threads: { type: "string" },
      json: { type: "boolean", default: false },
    },
  });
  const n = (k: "tokens" | "turns" | "repeat" | "threads") => {
    const x = Number(v[k]);
    if (!Number.isInteger(x) || x < 1) throw new Error(`--${k} must be a positive integer`);
    return x;
  };
  const model = v.model ?? await (await import("../../demo_model.ts")).demoModelPath(true);
  const threads = v.threads === undefined ? undefined : n("threads");
  const result = await benchServe(model, { quiet: true, ctx: 2048, threads }, {
    tokens: n("tokens"),
    turns: n("turns"),
    repeat: n("repeat"),
  });
  console.log(v.json ? JSON.stringify(result) : formatServe(result));
  if (!result.conversation.identical) throw new Error("warm and cold answers differ");
}
