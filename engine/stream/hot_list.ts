/**
 * The learned hot list: per-(layer, expert) use counts from earlier runs, kept beside the
 * container as `<container>.hot.json`, so the next open can warm the expert cache with the
 * hottest records first.
 *
 * @module
 */
import { existsSync, readFileSync, renameSync, writeFileSync } from "node:fs";

/** Path of the hot list of the container at `containerDir`. */
export function hotListPath(containerDir: string): string {
  return `${containerDir.replace(/\/+$/, "")}.hot.json`;
}

/** Use counts keyed "layer:expert". */
export type UseCounts = Map<string, number>;

/** Reads a hot list; null when there is none. Bad content is an error naming the file. */
export function readHotList(path: string): UseCounts | null {
  if (!existsSync(path)) return null;
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(path, "utf8"));
  } catch (e) {
    throw new Error(`${path}: not a hot list (${(e as Error).message})`);
  }
  const counts = (raw as { counts?: unknown })?.counts;
  if (!counts || typeof counts !== "object") throw new Error(`${path}: expected {"counts": {...}}`);
  const out: UseCounts = new Map();
  for (const [k, v] of Object.entries(counts)) {
    if (!/^\d+:\d+$/.test(k) || typeof v !== "number" || !(v >= 0)) {
      throw new Error(`${path}: bad entry ${JSON.stringify(k)}: ${JSON.stringify(v)}`);
    }
    out.set(k, v);
  }
  return out;
}

/** Adds `counts` to the hot list at `path` (temp file + rename). */
export function mergeHotList(path: string, counts: UseCounts): void {
  const merged = readHotList(path) ?? new Map();
  for (const [k, v] of counts) merged.set(k, (merged.get(k) ?? 0) + v);
  const tmp = `${path}.tmp-${Deno.pid}`;
  writeFileSync(tmp, JSON.stringify({ counts: Object.fromEntries(merged) }));
  renameSync(tmp, path);
}

/** (layer, expert) pairs, hottest first (ties by layer, then expert). */
export function hottest(counts: UseCounts): [number, number][] {
  return [...counts.entries()]
    .map(([k, v]) => [...k.split(":").map(Number), v] as [number, number, number])
    .sort((a, b) => b[2] - a[2] || a[0] - b[0] || a[1] - b[1])
    .map(([l, e]) => [l, e]);
}
