/**
 * The one argument parser of every command (`mod.ts <command>` and the deno tasks): flags are
 * declared once per command with their llama.cpp-style aliases, and values are read through
 * typed getters whose errors name the flag and what it expects.
 *
 * @module
 */
import { parseArgs } from "node:util";

/** One flag of a command, by its long name. */
export interface Flag {
  type: "string" | "boolean";
  /** One-letter form, e.g. `n` for `-n`. */
  short?: string;
  /** Other long names meaning the same flag, e.g. llama.cpp's `temp` for `temperature`. */
  aliases?: readonly string[];
}

/** A command's flags by long name. */
export type Flags = Record<string, Flag>;

/** `-h`/`--help`, which every command has. */
export const HELP_FLAG: Flags = { help: { type: "boolean", short: "h" } };

/** `--model PATH` (llama.cpp: `-m`). */
export const MODEL_FLAG: Flags = { model: { type: "string", short: "m" } };

/** `--ctx N` (llama.cpp: `-c`, `--ctx-size`). */
export const CTX_FLAG: Flags = { ctx: { type: "string", short: "c", aliases: ["ctx-size"] } };

/** `--budget SIZE` and `--preset NAME` (tools/cli/budget.ts). */
export const BUDGET_FLAGS: Flags = { budget: { type: "string" }, preset: { type: "string" } };

/** The parsed command line of one command. */
export class Args {
  /**
   * `command` names the command in errors; `values` are by long name; `positionals` are the
   * arguments that are not flags.
   */
  constructor(
    readonly command: string,
    readonly values: Readonly<Record<string, string | boolean | undefined>>,
    readonly positionals: readonly string[],
  ) {}

  /** A string flag's value, or undefined when it is not given. */
  str(name: string): string | undefined {
    const v = this.values[name];
    return typeof v === "string" ? v : undefined;
  }

  /** Whether a boolean flag is given. */
  bool(name: string): boolean {
    return this.values[name] === true;
  }

  /** A whole number ≥ `min` (default 0), or undefined when the flag is not given. */
  int(name: string, min = 0): number | undefined {
    const s = this.str(name);
    if (s === undefined) return undefined;
    const n = Number(s);
    if (s.trim() === "" || !Number.isSafeInteger(n) || n < min) {
      throw new Error(
        min === 1
          ? `--${name} must be a positive integer, got "${s}"`
          : `--${name} expects a whole number, got "${s}"`,
      );
    }
    return n;
  }

  /** A finite number, or undefined when the flag is not given. */
  num(name: string): number | undefined {
    const s = this.str(name);
    if (s === undefined) return undefined;
    const n = Number(s);
    if (s.trim() === "" || !Number.isFinite(n)) {
      throw new Error(`--${name} expects a number, got "${s}"`);
    }
    return n;
  }

  /** One of `allowed`, or undefined when the flag is not given. */
  oneOf<T extends string>(name: string, allowed: readonly T[]): T | undefined {
    const s = this.str(name);
    if (s === undefined) return undefined;
    if (!allowed.includes(s as T)) {
      throw new Error(`--${name} expects one of ${allowed.join(", ")}, got "${s}"`);
    }
    return s as T;
  }

  /** A comma-separated list (empty items dropped), or undefined when the flag is not given. */
  list(name: string): string[] | undefined {
    return this.str(name)?.split(",").filter((s) => s !== "");
  }
}

/** Prints `usage` (stdout) when `-h`/`--help` was given, and says whether it was. */
export function helpShown(a: Args, usage: string): boolean {
  if (a.bool("help")) console.log(usage);
  return a.bool("help");
}

/**
 * Parses `args` against `flags` (aliases rewritten to their long names first). Unknown flags
 * are errors; positionals only where `positionals` allows them.
 */
export function parseCommandArgs(
  command: string,
  args: readonly string[],
  flags: Flags,
  opts: { positionals?: boolean } = {},
): Args {
  const alias = new Map<string, string>();
  for (const [name, f] of Object.entries(flags)) {
    for (const a of f.aliases ?? []) alias.set(a, name);
  }
  const rewritten = args.map((arg) => {
    const m = /^--([^=]+)(=.*)?$/.exec(arg);
    const to = m && alias.get(m[1]);
    return to ? `--${to}${m[2] ?? ""}` : arg;
  });
  const options: Record<string, { type: "string" | "boolean"; short?: string }> = {};
  for (const [name, f] of Object.entries(flags)) {
    options[name] = f.short ? { type: f.type, short: f.short } : { type: f.type };
  }
  const { values, positionals } = parseArgs({
    args: rewritten,
    options,
    allowPositionals: opts.positionals ?? false,
    strict: true,
  });
  return new Args(command, values as Record<string, string | boolean | undefined>, positionals);
}
