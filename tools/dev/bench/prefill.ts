/**
 * `deno task bench prefill --model X.sluice [--prompt N] [--chunk N] [--at P,P,...]`: where a long
 * prompt's prefill spends its time, per kernel call kind. Every Ops method is wrapped with a timer
 * (matmuls by weight shape, so a model's projections, experts, router and LM head show apart);
 * what no kernel call accounts for (routing in JavaScript, gathers, the forward loop) is the rest.
 * Chunks run at the positions given by `--at` (default: the whole prompt, chunk after chunk); the
 * KV cache before a position holds whatever earlier chunks wrote, which does not change the time.
 *
 * @module
 */
import { parseArgs } from "node:util";
import { Model } from "../../../engine/model.ts";
import { Args } from "../../cli/args.ts";
import { Ops } from "../../../engine/ops.ts";
import { peakRss } from "../../../engine/stats.ts";
import { formatBytes, parseBytes } from "../../../engine/units.ts";

const HELP = `usage: deno task bench prefill --model X.sluice [--prompt N] [--chunk N] [--at P,...]
  [--budget SIZE] [--threads N] [--json]
  --model X.sluice  the container to prefill with
  --budget SIZE     arena budget (default: the whole model resident); over it experts stream
  --prompt N        prompt tokens (default 8192); the context is N + 16
  --chunk N         prefill chunk (default: the engine's)
  --at P,P,...      only the chunks starting at these positions (multiples of the chunk)
  --threads N       compute threads (default: all cores)
  --json            print the report as JSON`;

/** Milliseconds and calls per kernel call kind. */
type Profile = Map<string, { ms: number; calls: number }>;

/** Wraps every Ops method so its calls add their time to `prof` under a kind name. */
function instrument(prof: Profile): () => void {
  const proto = Ops.prototype as unknown as Record<string, (...a: unknown[]) => unknown>;
  const saved: [string, (...a: unknown[]) => unknown][] = [];
  let depth = 0;
  for (const name of Object.getOwnPropertyNames(Ops.prototype)) {
    const fn = proto[name];
    if (name === "constructor" || name === "f32" || typeof fn !== "function") continue;
    saved.push([name, fn]);
    proto[name] = function (this: unknown, ...args: unknown[]) {
      // Only the outermost call counts: an op made of other ops is timed once.
      if (depth > 0) return fn.apply(this, args);
      const kind = name === "matmul"
        ? "matmul " + (args as { w: { rows: number; cols: number } }[])
          .map((m) => `${m.w.rows}x${m.w.cols}`).join("+")
        : name;
      depth++;
      const t0 = performance.now();
      try {
        return fn.apply(this, args);
      } finally {
        depth--;
        const e = prof.get(kind) ?? { ms: 0, calls: 0 };
        e.ms += performance.now() - t0;
        e.calls++;
        prof.set(kind, e);
      }
    };
  }
  return () => saved.forEach(([name, fn]) => proto[name] = fn);
}

/** Runs the bench with its command-line arguments. */
export async function main(args: string[]): Promise<void> {
  const { values: v } = parseArgs({
    args,
    options: {
      model: { type: "string" },
      budget: { type: "string" },
      prompt: { type: "string" },
      chunk: { type: "string" },
      at: { type: "string" },
      threads: { type: "string" },
      json: { type: "boolean", default: false },
      help: { type: "boolean", short: "h", default: false },
    },
  });
  if (v.help) return console.log(HELP);
  if (!v.model) throw new Error("--model X.sluice is required\n" + HELP);
  const a = new Args("bench prefill", v, []);
  const n = a.int("prompt", 1) ?? 8192;
  const m = await Model.open(v.model, {
    budget: v.budget ? parseBytes(v.budget) : undefined,
    ctx: n + 16,
    prefillChunk: a.int("chunk", 1),
    threads: a.int("threads", 1),
    quiet: true,
  });
  const chunk = m.prefillChunk;
  const at = v.at?.split(",").map((p) => new Args("bench prefill", { at: p }, []).int("at")!) ??
    Array.from({ length: Math.ceil(n / chunk) }, (_, i) => i * chunk);
  const prof: Profile = new Map();
  const perChunk: { pos: number; ms: number }[] = [];
  let total = 0, tokens = 0;
  // Token ids: a fixed walk over the vocabulary (the time does not depend on them).
  const ids = (pos: number, k: number) =>
    Array.from({ length: k }, (_, i) => (pos + i) * 7919 % m.cfg.vocabSize);
  m.forward(ids(0, 8), 0);
  const restore = instrument(prof);
  try {
    for (const pos of at) {
      const k = Math.min(chunk, n - pos);
      if (k <= 0) continue;
      const t0 = performance.now();
      m.forward(ids(pos, k), pos);
      const ms = performance.now() - t0;
      perChunk.push({ pos, ms });
      total += ms;
      tokens += k;
    }
  } finally {
    restore();
    m.close();
  }
  const kernels = [...prof.entries()].sort((a, b) => b[1].ms - a[1].ms);
  const inKernels = kernels.reduce((s, [, e]) => s + e.ms, 0);
  const report = {
    model: v.model,
    prompt: n,
    chunk,
    threads: m.pool.threads,
    arena_bytes: m.plan.arenaBytes,
    kv_bytes: m.plan.kvBytes,
    peak_rss_bytes: peakRss(),
    chunks: perChunk.length,
    tokens,
    total_ms: total,
    tok_s: tokens / (total / 1000),
    load_average: Deno.loadavg(),
    kernels: Object.fromEntries(kernels),
    rest_ms: total - inKernels,
    per_chunk: perChunk,
  };
  if (v.json) return console.log(JSON.stringify(report));
  console.log(
    `prefill ${tokens} tokens in ${perChunk.length} chunks of ${chunk}: ${
      (total / 1000).toFixed(2)
    } s, ${report.tok_s.toFixed(1)} tok/s (${report.threads} threads, load ${
      report.load_average.map((x) => x.toFixed(1)).join(" ")
    })`,
  );
  console.log(
    `  arena ${formatBytes(report.arena_bytes)} (KV cache ${formatBytes(report.kv_bytes)}), ` +
      `peak RSS ${formatBytes(report.peak_rss_bytes)}`,
  );
  for (const [kind, e] of kernels) {
    console.log(
      `  ${kind.padEnd(36)} ${(e.ms / 1000).toFixed(3).padStart(9)} s ${
        (100 * e.ms / total).toFixed(1).padStart(5)
      }%  ${e.calls} calls`,
    );
  }
  console.log(
    `  ${"rest (JS, routing, gathers)".padEnd(36)} ${
      ((total - inKernels) / 1000).toFixed(3).padStart(9)
    } s ${(100 * (total - inKernels) / total).toFixed(1).padStart(5)}%`,
  );
  const show = perChunk.length > 8
    ? [0, 1, perChunk.length >> 1, perChunk.length - 1].map((i) => perChunk[i])
    : perChunk;
  console.log(
    "  chunk ms by position: " + show.map((c) => `${c.pos}: ${c.ms.toFixed(0)}`).join(", "),
  );
}
