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
 * `deno task bench serve --clients 1,4,8 [--model X.sluice | --size 512M] [--budget-fraction 0.25]
 * [--tokens 32] [--requests 2] [--repeat 2] [--json]`: continuous batching instead. The model
 * (default: bench stream's synthetic Qwen3-MoE-shaped model of `--size`) is served twice by the
 * worker server (what `mod.ts serve` runs: the front, the engine in its worker), over the
 * cap (budget = fraction × the whole model) and in RAM, with `--parallel` the most clients; each
 * client count runs that many clients at once, each sending `--requests` greedy streamed
 * completions one after another (distinct prompts). Reported per placement and count: aggregate
 * tok/s (completion tokens ÷ wall time, best of the repeats) and its ratio to one client
 * (targets: ≥ 2.5× at 4 clients over the cap, ≥ 1.5× in RAM), mean sequences per pass, bytes read
 * per completion token and the ratio they allow (one client's ÷ this count's: where a pass is
 * bound by its reads, the most batching can give), and p50/p95 time to first token (all repeats).
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
import { parseBytes } from "../../../engine/units.ts";
import { modelId } from "../../serve/live.ts";
import { startControlledServer } from "../serve_control.ts";
import { ensureStreamModel, fixedPrompt } from "./stream.ts";

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

/** One client count's measurement of {@link benchClients}. */
export interface ClientsRun {
  clients: number;
  /** Completion tokens of all clients ÷ wall time, best of the repeats. */
  tok_s: number;
  /** tok_s ÷ the one-client tok_s of the same placement. */
  ratio: number;
  /** Sequences per forward pass over the best repeat. */
  batch_mean: number;
  /** Bytes read from the container per completion token (prompts included), all repeats. */
  read_per_token: number;
  /**
   * The one-client read_per_token ÷ this one: the ratio the reads allow, where a pass is bound
   * by them (over the cap).
   */
  read_ratio: number;
  /** Time to first token of every request of every repeat, ms. */
  ttft_ms: number[];
}

/** The measurements of one placement (over the cap, or in RAM). */
export interface ClientsPlacement {
  label: string;
  budget: number | null;
  runs: ClientsRun[];
}

/** Everything `bench serve --clients` measures. */
export interface ClientsBenchResult {
  model: string;
  whole_bytes: number;
  parallel: number;
  tokens: number;
  requests: number;
  placements: ClientsPlacement[];
}

/** Options of {@link benchClients}. */
export interface ClientsBenchOptions {
  model: string;
  clients: number[];
  budgetFraction: number;
  tokens: number;
  requests: number;
  repeat: number;
  threads?: number;
}

/**
 * A streamed greedy completion of `prompt`: its completion tokens and the ms to its first
 * token (the first SSE event that carries a choice).
 */
async function streamed(
  url: string,
  prompt: number[],
  tokens: number,
): Promise<{ tokens: number; ttft: number }> {
  const t0 = performance.now();
  const r = await post(url, {
    prompt,
    max_tokens: tokens,
    temperature: 0,
    ignore_eos: true,
    stream: true,
    stream_options: { include_usage: true },
  });
  const reader = r.body!.pipeThrough(new TextDecoderStream()).getReader();
  let ttft = NaN, used = 0, text = "";
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    text += value;
    let cut;
    while ((cut = text.indexOf("\n\n")) >= 0) {
      const event = text.slice(0, cut);
      text = text.slice(cut + 2);
      if (!event.startsWith("data: ") || event === "data: [DONE]") continue;
      const data = JSON.parse(event.slice(6));
      if (data.choices?.length > 0 && Number.isNaN(ttft)) ttft = performance.now() - t0;
      if (data.usage) used = data.usage.completion_tokens;
    }
  }
  return { tokens: used, ttft };
}

/** The `q` quantile (0..1) of `xs`, nearest rank (NaN when empty). */
export function quantile(xs: number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s[Math.min(s.length - 1, Math.ceil(q * s.length) - 1)];
}

/** Counters of the server's `/metrics` that {@link benchClients} reads around each round. */
interface ServerCounters {
  passes: number;
  sequences: number;
  readBytes: number;
}

