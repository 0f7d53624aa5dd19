/**
 * Byte-level BPE vocabularies in GGUF exports (tools/dev/gguf/bpe_vocab.ts). Structural: the
 * exported tokens, types and merges, read back with the repo's GGUF reader, are what
 * tokenizer.json says. Behavioural: llama.cpp (node-llama-cpp, installed on demand as `bench
 * compare` does; skipped when its prebuilt binary is unavailable) tokenizes text into the ids
 * @huggingface/tokenizers gives, for the synthetic tokenizer (GPT-2 regex) and, when
 * SLUICE_TOKENIZER_PACKAGES holds them (.ci/run fetches them), the real Llama-3 and DeepSeek-V3
 * tokenizers of the @lenml packages.
 */
import assert from "node:assert/strict";
import { copyFileSync, existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Tokenizer } from "@huggingface/tokenizers";
import { exportGguf } from "../tools/dev/export_gguf.ts";
import { type LlamaCppSetup, setupLlamaCpp } from "../tools/dev/bench/llamacpp.ts";
import { bpeVocabFromTokenizerJson } from "../tools/dev/gguf/bpe_vocab.ts";
import { readGguf } from "../tools/dev/gguf/read.ts";
import { TOKEN_TYPE } from "../tools/dev/gguf/spm_vocab.ts";
import { synthCheckpoint } from "../tools/synth.ts";
import { tempDir } from "./fixtures.ts";
import { LLAMACPP_REASON, LLAMACPP_TESTS, NO_TOKENIZER_PACKAGES, skipIf } from "./skips.ts";

const PACKAGES = Deno.env.get("SLUICE_TOKENIZER_PACKAGES");
/** models/ of an @lenml tokenizer package, or null when it was not fetched. */
function lenml(name: string): string | null {
  const dir = PACKAGES ? join(PACKAGES, "@lenml", name, "models") : "";
  return PACKAGES && existsSync(join(dir, "tokenizer.json")) ? dir : null;
}
const LLAMA3 = lenml("tokenizer-llama3");
const DEEPSEEK = lenml("tokenizer-deepseek_v3");

/** Text with words, digits, punctuation, whitespace runs, accents, CJK and an emoji. */
const TEXTS = [
  "Once upon a time there was a little girl.",
  "  Numbers: 1, 22, 333, 4444 and 2024-12-01!\n\nNew\tline  ",
  "Héllo wörld — naïve café; 日本語のテキスト and 中文 🙂 what's it'll we'd",
  'x=f(y)*3.14159; if (a<b) { return "ok"; }',
  "helloWorld fooWorld",
];

/** Qwen2/Qwen3's split regex, as their tokenizer.json files hold it. */
const QWEN2_REGEX = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|" +
  " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/** gpt-oss's (o200k) split regex, as its tokenizer.json holds it. */
const O200K_REGEX =
  "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" +
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+" +
  "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}|" +
  " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/** A pre-tokenizer splitting by `regex`, then mapping bytes (Llama-3's layout). */
function splitThenBytes(regex: string): unknown {
  return {
    type: "Sequence",
    pretokenizers: [
      { type: "Split", pattern: { Regex: regex }, behavior: "Isolated", invert: false },
      { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false },
    ],
  };
}

function readJson(path: string): Record<string, unknown> {
  return JSON.parse(readFileSync(path, "utf8"));
}

/** A small synthetic Qwen3-MoE checkpoint, its tokenizer swapped for `tokDir`'s when given. */
async function synthModel(name: string, tokDir?: string): Promise<string> {
  const dir = join(tempDir(), name);
  if (existsSync(join(dir, "config.json"))) return dir;
  await synthCheckpoint({
    arch: "qwen3_moe",
    out: dir,
    size: 4 * 2 ** 20,
    overrides: { hidden: 64, layers: 2, experts: 4, topK: 2, vocab: tokDir ? 129280 : 1024 },
    progress: "off",
    log: () => {},
  });
  if (tokDir) {
    for (const f of ["tokenizer.json", "tokenizer_config.json"]) {
      copyFileSync(join(tokDir, f), join(dir, f));
    }
  }
  return dir;
}

