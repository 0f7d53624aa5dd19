/**
 * Small tokenizer folders for tests, written to new temporary folders: a Kimi-format tiktoken
 * one and a Llama-2-style SentencePiece one.
 *
 * @module
 */
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

/**
 * Writes a Kimi-format tokenizer (tiktoken.model: the 256 bytes and a few merges, then added
 * tokens and a chat template) into a new temporary folder; returns it with the byte sequences
 * by rank.
 */
export function kimiTiktokenDir(): { dir: string; tokens: number[][] } {
  const dir = mkdtempSync(join(tmpdir(), "sluice-tiktoken-"));
  const enc = new TextEncoder();
  const tokens: number[][] = Array.from({ length: 256 }, (_, b) => [b]);
  for (const m of ["he", "ll", "hell", "hello", " w", "or", " wor", "ld", " world"]) {
    tokens.push([...enc.encode(m)]);
  }
  tokens.push([0xe4, 0xb8], [0xe4, 0xb8, 0xad]); // 中 in two merges
  const b64 = (t: number[]) => btoa(String.fromCharCode(...t));
  writeFileSync(join(dir, "tiktoken.model"), tokens.map((t, r) => `${b64(t)} ${r}\n`).join(""));
  const n = tokens.length;
  writeFileSync(
    join(dir, "tokenizer_config.json"),
    JSON.stringify({
      added_tokens_decoder: {
        [n]: { content: "[BOS]", special: true },
        [n + 1]: { content: "[EOS]", special: true },
        [n + 4]: { content: "<|im_end|>", special: true },
      },
      bos_token: "[BOS]",
      eos_token: "<|im_end|>",
      chat_template: [{
        name: "default",
        template: "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|im_end|>{% endfor %}" +
          "{% if add_generation_prompt %}<|assistant|>{% endif %}",
      }],
    }),
  );
  return { dir, tokens };
}

/**
 * Writes a Llama-2-style SentencePiece tokenizer.json (Metaspace normalizer, BPE with byte
 * fallback, a decoder that strips the text's leading space) into a new temporary folder.
 */
export function sentencePieceDir(): string {
  const dir = mkdtempSync(join(tmpdir(), "sluice-spm-"));
  const vocab: Record<string, number> = { "<unk>": 0, "<s>": 1, "</s>": 2 };
  for (let b = 0; b < 256; b++) {
    vocab[`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`] = 3 + b;
  }
  const merges = [
    ["T", "h"],
    ["Th", "e"],
    ["▁", "The"],
    ["▁", "d"],
    ["▁d", "o"],
    ["▁do", "g"],
    ["▁", "w"],
    ["▁w", "a"],
    ["▁wa", "s"],
  ];
  for (const ch of "▁abcdefghijklmnopqrstuvwxyzOT,.") vocab[ch] ??= Object.keys(vocab).length;
  for (const [a, b] of merges) vocab[a + b] ??= Object.keys(vocab).length;
  const added = ["<unk>", "<s>", "</s>"].map((content, id) => ({
    id,
    content,
    single_word: false,
    lstrip: false,
    rstrip: false,
    normalized: false,
    special: true,
  }));
  writeFileSync(
    join(dir, "tokenizer.json"),
    JSON.stringify({
      version: "1.0",
      added_tokens: added,
      normalizer: {
        type: "Sequence",
        normalizers: [
          { type: "Prepend", prepend: "▁" },
          { type: "Replace", pattern: { String: " " }, content: "▁" },
        ],
      },
      pre_tokenizer: null,
      post_processor: {
        type: "TemplateProcessing",
        single: [{ SpecialToken: { id: "<s>", type_id: 0 } }, {
          Sequence: { id: "A", type_id: 0 },
        }],
        pair: [{ Sequence: { id: "A", type_id: 0 } }, { Sequence: { id: "B", type_id: 1 } }],
        special_tokens: { "<s>": { id: "<s>", ids: [1], tokens: ["<s>"] } },
      },
      decoder: {
        type: "Sequence",
        decoders: [
          { type: "Replace", pattern: { String: "▁" }, content: " " },
          { type: "ByteFallback" },
          { type: "Fuse" },
          { type: "Strip", content: " ", start: 1, stop: 0 },
        ],
      },
      model: {
        type: "BPE",
        unk_token: "<unk>",
        byte_fallback: true,
        fuse_unk: true,
        vocab,
        merges: merges.map(([a, b]) => `${a} ${b}`),
      },
    }),
  );
  writeFileSync(
    join(dir, "tokenizer_config.json"),
    JSON.stringify({ bos_token: "<s>", eos_token: "</s>" }),
  );
  return dir;
}
