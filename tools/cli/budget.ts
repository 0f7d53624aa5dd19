/**
 * The memory budget from --budget / --preset: sizes, named presets, and "auto" = ¾ of usable RAM,
 * where usable is the smaller of physical RAM and any cgroup limit up the hierarchy.
 *
 * @module
 */
import { existsSync, readFileSync } from "node:fs";
import { totalmem } from "node:os";
import { formatBytes, parseBytes } from "../../engine/units.ts";

/** Named budgets, in bytes. */
export const PRESETS: Record<string, number> = {
  laptop: 6 * 2 ** 30,
  desktop: 12 * 2 ** 30,
  workstation: 48 * 2 ** 30,
  server: 192 * 2 ** 30,
};

/** The --budget/--preset lines of a command's --help. */
export const BUDGET_HELP =
  `  --budget SIZE         arena budget, e.g. 6G, 512M (default: the whole model resident)
  --preset NAME         laptop (6G), desktop (12G), workstation (48G), server (192G), or auto
                        (¾ of usable RAM: the smaller of RAM and the cgroup memory limit)`;

function readLimit(path: string): number | null {
  if (!existsSync(path)) return null;
  const text = readFileSync(path, "utf8").trim();
  if (text === "max" || text === "") return null;
  const n = Number(text);
  // cgroup v1 reports "no limit" as a huge page-rounded number.
  return Number.isFinite(n) && n > 0 && n < 2 ** 60 ? n : null;
}

/** The smallest memory limit of this process's cgroups (v1 and v2, up the hierarchy), or null. */
export function cgroupLimit(): number | null {
  let best: number | null = null;
  const take = (n: number | null) => {
    if (n !== null && (best === null || n < best)) best = n;
  };
  let lines: string[] = [];
  try {
    lines = readFileSync("/proc/self/cgroup", "utf8").trim().split("\n");
  } catch {
    return null;
  }
  for (const line of lines) {
    const [, controllers, path] = line.split(":");
    const v2 = controllers === "";
    if (!v2 && !controllers.split(",").includes("memory")) continue;
    const root = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory";
    const parts = path.split("/").filter((p) => p);
    for (let i = parts.length; i >= 0; i--) {
      const dir = [root, ...parts.slice(0, i)].join("/");
      if (v2) {
        take(readLimit(`${dir}/memory.max`));
        take(readLimit(`${dir}/memory.high`));
      } else {
        take(readLimit(`${dir}/memory.limit_in_bytes`));
      }
    }
  }
  return best;
}

/** Usable RAM: physical RAM or the cgroup limit, whichever is smaller. */
export function usableMemory(): number {
  const limit = cgroupLimit();
  return limit === null ? totalmem() : Math.min(totalmem(), limit);
}

/** The budget to recommend for a model: all of it when it fits in ¾ of usable RAM, else that ¾. */
export function recommendedBudget(wholeModelBytes: number): number {
  return Math.min(wholeModelBytes, Math.floor(usableMemory() * 0.75));
}

/** The budget in bytes that --budget / --preset ask for, or undefined for the whole model. */
export function budgetFromArgs(budget?: string, preset?: string): number | undefined {
  if (budget !== undefined && preset !== undefined) {
    throw new Error("give --budget or --preset, not both");
  }
  if (budget !== undefined) return parseBytes(budget);
  if (preset === undefined) return undefined;
  if (preset === "auto") return Math.floor(usableMemory() * 0.75);
  const bytes = PRESETS[preset];
  if (bytes === undefined) {
    throw new Error(
      `unknown preset "${preset}" (choose ${[...Object.keys(PRESETS), "auto"].join(", ")})`,
    );
  }
  return bytes;
}

/**
 * Bytes a memory cgroup charges the process beyond its arena: the runtime (V8's heaps, the
 * kernels, the pool worker; the Deno binary's code is shared and mostly charged elsewhere), about
 * 26 MiB in tests/memory_test.ts, and the tokenizer's tables, measured in a fresh process at
 * 0.7–0.98 KiB per vocabulary entry (26 MiB at 32,000 entries, 54–61 at 65,536, 101 at 151,936,
 * 189 at 262,144); rounded up to 8 MiB + 1 KiB per entry.
 */
export function beyondArenaBytes(vocabSize: number): { runtime: number; tokenizer: number } {
  return { runtime: 32 * 2 ** 20, tokenizer: 8 * 2 ** 20 + vocabSize * 1024 };
}

/**
 * A warning when an arena of `arenaBytes` plus what the process needs beyond it
 * ({@link beyondArenaBytes}) would pass the memory limit `limit` (the cgroup's unless given),
 * naming the largest budget that leaves room; null when it fits or nothing limits it.
 */
export function memoryLimitWarning(
  arenaBytes: number,
  vocabSize: number,
  limit: number | null = cgroupLimit(),
): string | null {
  if (limit === null) return null;
  const { runtime, tokenizer } = beyondArenaBytes(vocabSize);
  if (arenaBytes + runtime + tokenizer <= limit) return null;
  const room = limit - runtime - tokenizer;
  return `the arena (${formatBytes(arenaBytes)}) and what the process needs beyond it ` +
    `(about ${formatBytes(runtime)} for the runtime and ${formatBytes(tokenizer)} for a ` +
    `tokenizer of ${vocabSize} entries) pass this cgroup's memory limit of ` +
    `${formatBytes(limit)}, so the kernel may kill the run; ` +
    (room > 0
      ? `--budget ${Math.floor(room / 2 ** 20)}M or less leaves room`
      : "the limit leaves no room for an arena");
}