Deno.test("byte-level BPE export: tokens, types and merges read back as tokenizer.json says", async () => {
  const dir = await synthModel("bpe-synth");
  const out = join(tempDir(), "bpe-synth.gguf");
  exportGguf(dir, out, { progress: "off", force: true });
  const g = readGguf(out);
  try {
    const tj = readJson(join(dir, "tokenizer.json"));
    const model = tj.model as { vocab: Record<string, number>; merges: [string, string][] };
    const meta = (k: string) => g.metadata.get(k)?.value;
    assert.equal(meta("tokenizer.ggml.model"), "gpt2");
    assert.equal(meta("tokenizer.ggml.pre"), "gpt-2");
    assert.equal(g.metadata.has("tokenizer.ggml.scores"), false);
    const tokens = meta("tokenizer.ggml.tokens") as string[];
    const types = Array.from(meta("tokenizer.ggml.token_type") as ArrayLike<number>);
    assert.equal(tokens.length, 1024);
    for (const [text, id] of Object.entries(model.vocab)) assert.equal(tokens[id], text);
    const added = tj.added_tokens as { id: number; special: boolean }[];
    for (let id = 0; id < tokens.length; id++) {
      const a = added.find((x) => x.id === id);
      assert.equal(types[id], a ? TOKEN_TYPE.control : TOKEN_TYPE.normal, `type of ${id}`);
    }
    assert.deepEqual(meta("tokenizer.ggml.merges"), model.merges.map(([a, b]) => `${a} ${b}`));
    const tc = readJson(join(dir, "tokenizer_config.json"));
    assert.equal(meta("tokenizer.ggml.bos_token_id"), model.vocab[tc.bos_token as string]);
    assert.equal(meta("tokenizer.ggml.eos_token_id"), model.vocab[tc.eos_token as string]);
    assert.equal(meta("tokenizer.ggml.add_bos_token"), true);
  } finally {
    g.close();
  }
});

