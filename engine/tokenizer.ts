/**
 * Tokenizers of a checkpoint directory behind one interface: Hugging Face `tokenizer.json`
 * (through `@huggingface/tokenizers`) or a tiktoken `tiktoken.model` as shipped by Kimi-K2
 * (through `js-tiktoken`, with Kimi's pre-tokenizer pattern and added tokens).
 *
 * @module
 */

import { readJsonObject, readJsonObjectIfExists } from "../io/json_file.ts";
import { Tokenizer as HfTokenizer } from "@huggingface/tokenizers";
import { Tiktoken } from "js-tiktoken/lite";
import {
  checkFileSize,
  checkTiktokenRank,
  checkTokenizerJsonIds,
  MAX_CHAT_TEMPLATE_BYTES,
  MAX_TOKENIZER_FILE_BYTES,
} from "./tokenizer_bounds.ts";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";

/** Incremental detokenizer for printing a generation as it happens. */
export interface DecodeStream {
  /** Adds one id; returns the text that became printable (may be ""). */
  push(id: number): string;
  /** Returns whatever is still held back (an incomplete UTF-8 sequence at the end). */
  flush(): string;
  /** Whether pushed ids are held back, waiting for more (their text is not printed yet). */
  readonly holding: boolean;
}

/** Text ↔ ids for one model. */
export interface Tokenizer {
  /** Ids for `text`; `addSpecial` (default true) adds BOS etc. as the tokenizer config says. */
  encode(text: string, opts?: { addSpecial?: boolean }): number[];
  /** Text for `ids`; special tokens are kept unless `skipSpecial` is set. */
  decode(ids: number[], opts?: { skipSpecial?: boolean }): string;
  /**
   * A stream decoder. Special tokens are skipped (default) and partial UTF-8 is held back.
   * `context` holds the ids before the first pushed one (a generation's prompt): the streamed
   * text is then what decoding context and pushed ids together adds to the context's own text,
   * so a continuation keeps its leading space. Without it the decoder's leading-space rule
   * applies to the first printed token, as at the start of a text.
   */
  decodeStream(opts?: { skipSpecial?: boolean; context?: readonly number[] }): DecodeStream;
  bosId: number | null;
  eosIds: number[];
  /** Number of ids the tokenizer can produce (base vocabulary plus added tokens). */
  vocabSize: number;
  /** The raw Jinja chat template, or null when the checkpoint has none. */
  chatTemplate: string | null;
  /** Named special tokens, e.g. `{bos_token: "<s>", eos_token: "</s>"}`. */
  specialTokens: Record<string, string>;
}

/**
 * Kimi-K2's pre-tokenizer (`pat_str` of its tokenization_kimi.py), rewritten for JavaScript's
 * `u` flag: the class intersections `[…&&[^\p{Han}]]` become a negative lookahead, and `\s`
 * becomes `\p{White_Space}` because JavaScript's `\s` differs from the Unicode property that
 * the Rust/Python engines use (it adds U+FEFF and lacks U+0085).
 */
export const KIMI_PAT_STR: string = (() => {
  const notHan = "(?!\\p{Script=Han})";
  const upper = `(?:${notHan}[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])`;
  const lower = `(?:${notHan}[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])`;
  const contraction = "(?i:'s|'t|'re|'ve|'m|'ll|'d)?";
  const s = "\\p{White_Space}";
  return [
    "\\p{Script=Han}+",
    `[^\\r\\n\\p{L}\\p{N}]?${upper}*${lower}+${contraction}`,
    `[^\\r\\n\\p{L}\\p{N}]?${upper}+${lower}*${contraction}`,
    "\\p{N}{1,3}",
    ` ?[^${s}\\p{L}\\p{N}]+[\\r\\n]*`,
    `${s}*[\\r\\n]+`,
    `${s}+(?!\\P{White_Space})`,
    `${s}+`,
  ].join("|");
})();

/** Number of ids Kimi reserves for special tokens right after the BPE ranks. */
const KIMI_RESERVED_SPECIAL = 256;

type Json = Record<string, unknown>;

