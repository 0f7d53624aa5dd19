/**
 * Builds llama.cpp's byte-level BPE vocabulary metadata (`tokenizer.ggml.model = gpt2`: tokens,
 * token types, merges, pre-tokenizer name, special ids) from a Hugging Face tokenizer.json whose
 * model is BPE under a ByteLevel pre-tokenizer, the layout of GPT-2, Llama-3, Qwen2/3,
 * DeepSeek-V3, GLM-4.5 and gpt-oss.
 *
 * Pre-tokenizer. llama.cpp splits text with a regex chosen by `tokenizer.ggml.pre`. Its converter
 * identifies the family by hashing the tokenization of a test text; here the family is read from
 * the split regexes themselves, which is what that name stands for. Llama-3 and GLM-4.5 share one
 * regex, so the architecture decides between "llama-bpe" and "glm4". An unknown regex is an
 * error: the "default" pre-tokenizer would split differently and tokenize silently wrong.
 *
 * @module
 */

import { readJsonObject } from "../../../io/json_file.ts";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { asObject, type Json, mergePair, tokenContent, vocabTable } from "./spm_vocab.ts";

/** The vocabulary as GGUF metadata wants it. */
export interface BpeVocab {
  /** llama.cpp's pre-tokenizer name (`tokenizer.ggml.pre`). */
  pre: string;
  tokens: string[];
  types: number[];
  /** "left right" pairs in rank order. */
  merges: string[];
  bosId: number | null;
  eosId: number | null;
  padId: number | null;
  addBos: boolean;
  addEos: boolean;
}

/** Llama-3's split regex (GLM-4.5 uses it too). */
const LLAMA3_REGEX = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|" +
  " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/** Split regexes (in pre-tokenizer order, "" = ByteLevel's built-in GPT-2 regex) → pre name. */
