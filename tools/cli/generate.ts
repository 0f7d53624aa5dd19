/**
 * `mod.ts generate`: generate text from a container under a memory budget, streaming it to
 * stdout, with a stats block on stderr (or one JSON object on stdout with --json).
 *
 * @module
 */
import { renderChat } from "../../engine/chat.ts";
import type { RunOptions } from "../../engine/model.ts";
import { Session } from "../../engine/session.ts";
import { formatStats } from "../../engine/stats.ts";
import {
  type Args,
  BUDGET_FLAGS,
  CTX_FLAG,
  type Flags,
  HELP_FLAG,
  helpShown,
  MODEL_FLAG,
  parseCommandArgs,
} from "./args.ts";
import { BUDGET_HELP, budgetFromArgs } from "./budget.ts";

const HELP = `sluice generate — generate text from a .sluice container

Usage:
  deno run -A mod.ts generate --model X.sluice --prompt "Once upon a time" [-n 200]
  echo "Once upon a time" | deno run -A mod.ts generate --model X.sluice

Input:
  -m, --model PATH      container made by 'mod.ts pack' (default: a small synthetic demo
                        model with random weights, made on first use; its text is gibberish)
  -p, --prompt TEXT     prompt text (else --prompt-file, else stdin)
  -f, --prompt-file FILE  read the prompt from a file
  --prompt-ids 1,2,3    token ids instead of text (for models without a text tokenizer)
  --chat                wrap the prompt in the model's chat template as a user message
  --system TEXT         system message for --chat

Sampling (greedy by default):
  -n, --max-tokens N    new tokens to generate (default 256; also --n-predict)
  --temperature T       0 = greedy (default 0; also --temp)
  --top-k K  --top-p P  --min-p P  --repeat-penalty R
  -s, --seed S          same seed, same tokens
  --ignore-eos          do not stop at end-of-sequence tokens

Memory and I/O (none of these change the output):
${BUDGET_HELP}
  -c, --ctx N           context length the KV cache is sized for (default min(model, 4096);
                        also --ctx-size)
  -t, --threads N       compute threads including the main thread (default: all cores)
  --cache lfru|lru      expert cache policy (default lfru)
  --no-readahead        read each expert only when it is needed
  --readahead-depth N   expert reads kept in flight after routing (default 4)
  --ring-slots N        ring slots for unpinned trunk layers (default 2)
  --expert-slots N      cap the expert cache at N records
  --prefill-chunk N     prompt tokens per forward pass, ≤ 64 (default 64; also --batch-size)
  --shards A,B,...      directories holding bank shards (env SLUICE_SHARDS)
  --io direct|buffered|fallback   reader (default direct: O_DIRECT through the C shim)
  --verify              check each expert record's CRC32 as it is read
  --lookahead N         prefetch the next layer's top-N predicted experts while the disk idles
                        (default 1 while experts stream, 0 when all fit)
  --learn               add this run's expert use counts to the hot list (<model>.hot.json)
  --no-hot-list         do not warm the expert cache from the hot list
  --trace FILE          write the routed experts of every (token, layer) as JSON lines

Output:
  --json                print one JSON object (prompt_ids, generated_ids, text, stats)
  --quiet               no stats block
  -h, --help            this text
`;

/**
 * The memory and I/O flags of every command that runs a model (generate, and chat and serve
 * next), read by {@link runOptionsFromArgs}. None of them changes the output.
 */
export const RUN_FLAGS: Flags = {
  ...BUDGET_FLAGS,
  ...CTX_FLAG,
  threads: { type: "string", short: "t" },
  cache: { type: "string" },
  "no-readahead": { type: "boolean" },
  "readahead-depth": { type: "string" },
  "ring-slots": { type: "string" },
  "expert-slots": { type: "string" },
  "prefill-chunk": { type: "string", aliases: ["batch-size"] },
  shards: { type: "string" },
  io: { type: "string" },
  verify: { type: "boolean" },
  lookahead: { type: "string" },
  learn: { type: "boolean" },
  "no-hot-list": { type: "boolean" },
  trace: { type: "string" },
};

/** The flags of `generate`, with llama.cpp's spellings as aliases. */
const FLAGS: Flags = {
  ...MODEL_FLAG,
  prompt: { type: "string", short: "p" },
  "prompt-file": { type: "string", short: "f", aliases: ["file"] },
  "prompt-ids": { type: "string" },
  chat: { type: "boolean" },
  system: { type: "string" },
  "max-tokens": { type: "string", short: "n", aliases: ["n-predict"] },
  temperature: { type: "string", aliases: ["temp"] },
  "top-k": { type: "string" },
  "top-p": { type: "string" },
  "min-p": { type: "string" },
  "repeat-penalty": { type: "string" },
  seed: { type: "string", short: "s" },
  "ignore-eos": { type: "boolean" },
  json: { type: "boolean" },
  quiet: { type: "boolean" },
  ...RUN_FLAGS,
  ...HELP_FLAG,
};

