/**
 * The flags every model-running command shares (generate, chat, serve): memory and I/O
 * placement, which never change the output, and sampling; parsed once here into RunOptions and
 * GenerateOptions.
 *
 * @module
 */
import type { RunOptions } from "../../engine/model.ts";
import type { GenerateOptions } from "../../engine/session.ts";
import { BUDGET_HELP, budgetFromArgs } from "./budget.ts";

/** The --help lines of the memory and I/O flags. */
export const RUN_HELP = `${BUDGET_HELP}
  --ctx N               context length the KV cache is sized for (default min(model, 4096))
  --threads N           compute threads including the main thread (default: all cores)
  --cache lfru|lru      expert cache policy (default lfru)
  --no-readahead        read each expert only when it is needed
  --readahead-depth N   expert reads kept in flight after routing (default 4)
  --ring-slots N        ring slots for unpinned trunk layers (default 2)
  --expert-slots N      cap the expert cache at N records
  --prefill-chunk N     prompt tokens per forward pass, ≤ 64 (default 64)
  --shards A,B,...      directories holding bank shards (env SLUICE_SHARDS)
  --io direct|buffered|fallback   reader (default direct: O_DIRECT through the C shim)
  --verify              check each expert record's CRC32 as it is read
  --lookahead N         prefetch the next layer's top-N predicted experts while the disk idles
                        (default 1 while experts stream, 0 when all fit)
  --learn               add this run's expert use counts to the hot list (<model>.hot.json)
  --no-hot-list         do not warm the expert cache from the hot list
  --trace FILE          write the routed experts of every (token, layer) as JSON lines`;

/** The --help lines of the sampling flags. */
export const SAMPLING_HELP = `  -n, --max-tokens N    new tokens to generate (default 256)
  --temperature T       0 = greedy (default 0)
  --top-k K  --top-p P  --min-p P  --repeat-penalty R
  --seed S              same seed, same tokens
  --ignore-eos          do not stop at end-of-sequence tokens`;

/** parseArgs options of the memory and I/O flags. */
export const RUN_FLAGS = {
  budget: { type: "string" },
  preset: { type: "string" },
  ctx: { type: "string" },
  threads: { type: "string" },
  cache: { type: "string" },
  "no-readahead": { type: "boolean" },
  "readahead-depth": { type: "string" },
  "ring-slots": { type: "string" },
  "expert-slots": { type: "string" },
  "prefill-chunk": { type: "string" },
  shards: { type: "string" },
  io: { type: "string" },
  verify: { type: "boolean" },
  lookahead: { type: "string" },
  learn: { type: "boolean" },
  "no-hot-list": { type: "boolean" },
  trace: { type: "string" },
} as const;

/** parseArgs options of the sampling flags. */
export const SAMPLING_FLAGS = {
  "max-tokens": { type: "string", short: "n" },
  temperature: { type: "string" },
  "top-k": { type: "string" },
  "top-p": { type: "string" },
  "min-p": { type: "string" },
  "repeat-penalty": { type: "string" },
  seed: { type: "string" },
  "ignore-eos": { type: "boolean" },
} as const;

type Values = Record<string, string | boolean | undefined>;

/** A whole-number flag (undefined when absent). */
export function intFlag(name: string, s: string | boolean | undefined): number | undefined {
  if (s === undefined) return undefined;
  const n = Number(s);
  if (typeof s !== "string" || !Number.isInteger(n) || n < 0) {
    throw new Error(`--${name} expects a whole number, got "${s}"`);
  }
  return n;
}

/** A number flag (undefined when absent). */
export function numFlag(name: string, s: string | boolean | undefined): number | undefined {
  if (s === undefined) return undefined;
  const n = Number(s);
  if (typeof s !== "string" || !Number.isFinite(n)) {
    throw new Error(`--${name} expects a number, got "${s}"`);
  }
  return n;
}

function oneOf<T extends string>(name: string, s: unknown, ok: T[]): T | undefined {
  if (s === undefined) return undefined;
  if (!ok.includes(s as T)) {
    throw new Error(`--${name} expects one of ${ok.join(", ")}, got "${s}"`);
  }
  return s as T;
}

/** RunOptions from parsed {@link RUN_FLAGS}. */
export function runOptions(v: Values, quiet: boolean): RunOptions {
  const str = (k: string) => v[k] as string | undefined;
  const shards = str("shards") ?? Deno.env.get("SLUICE_SHARDS");
  return {
    budget: budgetFromArgs(str("budget"), str("preset")),
    ctx: intFlag("ctx", v.ctx),
    threads: intFlag("threads", v.threads),
    cache: oneOf("cache", v.cache, ["lfru", "lru"]),
    readaheadDepth: v["no-readahead"] ? 0 : intFlag("readahead-depth", v["readahead-depth"]),
    trunkReadahead: !v["no-readahead"],
    ringSlots: intFlag("ring-slots", v["ring-slots"]),
    expertSlots: intFlag("expert-slots", v["expert-slots"]),
    prefillChunk: intFlag("prefill-chunk", v["prefill-chunk"]),
    shards: shards ? shards.split(",").filter((s) => s) : undefined,
    io: oneOf("io", v.io, ["direct", "buffered", "fallback"]),
    verify: Boolean(v.verify),
    lookahead: intFlag("lookahead", v.lookahead),
    learn: Boolean(v.learn),
    hotList: !v["no-hot-list"],
    trace: str("trace"),
    quiet,
  };
}

/** GenerateOptions from parsed {@link SAMPLING_FLAGS}. */
export function samplingOptions(v: Values): GenerateOptions {
  return {
    maxTokens: intFlag("max-tokens", v["max-tokens"]),
    temperature: numFlag("temperature", v.temperature),
    topK: intFlag("top-k", v["top-k"]),
    topP: numFlag("top-p", v["top-p"]),
    minP: numFlag("min-p", v["min-p"]),
    repetitionPenalty: numFlag("repeat-penalty", v["repeat-penalty"]),
    seed: intFlag("seed", v.seed),
    ignoreEos: Boolean(v["ignore-eos"]),
  };
}

/** The model to open: --model, or the demo model (made on first use). */
export async function modelPath(model: string | undefined, quiet: boolean): Promise<string> {
  return model ?? await (await import("../demo_model.ts")).demoModelPath(quiet);
}
