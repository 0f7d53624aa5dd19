/**
 * `mod.ts generate`: generate text from a container under a memory budget, streaming it to
 * stdout, with a stats block on stderr (or one JSON object on stdout with --json).
 *
 * @module
 */
import { parseArgs } from "node:util";
import { Session } from "../../engine/session.ts";
import { formatStats } from "../../engine/stats.ts";
import {
  modelPath,
  RUN_FLAGS,
  RUN_HELP,
  runOptions,
  SAMPLING_FLAGS,
  SAMPLING_HELP,
  samplingOptions,
} from "./run_flags.ts";

const HELP = `sluice generate — generate text from a .sluice container

Usage:
  deno run -A mod.ts generate --model X.sluice --prompt "Once upon a time" [-n 200]
  echo "Once upon a time" | deno run -A mod.ts generate --model X.sluice

Input:
  --model PATH          container made by 'deno task pack' (default: a small synthetic demo
                        model with random weights, made on first use; its text is gibberish)
  --prompt TEXT         prompt text (else --prompt-file, else stdin)
  --prompt-file FILE    read the prompt from a file
  --chat                wrap the prompt in the model's chat template as a user message
  --system TEXT         system message for --chat

Sampling (greedy by default):
${SAMPLING_HELP}

Memory and I/O (none of these change the output):
${RUN_HELP}

Output:
  --json                print one JSON object (prompt_ids, generated_ids, text, stats)
  --quiet               no stats block
  -h, --help            this text
`;

/** Runs the generate command with command-line `args`; returns the exit code. */
export async function generateCommand(args: string[]): Promise<number> {
  const { values: v } = parseArgs({
    args,
    options: {
      model: { type: "string" },
      prompt: { type: "string" },
      "prompt-file": { type: "string" },
      chat: { type: "boolean" },
      system: { type: "string" },
      ...SAMPLING_FLAGS,
      ...RUN_FLAGS,
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
  const run = runOptions(v, Boolean(v.quiet || v.json));
  // A prompt read from a file or a pipe loses one trailing newline, as `echo` or an editor adds it.
  const chomp = (text: string) => text.replace(/\r?\n$/, "");
  let prompt = v.prompt;
  if (prompt === undefined && v["prompt-file"]) {
    prompt = chomp(await Deno.readTextFile(v["prompt-file"]));
  }
  if (prompt === undefined && !Deno.stdin.isTerminal()) {
    prompt = chomp(await new Response(Deno.stdin.readable).text());
  }
  if (prompt === undefined) prompt = "";
  const session = await Session.open(await modelPath(v.model, Boolean(v.quiet || v.json)), run);
  try {
    let ids: number[];
    if (v.chat) {
      const messages = [
        ...(v.system ? [{ role: "system", content: v.system }] : []),
        { role: "user", content: prompt },
      ];
      ids = session.chatIds(messages);
    } else {
      ids = session.tokenize(prompt);
    }
    const generated: number[] = [];
    let text = "";
    const enc = new TextEncoder();
    for await (
      const tok of session.generate(ids, samplingOptions(v))
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
