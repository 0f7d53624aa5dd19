/**
 * A small byte-level BPE tokenizer for synthetic checkpoints, in the Hugging Face `tokenizers`
 * JSON format (the GPT-2 / Llama-3 family of layout): a ByteLevel pre-tokenizer and decoder, a
 * vocabulary of three special tokens, the 256 byte symbols, merges learnt from a short built-in
 * English text, and made-up filler words up to the model's vocab_size. Every byte string encodes, so any
 * text round-trips. A TemplateProcessing post-processor adds `<s>`.
 *
 * @module
 */

import { writeFileSync } from "node:fs";
import { join } from "node:path";

/** Id of `<unk>` (kept for the classic Llama layout; byte-level BPE never produces it). */
export const SYNTH_UNK_ID = 0;
/** Id of the BOS token `<s>`. */
export const SYNTH_BOS_ID = 1;
/** Id of the EOS token `</s>`. */
export const SYNTH_EOS_ID = 2;

const SPECIALS = ["<unk>", "<s>", "</s>"];

/** Smallest vocabulary: the special tokens plus the 256 byte symbols. */
export const MIN_SYNTH_VOCAB: number = SPECIALS.length + 256;

/** Most merges learnt; the rest of the vocabulary is filler. */
const MAX_MERGES = 2000;

/** Text the merges are learnt from: ordinary English, so common words become single tokens. */
const CORPUS = `
Once upon a time there was a little girl who lived in a small house near the woods. Every
morning she walked to the river with her dog, and they watched the birds fly over the water.
One day the dog found a shiny stone under a tree. The girl picked it up and put it in her
pocket. When she came home, her mother asked her what she had found. She showed the stone to
her mother, and they both smiled. The sun was warm, the sky was blue, and the wind was soft.
The model reads the text, splits it into tokens, and writes the next token after the last one.
It is a synthetic model with random weights, so the text it writes is not meant to make sense.
Numbers like 1, 2, 3, 10, 42 and 2024 appear in text too, as do questions: what, where, when,
why and how? The quick brown fox jumps over the lazy dog. She said that it was time to go, and
he said that he would come with her. They were happy to be together in the garden again.
`;

/** The byte-level pre-tokenizer's split pattern (GPT-2's), used to learn the merges. */
const SPLIT = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;

/**
 * GPT-2's byte → printable character table: printable Latin-1 bytes stand for themselves, the
 * others are moved to U+0100 onwards, in byte order.
 */
export function byteSymbols(): string[] {
  const out: string[] = new Array(256);
  let next = 256;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    out[b] = String.fromCharCode(printable ? b : next++);
  }
  return out;
}

/** Learns up to `count` merges from {@link CORPUS}: the most frequent adjacent pair each time. */
function learnMerges(count: number, bytes: string[]): [string, string][] {
  const enc = new TextEncoder();
  const freq = new Map<string, number>();
  for (const piece of CORPUS.match(SPLIT) ?? []) {
    const key = Array.from(enc.encode(piece), (b) => bytes[b]).join("\u0000");
    freq.set(key, (freq.get(key) ?? 0) + 1);
  }
  const words = [...freq].map(([k, n]) => ({ syms: k.split("\u0000"), n }));
  const merges: [string, string][] = [];
  while (merges.length < count) {
    const pairs = new Map<string, number>();
    for (const w of words) {
      for (let i = 0; i + 1 < w.syms.length; i++) {
        const k = w.syms[i] + "\u0000" + w.syms[i + 1];
        pairs.set(k, (pairs.get(k) ?? 0) + w.n);
      }
    }
    let best = "", bestN = 1;
    // Ties go to the smallest pair, so the result does not depend on Map order.
    for (const [k, n] of pairs) {
      if (n > bestN || (n === bestN && bestN > 1 && k < best)) {
        best = k;
        bestN = n;
      }
    }
    if (bestN < 2) break;
    const [a, b] = best.split("\u0000");
    merges.push([a, b]);
    for (const w of words) {
      const s: string[] = [];
      for (let i = 0; i < w.syms.length; i++) {
        if (i + 1 < w.syms.length && w.syms[i] === a && w.syms[i + 1] === b) {
          s.push(a + b);
          i++;
        } else s.push(w.syms[i]);
      }
      w.syms = s;
    }
  }
  return merges;
}

