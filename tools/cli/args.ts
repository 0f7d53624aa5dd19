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
  /** llama.cpp's single-dash long spellings, e.g. `ngl` for `-ngl`. */
  dashed?: readonly string[];
  /** Values a boolean flag may be followed by and that are taken with it (`-fa on`). */
  values?: readonly string[];
  /** Accepted from llama.cpp habit but meaningless here: ignored, with this one-line note. */
  ignored?: string;
  /** A string flag that may be given several times (read with {@link Args.all}). */
  multiple?: boolean;
}

/** A command's flags by long name. */
export type Flags = Record<string, Flag>;

/** `-h`/`--help`, which every command has. */
export const HELP_FLAG: Flags = { help: { type: "boolean", short: "h" } };

/** `--model PATH` (llama.cpp: `-m`). */
export const MODEL_FLAG: Flags = { model: { type: "string", short: "m" } };

/** `--ctx N` (llama.cpp: `-c`, `--ctx-size`). */
export const CTX_FLAG: Flags = { ctx: { type: "string", short: "c", aliases: ["ctx-size"] } };

/**
 * llama.cpp's GPU flags, which have no meaning on this CPU engine: accepted with a note rather
 * than misread (`-fa` would otherwise be `-f a`).
 */
export const GPU_HABIT_FLAGS: Flags = {
  "n-gpu-layers": {
    type: "string",
    dashed: ["ngl"],
    aliases: ["gpu-layers"],
    ignored: "sluice runs on the CPU, so there are no GPU layers; --budget decides what stays " +
      "in RAM",
  },
  "flash-attn": {
    type: "boolean",
    dashed: ["fa"],
    values: ["on", "off", "auto"],
    ignored: "flash attention is a GPU kernel choice; sluice's CPU attention has no such switch",
  },
};

/** `--parallel N|auto` (llama.cpp: `-np`): sequences that decode together. */
export const PARALLEL_FLAG: Flags = { parallel: { type: "string", dashed: ["np"] } };

/** The value of `--parallel`: a positive whole number or "auto"; undefined when not given. */
export function parallelFromArgs(a: Args): number | "auto" | undefined {
  return a.str("parallel") === "auto" ? "auto" : a.int("parallel", 1);
}

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
    readonly values: Readonly<Record<string, string | string[] | boolean | undefined>>,
    readonly positionals: readonly string[],
  ) {}

  /** A string flag's value, or undefined when it is not given. */
  str(name: string): string | undefined {
    const v = this.values[name];
    return typeof v === "string" ? v : undefined;
  }

  /** Every value of a flag given several times (`multiple`), in order; none when absent. */
  all(name: string): string[] {
    const v = this.values[name];
    return Array.isArray(v) ? v : typeof v === "string" ? [v] : [];
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

/** Edit distance of `a` and `b` (insertions, deletions, substitutions, transpositions). */
function distance(a: string, b: string): number {
  const d = Array.from({ length: a.length + 1 }, (_, i) => [i, ...Array(b.length).fill(0)]);
  for (let j = 1; j <= b.length; j++) d[0][j] = j;
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      d[i][j] = Math.min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) {
        d[i][j] = Math.min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.length][b.length];
}

/**
 * The candidate `word` was most likely meant as: the closest by edit distance (at most a third
 * of its length, and at least 1), or the only one it begins; null when none is close or the
 * word is longer than any name.
 */
export function closest(word: string, candidates: readonly string[]): string | null {
  // Bounded: the distance costs length × length, and a hostile argument can be megabytes.
  if (word.length > 64) return null;
  let best: string | null = null;
  let bestD = Math.max(1, Math.floor(word.length / 3)) + 1;
  for (const c of candidates) {
    const d = distance(word, c);
    if (d < bestD) [best, bestD] = [c, d];
  }
  if (best !== null) return best;
  const prefixed = candidates.filter((c) => c.startsWith(word));
  return prefixed.length === 1 ? prefixed[0] : null;
}

/** ` (did you mean X?)` when a close candidate exists, else "". */
export function didYouMean(word: string, candidates: readonly string[]): string {
  const c = closest(word, candidates);
  return c === null ? "" : ` (did you mean ${c}?)`;
}