/** Runs the generate command with command-line `args`; returns the exit code. */
export async function generateCommand(args: string[]): Promise<number> {
  const a = parseCommandArgs("generate", args, FLAGS);
  if (helpShown(a, HELP)) return 0;
  const run = runOptionsFromArgs(a);
  const quiet = a.bool("quiet") || a.bool("json");
  // A prompt read from a file or a pipe loses one trailing newline, as `echo` or an editor adds it.
  const chomp = (text: string) => text.replace(/\r?\n$/, "");
  const promptIds = a.list("prompt-ids")?.map((s) => {
    const n = Number(s);
    if (!Number.isSafeInteger(n) || n < 0) {
      throw new Error(`--prompt-ids expects token ids separated by commas, got "${s}"`);
    }
    return n;
  });
  let prompt = a.str("prompt");
  if (promptIds && (prompt !== undefined || a.str("prompt-file") || a.bool("chat"))) {
    throw new Error(
      "give --prompt-ids or a text prompt (--prompt, --prompt-file, --chat), not both",
    );
  }
  const promptFile = a.str("prompt-file");
  if (prompt === undefined && promptFile) prompt = chomp(await Deno.readTextFile(promptFile));
  if (prompt === undefined && !promptIds && !Deno.stdin.isTerminal()) {
    prompt = chomp(await new Response(Deno.stdin.readable).text());
  }
  if (prompt === undefined) prompt = "";
  const modelPath = a.str("model") ??
    await (await import("../demo_model.ts")).demoModelPath(quiet);

  const session = await Session.open(modelPath, run);
  try {
    let ids: number[];
    if (promptIds) {
      const vocab = session.model.cfg.vocabSize;
      const bad = promptIds.find((id) => id >= vocab);
      if (bad !== undefined) {
        throw new Error(`--prompt-ids: token id ${bad} is outside the vocabulary of ${vocab}`);
      }
      ids = promptIds;
    } else if (a.bool("chat")) {
      const system = a.str("system");
      const messages = [
        ...(system ? [{ role: "system", content: system }] : []),
        { role: "user", content: prompt },
      ];
      const text = renderChat(session.model.container.dir, messages, { addGenerationPrompt: true });
      ids = session.tokenizer.encode(text, { addSpecial: false });
    } else {
      ids = session.tokenize(prompt);
    }
    const generated: number[] = [];
    let text = "";
    const enc = new TextEncoder();
    const json = a.bool("json");
    for await (
      const tok of session.generate(ids, {
        maxTokens: a.int("max-tokens"),
        temperature: a.num("temperature"),
        topK: a.int("top-k"),
        topP: a.num("top-p"),
        minP: a.num("min-p"),
        repetitionPenalty: a.num("repeat-penalty"),
        seed: a.int("seed"),
        ignoreEos: a.bool("ignore-eos"),
      })
    ) {
      generated.push(tok.id);
      text += tok.text;
      if (!json) await Deno.stdout.write(enc.encode(tok.text));
    }
    const stats = session.stats();
    if (json) {
      console.log(JSON.stringify({ prompt_ids: ids, generated_ids: generated, text, stats }));
    } else {
      await Deno.stdout.write(enc.encode("\n"));
      if (!a.bool("quiet")) console.error(`\n${formatStats(stats)}`);
    }
  } finally {
    session.close();
  }
  return 0;
}

/** The run options of the memory and I/O flags (`generate`, and later `chat` and `serve`). */
export function runOptionsFromArgs(a: Args): RunOptions {
  const shards = a.str("shards") ?? Deno.env.get("SLUICE_SHARDS");
  return {
    budget: budgetFromArgs(a.str("budget"), a.str("preset")),
    ctx: a.int("ctx"),
    threads: a.int("threads"),
    cache: a.oneOf("cache", ["lfru", "lru"]),
    readaheadDepth: a.bool("no-readahead") ? 0 : a.int("readahead-depth"),
    trunkReadahead: !a.bool("no-readahead"),
    ringSlots: a.int("ring-slots"),
    expertSlots: a.int("expert-slots"),
    prefillChunk: a.int("prefill-chunk"),
    shards: shards ? shards.split(",").filter((s) => s) : undefined,
    io: a.oneOf("io", ["direct", "buffered", "fallback"]),
    verify: a.bool("verify"),
    lookahead: a.int("lookahead"),
    learn: a.bool("learn"),
    hotList: !a.bool("no-hot-list"),
    trace: a.str("trace"),
    quiet: a.bool("quiet") || a.bool("json"),
  };
}