/** `"<s>"` or `{content: "<s>", …}` → `"<s>"`. */
function tokenContent(v: unknown): string | null {
  if (typeof v === "string") return v;
  if (v && typeof v === "object" && typeof (v as Json).content === "string") {
    return (v as Json).content as string;
  }
  return null;
}

/**
 * The chat template of a tokenizer directory: `chat_template.jinja` when present, else
 * tokenizer_config.json's `chat_template`, which is a string or a list of `{name, template}`
 * (the one named "default" is used, as transformers does).
 */
export function readChatTemplate(dir: string, config?: Json): string | null {
  const jinjaPath = join(dir, "chat_template.jinja");
  if (existsSync(jinjaPath)) {
    checkFileSize(jinjaPath, MAX_CHAT_TEMPLATE_BYTES);
    return readFileSync(jinjaPath, "utf8");
  }
  const cfgPath = join(dir, "tokenizer_config.json");
  const cfg = config ?? readTokenizerConfig(dir);
  const t = cfg.chat_template;
  const capped = (template: string) => {
    if (template.length > MAX_CHAT_TEMPLATE_BYTES) {
      throw new Error(
        `${cfgPath}: chat_template has ${template.length} characters, more than the limit of ` +
          `${MAX_CHAT_TEMPLATE_BYTES}`,
      );
    }
    return template;
  };
  if (t === undefined || t === null) return null;
  if (typeof t === "string") return capped(t);
  if (Array.isArray(t)) {
    const named = t.find((x) => x && (x as Json).name === "default") ?? t[0];
    if (named && typeof (named as Json).template === "string") {
      return capped((named as Json).template as string);
    }
  }
  throw new Error(
    `${join(dir, "tokenizer_config.json")}: chat_template must be a string or a list of ` +
      `{name, template}`,
  );
}

function namedSpecialTokens(...sources: Json[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const src of sources) {
    for (const [key, value] of Object.entries(src)) {
      if (!key.endsWith("_token")) continue;
      const content = tokenContent(value);
      if (content !== null) out[key] = content;
    }
  }
  return out;
}

function idList(v: unknown): number[] {
  if (typeof v === "number") return [v];
  if (Array.isArray(v)) return v.filter((x): x is number => typeof x === "number");
  return [];
}

/** The named special tokens of a checkpoint and the BOS/EOS ids that follow from them. */
interface SpecialTokenIds {
  /** Role (`bos_token`, `eos_token`, …) → token text. */
  special: Record<string, string>;
  /** The named BOS token, else generation_config.json's first bos_token_id, else null. */
  bosId: number | null;
  /** The named EOS token's id, or null. */
  eosTok: number | null;
  /** generation_config.json's eos_token_id(s), plus the named EOS token. */
  eosIds: number[];
}

/**
 * Reads the named special tokens (special_tokens_map.json, then tokenizer_config.json) and
 * resolves BOS/EOS through `idOfToken`, the tokenizer's own text → id lookup.
 */
function specialTokenIds(
  dir: string,
  config: Json,
  generation: Json,
  idOfToken: (content: string) => number | undefined,
): SpecialTokenIds {
  const special = namedSpecialTokens(
    readJsonObjectIfExists(join(dir, "special_tokens_map.json")),
    config,
  );
  const idOf = (name: string): number | null => {
    const content = special[name];
    return content === undefined ? null : idOfToken(content) ?? null;
  };
  const bosId = idOf("bos_token") ?? idList(generation.bos_token_id)[0] ?? null;
  const eos = new Set<number>(idList(generation.eos_token_id));
  const eosTok = idOf("eos_token");
  if (eosTok !== null) eos.add(eosTok);
  return { special, bosId, eosTok, eosIds: [...eos] };
}

/**
 * Builds a stream decoder from a whole-sequence decoder (diffing windowed decodes), starting
 * after the ids of `start`.
 */
function streamFrom(decode: (ids: number[]) => string, start: readonly number[]): DecodeStream {
  // `context` is the chunk printed last (at first, what came before); decoding it together with
  // the pending ids and removing its own text keeps spacing rules that depend on the previous
  // token.
  let context: number[] = [...start];
  let pending: number[] = [];
  const emit = (force: boolean): string => {
    const base = decode(context);
    const text = decode([...context, ...pending]);
    if (!force && (text.endsWith("\uFFFD") || text.length <= base.length)) return "";
    context = pending;
    pending = [];
    return text.slice(base.length);
  };
  return {
    push(id) {
      pending.push(id);
      return emit(false);
    },
    flush() {
      return pending.length > 0 ? emit(true) : "";
    },
    get holding() {
      return pending.length > 0;
    },
  };
}

