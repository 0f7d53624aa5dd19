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
import { generateCommand } from "./generate.ts";
import { planCommand } from "./plan.ts";

/** One command: what it does (one line for --help) and how it runs. */
export interface Command {
  about: string;
  /** Runs with the arguments after the command name; resolves to the exit code. */
  run: (args: string[]) => Promise<number>;
}

/** Every user command, in the order --help lists them. */
export const COMMANDS: Record<string, Command> = {
  generate: { run: generateCommand, about: "generate text from a container" },
  plan: { run: planCommand, about: "show the memory plan of a container under a budget" },
  pack: { run: packCommand, about: "turn a Hugging Face checkpoint into a .sluice container" },
  inspect: { run: inspectCommand, about: "show what a container holds (--verify checks CRCs)" },
  "split-banks": {
    run: splitBanksCommand,
    about: "spread a container's expert banks over several disks",
  },
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
    console.error(`sluice: unknown command "${name}"\n\n${usage()}`);
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
