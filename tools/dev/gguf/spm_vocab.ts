/**
 * Builds llama.cpp's SentencePiece vocabulary metadata (`tokenizer.ggml.model = llama`: tokens,
 * scores, token types, special ids) from a Hugging Face tokenizer.json of the Llama-2 kind: a BPE
 * model with byte_fallback, whose merges were extracted from a SentencePiece model.
 *
 * Scores. llama.cpp's SPM tokenizer merges the adjacent pair whose concatenation has the highest
 * score, so the scores must order pieces as the BPE merge ranks do. A piece produced by a merge
 * gets -r, where r is the dense rank of its best (lowest-ranked) merge among all merged pieces;
 * the remaining normal pieces follow in id order. Control and added tokens get -1000 and byte
 * tokens 0, as sentencepiece-derived GGUFs have. (llama.cpp's converter, given only
 * tokenizer.json, writes -1000 for every token, which loses the merge order.)
 *
 * @module
 */

import { readJsonObject } from "../../../io/json_file.ts";
import { existsSync } from "node:fs";
import { join } from "node:path";

/** llama.cpp token types. */
export const TOKEN_TYPE = {
  normal: 1,
  unknown: 2,
  control: 3,
  userDefined: 4,
  unused: 5,
  byte: 6,
} as const;

/** Score llama.cpp converters give to control and added tokens. */
export const SPECIAL_SCORE = -1000;

/** The vocabulary as GGUF metadata wants it. */
export interface SpmVocab {
  tokens: string[];
  scores: number[];
  types: number[];
  bosId: number | null;
  eosId: number | null;
  unkId: number | null;
  addBos: boolean;
  addEos: boolean;
  /** Whether the normaliser prepends "▁" (llama.cpp's add_space_prefix). */
  addSpacePrefix: boolean;
}

type Json = Record<string, unknown>;

function asObject(v: unknown): Json | null {
  return v !== null && typeof v === "object" && !Array.isArray(v) ? v as Json : null;
}

/** Merge list entries are "a b" strings (older files) or ["a", "b"] pairs (newer ones). */
function mergePair(m: unknown, i: number, path: string): [string, string] {
  if (typeof m === "string") {
    const sp = m.indexOf(" ");
    if (sp > 0) return [m.slice(0, sp), m.slice(sp + 1)];
  } else if (Array.isArray(m) && m.length === 2 && m.every((s) => typeof s === "string")) {
    return [m[0], m[1]];
  }
  throw new Error(`${path}: model.merges[${i}] is not a merge pair`);
}

/** Whether a normaliser (or a Sequence of them) prepends "▁". */
function prependsSpace(n: unknown): boolean {
  const o = asObject(n);
  if (!o) return false;
  if (o.type === "Prepend") return o.prepend === "▁";
  if (o.type === "Sequence" && Array.isArray(o.normalizers)) {
    return o.normalizers.some(prependsSpace);
  }
  return false;
}

/** Whether a Metaspace pre-tokenizer (or one in a Sequence) adds a leading "▁". */
function metaspacePrepends(p: unknown): boolean {
  const o = asObject(p);
  if (!o) return false;
  if (o.type === "Metaspace") {
    return o.prepend_scheme !== undefined
      ? o.prepend_scheme !== "never"
      : o.add_prefix_space === true;
  }
  if (o.type === "Sequence" && Array.isArray(o.pretokenizers)) {
    return o.pretokenizers.some(metaspacePrepends);
  }
  return false;
}

/** Content of a special-token entry of tokenizer_config.json (a string or an AddedToken). */
function tokenContent(v: unknown): string | null {
  if (typeof v === "string") return v;
  const o = asObject(v);
  return o && typeof o.content === "string" ? o.content : null;
}

/**
 * Reads `dir`/tokenizer.json (and tokenizer_config.json when present) into SPM metadata padded
 * to `vocabSize` entries. `fallback` supplies bos/eos ids from the model config.
 */
