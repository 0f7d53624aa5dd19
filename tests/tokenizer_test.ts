import assert from "node:assert/strict";
import { readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { renderChat } from "../engine/chat.ts";
import { KIMI_PAT_STR, loadTokenizer } from "../engine/tokenizer.ts";
import { kimiTiktokenDir } from "./tokenizer_dirs.ts";
import { HAVE_SHARED } from "./shared_guard.ts";

const stories = fileURLToPath(new URL("../../shared/models/stories260k", import.meta.url));
// Without ../shared the tests that read it are skipped (tests/shared_guard.ts): read nothing then.
const reference = HAVE_SHARED
  ? JSON.parse(readFileSync(join(stories, "reference.json"), "utf8"))
  : null;

/**
 * llama2.c run.c's encoder, written from its description, over tok512.bin: BOS, a leading space
 * for non-empty text, one piece per UTF-8 character (byte fallback +3), then merge the adjacent
 * pair whose concatenation has the best score until none is in the vocabulary.
 */
function llama2cEncode(text: string): number[] {
  const buf = readFileSync(join(stories, "tok512.bin"));
  const view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  const pieces = new Map<string, { id: number; score: number }>();
  let off = 4;
  for (let id = 0; id < 512; id++) {
    const score = view.getFloat32(off, true);
    const len = view.getInt32(off + 4, true);
    const piece = new TextDecoder().decode(buf.subarray(off + 8, off + 8 + len));
    off += 8 + len;
    if (!pieces.has(piece)) pieces.set(piece, { id, score });
  }
  const ids = [1];
  if (text === "") return ids;
  for (const ch of " " + text) {
    const p = pieces.get(ch);
    if (p) ids.push(p.id);
    else for (const b of new TextEncoder().encode(ch)) ids.push(b + 3);
  }
  const idToPiece = new Map([...pieces].map(([s, { id }]) => [id, s]));
  for (;;) {
    let best = -1;
    let bestScore = -Infinity;
    let bestId = -1;
    for (let i = 1; i < ids.length - 1; i++) {
      const merged = pieces.get(
        (idToPiece.get(ids[i]) ?? "\0") + (idToPiece.get(ids[i + 1]) ?? "\0"),
      );
      if (merged && merged.score > bestScore) {
        best = i;
        bestScore = merged.score;
        bestId = merged.id;
      }
    }
    if (best < 0) return ids;
    ids.splice(best, 2, bestId);
  }
}

Deno.test("stories260k tokenizer: llama2.c conventions and ids", async () => {
  const tok = await loadTokenizer(stories);
  assert.deepEqual(tok.encode(reference.prompt), reference.prompt_ids);
  assert.deepEqual(tok.encode(""), [1]);
  assert.equal(tok.bosId, 1);
  assert.deepEqual(tok.eosIds, [2]);
  assert.equal(tok.vocabSize, 512);
  assert.equal(tok.specialTokens.bos_token, "<s>");
  assert.equal(tok.chatTemplate, null);
  for (
    const text of [
      "Once upon a time",
      "Lily's mom said, \"Let's go!\"\nThe end.",
      "  two spaces and\ttab",
      "héllo wörld 😀 中文",
    ]
  ) {
    assert.deepEqual(tok.encode(text), llama2cEncode(text), JSON.stringify(text));
    assert.equal(tok.decode(tok.encode(text), { skipSpecial: true }), text);
  }
  assert.deepEqual(tok.encode("Once", { addSpecial: false }), llama2cEncode("Once").slice(1));
});

Deno.test("decodeStream: prints the llama2.c reference text and holds partial UTF-8", async () => {
  const tok = await loadTokenizer(stories);
  const stream = tok.decodeStream();
  let text = "";
  for (const id of [1, ...reference.generated_ids]) text += stream.push(id);
  text += stream.flush();
  assert.equal(text, reference.generated_text);
  const ids = tok.encode("a 😀 é 中");
  const s2 = tok.decodeStream();
  const chunks = ids.map((id) => s2.push(id));
  chunks.push(s2.flush());
  for (const c of chunks) assert.ok(!c.includes("\uFFFD"), JSON.stringify(chunks));
  assert.equal(chunks.join(""), "a 😀 é 中");
});

/**
 * Pre-token splits of Kimi-K2's original pattern, computed with Python's `regex` module (V1, which
 * implements the `&&` class intersections) on the original pat_str.
 */
const KIMI_SPLITS: [string, string[]][] = [
  ["I'll say don't, CAN'T, we're, THEY'VE and it'S.", [
    "I'll",
    " say",
    " don't",
    ",",
    " CAN'T",
    ",",
    " we're",
    ",",
    " THEY'VE",
    " and",
    " it'S",
    ".",
  ]],
  ["中文English混合", ["中文", "English", "混合"]],
  ["日本語のテキスト、カタカナ。ー々〇", ["日本語", "のテキスト", "、カタカナ", "。ー", "々〇"]],
  ["  leading\n\n  spaces   \t\ttabs\r\n", [
    " ",
    " leading",
    "\n\n",
    " ",
    " spaces",
    "   \t",
    "\ttabs",
    "\r\n",
  ]],
  ["emoji 😀👍🏽 and ZWJ 👨‍👩‍👧", ["emoji", " 😀👍🏽", " and", " ZWJ", " 👨‍👩‍👧"]],
  ["x\u0085y\u00a0z\ufeffw", ["x", "\u0085y", "\u00a0z", "\ufeffw"]],
  ["ſ's 'S 'LL'd", ["ſ's", " '", "S", " '", "LL'd"]],
  ["In 2024: 123456 pi", ["In", " ", "202", "4", ":", " ", "123", "456", " pi"]],
];

Deno.test("Kimi pre-tokenizer pattern splits like the original (Python regex)", () => {
  const re = new RegExp(KIMI_PAT_STR, "ug");
  for (const [text, want] of KIMI_SPLITS) {
    assert.deepEqual([...text.matchAll(re)].map((m) => m[0]), want, JSON.stringify(text));
  }
});

/** Plain rank-ordered byte-pair merging of one pre-token (the tiktoken algorithm). */
function bpe(bytes: number[], ranks: Map<string, number>): number[] {
  let parts = bytes.map((b) => [b]);
  for (;;) {
    let best = -1;
    let bestRank = Infinity;
    for (let i = 0; i + 1 < parts.length; i++) {
      const r = ranks.get([...parts[i], ...parts[i + 1]].join(","));
      if (r !== undefined && r < bestRank) {
        best = i;
        bestRank = r;
      }
    }
    if (best < 0) return parts.map((p) => ranks.get(p.join(","))!);
    parts = [
      ...parts.slice(0, best),
      [...parts[best], ...parts[best + 1]],
      ...parts.slice(best + 2),
    ];
  }
}

Deno.test("tiktoken.model (Kimi format): BPE, special tokens, reserved names, streaming", async () => {
  const { dir, tokens } = kimiTiktokenDir();
  const n = tokens.length;
  try {
    const enc = new TextEncoder();
    const tok = await loadTokenizer(dir);
    assert.equal(tok.vocabSize, n + 256);
    assert.equal(tok.bosId, n);
    assert.deepEqual(tok.eosIds, [n + 4]);
    const ranks = new Map(tokens.map((t, r) => [t.join(","), r]));
    const re = new RegExp(KIMI_PAT_STR, "ug");
    for (const text of ["hello world", "Hello, world! 中中文 hello\n\n  worlds", "日本語 hell"]) {
      const want = [...text.matchAll(re)].flatMap((m) => bpe([...enc.encode(m[0])], ranks));
      assert.deepEqual(tok.encode(text), want, JSON.stringify(text));
      assert.equal(tok.decode(tok.encode(text)), text);
    }
    assert.deepEqual(tok.encode("hello world"), [259, 264]);
    assert.deepEqual(tok.encode("[BOS]hello<|im_end|>"), [n, 259, n + 4]);
    assert.deepEqual(tok.encode(`<|reserved_token_${n + 2}|>`), [n + 2]);
    assert.equal(tok.decode([n, 259, n + 4], { skipSpecial: true }), "hello");
    const stream = tok.decodeStream();
    const chunks = [0xe4, 0xb8, 0xad, 259].map((id) => stream.push(id));
    assert.deepEqual(chunks, ["", "", "中", "hello"]);
    assert.equal(
      renderChat(dir, [{ role: "user", content: "hi" }], { addGenerationPrompt: true }),
      "<|user|>hi<|im_end|><|assistant|>",
    );
  } finally {
    rmSync(dir, { recursive: true });
  }
});

Deno.test("renderChat: transformers variables (bos/eos tokens, add_generation_prompt)", () => {
  const template =
    "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}{{ eos_token }}" +
    "{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}";
  const source = { template, specialTokens: { bos_token: "<s>", eos_token: "</s>" } };
  const messages = [{ role: "system", content: "Be brief." }, { role: "user", content: "Hi" }];
  assert.equal(renderChat(source, messages), "<s>[system] Be brief.</s>[user] Hi</s>");
  assert.equal(
    renderChat(source, messages, { addGenerationPrompt: true }),
    "<s>[system] Be brief.</s>[user] Hi</s>[assistant] ",
  );
  assert.throws(() => renderChat(stories, messages), /no chat template/);
});

Deno.test("renderChat: a harmony-format template (gpt-oss) with strftime_now and reasoning_effort", () => {
  // The constructs gpt-oss's chat_template.jinja relies on: a namespace, strftime_now for the
  // date in the system header, the reasoning_effort keyword argument and <|start|>…<|end|> turns.
  const template = "{%- set ns = namespace(effort=reasoning_effort | default('medium')) -%}" +
    "<|start|>system<|message|>Current date: {{ strftime_now('%Y-%m-%d') }}\n\n" +
    "Reasoning: {{ ns.effort }}<|end|>" +
    "{%- for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endfor -%}" +
    "{%- if add_generation_prompt %}<|start|>assistant{% endif %}";
  const today = new Date();
  const pad = (n: number) => String(n).padStart(2, "0");
  const date = `${today.getFullYear()}-${pad(today.getMonth() + 1)}-${pad(today.getDate())}`;
  const messages = [{ role: "user", content: "Hi" }];
  const text = renderChat({ template }, messages, {
    addGenerationPrompt: true,
    extra: { reasoning_effort: "high" },
  });
  assert.equal(
    text,
    `<|start|>system<|message|>Current date: ${date}\n\nReasoning: high<|end|>` +
      "<|start|>user<|message|>Hi<|end|><|start|>assistant",
  );
  assert.match(renderChat({ template }, messages), /Reasoning: medium/);
});