/**
 * The batch's pass counters and the bytes read, from the server's `/metrics` (current once every
 * client has its answer: the engine posts its status before each response ends).
 */
async function serverCounters(base: string): Promise<ServerCounters> {
  const text = await (await fetch(`${base}/metrics`)).text();
  const value = (name: string) => {
    const m = text.match(new RegExp(`^sluice_${name} (\\S+)$`, "m"));
    if (!m) throw new Error(`bench serve: /metrics has no sluice_${name}`);
    return Number(m[1]);
  };
  return {
    passes: value("batch_passes_total"),
    sequences: value("batch_sequences_total"),
    readBytes: value("read_bytes_total"),
  };
}

/** Serves the model over the cap and in RAM and runs each client count against it. */
export async function benchClients(opts: ClientsBenchOptions): Promise<ClientsBenchResult> {
  const parallel = Math.max(...opts.clients);
  const base = { quiet: true, ctx: 512, parallel, threads: opts.threads, hotList: false };
  const probe = await Session.open(opts.model, base);
  const whole = probe.model.plan.wholeModelBytes;
  const vocab = probe.model.cfg.vocabSize;
  const model = modelId(probe);
  probe.close();
  const placements: ClientsPlacement[] = [];
  const budgets: [string, number | undefined][] = [
    [`over the cap (budget ${opts.budgetFraction} × the model)`, whole * opts.budgetFraction],
    ["in RAM", undefined],
  ];
  let prompts = 0;
  // Each request its own prompt: the prompt cache reuses nothing across them.
  const nextPrompt = () => [(prompts++ * 7919) % vocab, ...fixedPrompt(vocab)];
  for (const [label, budget] of budgets) {
    // What `mod.ts serve` runs: the front, and the engine in its worker.
    const controlled = await startControlledServer(
      { path: opts.model, options: { ...base, budget } },
      { port: 0, log: () => {}, queueSize: parallel },
    );
    const server = controlled.server;
    const url = `${server.url}/v1/completions`;
    const best = new Map<number, { tok_s: number; batch_mean: number }>();
    const ttft = new Map<number, number[]>(opts.clients.map((c) => [c, []]));
    // Bytes read and completion tokens per count, over the kept rounds.
    const reads = new Map<number, { bytes: number; tokens: number }>(
      opts.clients.map((c) => [c, { bytes: 0, tokens: 0 }]),
    );
    try {
      // Round 0 warms the JIT and the expert cache and is not kept.
      for (let round = 0; round <= opts.repeat; round++) {
        for (const clients of opts.clients) {
          const before = await serverCounters(server.url);
          const t0 = performance.now();
          const done = await Promise.all(
            Array.from({ length: clients }, async () => {
              const got = [];
              for (let k = 0; k < opts.requests; k++) {
                got.push(await streamed(url, nextPrompt(), opts.tokens));
              }
              return got;
            }),
          );
          const ms = performance.now() - t0;
          if (round === 0) continue;
          const all = done.flat();
          ttft.get(clients)!.push(...all.map((x) => x.ttft));
          const tokens = all.reduce((n, x) => n + x.tokens, 0);
          const tok_s = (1000 * tokens) / ms;
          const after = await serverCounters(server.url);
          const read = reads.get(clients)!;
          read.bytes += after.readBytes - before.readBytes;
          read.tokens += tokens;
          const batch_mean = (after.sequences - before.sequences) /
            Math.max(1, after.passes - before.passes);
          if (tok_s > (best.get(clients)?.tok_s ?? 0)) best.set(clients, { tok_s, batch_mean });
        }
      }
    } finally {
      await controlled.close();
    }
    const least = Math.min(...opts.clients);
    const one = best.get(least)!.tok_s;
    const perToken = (c: number) => reads.get(c)!.bytes / Math.max(1, reads.get(c)!.tokens);
    placements.push({
      label,
      budget: budget ?? null,
      runs: opts.clients.map((clients) => ({
        clients,
        ...best.get(clients)!,
        ratio: best.get(clients)!.tok_s / one,
        read_per_token: perToken(clients),
        read_ratio: perToken(least) / perToken(clients),
        ttft_ms: ttft.get(clients)!,
      })),
    });
  }
  return {
    model,
    whole_bytes: whole,
    parallel,
    tokens: opts.tokens,
    requests: opts.requests,
    placements,
  };
}

