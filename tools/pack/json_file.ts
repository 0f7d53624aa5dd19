/**
 * Writes a JSON file under a temporary name and renames it into place, so a reader never sees a
 * torn file.
 *
 * @module
 */

import { renameSync, writeFileSync } from "node:fs";

/** Writes `value` as JSON (one-space indent) to `path` through `<path>.part`. */
export function writeJson(path: string, value: unknown): void {
  writeFileSync(path + ".part", JSON.stringify(value, null, 1));
  renameSync(path + ".part", path);
}