/**
 * Adds BOS / EOS around the ids of one sequence as tokenizer_config.json's `add_bos_token` /
 * `add_eos_token` say (transformers' template `[bos] $A [eos]`).
 */
function withSpecialIds(ids: number[], config: Json, named: SpecialTokenIds): number[] {
  if (config.add_bos_token === true && named.bosId !== null) ids.unshift(named.bosId);
  if (config.add_eos_token === true && named.eosTok !== null) ids.push(named.eosTok);
  return ids;
}

/**
 * Assembles a {@link Tokenizer} from its encoder and whole-sequence decoder. The decode defaults
 * are the same for every format: keep special tokens, but skip them when streaming.
 */
function tokenizerOf(
  dir: string,
  config: Json,
  named: SpecialTokenIds,
  vocabSize: number,
  encode: Tokenizer["encode"],
  decode: (ids: number[], skipSpecial: boolean) => string,
): Tokenizer {
  return {
    encode,
    decode: (ids, opts) => decode(ids, opts?.skipSpecial ?? false),
    decodeStream: (opts) =>
      streamFrom((ids) => decode(ids, opts?.skipSpecial ?? true), opts?.context ?? []),
    bosId: named.bosId,
    eosIds: named.eosIds,
    vocabSize,
    chatTemplate: readChatTemplate(dir, config),
    specialTokens: named.special,
  };
}

/** tokenizer_config.json of `dir` ({} when absent), size-capped before it is parsed. */
export function readTokenizerConfig(dir: string): Json {
  const path = join(dir, "tokenizer_config.json");
  if (existsSync(path)) checkFileSize(path, MAX_TOKENIZER_FILE_BYTES);
  return readJsonObjectIfExists(path);
}

function loadHfTokenizer(dir: string): Tokenizer {
  const config = readTokenizerConfig(dir);
  const path = join(dir, "tokenizer.json");
  checkFileSize(path, MAX_TOKENIZER_FILE_BYTES);
  const json = readJsonObject(path);
  checkTokenizerJsonIds(json, path);
  // Like the Rust library and transformers 5, decode does no clean_up_tokenization_spaces on
  // BPE vocabularies (it strips spaces before punctuation: " 'stop'" would print as "'stop'");
  // tokenizers.js applies it whenever the config says so, and even when it is absent.
  const wordPiece = (json.model as Json | undefined)?.type === "WordPiece";
  let hf: HfTokenizer;
  try {
    hf = new HfTokenizer(json, {
      ...config,
      clean_up_tokenization_spaces: wordPiece && config.clean_up_tokenization_spaces === true,
    });
  } catch (e) {
    // The library's messages name a field but not the file, and say "undefined" for a missing one.
    const why = (e as Error).message.replace(/\bundefined\b/g, "(missing)");
    throw new Error(`${path}: not a tokenizer this engine can load (${why})`);
  }
  const generation = readJsonObjectIfExists(join(dir, "generation_config.json"));
  const named = specialTokenIds(dir, config, generation, (content) => hf.token_to_id(content));
  let vocabSize = 0;
  for (const id of hf.get_vocab(true).values()) vocabSize = Math.max(vocabSize, id + 1);
  // tokenizers.js rejects an empty list; the empty sequence decodes to "".
  const decode = (ids: number[], skip: boolean) =>
    ids.length === 0 ? "" : hf.decode(ids, { skip_special_tokens: skip });
  // transformers 5 replaces tokenizer.json's post-processor by `[bos] $A [eos]` from
  // add_bos_token / add_eos_token when the config names either (DeepSeek-V3 says
  // add_bos_token: true and ships a post-processor that adds nothing), or when there is none.
  const rebuilt = "add_bos_token" in config || "add_eos_token" in config ||
    json.post_processor === null || json.post_processor === undefined;
  const encode: Tokenizer["encode"] = (text, opts) => {
    const addSpecial = opts?.addSpecial ?? true;
    if (!rebuilt) return hf.encode(text, { add_special_tokens: addSpecial }).ids;
    const ids = hf.encode(text, { add_special_tokens: false }).ids;
    return addSpecial ? withSpecialIds(ids, config, named) : ids;
  };
  return tokenizerOf(dir, config, named, vocabSize, encode, decode);
}

