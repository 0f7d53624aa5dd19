/**
 * What a pack may write and replace: the output must not be (or contain) the source checkpoint,
 * `--force` replaces only a directory that is a sluice container, the temporary directory is
 * reused only when it is a pack's own, and one lock file keeps two packs off the same output.
 *
 * @module
 */

import {
  existsSync,
  lstatSync,
  readdirSync,
  readFileSync,
  realpathSync,
  rmSync,
  statfsSync,
  statSync,
} from "node:fs";
import { basename, dirname, join, resolve } from "node:path";
import { CONTAINER_FORMAT } from "../../io/manifest_schema.ts";
import { formatBytes } from "../progress.ts";
import { JOURNAL } from "./journal.ts";

/** The real path of `p`, resolving the nearest existing ancestor when `p` does not exist yet. */
function realish(p: string): string {
  const abs = resolve(p);
  if (existsSync(abs)) return realpathSync(abs);
  const parent = dirname(abs);
  return parent === abs ? abs : join(realish(parent), basename(abs));
}

function isInside(child: string, parent: string): boolean {
  return child === parent || child.startsWith(parent.endsWith("/") ? parent : parent + "/");
}

/** Whether `dir` is a directory holding a manifest.json of format "sluice". */
export function isContainerDir(dir: string): boolean {
  try {
    if (!lstatSync(dir).isDirectory()) return false;
    const m = join(dir, "manifest.json");
    if (statSync(m).size > 64 << 20) return false;
    return JSON.parse(readFileSync(m, "utf-8"))?.format === CONTAINER_FORMAT;
  } catch {
    return false;
  }
}

/**
 * Whether `tmp` is a pack's temporary directory: empty (made, journal not yet written), holding
 * a journal, or a finished container waiting for its rename.
 */
export function isPackTempDir(tmp: string): boolean {
  try {
    if (!lstatSync(tmp).isDirectory()) return false;
    const names = readdirSync(tmp);
    return names.length === 0 || names.includes(JOURNAL) || names.includes(`${JOURNAL}.part`) ||
      isContainerDir(tmp);
  } catch {
    return false;
  }
}

/**
 * Throws unless packing `src` into `out` (through `<out>.tmp`) can destroy nothing but an older
 * sluice container at `out` (with `force`) and the pack's own temporary directory.
 */
export function checkPackOutput(src: string, out: string, force: boolean): void {
  const srcReal = realish(src);
  for (const [p, what] of [[out, "output"], [out + ".tmp", "temporary directory"]]) {
    if (isInside(srcReal, realish(p))) {
      throw new Error(
        `${p}: the ${what} is the source checkpoint ${src} or a folder holding it; ` +
          `choose another output path`,
      );
    }
  }
  if (existsSync(out) || isSymlink(out)) {
    if (!force) throw new Error(`${out} already exists; pass --force to replace it`);
    if (!isContainerDir(out)) {
      throw new Error(
        `${out} exists and is not a sluice container (no manifest.json of format "sluice"); ` +
          `--force only replaces a container, so remove or rename it yourself`,
      );
    }
  }
  const tmp = out + ".tmp";
  if ((existsSync(tmp) || isSymlink(tmp)) && !isPackTempDir(tmp)) {
    throw new Error(
      `${tmp} exists and is not a pack's temporary directory; remove or rename it yourself`,
    );
  }
}

function isSymlink(p: string): boolean {
  try {
    return lstatSync(p).isSymbolicLink();
  } catch {
    return false;
  }
}

/** A held pack lock; {@link PackLock.release} removes the lock file. */
export interface PackLock {
  path: string;
  release(): void;
}

/**
 * Takes the exclusive lock `<out>.lock` (flock on the file, so a killed pack never leaves a stale
 * lock); throws naming the file when another pack holds it.
 */
export function lockPackOutput(out: string): PackLock {
  const path = out + ".lock";
  for (let attempt = 0; attempt < 8; attempt++) {
    const file = Deno.openSync(path, { read: true, write: true, create: true });
    if (!file.tryLockSync(true)) {
      file.close();
      throw new Error(
        `${out}: another pack is writing this output (it holds ${path}); wait for it to finish`,
      );
    }
    // The holder before us may have removed the file after we opened it: only a lock on the
    // file that is at `path` now counts.
    const fd = file.statSync();
    let here: Deno.FileInfo | null = null;
    try {
      here = Deno.statSync(path);
    } catch {
      // Removed meanwhile: try again on a new file.
    }
    if (here && here.ino === fd.ino && here.dev === fd.dev) {
      return {
        path,
        release() {
          rmSync(path, { force: true });
          file.close();
        },
      };
    }
    file.close();
  }
  throw new Error(`${path}: could not take the pack lock (the file keeps changing)`);
}

/** Throws a clear error when the file system of `dir` has less than `bytes` available. */
export function checkFreeSpace(dir: string, bytes: number): void {
  let free: number;
  try {
    let at = resolve(dir);
    while (!existsSync(at) && dirname(at) !== at) at = dirname(at);
    const s = statfsSync(at);
    free = s.bavail * s.bsize;
  } catch {
    return;
  }
  if (free < bytes) {
    throw new Error(
      `${dir}: the pack needs ${formatBytes(bytes)} but the disk has ${formatBytes(free)} free`,
    );
  }
}

/** Whether `e` is a "no space left on device" error from a write. */
export function isDiskFull(e: unknown): boolean {
  return (e as { code?: string })?.code === "ENOSPC" ||
    /No space left on device|os error 28/.test((e as Error)?.message ?? "");
}