const PRE_BY_REGEXES: ReadonlyMap<string, string> = new Map([
  [JSON.stringify([""]), "gpt-2"],
  [JSON.stringify([LLAMA3_REGEX]), "llama-bpe"],
  [JSON.stringify([LLAMA3_REGEX.replace("\\p{N}{1,3}", "\\p{N}")]), "qwen2"],
  [
    JSON.stringify([
      "\\p{N}{1,3}",
      "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|" +
      " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    ]),
    "deepseek-v3",
  ],
  [
    JSON.stringify([
      "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" +
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+" +
      "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}|" +
      " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ]),
    "gpt-4o",
  ],
]);

/** The split regexes of a pre-tokenizer, "" for a ByteLevel that splits itself; null if other. */
function splitRegexes(p: unknown, out: string[]): boolean {
  const o = asObject(p);
  if (!o) return false;
  if (o.type === "Sequence" && Array.isArray(o.pretokenizers)) {
    return o.pretokenizers.every((q) => splitRegexes(q, out));
  }
  if (o.type === "ByteLevel") {
    if (o.use_regex !== false) out.push("");
    return true;
  }
  const regex = asObject(o.pattern)?.Regex;
  if (o.type === "Split" && typeof regex === "string" && o.behavior === "Isolated") {
    out.push(regex);
    return true;
  }
  return false;
}

/** Whether a pre-tokenizer (or a Sequence holding one) is ByteLevel. */
function hasByteLevel(p: unknown): boolean {
  const o = asObject(p);
  if (!o) return false;
  if (o.type === "ByteLevel") return true;
  return o.type === "Sequence" && Array.isArray(o.pretokenizers) &&
    o.pretokenizers.some(hasByteLevel);
}

/** Whether tokenizer.json `tj` is byte-level BPE (what {@link bpeVocabFromTokenizerJson} reads). */
export function isByteLevelBpe(tj: Json): boolean {
  const model = asObject(tj.model);
  return model?.type === "BPE" && model.byte_fallback !== true && hasByteLevel(tj.pre_tokenizer);
}

/** Whether a post-processor (or one in a Sequence) starts single sequences with `bos`. */
function templatePrepends(p: unknown, bos: string): boolean {
  const o = asObject(p);
  if (!o) return false;
  if (o.type === "Sequence" && Array.isArray(o.processors)) {
    return o.processors.some((q) => templatePrepends(q, bos));
  }
  if (o.type !== "TemplateProcessing" || !Array.isArray(o.single)) return false;
  return asObject(asObject(o.single[0])?.SpecialToken)?.id === bos;
}

/**
 * Reads `dir`/tokenizer.json (and tokenizer_config.json, generation_config.json when present)
 * into byte-level BPE metadata padded to `vocabSize` entries. `arch` (the GGUF architecture)
 * separates families sharing a regex; `fallback` supplies bos/eos ids from the model config.
 */
export function bpeVocabFromTokenizerJson(
  dir: string,
  vocabSize: number,
  arch: string,
  fallback: { bosId: number | null; eosId: number | null },
): BpeVocab {
  const path = join(dir, "tokenizer.json");
  if (!existsSync(path)) throw new Error(`${dir}: no tokenizer.json to export the vocabulary from`);
  const tj = readJsonObject(path);
  const model = asObject(tj.model);
  if (!model || !isByteLevelBpe(tj)) {
    throw new Error(
      `${path}: not a byte-level BPE tokenizer (model.type BPE under a ByteLevel pre-tokenizer)`,
    );
  }
  const regexes: string[] = [];
  const known = splitRegexes(tj.pre_tokenizer, regexes) &&
    PRE_BY_REGEXES.get(JSON.stringify(regexes));
  if (!known) {
    throw new Error(
      `${path}: pre-tokenizer ${
        JSON.stringify(tj.pre_tokenizer).slice(0, 300)
      } matches none llama.cpp names here (${[...new Set(PRE_BY_REGEXES.values())].join(", ")})`,
    );
  }
  const pre = known === "llama-bpe" && arch === "glm4moe" ? "glm4" : known;
  const { tokens, types, idOf } = vocabTable(path, tj, model, vocabSize);
  const merges = (Array.isArray(model.merges) ? model.merges : []).map((m, i) => {
    const [a, b] = mergePair(m, i, path);
    // llama.cpp splits each merge at its one space; byte-level symbols never hold a space.
    if (a.includes(" ") || b.includes(" ")) {
      throw new Error(`${path}: merge ${i} (${a} ${b}) has a space inside a symbol`);
    }
    if (!idOf.has(a + b)) throw new Error(`${path}: merge ${i} (${a} ${b}) yields no vocab token`);
    return `${a} ${b}`;
  });

  const cfgPath = join(dir, "tokenizer_config.json");
  const tc = existsSync(cfgPath) ? readJsonObject(cfgPath) : {};
  const genPath = join(dir, "generation_config.json");
  const gc = existsSync(genPath) ? readJsonObject(genPath) : {};
  const special = (key: string, fb: number | null): number | null => {
    const content = tokenContent(tc[key]);
    if (content !== null) {
      const id = idOf.get(content);
      if (id === undefined) {
        throw new Error(`${cfgPath}: ${key} ${content} is not in the vocabulary`);
      }
      return id;
    }
    const g = gc[`${key}_id`];
    const gid = Array.isArray(g) ? g[0] : g;
    return typeof gid === "number" && Number.isInteger(gid) ? gid : fb;
  };
  const bosId = special("bos_token", fallback.bosId);
  const bosText = bosId === null ? null : tokens[bosId];
  return {
    pre,
    tokens,
    types,
    merges,
    bosId,
    eosId: special("eos_token", fallback.eosId),
    padId: special("pad_token", null),
    addBos: typeof tc.add_bos_token === "boolean"
      ? tc.add_bos_token
      : bosText !== null && templatePrepends(tj.post_processor, bosText),
    addEos: tc.add_eos_token === true,
  };
}