/** Parses tiktoken's rank file: one `base64-token rank` pair per line. */
export function parseTiktokenRanks(text: string, path: string): Map<string, number> {
  const ranks = new Map<string, number>();
  const lines = text.split("\n");
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i].trim();
    if (line === "") continue;
    const parts = line.split(" ");
    const rank = Number(parts[1]);
    if (parts.length !== 2 || !Number.isSafeInteger(rank) || rank < 0) {
      throw new Error(`${path}:${i + 1}: expected "<base64 token> <rank>", got "${line}"`);
    }
    checkTiktokenRank(rank, path, i + 1);
    ranks.set(parts[0], rank);
  }
  return ranks;
}

function loadTiktokenTokenizer(dir: string): Tokenizer {
  const path = join(dir, "tiktoken.model");
  checkFileSize(path, MAX_TOKENIZER_FILE_BYTES);
  const ranks = parseTiktokenRanks(readFileSync(path, "utf8"), path);
  const config = readTokenizerConfig(dir);
  const generation = readJsonObjectIfExists(join(dir, "generation_config.json"));
  const numBase = ranks.size;
  // Kimi: the added tokens of tokenizer_config.json, the rest of the reserved block named
  // `<|reserved_token_{id}|>`.
  const specialIds = new Map<string, number>();
  const addedDecoder = (config.added_tokens_decoder ?? {}) as Record<string, unknown>;
  for (const [idStr, tok] of Object.entries(addedDecoder)) {
    const content = tokenContent(tok);
    const id = Number(idStr);
    if (content === null || !Number.isSafeInteger(id)) {
      throw new Error(`${join(dir, "tokenizer_config.json")}: bad added token ${idStr}`);
    }
    specialIds.set(content, id);
  }
  const taken = new Set(specialIds.values());
  for (let id = numBase; id < numBase + KIMI_RESERVED_SPECIAL; id++) {
    if (!taken.has(id)) specialIds.set(`<|reserved_token_${id}|>`, id);
  }
  const bpeRanks = [...ranks].map(([tok, rank]) => `! ${rank} ${tok}`).join("\n");
  const tk = new Tiktoken({
    pat_str: KIMI_PAT_STR,
    special_tokens: Object.fromEntries(specialIds),
    bpe_ranks: bpeRanks,
  });
  const specialSet = new Set(specialIds.values());
  const named = specialTokenIds(dir, config, generation, (content) => specialIds.get(content));
  let vocabSize = 0;
  for (const id of [...ranks.values(), ...specialSet]) vocabSize = Math.max(vocabSize, id + 1);
  const decode = (ids: number[], skip: boolean) =>
    tk.decode(skip ? ids.filter((id) => !specialSet.has(id)) : ids);
  const encode: Tokenizer["encode"] = (text, opts) => {
    const ids = tk.encode(text, "all");
    return opts?.addSpecial ?? true ? withSpecialIds(ids, config, named) : ids;
  };
  return tokenizerOf(dir, config, named, vocabSize, encode, decode);
}

/**
 * Loads the tokenizer of a checkpoint directory: `tokenizer.json` when present, else
 * `tiktoken.model` (Kimi's format).
 */
export function loadTokenizer(dir: string): Promise<Tokenizer> {
  try {
    if (existsSync(join(dir, "tokenizer.json"))) return Promise.resolve(loadHfTokenizer(dir));
    if (existsSync(join(dir, "tiktoken.model"))) {
      return Promise.resolve(loadTiktokenTokenizer(dir));
    }
  } catch (e) {
    return Promise.reject(e);
  }
  return Promise.reject(
    new Error(`${dir}: no tokenizer found (expected tokenizer.json or tiktoken.model)`),
  );
}
