/**
 * Bounds on the ids of tokenizer files, checked before a tokenizer library sees them: the
 * libraries size tables by the largest id, so one id of 2^31 in a damaged tokenizer.json costs
 * minutes and gigabytes (found by `deno task fuzz`) instead of an error.
 *
 * @module
 */

import { statSync } from "node:fs";

/**
 * Largest tokenizer file read (tokenizer.json, tiktoken.model, tokenizer_config.json): released
 * ones are under 40 MiB, and parsing one costs time and memory outside the budget on every run.
 */
export const MAX_TOKENIZER_FILE_BYTES = 64 << 20;
/** Longest chat template accepted (released ones are a few to a few tens of KiB). */
export const MAX_CHAT_TEMPLATE_BYTES = 1 << 20;

/** Throws, naming the file and the limit, when the file at `path` is larger than `max` bytes. */
export function checkFileSize(path: string, max: number): void {
  const size = statSync(path).size;
  if (size > max) {
    throw new Error(`${path}: ${size} bytes, more than the ${max}-byte limit for this file`);
  }
}

/** Largest token id accepted (16.7 M, far above any released vocabulary). */
export const MAX_TOKEN_ID = 1 << 24;

function checkId(v: unknown, path: string, what: string): void {
  if (typeof v !== "number" || !Number.isInteger(v) || v < 0 || v >= MAX_TOKEN_ID) {
    throw new Error(
      `${path}: ${what} has id ${JSON.stringify(v) ?? "(none)"}, expected an integer in ` +
        `0..${MAX_TOKEN_ID - 1}`,
    );
  }
}

/**
 * Throws, naming the file and the token or field, when a tokenizer.json id is not a sane integer
 * or a normalizer inserts long text.
 */
export function checkTokenizerJsonIds(json: Record<string, unknown>, path: string): void {
  const model = json.model as Record<string, unknown> | null | undefined;
  const vocab = model && typeof model === "object" ? model.vocab : undefined;
  if (vocab && typeof vocab === "object" && !Array.isArray(vocab)) {
    for (const [token, id] of Object.entries(vocab)) {
      checkId(id, path, `vocabulary token ${JSON.stringify(token)}`);
    }
  } else if (Array.isArray(vocab) && vocab.length > MAX_TOKEN_ID) {
    throw new Error(`${path}: ${vocab.length} vocabulary entries, more than ${MAX_TOKEN_ID}`);
  }
  const added = json.added_tokens;
  if (added !== undefined && !Array.isArray(added)) {
    throw new Error(`${path}: added_tokens must be a list`);
  }
  for (const [i, t] of (added ?? []).entries()) {
    checkId((t as { id?: unknown } | null)?.id, path, `added token ${i}`);
  }
  checkNormalizer(json.normalizer, path, "normalizer");
}

/** Longest text a normalizer may insert (Replace content, Prepend): real ones insert a character. */
export const MAX_NORMALIZER_TEXT = 1024;

/**
 * Throws when a normalizer inserts long text: it is applied at every match, so a 200 KB
 * replacement of " " made a 40-character prompt take seconds to encode (found by `deno task
 * fuzz`).
 */
function checkNormalizer(n: unknown, path: string, where: string, depth = 0): void {
  if (n === null || typeof n !== "object" || depth > 64) return;
  const o = n as Record<string, unknown>;
  for (const k of ["content", "prepend"]) {
    const v = o[k];
    if (typeof v === "string" && v.length > MAX_NORMALIZER_TEXT) {
      throw new Error(
        `${path}: ${where}.${k} inserts ${v.length} characters, more than ${MAX_NORMALIZER_TEXT}`,
      );
    }
  }
  if (Array.isArray(o.normalizers)) {
    o.normalizers.forEach((m, i) =>
      checkNormalizer(m, path, `${where}.normalizers[${i}]`, depth + 1)
    );
  }
}

/** Throws when a tiktoken rank is out of bounds (ranks are token ids). */
export function checkTiktokenRank(rank: number, path: string, line: number): void {
  if (rank >= MAX_TOKEN_ID) {
    throw new Error(`${path}:${line}: rank ${rank} is above the largest id ${MAX_TOKEN_ID - 1}`);
  }
}