/**
 * Parses `args` against `flags`: aliases and llama.cpp's single-dash spellings are rewritten to
 * the long names first, a string flag takes a negative number as its value (`-n -1`), and a
 * flag marked `ignored` is dropped with its note on stderr. Unknown flags are errors that name
 * the closest known one; positionals only where `positionals` allows them.
 */
export function parseCommandArgs(
  command: string,
  args: readonly string[],
  flags: Flags,
  opts: { positionals?: boolean } = {},
): Args {
  const alias = new Map<string, string>();
  const dashed = new Map<string, string>();
  for (const [name, f] of Object.entries(flags)) {
    for (const a of f.aliases ?? []) alias.set(a, name);
    for (const a of f.dashed ?? []) dashed.set(a, name);
    // `-n` is a short form, spelled like a single-dash long one.
    if (f.short) dashed.set(f.short, name);
  }
  const known = [
    ...Object.keys(flags).map((n) => `--${n}`),
    ...[...alias.keys()].map((n) => `--${n}`),
    ...[...dashed.keys()].filter((n) => n.length > 1).map((n) => `-${n}`),
  ];
  // node:util's parseArgs recurses over a group of short flags ("-abc"), so a long one overflows
  // its stack (found by `deno task fuzz`): only a string flag's letter may carry more ("-n20").
  const valued = new Set(
    Object.values(flags).filter((f) => f.type === "string").map((f) => f.short),
  );
  const rewritten: string[] = [];
  const notes = new Set<string>();
  for (let i = 0; i < args.length; i++) {
    const arg = args[i];
    if (arg === "--") {
      rewritten.push(...args.slice(i));
      break;
    }
    const m = /^--([^=]+)(=.*)?$/.exec(arg) ?? /^-([^-=][^=]*)(=.*)?$/.exec(arg);
    // A long name behind one dash (`-temp`) means the long flag, as llama.cpp reads it.
    const long = (n: string) => alias.get(n) ?? (n in flags ? n : undefined);
    const name = m &&
      (arg.startsWith("--") ? long(m[1]) ?? m[1] : dashed.get(m[1]) ?? long(m[1]));
    const flag = name ? flags[name] : undefined;
    if (!flag) {
      // `-n20` is -n with 20; `-tmp` is not -t with "mp" but a mistyped --temp.
      const typo = /^-[^-]./.test(arg) && !/^-.-?[\d.]/.test(arg) &&
        closest(`--${arg.slice(1).split("=")[0]}`, known);
      if (/^-[^-]./.test(arg) && (!valued.has(arg[1]) || typo)) {
        throw new Error(
          `${command}: unknown option ${JSON.stringify(arg.slice(0, 40))} (short options are ` +
            `single letters${typo ? `; did you mean ${typo}?` : ""}; see --help)`,
        );
      }
      rewritten.push(arg);
      continue;
    }
    let value = m![2];
    if (value === undefined && flag.type === "string" && /^-\d/.test(args[i + 1] ?? "")) {
      value = `=${args[++i]}`;
    }
    if (value === undefined && flag.values?.includes(args[i + 1])) i++;
    if (flag.ignored !== undefined) {
      if (flag.type === "string" && value === undefined) i++;
      notes.add(`note: ${arg.split("=")[0]} ignored: ${flag.ignored}`);
      continue;
    }
    rewritten.push(`--${name}${value ?? ""}`);
  }
  const options: Record<
    string,
    { type: "string" | "boolean"; short?: string; multiple?: boolean }
  > = {};
  for (const [name, f] of Object.entries(flags)) {
    options[name] = {
      type: f.type,
      ...(f.short ? { short: f.short } : {}),
      ...(f.multiple ? { multiple: true } : {}),
    };
  }
  let parsed;
  try {
    parsed = parseArgs({
      args: rewritten,
      options,
      allowPositionals: opts.positionals ?? false,
      strict: true,
    });
  } catch (e) {
    const unknown = /^Unknown option '([^']*)'/.exec((e as Error).message);
    if (!unknown) throw e;
    const arg = unknown[1].slice(0, 40);
    throw new Error(
      `unknown option ${JSON.stringify(arg)}${didYouMean(arg, known)}; see --help`,
    );
  }
  for (const n of notes) console.error(n);
  return new Args(
    command,
    parsed.values as Record<string, string | string[] | boolean | undefined>,
    parsed.positionals,
  );
}
