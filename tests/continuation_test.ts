/**
 * A continuation decoded after its prompt gives the whole decode minus the prompt's (so the
 * first generated token keeps its leading space), on every tokenizer kind: SentencePiece
 * (Metaspace), byte-level BPE, tiktoken, and every tokenizer of ../shared/models.
 */
import assert from "node:assert/strict";
import { mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { loadTokenizer, type Tokenizer } from "../engine/tokenizer.ts";
import { writeSynthTokenizer } from "../tools/synth/tokenizer.ts";
import { kimiTiktokenDir, sentencePieceDir } from "./tokenizer_dirs.ts";
import "./shared_guard.ts";

/** Texts to split at every token: leading spaces, punctuation, multi-byte characters. */
const CONTINUED = ["The dog was a big dog.", "Once upon a time, 東京 😀 ok hello world"];

/**
 * Checks that decoding each continuation of each text's ids after its prompt (every split point)
 * streams exactly the whole decode minus the prompt's decode; returns the splits checked.
 */
function checkContinuations(tok: Tokenizer, label: string): number {
  let checked = 0;
  for (const text of CONTINUED) {
    const ids = tok.encode(text);
    const whole = tok.decode(ids, { skipSpecial: true });
    for (let k = 1; k < ids.length; k++) {
      const head = tok.decode(ids.slice(0, k), { skipSpecial: true });
      // A prompt ending inside a character has no text of its own to subtract.
      if (!whole.startsWith(head)) continue;
      const stream = tok.decodeStream({ context: ids.slice(0, k) });
      let got = "";
      for (const id of ids.slice(k)) got += stream.push(id);
      got += stream.flush();
      assert.equal(got, whole.slice(head.length), `${label}: ${JSON.stringify(text)} after ${k}`);
      checked++;
    }
  }
  return checked;
}

Deno.test("decodeStream after a prompt keeps the continuation's leading space (every tokenizer kind)", async () => {
  const dirs = { sentencepiece: sentencePieceDir(), tiktoken: kimiTiktokenDir().dir };
  const synth = mkdtempSync(join(tmpdir(), "sluice-bytelevel-"));
  writeSynthTokenizer(synth, 2048);
  try {
    for (const [label, dir] of Object.entries({ ...dirs, "byte-level BPE": synth })) {
      const tok = await loadTokenizer(dir);
      assert.ok(checkContinuations(tok, label) > 10, label);
    }
    // The report's case: "The dog" then " was", not "was".
    const spm = await loadTokenizer(dirs.sentencepiece);
    const ids = spm.encode("The dog was");
    const stream = spm.decodeStream({ context: ids.slice(0, -1) });
    assert.equal(stream.push(ids[ids.length - 1]) + stream.flush(), " was");
  } finally {
    for (const dir of [...Object.values(dirs), synth]) rmSync(dir, { recursive: true });
  }
});

/** The files a tokenizer folder is recognised by (engine/tokenizer.ts). */
const TOKENIZER_FILES = ["tokenizer.json", "tiktoken.model"];

Deno.test("decodeStream after a prompt: every tokenizer in ../shared/models", async () => {
  const root = fileURLToPath(new URL("../../shared/models", import.meta.url));
  let kinds = 0;
  for (const e of readdirSync(root, { withFileTypes: true })) {
    const dir = join(root, e.name);
    if (!e.isDirectory() || !readdirSync(dir).some((f) => TOKENIZER_FILES.includes(f))) continue;
    assert.ok(checkContinuations(await loadTokenizer(dir), e.name) > 0, e.name);
    kinds++;
  }
  assert.ok(kinds >= 10, `${kinds} fixture tokenizers`);
});