export function spmVocabFromTokenizerJson(
  dir: string,
  vocabSize: number,
  fallback: { bosId: number | null; eosId: number | null },
): SpmVocab {
  const path = join(dir, "tokenizer.json");
  if (!existsSync(path)) throw new Error(`${dir}: no tokenizer.json to export the vocabulary from`);
  const tj = readJsonObject(path);
  const model = asObject(tj.model);
  if (!model || model.type !== "BPE" || model.byte_fallback !== true) {
    throw new Error(
      `${path}: only SentencePiece-style BPE tokenizers (model.type BPE with byte_fallback) ` +
        `can be exported as tokenizer.ggml.model=llama; got model.type ${
          JSON.stringify(model?.type)
        }, byte_fallback ${JSON.stringify(model?.byte_fallback)}`,
    );
  }
  const vocab = asObject(model.vocab);
  if (!vocab) throw new Error(`${path}: model.vocab is not an object`);
  const tokens: (string | undefined)[] = new Array(vocabSize);
  const idOf = new Map<string, number>();
  const place = (text: string, id: unknown, what: string) => {
    if (typeof id !== "number" || !Number.isInteger(id) || id < 0 || id >= vocabSize) {
      throw new Error(
        `${path}: ${what} ${JSON.stringify(text)} has id ${id}, outside [0, ${vocabSize})`,
      );
    }
    if (tokens[id] !== undefined && tokens[id] !== text) {
      throw new Error(
        `${path}: id ${id} is both ${JSON.stringify(tokens[id])} and ${JSON.stringify(text)}`,
      );
    }
    tokens[id] = text;
    idOf.set(text, id);
  };
  for (const [text, id] of Object.entries(vocab)) place(text, id, "vocab token");

  const types = new Array<number>(vocabSize).fill(TOKEN_TYPE.normal);
  const scores = new Array<number>(vocabSize).fill(0);
  const fixed = new Set<number>();
  const added = Array.isArray(tj.added_tokens) ? tj.added_tokens : [];
  for (const a of added) {
    const o = asObject(a);
    if (!o || typeof o.content !== "string") {
      throw new Error(`${path}: malformed added_tokens entry`);
    }
    place(o.content, o.id, "added token");
    const id = o.id as number;
    types[id] = o.special === true ? TOKEN_TYPE.control : TOKEN_TYPE.userDefined;
    scores[id] = SPECIAL_SCORE;
    fixed.add(id);
  }
  for (let id = 0; id < vocabSize; id++) {
    if (fixed.has(id)) continue;
    if (tokens[id] === undefined) {
      // Embedding rows beyond the tokenizer (padding), as llama.cpp's converters name them.
      tokens[id] = `[PAD${id}]`;
      types[id] = TOKEN_TYPE.unused;
      scores[id] = SPECIAL_SCORE;
      fixed.add(id);
    } else if (/^<0x[0-9A-Fa-f]{2}>$/.test(tokens[id]!)) {
      types[id] = TOKEN_TYPE.byte;
      fixed.add(id);
    }
  }

  // Best merge rank of each merged piece, then dense ranks: merged pieces first, others after.
  const merges = Array.isArray(model.merges) ? model.merges : [];
  const bestMerge = new Map<number, number>();
  merges.forEach((m, i) => {
    const [a, b] = mergePair(m, i, path);
    const id = idOf.get(a + b);
    if (id === undefined) throw new Error(`${path}: merge ${i} (${a} ${b}) yields no vocab token`);
    if (!fixed.has(id) && !bestMerge.has(id)) bestMerge.set(id, i);
  });
  const order = [...bestMerge.keys()].sort((x, y) => bestMerge.get(x)! - bestMerge.get(y)!);
  for (let id = 0; id < vocabSize; id++) if (!fixed.has(id) && !bestMerge.has(id)) order.push(id);
  order.forEach((id, rank) => scores[id] = -rank);

  const cfgPath = join(dir, "tokenizer_config.json");
  const tc = existsSync(cfgPath) ? readJsonObject(cfgPath) : {};
  const special = (key: string, fb: number | null): number | null => {
    const content = tokenContent(tc[key]);
    if (content === null) return fb;
    const id = idOf.get(content);
    if (id === undefined) throw new Error(`${cfgPath}: ${key} ${content} is not in the vocabulary`);
    return id;
  };
  const unkText = typeof model.unk_token === "string" ? model.unk_token : null;
  const addBos = typeof tc.add_bos_token === "boolean" ? tc.add_bos_token : true;
  const addEos = typeof tc.add_eos_token === "boolean" ? tc.add_eos_token : false;
  return {
    tokens: tokens as string[],
    scores,
    types,
    bosId: special("bos_token", fallback.bosId),
    eosId: special("eos_token", fallback.eosId),
    unkId: special("unk_token", unkText === null ? null : idOf.get(unkText) ?? null),
    addBos,
    addEos,
    addSpacePrefix: prependsSpace(tj.normalizer) || metaspacePrepends(tj.pre_tokenizer),
  };
}
