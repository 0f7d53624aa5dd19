/**
 * `mod.ts generate`: generate text from a container under a memory budget, streaming it to
 * stdout, with a stats block on stderr (or one JSON object on stdout with --json).
 *
 * @module
 */
import { parseArgs } from "node:util";
import { renderChat } from "../../engine/chat.ts";
import type { RunOptions } from "../../engine/model.ts";
import { Session } from "../../engine/session.ts";
import { formatStats } from "../../engine/stats.ts";
import { BUDGET_HELP, budgetFromArgs } from "./budget.ts";

const HELP = `sluice generate — generate text from a .sluice container

Usage:
  deno run -A mod.ts generate --model X.sluice --prompt "Once upon a time" [-n 200]
  echo "Once upon a time" | deno run -A mod.ts generate --model X.sluice

Input:
  --model PATH          container made by 'deno task pack' (default: a small synthetic demo
                        model with random weights, made on first use; its text is gibberish)
  --prompt TEXT         prompt text (else --prompt-file, else stdin)
  --prompt-file FILE    read the prompt from a file
  --prompt-ids 1,2,3    the prompt as token ids, used as they are (models whose tests give ids)
  --chat                wrap the prompt in the model's chat template as a user message
  --system TEXT         system message for --chat

Sampling (greedy by default):
  -n, --max-tokens N    new tokens to generate (default 256)
  --temperature T       0 = greedy (default 0)
  --top-k K  --top-p P  --min-p P  --repeat-penalty R
  --seed S              same seed, same tokens
  --ignore-eos          do not stop at end-of-sequence tokens

Memory and I/O (none of these change the output):
${BUDGET_HELP}
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
  --trace FILE          write the routed experts of every (token, layer) as JSON lines

Output:
  --json                print one JSON object (prompt_ids, generated_ids, text, stats)
  --quiet               no stats block
  -h, --help            this text
`;

/** `1,2,3` → [1, 2, 3]; every entry must be a token id of the model's vocabulary. */
export function parsePromptIds(s: string, vocabSize: number): number[] {
  const parts = s.split(",").map((x) => x.trim()).filter((x) => x !== "");
  if (parts.length === 0) throw new Error("--prompt-ids expects ids like 1,2,3, got nothing");
  return parts.map((x) => {
    const n = Number(x);
    if (!/^\d+$/.test(x) || n >= vocabSize) {
      throw new Error(`--prompt-ids: "${x}" is not a token id in 0..${vocabSize - 1}`);
    }
    return n;
  });
}

/** Runs the generate command with command-line `args`; returns the exit code. */
export async function generateCommand(args: string[]): Promise<number> {
  const { values: v } = parseArgs({
    args,
    options: {
      model: { type: "string" },
      prompt: { type: "string" },
      "prompt-file": { type: "string" },
      "prompt-ids": { type: "string" },
      chat: { type: "boolean" },
      system: { type: "string" },
      "max-tokens": { type: "string", short: "n" },
      temperature: { type: "string" },
      "top-k": { type: "string" },
      "top-p": { type: "string" },
      "min-p": { type: "string" },
      "repeat-penalty": { type: "string" },
      seed: { type: "string" },
      "ignore-eos": { type: "boolean" },
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
      json: { type: "boolean" },
      quiet: { type: "boolean" },
      help: { type: "boolean", short: "h" },
    },
    strict: true,
  });
  if (v.help) {
    console.log(HELP);
    return 0;
  }
  const int = (name: string, s: string | undefined) => {
    if (s === undefined) return undefined;
    const n = Number(s);
    if (!Number.isInteger(n) || n < 0) {
      throw new Error(`--${name} expects a whole number, got "${s}"`);
    }
    return n;
  };
  const num = (name: string, s: string | undefined) => {
    if (s === undefined) return undefined;
    const n = Number(s);
    if (!Number.isFinite(n)) throw new Error(`--${name} expects a number, got "${s}"`);
    return n;
  };
  const oneOf = <T extends string>(name: string, s: string | undefined, ok: T[]) => {
    if (s === undefined) return undefined;
    if (!ok.includes(s as T)) {
      throw new Error(`--${name} expects one of ${ok.join(", ")}, got "${s}"`);
    }
    return s as T;
  };
  const shards = v.shards ?? Deno.env.get("SLUICE_SHARDS");
  const run: RunOptions = {
    budget: budgetFromArgs(v.budget, v.preset),
    ctx: int("ctx", v.ctx),
    threads: int("threads", v.threads),
    cache: oneOf("cache", v.cache, ["lfru", "lru"]),
    readaheadDepth: v["no-readahead"] ? 0 : int("readahead-depth", v["readahead-depth"]),
    trunkReadahead: !v["no-readahead"],
    ringSlots: int("ring-slots", v["ring-slots"]),
    expertSlots: int("expert-slots", v["expert-slots"]),
    prefillChunk: int("prefill-chunk", v["prefill-chunk"]),
    shards: shards ? shards.split(",").filter((s) => s) : undefined,
    io: oneOf("io", v.io, ["direct", "buffered", "fallback"]),
    verify: v.verify,
    lookahead: int("lookahead", v.lookahead),
    learn: v.learn,
    hotList: !v["no-hot-list"],
    trace: v.trace,
    quiet: v.quiet || v.json,
  };
  // A prompt read from a file or a pipe loses one trailing newline, as `echo` or an editor adds it.
  const chomp = (text: string) => text.replace(/\r?\n$/, "");
  let prompt = v.prompt;
  if (prompt === undefined && v["prompt-file"]) {
    prompt = chomp(await Deno.readTextFile(v["prompt-file"]));
  }
  if (prompt === undefined && v["prompt-ids"] === undefined && !Deno.stdin.isTerminal()) {
    prompt = chomp(await new Response(Deno.stdin.readable).text());
  }
  if (prompt === undefined) prompt = "";
  const modelPath = v.model ??
    await (await import("../demo_model.ts")).demoModelPath(Boolean(v.quiet || v.json));

  const session = await Session.open(modelPath, run);
  try {
    let ids: number[];
    if (v["prompt-ids"] !== undefined) {
      if (v.chat || v.prompt !== undefined || v["prompt-file"]) {
        throw new Error("--prompt-ids replaces --prompt, --prompt-file and --chat");
      }
      ids = parsePromptIds(v["prompt-ids"], session.model.cfg.vocabSize);
    } else if (v.chat) {
      const messages = [
        ...(v.system ? [{ role: "system", content: v.system }] : []),
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
    for await (
      const tok of session.generate(ids, {
        maxTokens: int("max-tokens", v["max-tokens"]),
        temperature: num("temperature", v.temperature),
        topK: int("top-k", v["top-k"]),
        topP: num("top-p", v["top-p"]),
        minP: num("min-p", v["min-p"]),
        repetitionPenalty: num("repeat-penalty", v["repeat-penalty"]),
        seed: int("seed", v.seed),
        ignoreEos: v["ignore-eos"],
      })
    ) {
      generated.push(tok.id);
      text += tok.text;
      if (!v.json) await Deno.stdout.write(enc.encode(tok.text));
    }
    const stats = session.stats();
    if (v.json) {
      console.log(JSON.stringify({ prompt_ids: ids, generated_ids: generated, text, stats }));
    } else {
      await Deno.stdout.write(enc.encode("\n"));
      if (!v.quiet) console.error(`\n${formatStats(stats)}`);
    }
  } finally {
    session.close();
  }
  return 0;
}
