/**
 * The flags every model-running command shares (generate, chat, serve): memory and I/O
 * placement, which never change the output, and sampling; declared once here for the one
 * argument parser (./args.ts) and read into RunOptions and GenerateOptions.
 *
 * @module
 */
import { planRun, type RunOptions } from "../../engine/model.ts";
import { checkContext, crcSampleOf, prefillChunkOf } from "../../engine/run_limits.ts";
import { type GenerateOptions, Session, type SessionOptions } from "../../engine/session.ts";
import { openContainer } from "../../engine/container.ts";
import { autoBudget } from "./modes.ts";
import { CACHE_POLICIES } from "../../engine/stream/expert_cache.ts";
import { checkTracePath } from "../../io/trace.ts";
import { type Args, BUDGET_FLAGS, CTX_FLAG, type Flags, GPU_HABIT_FLAGS } from "./args.ts";
import { BUDGET_HELP, budgetFromArgs, memoryLimitWarning } from "./budget.ts";
import { resolveModel } from "./models.ts";
import { colorOn, loadProgress } from "./feedback.ts";

/** The --help lines of {@link RUN_FLAGS}. */
export const RUN_HELP = `${BUDGET_HELP}
  -c, --ctx N           context length the KV cache is sized for (default min(model, 4096);
                        also --ctx-size)
  -t, --threads N       compute threads including the main thread (default and most: all cores)
  --cache POLICY        expert cache policy: decay (default), lfru or lru
  --no-readahead        read each expert only when it is needed
  --readahead-depth N   expert reads kept in flight after routing (default 32)
  --ring-slots N        ring slots for unpinned trunk layers (default 2)
  --expert-slots N      cap the expert cache at N records (it then borrows no KV room)
  --no-kv-lend          keep the KV cache's unwritten rows empty instead of lending them to
                        the expert cache while the context is short
  --prefill-chunk N     prompt tokens per forward pass, 1..512 (default 128, 512 at -c 8192 or
                        more; also --batch-size)
  --shards A,B,...      directories holding bank shards (env SLUICE_SHARDS)
  --io direct|buffered|fallback   reader (default direct: O_DIRECT through the C shim)
  --verify              check the CRC32 of each expert record and trunk region as it is read
  --crc-sample P        share of expert reads whose CRC32 is checked without --verify
                        (default 1/64; every read gets its header checked)
  --lookahead N         prefetch the next layer's top-N predicted experts while the disk idles
                        (default 1 while experts stream, 0 when all fit)
  --learn               add this run's expert use counts to the hot list (<model>.hot.json)
  --no-hot-list         do not warm the expert cache from the hot list
  --trace FILE          write the routed experts of every (token, layer) as JSON lines
  -ngl N, -fa           accepted from llama.cpp habit and ignored, with a note (no GPU here)`;

/** The --help lines of {@link SAMPLING_FLAGS}. */
export const SAMPLING_HELP =
  `  -n, --max-tokens N    new tokens to generate (default 256; also --n-predict); -1: until
                        an end-of-sequence token or the context is full
  --temperature T       0 = greedy (default 0; also --temp)
  --top-k K  --top-p P  --min-p P  --repeat-penalty R
  -s, --seed S          same seed, same tokens
  --ignore-eos          do not stop at end-of-sequence tokens`;

/** The memory and I/O flags, with llama.cpp's spellings as aliases. */
export const RUN_FLAGS: Flags = {
  ...BUDGET_FLAGS,
  ...CTX_FLAG,
  threads: { type: "string", short: "t" },
  cache: { type: "string" },
  "no-readahead": { type: "boolean" },
  "readahead-depth": { type: "string" },
  "ring-slots": { type: "string" },
  "expert-slots": { type: "string" },
  "no-kv-lend": { type: "boolean" },
  "prefill-chunk": { type: "string", aliases: ["batch-size"] },
  shards: { type: "string" },
  io: { type: "string" },
  verify: { type: "boolean" },
  "crc-sample": { type: "string" },
  lookahead: { type: "string" },
  learn: { type: "boolean" },
  "no-hot-list": { type: "boolean" },
  trace: { type: "string" },
  ...GPU_HABIT_FLAGS,
};

/** The sampling flags, with llama.cpp's spellings as aliases. */
export const SAMPLING_FLAGS: Flags = {
  "max-tokens": { type: "string", short: "n", aliases: ["n-predict"] },
  temperature: { type: "string", aliases: ["temp"] },
  "top-k": { type: "string" },
  "top-p": { type: "string" },
  "min-p": { type: "string" },
  "repeat-penalty": { type: "string" },
  seed: { type: "string", short: "s" },
  "ignore-eos": { type: "boolean" },
};

/**
 * The run options of {@link RUN_FLAGS} (quiet with --quiet or --json), checked as the model
 * would check them.
 */
