/**
 * A memory cgroup for the bench's over-cap regime: found from /proc/self/mounts (v2 memory.max or
 * v1 memory.limit_in_bytes), created when the bench may write there (root), and used by running
 * an engine through `sh -c 'echo $$ > cgroup.procs; exec "$@"'` so that the engine process and
 * everything it starts are charged to the cap from their first allocation.
 *
 * @module
 */
import { existsSync, mkdirSync, readFileSync, rmdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";

/** Where memory cgroups can be made. */
export interface CgroupRoot {
  version: 1 | 2;
  /** Directory under which a child cgroup is created. */
  dir: string;
}

/**
 * The memory cgroup hierarchy from the text of /proc/self/mounts: the v1 "memory" controller
 * mount, else a cgroup2 mount whose root enables (or can enable) the memory controller.
 * `controllersOf(dir)` returns the text of a v2 directory's cgroup.controllers.
 */
export function findCgroupRoot(
  mounts: string,
  controllersOf: (dir: string) => string | null,
): CgroupRoot | null {
  let v2: string | null = null;
  for (const line of mounts.split("\n")) {
    const [, dir, type, opts] = line.split(" ");
    if (type === "cgroup" && opts?.split(",").includes("memory")) return { version: 1, dir };
    if (type === "cgroup2" && v2 === null) {
      const c = controllersOf(dir);
      if (c !== null && c.split(/\s+/).includes("memory")) v2 = dir;
    }
  }
  return v2 === null ? null : { version: 2, dir: v2 };
}

/** The limit file of a cgroup of `version`. */
export function limitFile(version: 1 | 2): string {
  return version === 1 ? "memory.limit_in_bytes" : "memory.max";
}

/** A created memory cgroup; remove it with {@link removeCgroup}. */
export interface MemoryCgroup {
  version: 1 | 2;
  dir: string;
  limitBytes: number;
}

/**
 * Creates `prefix-PID` (this process's id) under the memory hierarchy with a limit of
 * `limitBytes`. Returns the reason as a string when that is impossible (no memory controller, not
 * root, not writable, or the cgroup already holds processes). Each run gets a cgroup of its own:
 * two benches sharing one name put both engines under one limit (the later one also rewrote the
 * earlier one's), which OOM-killed engines whose own charge fitted their cap (docs/LEARNED.md).
 */
export function createCgroup(prefix: string, limitBytes: number): MemoryCgroup | string {
  const name = `${prefix}-${Deno.pid}`;
  if (Deno.uid() !== 0) return "not running as root, so no memory cgroup can be created";
  let mounts = "";
  try {
    mounts = readFileSync("/proc/self/mounts", "utf8");
  } catch {
    return "cannot read /proc/self/mounts";
  }
  const root = findCgroupRoot(mounts, (d) => {
    try {
      return readFileSync(join(d, "cgroup.controllers"), "utf8");
    } catch {
      return null;
    }
  });
  if (root === null) return "no cgroup memory controller is mounted";
  const dir = join(root.dir, name);
  try {
    if (root.version === 2) {
      // The memory controller must be enabled for the root's children.
      writeFileSync(join(root.dir, "cgroup.subtree_control"), "+memory");
    }
    if (!existsSync(dir)) mkdirSync(dir);
    const procs = readFileSync(join(dir, "cgroup.procs"), "utf8").trim();
    if (procs !== "") {
      return `memory cgroup ${dir} already holds processes (${procs.split("\n").join(", ")})`;
    }
    if (root.version === 1 && existsSync(join(dir, "memory.swappiness"))) {
      writeFileSync(join(dir, "memory.swappiness"), "0");
    }
    writeFileSync(join(dir, limitFile(root.version)), String(limitBytes));
  } catch (e) {
    return `cannot set up memory cgroup ${dir}: ${(e as Error).message}`;
  }
  return { version: root.version, dir, limitBytes };
}

/** The command that runs `cmd args` inside `cg` (the shell joins it, then execs the engine). */
export function cgroupCommand(cg: MemoryCgroup, cmd: string, args: string[]): [string, string[]] {
  const procs = join(cg.dir, "cgroup.procs");
  return ["sh", ["-c", `echo $$ > '${procs}' && exec "$@"`, "sh", cmd, ...args]];
}

/** Peak memory the cgroup was charged (v1 max_usage_in_bytes, v2 memory.peak), or null. */
export function cgroupPeak(cg: MemoryCgroup): number | null {
  const f = join(cg.dir, cg.version === 1 ? "memory.max_usage_in_bytes" : "memory.peak");
  try {
    return Number(readFileSync(f, "utf8").trim());
  } catch {
    return null;
  }
}

/** Resets the peak counter (v1 only; v2 has no reset before 6.12). */
export function resetCgroupPeak(cg: MemoryCgroup): void {
  if (cg.version !== 1) return;
  try {
    writeFileSync(join(cg.dir, "memory.max_usage_in_bytes"), "0");
  } catch {
    // Best effort: the peak is informational.
  }
}

/** Removes the cgroup (it must be empty: its processes have exited). */
export function removeCgroup(cg: MemoryCgroup): void {
  try {
    rmdirSync(cg.dir);
  } catch {
    // A lingering process keeps it; it is harmless (the next run has another pid).
  }
}
