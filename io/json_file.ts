/**
 * JSON files: reading with errors that name the file, and writing under a temporary name renamed
 * into place, so a reader never sees a torn file.
 *
 * @module
 */

import { existsSync, readFileSync, renameSync, writeFileSync } from "node:fs";

/** Reads and parses a JSON file; the error names the file and whether it was unreadable or bad. */
export function readJson(path: string): unknown {
  let text: string;
  try {
    text = readFileSync(path, "utf-8");
  } catch (e) {
    throw new Error(`${path}: cannot read (${(e as Error).message})`);
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new Error(`${path}: not valid JSON (${(e as Error).message})`);
  }
}

/** {@link readJson} of a file whose top level must be an object. */
export function readJsonObject(path: string): Record<string, unknown> {
  const v = readJson(path);
  if (v === null || typeof v !== "object" || Array.isArray(v)) {
    throw new Error(`${path}: expected a JSON object`);
  }
  return v as Record<string, unknown>;
}

/** {@link readJsonObject}, or an empty object when the file does not exist. */
export function readJsonObjectIfExists(path: string): Record<string, unknown> {
  return existsSync(path) ? readJsonObject(path) : {};
}

/** Writes `value` as JSON (one-space indent) to `path` through `<path>.part`. */
export function writeJson(path: string, value: unknown): void {
  writeFileSync(path + ".part", JSON.stringify(value, null, 1));
  renameSync(path + ".part", path);
}