export function runOptionsFromArgs(a: Args): RunOptions {
  const shards = a.str("shards") ?? Deno.env.get("SLUICE_SHARDS");
  const run: RunOptions = {
    budget: budgetFromArgs(a.str("budget"), a.str("preset")),
    ctx: a.int("ctx"),
    threads: a.int("threads"),
    cache: a.oneOf("cache", [...CACHE_POLICIES]),
    readaheadDepth: a.bool("no-readahead") ? 0 : a.int("readahead-depth"),
    trunkReadahead: !a.bool("no-readahead"),
    ringSlots: a.int("ring-slots"),
    expertSlots: a.int("expert-slots"),
    lendKv: !a.bool("no-kv-lend"),
    prefillChunk: a.int("prefill-chunk"),
    shards: shards ? shards.split(",").filter((s) => s) : undefined,
    io: a.oneOf("io", ["direct", "buffered", "fallback"]),
    verify: a.bool("verify"),
    crcSample: a.num("crc-sample"),
    lookahead: a.int("lookahead"),
    learn: a.bool("learn"),
    hotList: !a.bool("no-hot-list"),
    trace: a.str("trace"),
    quiet: a.bool("quiet") || a.bool("json"),
  };
  // Checked as the model would check them, so a bad value fails before it loads.
  if (run.trace !== undefined) checkTracePath(run.trace);
  prefillChunkOf(run.prefillChunk);
  crcSampleOf(run.crcSample);
  checkContext(run.ctx);
  return run;
}

/**
 * `-n -1` (llama.cpp's "no limit"): the generation then stops at an end-of-sequence token or
 * when the context is full. A safe integer, so a saved chat's JSON keeps it.
 */
export const UNTIL_END = Number.MAX_SAFE_INTEGER;

/** The generate options of {@link SAMPLING_FLAGS}. */
export function samplingFromArgs(a: Args): GenerateOptions {
  return {
    maxTokens: a.str("max-tokens") === "-1" ? UNTIL_END : a.int("max-tokens"),
    temperature: a.num("temperature"),
    topK: a.int("top-k"),
    topP: a.num("top-p"),
    minP: a.num("min-p"),
    repetitionPenalty: a.num("repeat-penalty"),
    seed: a.int("seed"),
    ignoreEos: a.bool("ignore-eos"),
  };
}

/**
 * The container of `--model` (see {@link modelPath}) and the options to open it with: `run`,
 * where `--preset auto` becomes the whole working-set step below its ¾ of usable memory
 * (tools/cli/modes.ts). Plain data, so a worker can open it (`serve`).
 */
export async function sessionSpec(
  a: Args,
  run: SessionOptions,
  quiet: boolean,
): Promise<{ path: string; options: SessionOptions }> {
  const path = await modelPath(a, quiet);
  const c = openContainer(path);
  if (a.str("preset") === "auto" && run.budget !== undefined) {
    run = { ...run, budget: autoBudget(c, run, run.budget) };
  }
  let arena: number | null = null;
  try {
    arena = planRun(c, run).plan.arenaBytes;
  } catch {
    // A budget below the floor: opening the session says so, naming what does not fit.
  }
  const warning = arena === null ? null : memoryLimitWarning(arena, c.config.vocabSize);
  if (warning) console.error(`warning: ${warning}`);
  return { path, options: run };
}

/**
 * Opens the session of {@link sessionSpec}, with a live load line on a terminal unless `quiet`
 * (tools/cli/feedback.ts).
 */
export async function openSession(
  a: Args,
  run: SessionOptions,
  quiet: boolean,
): Promise<Session> {
  const { path, options } = await sessionSpec(a, run, quiet);
  if (quiet) return await Session.open(path, options);
  const progress = loadProgress({ color: colorOn(a, Deno.stderr) });
  try {
    return await Session.open(path, { ...options, onLoad: progress.onLoad });
  } finally {
    progress.end();
  }
}

/**
 * The model to open: --model (a path, or a name of the model store: tools/cli/models.ts), or the
 * demo model (made on first use).
 */
export async function modelPath(a: Args, quiet: boolean): Promise<string> {
  const given = a.str("model");
  if (given !== undefined) return await resolveModel(given);
  return await (await import("../demo_model.ts")).demoModelPath(quiet);
}

/** `--chat-template T`, shared by chat, generate --chat and serve. */
export const CHAT_TEMPLATE_FLAG = { "chat-template": { type: "string" } } as const;

/** The help line of {@link CHAT_TEMPLATE_FLAG}. */
export const CHAT_TEMPLATE_HELP =
  `  --chat-template T     a Jinja file, or "chatml" (built-in), instead of the checkpoint's
                        template; a checkpoint without one uses chatml, with a notice`;

/**
 * Makes `session` render chats with `--chat-template` when given, and says once on stderr (as
 * `command`) that the built-in template stands in for a checkpoint without one.
 */
export function applyChatTemplate(
  session: Session,
  a: Args,
  command: string,
  quiet: boolean,
): void {
  const template = a.str("chat-template");
  if (template !== undefined) session.useChatTemplate(template);
  const notice = session.chatTemplate.notice;
  if (notice && !quiet) console.error(`sluice ${command}: ${notice}`);
}