const CONSONANTS = "bdfgklmnprstvz";
const VOWELS = "aeiou";

/**
 * Filler token `i`: a space and two or more made-up syllables ("Ġkamo"). Filler tokens are plain
 * vocabulary entries that no merge produces, so encoding never yields them; a random model that
 * samples them prints pronounceable nonsense words rather than markup.
 */
function fillerWord(i: number, space: string): string {
  const n = CONSONANTS.length * VOWELS.length;
  let word = "";
  for (let k = 0; k < 2 || i > 0; k++) {
    const s = i % n;
    word += CONSONANTS[Math.floor(s / VOWELS.length)] + VOWELS[s % VOWELS.length];
    i = Math.floor(i / n);
  }
  return space + word;
}

/** The contents of the two tokenizer files. */
export interface SynthTokenizerFiles {
  /** tokenizer.json */
  tokenizer: Record<string, unknown>;
  /** tokenizer_config.json */
  config: Record<string, unknown>;
}

/** The chat template: `<|role|>` headers, each turn closed by `</s>`. */
export const SYNTH_CHAT_TEMPLATE = "{{ bos_token }}{% for message in messages %}" +
  "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}" +
  "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}";

/** Builds tokenizer.json and tokenizer_config.json with exactly `vocabSize` ids. */
export function buildSynthTokenizer(vocabSize: number, modelMaxLength = 4096): SynthTokenizerFiles {
  if (!Number.isSafeInteger(vocabSize) || vocabSize < MIN_SYNTH_VOCAB) {
    throw new Error(
      `synthetic tokenizer: vocab_size ${vocabSize} must be an integer >= ${MIN_SYNTH_VOCAB}`,
    );
  }
  const bytes = byteSymbols();
  const vocab: Record<string, number> = {};
  let next = 0;
  for (const s of [...SPECIALS, ...bytes]) vocab[s] = next++;
  const merges = learnMerges(Math.min(MAX_MERGES, vocabSize - MIN_SYNTH_VOCAB), bytes);
  for (const [a, b] of merges) if (!Object.hasOwn(vocab, a + b)) vocab[a + b] = next++;
  for (let i = 0; next < vocabSize; i++) {
    const word = fillerWord(i, bytes[0x20]);
    if (!Object.hasOwn(vocab, word)) vocab[word] = next++;
  }
  const added = SPECIALS.map((content, id) => ({
    id,
    content,
    single_word: false,
    lstrip: false,
    rstrip: false,
    normalized: false,
    special: true,
  }));
  const byteLevel = { add_prefix_space: false, trim_offsets: true, use_regex: true };
  const tokenizer = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: null,
    pre_tokenizer: { type: "ByteLevel", ...byteLevel },
    post_processor: {
      type: "TemplateProcessing",
      single: [{ SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
      pair: [
        { SpecialToken: { id: "<s>", type_id: 0 } },
        { Sequence: { id: "A", type_id: 0 } },
        { SpecialToken: { id: "<s>", type_id: 1 } },
        { Sequence: { id: "B", type_id: 1 } },
      ],
      special_tokens: { "<s>": { id: "<s>", ids: [SYNTH_BOS_ID], tokens: ["<s>"] } },
    },
    decoder: { type: "ByteLevel", ...byteLevel },
    model: {
      type: "BPE",
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: false,
      vocab,
      merges,
    },
  };
  const config = {
    add_bos_token: true,
    add_eos_token: false,
    added_tokens_decoder: Object.fromEntries(added.map(({ id, ...rest }) => [String(id), rest])),
    bos_token: "<s>",
    eos_token: "</s>",
    unk_token: "<unk>",
    pad_token: null,
    chat_template: SYNTH_CHAT_TEMPLATE,
    clean_up_tokenization_spaces: false,
    model_max_length: modelMaxLength,
    tokenizer_class: "PreTrainedTokenizerFast",
  };
  return { tokenizer, config };
}

/** Writes tokenizer.json and tokenizer_config.json for a `vocabSize`-id model into `dir`. */
export function writeSynthTokenizer(dir: string, vocabSize: number, modelMaxLength = 4096): void {
  const { tokenizer, config } = buildSynthTokenizer(vocabSize, modelMaxLength);
  writeFileSync(join(dir, "tokenizer.json"), JSON.stringify(tokenizer));
  writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify(config, null, 2) + "\n");
}
