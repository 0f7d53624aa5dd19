/**
 * The command line behind `deno run -A mod.ts <command>`: every user command, one module each,
 * parsed by tools/cli/args.ts; errors printed as one clear line (no stack trace) with exit code
 * 1. The deno tasks (`deno task pack`, …) are aliases of these commands. A new command is one
 * entry in {@link COMMANDS}.
 *
 * @module
 */
import { inspectCommand } from "../inspect.ts";
import { packCommand } from "../pack.ts";
import { splitBanksCommand } from "../split_banks.ts";
import { didYouMean } from "./args.ts";
import { chatCommand } from "./chat.ts";
import { doctorCommand } from "./doctor.ts";
import { generateCommand } from "./generate.ts";
import { listCommand } from "./list.ts";
import { planCommand } from "./plan.ts";
import { pullCommand } from "./pull.ts";
import { serveCommand } from "./serve.ts";

/** One command: what it does (one line for --help) and how it runs. */
export interface Command {
  about: string;
  /** Runs with the arguments after the command name; resolves to the exit code. */
  run: (args: string[]) => Promise<number>;
}

/** Every user command, in the order --help lists them. */
export const COMMANDS: Record<string, Command> = {
  generate: { run: generateCommand, about: "generate text from a container" },
  chat: { run: chatCommand, about: "multi-turn chat in the terminal, KV cache kept" },
  list: { run: listCommand, about: "show the models of the local store (pull writes there)" },
  plan: { run: planCommand, about: "show the memory plan of a container under a budget" },
  serve: { run: serveCommand, about: "OpenAI-compatible HTTP server with a live view at /ui" },
  pack: { run: packCommand, about: "turn a Hugging Face checkpoint into a .sluice container" },
  inspect: { run: inspectCommand, about: "show what a container holds (--verify checks CRCs)" },
  "split-banks": {
    run: splitBanksCommand,
    about: "spread a container's expert banks over several disks",
  },
  pull: { run: pullCommand, about: "download a Hub checkpoint shard by shard into a container" },
  doctor: { run: doctorCommand, about: "measure this machine and recommend a budget for a model" },
};

function usage(): string {
  const lines = Object.entries(COMMANDS).map(([name, c]) => `  ${name.padEnd(12)} ${c.about}`);
  return `sluice — run MoE models larger than RAM from NVMe

Usage: deno run -A mod.ts <command> [options]   (each command has --help)

Commands:
${lines.join("\n")}

Common flags follow llama.cpp: -m/--model, -p/--prompt, -n, -t/--threads, -c/--ctx-size,
--temp, --prompt-ids 1,2,3. Deno tasks run the same commands (deno task pack …); developer
tools: deno task bench | sim | synth | export-gguf | quant-report | test.`;
}

/** Runs the command named by `args[0]`; returns the process exit code. */
export async function main(args: string[]): Promise<number> {
  const [name, ...rest] = args;
  if (!name || name === "-h" || name === "--help") {
    console.log(usage());
    return name ? 0 : 2;
  }
  const cmd = COMMANDS[name];
  if (!cmd) {
    const hint = didYouMean(name, Object.keys(COMMANDS));
    console.error(`sluice: unknown command "${name}"${hint}\n\n${usage()}`);
    return 2;
  }
  try {
    return await cmd.run(rest);
  } catch (e) {
    if (Deno.env.get("SLUICE_DEBUG")) console.error(e);
    console.error(`sluice ${name}: ${e instanceof Error ? e.message : String(e)}`);
    return 1;
  }
}
