/**
 * The small files of a checkpoint a container carries along: the configs and the tokenizer
 * files, copied as they are.
 *
 * @module
 */

import { chmodSync, copyFileSync, existsSync } from "node:fs";
import { join } from "node:path";
import type { ModelConfig } from "../../io/model_config.ts";
import { loadTokenizer } from "../../engine/tokenizer.ts";

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

/**
 * Loads the checkpoint's tokenizer as generate will, so a broken one fails the pack, not the first
 * run: its ids must fit the model's vocabulary. A checkpoint without one still packs (the
 * container then runs from token ids only), with a warning.
 */
export async function checkTokenizer(
  src: string,
  cfg: ModelConfig,
  log: (line: string) => void,
): Promise<void> {
  if (!TOKENIZER_FILES.some((f) => existsSync(join(src, f)))) {
    log(
      `pack: warning: ${src} has no tokenizer.json or tiktoken.model; the container will ` +
        `only run from token ids`,
    );
    return;
  }
  let tok;
  try {
    tok = await loadTokenizer(src);
  } catch (e) {
    throw new Error(`tokenizer of ${src} does not load: ${(e as Error).message}`);
  }
  if (tok.vocabSize > cfg.vocabSize) {
    throw new Error(
      `${join(src, "tokenizer.json")}: the tokenizer has ${tok.vocabSize} ids but config.json's ` +
        `vocab_size is ${cfg.vocabSize}`,
    );
  }
}