/** The report of {@link benchClients}. */
export function formatClients(r: ClientsBenchResult): string {
  const mib = (b: number) => `${(b / 2 ** 20).toFixed(0)} MiB`;
  const lines = [
    `bench serve --clients: ${r.model} (${mib(r.whole_bytes)}), --parallel ${r.parallel}, ` +
    `${r.requests} streamed greedy completion(s) of ${r.tokens} tokens per client`,
  ];
  for (const p of r.placements) {
    lines.push(`${p.label}${p.budget ? `: ${mib(p.budget)}` : ""}`);
    const target = p.budget ? 2.5 : 1.5;
    for (const x of p.runs) {
      const check = x.clients === 4
        ? ` (target ≥ ${target}: ${x.ratio >= target ? "ok" : "BELOW"})`
        : "";
      lines.push(
        `  ${String(x.clients).padStart(2)} client(s) ${x.tok_s.toFixed(1).padStart(8)} tok/s ` +
          `${x.ratio.toFixed(2)}× one client${check}; ${x.batch_mean.toFixed(2)} sequences/pass; ` +
          (x.read_per_token > 0
            ? `${(x.read_per_token / 2 ** 20).toFixed(1)} MiB read/token ` +
              `(the reads allow ${x.read_ratio.toFixed(2)}×); `
            : "") +
          `TTFT p50 ${quantile(x.ttft_ms, 0.5).toFixed(0)} ms, p95 ${
            quantile(x.ttft_ms, 0.95).toFixed(0)
          } ms`,
      );
    }
  }
  return lines.join("\n");
}

/** `deno task bench serve` entry point. */
export async function main(args: string[]): Promise<void> {
  const { values: v } = parseArgs({
    args,
    options: {
      model: { type: "string" },
      tokens: { type: "string" },
      turns: { type: "string", default: "4" },
      repeat: { type: "string" },
      threads: { type: "string" },
      clients: { type: "string" },
      size: { type: "string", default: "512M" },
      "budget-fraction": { type: "string", default: "0.25" },
      requests: { type: "string", default: "2" },
      json: { type: "boolean", default: false },
    },
  });
  const n = (k: "tokens" | "turns" | "repeat" | "threads" | "requests", dflt?: string) => {
    const x = Number(v[k] ?? dflt);
    if (!Number.isInteger(x) || x < 1) throw new Error(`--${k} must be a positive integer`);
    return x;
  };
  if (v.clients !== undefined) {
    const clients = v.clients.split(",").map(Number);
    if (!clients.every((c) => Number.isInteger(c) && c >= 1 && c <= 64)) {
      throw new Error(`--clients: expected counts 1..64 separated by commas, got "${v.clients}"`);
    }
    const fraction = Number(v["budget-fraction"]);
    if (!(fraction > 0 && fraction < 1)) throw new Error("--budget-fraction must be in (0, 1)");
    const model = v.model ??
      await ensureStreamModel(
        Deno.env.get("SLUICE_CACHE") ?? "/tmp/sluice-bench",
        parseBytes(v.size!),
        (l) => console.error(l),
      );
    const result = await benchClients({
      model,
      clients,
      budgetFraction: fraction,
      tokens: n("tokens", "32"),
      requests: n("requests"),
      repeat: n("repeat", "2"),
      threads: v.threads === undefined ? undefined : n("threads"),
    });
    console.log(v.json ? JSON.stringify(result) : formatClients(result));
    return;
  }
  const model = v.model ?? await (await import("../../demo_model.ts")).demoModelPath(true);
  const threads = v.threads === undefined ? undefined : n("threads");
  const result = await benchServe(model, { quiet: true, ctx: 2048, threads }, {
    tokens: n("tokens", "512"),
    turns: n("turns"),
    repeat: n("repeat", "3"),
  });
  console.log(v.json ? JSON.stringify(result) : formatServe(result));
  if (!result.conversation.identical) throw new Error("warm and cold answers differ");
}
