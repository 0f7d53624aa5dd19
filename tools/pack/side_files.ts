/**
 * The small files of a checkpoint a container carries along: the configs and the tokenizer
 * files, copied as they are.
 *
 * @module
 */

import { chmodSync, copyFileSync, existsSync } from "node:fs";
import { join } from "node:path";

/** Files copied from the checkpoint when present, listed in the manifest as tokenizer files. */
export const TOKENIZER_FILES = [
  "tokenizer.json",
  "tokenizer.model",
  "tiktoken.model",
  "tokenizer_config.json",
  "special_tokens_map.json",
  "chat_template.jinja",
];

/** The checkpoint's configs: copied too, recorded in the manifest and in the source fingerprint. */
export const CONFIG_FILES = ["config.json", "generation_config.json"];

/**
 * Copies the tokenizer and config files `src` has into `dir` (mode 0644); returns the tokenizer
 * files copied.
 */
export function copySideFiles(src: string, dir: string): string[] {
  const copied: string[] = [];
  for (const f of [...TOKENIZER_FILES, ...CONFIG_FILES]) {
    if (existsSync(join(src, f))) {
      copyFileSync(join(src, f), join(dir, f));
      chmodSync(join(dir, f), 0o644);
      if (TOKENIZER_FILES.includes(f)) copied.push(f);
    }
  }
  return copied;
}
