/**
 * `mod.ts generate`: generate text from a container under a memory budget, streaming it to
 * stdout, with a stats block on stderr (or one JSON object on stdout with --json).
 *
 * @module
 */
import { createSampler } from "../../engine/sampler.ts";
import { formatStats } from "../../engine/stats.ts";
import { chatCommand } from "./chat.ts";
import { modeLines } from "./modes.ts";
import {
  COLOR_FLAGS,
  COLOR_HELP,
  colorOn,
  contextFullNotice,
  loadLine,
  paint,
  prefillProgress,
} from "./feedback.ts";
import { type Flags, HELP_FLAG, helpShown, MODEL_FLAG, parseCommandArgs } from "./args.ts";
import {
  applyChatTemplate,
  CHAT_TEMPLATE_FLAG,
  CHAT_TEMPLATE_HELP,
  openSession,
  RUN_FLAGS,
  RUN_HELP,
  runOptionsFromArgs,
  SAMPLING_FLAGS,
  SAMPLING_HELP,
  samplingFromArgs,
} from "./run_flags.ts";
import { SPEC_FLAGS, SPEC_HELP, specFromArgs } from "./spec_flags.ts";

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
  --system TEXT         system message for --chat (also -sys, --system-prompt)
  -cnv, --conversation  start an interactive chat instead (as 'mod.ts chat' with these flags;
                        -no-cnv, generate's own behaviour, is accepted too)
${CHAT_TEMPLATE_HELP}
  --chat-template-kwargs JSON
                        extra template variables for --chat, as llama.cpp takes them, e.g.
                        '{"reasoning_effort":"high"}' for gpt-oss's harmony template
  An empty prompt starts from BOS (as llama.cpp does); --chat refuses an empty user message.
  A prompt that does not fit in --ctx is refused with both lengths (raise --ctx or shorten it).

Sampling (greedy by default):
${SAMPLING_HELP}

Speculative decoding:
${SPEC_HELP}

Memory and I/O (none of these change the output):
${RUN_HELP}

Output:
  The prompt is printed before the text that continues it, as llama.cpp does (not with --chat).
  --no-display-prompt   print only the generated text
  --json                print one JSON object (prompt_ids, generated_ids, text, stop_reason:
                        eos, max_tokens, context or aborted, stats)
${COLOR_HELP}
  --quiet               no stats block
  -h, --help            this text
`;

/** The `--chat-template-kwargs` object, or an error naming the flag. */
function templateKwargs(raw: string | undefined): Record<string, unknown> | undefined {
  if (raw === undefined) return undefined;
  let v: unknown;
  try {
    v = JSON.parse(raw);
  } catch (e) {
    throw new Error(`--chat-template-kwargs: not valid JSON (${(e as Error).message})`);
  }
  if (v === null || typeof v !== "object" || Array.isArray(v)) {
    throw new Error(`--chat-template-kwargs: expected a JSON object, got ${raw}`);
  }
  return v as Record<string, unknown>;
}

/** The flags of `generate`, with llama.cpp's spellings as aliases. */
const FLAGS: Flags = {
  ...MODEL_FLAG,
  prompt: { type: "string", short: "p" },
  "prompt-file": { type: "string", short: "f", aliases: ["file"] },
  "prompt-ids": { type: "string" },
  chat: { type: "boolean" },
  conversation: { type: "boolean", dashed: ["cnv"] },
  "no-conversation": { type: "boolean", dashed: ["no-cnv"] },
  system: { type: "string", dashed: ["sys"], aliases: ["system-prompt"] },
  "chat-template-kwargs": { type: "string" },
  ...CHAT_TEMPLATE_FLAG,
  ...SAMPLING_FLAGS,
  ...RUN_FLAGS,
  ...SPEC_FLAGS,
  "no-display-prompt": { type: "boolean" },
  ...COLOR_FLAGS,
  json: { type: "boolean" },
  quiet: { type: "boolean" },
  ...HELP_FLAG,
};

/**
 * Parses and checks the generate command line: everything that can be refused is refused here,
 * before a model loads (run options, --trace's path, the sampling values). Null for --help.
 */
export function parseGenerateArgs(args: string[]) {
  const a = parseCommandArgs("generate", args, FLAGS);
  if (helpShown(a, HELP)) return null;
  const run = { ...runOptionsFromArgs(a), spec: specFromArgs(a) };
  const sampling = samplingFromArgs(a);
  createSampler(Object.fromEntries(Object.entries(sampling).filter(([, x]) => x !== undefined)));
  const kwargs = templateKwargs(a.str("chat-template-kwargs"));
  return { a, run, sampling, kwargs };
}

/** Runs the generate command with command-line `args`; returns the exit code. */
export async function generateCommand(args: string[]): Promise<number> {
  const cnv = ["-cnv", "--conversation"];
  if (args.some((x) => cnv.includes(x))) {
    return await chatCommand(args.filter((x) => !cnv.includes(x)));
  }
  const parsed = parseGenerateArgs(args);
  if (!parsed) return 0;
  const { a, run, sampling, kwargs } = parsed;
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
  if (a.bool("chat") && prompt.trim() === "") {
    throw new Error(
      "--chat needs a user message: give --prompt, --prompt-file or pipe it on stdin",
    );
  }
  const colorOut = colorOn(a, Deno.stdout);
  const colorErr = colorOn(a, Deno.stderr);
  const session = await openSession(a, run, quiet);
  try {
    if (a.bool("chat")) applyChatTemplate(session, a, "generate", quiet);
    if (!quiet) {
      console.error(paint(colorErr, "dim", loadLine(session.stats())));
      const [mode, warning] = modeLines(session.model, run);
      console.error(paint(colorErr, "dim", mode));
      if (warning) console.error(paint(colorErr, "yellow", warning));
    }
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
      ids = session.chatIds(messages, kwargs);
    } else {
      ids = session.tokenize(prompt);
    }
    const generated: number[] = [];
    let text = "";
    const enc = new TextEncoder();
    const json = a.bool("json");
    // The prompt's own decode: with the continuation's text after it, the decode of the whole.
    // Printed once the prefill is done, after its progress line.
    let echo = !json && !a.bool("chat") && !a.bool("no-display-prompt")
      ? paint(colorOut, "bold", session.detokenize(ids))
      : "";
    const onPrefill = quiet
      ? undefined
      : prefillProgress({ color: colorErr, cached: () => session.timings.cachedTokens });
    for await (const tok of session.generate(ids, { ...sampling, onPrefill })) {
      generated.push(tok.id);
      text += tok.text;
      if (!json) await Deno.stdout.write(enc.encode(echo + tok.text));
      echo = "";
    }
    if (echo) await Deno.stdout.write(enc.encode(echo));
    const stats = session.stats();
    // A full context is said on stderr even with --json, where stop_reason says it too.
    const full = contextFullNotice(stats, session.model.maxContext);
    if (full && !a.bool("quiet")) console.error(paint(colorErr, "yellow", `\n${full}`));
    if (json) {
      console.log(JSON.stringify({
        prompt_ids: ids,
        generated_ids: generated,
        text,
        stop_reason: stats.stop_reason,
        stats,
      }));
    } else {
      await Deno.stdout.write(enc.encode("\n"));
      if (!a.bool("quiet")) console.error(`\n${formatStats(stats)}`);
    }
  } finally {
    session.close();
  }
  return 0;
}
