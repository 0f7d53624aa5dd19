/**
 * Sessions and conversations as an attacker or a careless user shapes them (issue 27): `/save`
 * onto a link, FIFO, folder or someone's file is refused and leaves it as it was; a session file
 * is replaced only when asked; `/load` of a FIFO is refused instead of blocking; token ids outside
 * the vocabulary and conversations that cannot fit the context are refused before any template
 * or tokenizer runs, with messages naming the limit.
 */
import assert from "node:assert/strict";
import {
  existsSync,
  lstatSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { join } from "node:path";
import { checkChatMessages, MAX_TOKEN_BYTES } from "../engine/chat.ts";
import { Session } from "../engine/session.ts";
import { loadSession, saveSession } from "../engine/session_state.ts";
import { demoModelPath } from "../tools/demo_model.ts";
import { runSluice, tempDir } from "./fixtures.ts";

const OPTS = { quiet: true, ctx: 256, threads: 1 };

async function warmSession(): Promise<Session> {
  const s = await Session.open(await demoModelPath(true), OPTS);
  for await (const _ of s.generate(s.tokenize("hello"), { maxTokens: 3, ignoreEos: true })) {
    // Fills the prompt cache that a save writes.
  }
  return s;
}

Deno.test({
  name:
    "/save refuses links, FIFOs, folders and other files; replaces a session file only when asked",
  sanitizeResources: false,
  fn: async () => {
    const dir = join(tempDir(), "save-targets");
    mkdirSync(dir);
    const precious = join(dir, "precious.txt");
    writeFileSync(precious, "keep me");
    symlinkSync(precious, join(dir, "link.session"));
    mkdirSync(join(dir, "folder.session"));
    new Deno.Command("mkfifo", { args: [join(dir, "fifo.session")] }).outputSync();
    const s = await warmSession();
    try {
      const cases: [string, RegExp][] = [
        ["link.session", /it is a symbolic link/],
        ["folder.session", /it is a folder/],
        ["fifo.session", /it is a FIFO/],
        ["precious.txt", /exists and is not a sluice session file/],
      ];
      for (const [name, why] of cases) {
        assert.throws(() => saveSession(s, join(dir, name), null, true), why, name);
      }
      assert.equal(readFileSync(precious, "utf8"), "keep me");
      assert.equal(readlinkSync(join(dir, "link.session")), precious);
      assert.ok(lstatSync(join(dir, "fifo.session")).isFIFO());
      const file = join(dir, "chat.session");
      saveSession(s, file);
      const first = readFileSync(file);
      assert.throws(() => saveSession(s, file), /a session file is there; replace it explicitly/);
      assert.deepEqual(readFileSync(file), first);
      assert.ok(saveSession(s, file, { again: true }, true) > 0);
      assert.equal(loadSession(s, file).app?.constructor, Object);
      // A failed save names the file asked for, never the temporary one.
      assert.throws(
        () => saveSession(s, join(dir, "missing", "x.session")),
        (e: Error) => !e.message.includes(".tmp-") && e.message.includes("missing/x.session"),
      );
      assert.ok(!readdirSync(dir).some((n) => n.includes(".tmp-")), "no temporary file left");
      // Loading a FIFO is refused at once instead of waiting for a writer.
      assert.throws(() => loadSession(s, join(dir, "fifo.session")), /it is a FIFO/);
      assert.throws(() => loadSession(s, join(dir, "folder.session")), /it is a folder/);
    } finally {
      s.close();
    }
  },
});

Deno.test({
  name: "a session holding token ids outside the vocabulary is refused",
  sanitizeResources: false,
  fn: async () => {
    const s = await warmSession();
    const file = join(tempDir(), "bad-ids.session");
    try {
      const vocab = s.model.cfg.vocabSize;
      s.adoptCache([1, vocab + 7]);
      saveSession(s, file);
      s.resetCache();
      assert.throws(
        () => loadSession(s, file),
        new RegExp(`token 1 of the session is id ${vocab + 7}, outside the vocabulary of ${vocab}`),
      );
      assert.equal(s.cachedTokens.length, 0);
    } finally {
      s.close();
    }
  },
});

Deno.test("conversations that cannot fit the context are refused before rendering", () => {
  const msgs = (n: number, content = "hi") =>
    Array.from({ length: n }, (_, i) => ({ role: i % 2 ? "assistant" : "user", content }));
  checkChatMessages(msgs(256), 256);
  assert.throws(
    () => checkChatMessages(msgs(20_000), 256),
    /the conversation has 20000 messages; the context holds 256 tokens, so at most 256 can fit/,
  );
  const long = "x".repeat(256 * MAX_TOKEN_BYTES);
  assert.throws(
    () => checkChatMessages(msgs(1, long), 256),
    /characters of text, which cannot fit the context of 256 tokens \(at most 32768, 128 per token\)/,
  );
  assert.throws(
    () => checkChatMessages([{ role: "user" }], 256),
    /message 0 of the conversation: expected/,
  );
  assert.throws(() => checkChatMessages("hi", 256), /expected a list/);
});

Deno.test({
  name: "session chatIds and chat /load bound the messages up front",
  sanitizeResources: false,
  fn: async () => {
    const s = await Session.open(await demoModelPath(true), OPTS);
    const file = join(tempDir(), "many.session");
    try {
      const many = Array.from({ length: 20_000 }, () => ({ role: "user", content: "hi" }));
      // The bound's message, not the tokenizer's "the prompt has N tokens": refused up front.
      assert.throws(() => s.chatIds(many), /has 20000 messages; the context holds 256 tokens/);
      saveSession(s, file, {
        kind: "sluice-chat",
        system: null,
        messages: many,
        turn: 1,
        sampling: { seed: 1 },
      });
    } finally {
      s.close();
    }
    const r = await runSluice(
      ["chat", "--model", await demoModelPath(true), "--ctx", "256", "--quiet"],
      `/load ${file}\n/exit\n`,
      60_000,
    );
    assert.equal(r.code, 0, r.stderr);
    assert.match(
      r.stderr,
      /many\.session: the conversation has 20000 messages; the context holds 256 tokens/,
    );
    assert.match(r.stderr, /the chat was cleared/);
    assert.ok(existsSync(file));
  },
});
