/**
 * The command line behind `deno run -A mod.ts <command>`: one module per command, errors printed
 * as one clear line (no stack trace) with exit code 1.
 *
 * @module
 */
import { chatCommand } from "./chat.ts";
import { generateCommand } from "./generate.ts";
import { planCommand } from "./plan.ts";
import { serveCommand } from "./serve.ts";

const COMMANDS: Record<string, { run: (args: string[]) => Promise<number>; about: string }> = {
  generate: { run: generateCommand, about: "generate text from a container" },
  chat: { run: chatCommand, about: "multi-turn chat in the terminal, KV cache kept" },
  plan: { run: planCommand, about: "show the memory plan of a container under a budget" },
  serve: { run: serveCommand, about: "OpenAI-compatible HTTP server with a live view at /ui" },
};

function usage(): string {
  const lines = Object.entries(COMMANDS).map(([name, c]) => `  ${name.padEnd(10)} ${c.about}`);
  return `sluice — run MoE models larger than RAM from NVMe

Usage: deno run -A mod.ts <command> [options]   (each command has --help)

Commands:
${lines.join("\n")}

Tasks: deno task pack <hf-dir> <out>.sluice | inspect <x.sluice> | bench <name> | test`;
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