Deno.test("byte-level BPE: the pre-tokenizer name follows the split regex and family", () => {
  const dir = Deno.makeTempDirSync({ prefix: "sluice-bpe-" });
  try {
    const llama3 = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|" +
      " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    const tj = (pre: unknown) => ({
      added_tokens: [{ id: 2, content: "<|x|>", special: false }],
      pre_tokenizer: pre,
      model: { type: "BPE", vocab: { a: 0, b: 1, ab: 3 }, merges: [["a", "b"]] },
    });
    const pre = (p: unknown, arch = "qwen3moe") => {
      writeFileSync(join(dir, "tokenizer.json"), JSON.stringify(tj(p)));
      return bpeVocabFromTokenizerJson(dir, 5, arch, { bosId: null, eosId: 3 });
    };
    const v = pre(splitThenBytes(llama3));
    assert.equal(v.pre, "llama-bpe");
    assert.deepEqual(v.tokens, ["a", "b", "<|x|>", "ab", "[PAD4]"]);
    assert.deepEqual(v.types, [1, 1, TOKEN_TYPE.userDefined, 1, TOKEN_TYPE.unused]);
    assert.deepEqual([v.bosId, v.eosId, v.addBos], [null, 3, false]);
    assert.equal(pre(splitThenBytes(llama3), "glm4moe").pre, "glm4");
    assert.equal(pre(splitThenBytes(QWEN2_REGEX)).pre, "qwen2");
    assert.equal(pre(splitThenBytes(O200K_REGEX)).pre, "gpt-4o");
    assert.throws(
      () => pre(splitThenBytes("\\w+")),
      /tokenizer\.json: pre-tokenizer .* matches none/,
    );
    if (DEEPSEEK) {
      const p = readJson(join(DEEPSEEK, "tokenizer.json")).pre_tokenizer;
      assert.equal(pre(p).pre, "deepseek-v3");
    }
    if (LLAMA3) {
      const p = readJson(join(LLAMA3, "tokenizer.json")).pre_tokenizer;
      assert.equal(pre(p).pre, "llama-bpe");
    }
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

const llama: LlamaCppSetup = LLAMACPP_TESTS
  ? await setupLlamaCpp(undefined, () => {})
  : { ok: false, why: LLAMACPP_REASON };
if (!llama.ok && LLAMACPP_TESTS) {
  console.error(`gguf_bpe_test: llama.cpp checks skipped: ${llama.why}`);
}
/** A llama.cpp test's `ignore`, its reason counted (tests/skips.ts); `tokenizer` when it needs one. */
const noLlama = (tokenizer?: string | null) =>
  skipIf(
    !llama.ok,
    LLAMACPP_TESTS ? `need llama.cpp (${!llama.ok && llama.why})` : LLAMACPP_REASON,
  ) ||
  skipIf(tokenizer === null, NO_TOKENIZER_PACKAGES);

/** llama.cpp's ids for `texts` (no BOS added, special tokens parsed) from a vocab-only load. */
async function llamaCppTokens(gguf: string, texts: string[]): Promise<number[][]> {
  if (!llama.ok) throw new Error("node-llama-cpp is not set up");
  const script = join(llama.dir, "sluice_tokenize.mjs");
  writeFileSync(
    script,
    `import { getLlama } from "node-llama-cpp";
const [path, texts] = [process.argv[2], JSON.parse(process.argv[3])];
const l = await getLlama({ gpu: false, build: "never", skipDownload: true, progressLogs: false,
  logLevel: "error" });
const m = await l.loadModel({ modelPath: path, vocabOnly: true });
console.log(JSON.stringify(texts.map((t) => Array.from(m.tokenize(t, true), Number))));
await m.dispose();
await l.dispose();`,
  );
  const out = await new Deno.Command("node", {
    args: [script, gguf, JSON.stringify(texts)],
    cwd: llama.dir,
    stdout: "piped",
    stderr: "piped",
  }).output();
  const err = new TextDecoder().decode(out.stderr);
  assert.ok(out.success, `llama.cpp failed: ${err.slice(-800)}`);
  return JSON.parse(new TextDecoder().decode(out.stdout).trim().split("\n").pop()!);
}

/**
 * Exports the synthetic model with `tokDir`'s tokenizer, or with the synthetic one under the
 * split regex `regex`, and compares llama.cpp's ids with HF's.
 */
async function agree(name: string, tokDir?: string, regex?: string): Promise<void> {
  const dir = await synthModel(name, tokDir);
  if (regex) {
    const tj = readJson(join(dir, "tokenizer.json"));
    tj.pre_tokenizer = splitThenBytes(regex);
    // Top-ranked merges across the boundaries the regexes disagree on (digit runs, a case
    // change inside a word), in place of filler words no merge produces.
    const model = tj.model as { vocab: Record<string, number>; merges: [string, string][] };
    const fillers = Object.entries(model.vocab).sort((x, y) => y[1] - x[1]).slice(0, 2);
    for (const [[word, id], piece] of fillers.map((f, i) => [f, ["44", "oW"][i]] as const)) {
      delete model.vocab[word];
      model.vocab[piece] = id;
    }
    model.merges.unshift(["4", "4"], ["o", "W"]);
    writeFileSync(join(dir, "tokenizer.json"), JSON.stringify(tj));
  }
  const gguf = join(tempDir(), `${name}.gguf`);
  exportGguf(dir, gguf, { progress: "off", force: true, type: "bf16" });
  const tc = readJson(join(dir, "tokenizer_config.json"));
  const hf = new Tokenizer(readJson(join(dir, "tokenizer.json")), tc);
  // Special tokens inside text must come out as their control ids, not as spelled-out bytes.
  const special = (k: string) => {
    const v = tc[k] as string | { content: string };
    return typeof v === "string" ? v : v.content;
  };
  const texts = [...TEXTS, `${special("bos_token")}Hi there${special("eos_token")}\n`];
  const want = texts.map((t) => hf.encode(t, { add_special_tokens: false }).ids);
  assert.ok(want.at(-1)!.includes(hf.token_to_id(special("eos_token"))!));
  const got = await llamaCppTokens(gguf, texts);
  for (let i = 0; i < texts.length; i++) assert.deepEqual(got[i], want[i], texts[i]);
}

Deno.test({
  name: "byte-level BPE export: llama.cpp tokenizes as @huggingface/tokenizers (synthetic)",
  ignore: noLlama(),
  fn: () => agree("bpe-synth"),
});

Deno.test({
  name: "byte-level BPE export: llama.cpp tokenizes as @huggingface/tokenizers (Qwen2 regex)",
  ignore: noLlama(),
  fn: () => agree("bpe-qwen2", undefined, QWEN2_REGEX),
});

Deno.test({
  name: "byte-level BPE export: llama.cpp tokenizes as @huggingface/tokenizers (o200k regex)",
  ignore: noLlama(),
  fn: () => agree("bpe-o200k", undefined, O200K_REGEX),
});

Deno.test({
  name: "byte-level BPE export: llama.cpp tokenizes as @huggingface/tokenizers (Llama-3)",
  ignore: noLlama(LLAMA3),
  fn: () => agree("bpe-llama3", LLAMA3!),
});

Deno.test({
  name: "byte-level BPE export: llama.cpp tokenizes as @huggingface/tokenizers (DeepSeek-V3)",
  ignore: noLlama(DEEPSEEK),
  fn: () => agree("bpe-deepseek", DEEPSEEK!),
});
