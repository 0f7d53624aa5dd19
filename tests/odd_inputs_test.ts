/**
 * What a newcomer types, on the synthetic demo model (no ../shared needed): the streamed text of
 * a generation equals the decode of its ids even when the last token ends inside a UTF-8
 * character; an id outside the vocabulary, an empty --chat message and a prompt longer than
 * --ctx are refused with one clear line; an empty plain prompt starts from BOS.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { Session } from "../engine/session.ts";
import { demoModelPath } from "../tools/demo_model.ts";
import { tempDir } from "./fixtures.ts";

const MOD = new URL("../mod.ts", import.meta.url).pathname;
const CACHE = join(tempDir(), "cache");

function demoModel(): Promise<string> {
  return demoModelPath(true, CACHE);
}

async function sluice(
  ...args: string[]
): Promise<{ code: number; stdout: string; stderr: string }> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", MOD, ...args],
    stdin: "null",
    env: { NO_COLOR: "1", SLUICE_CACHE: CACHE },
  }).output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

Deno.test("generate: the yielded texts add up to the decode, also when cut mid-character", async () => {
  const session = await Session.open(await demoModel(), { quiet: true });
  try {
    const all: number[] = [];
    for await (const t of session.generate("Once upon a time", { maxTokens: 96 })) all.push(t.id);
    // The lengths at which the stream decoder still holds bytes back: the cases a missing
    // flush loses.
    const stream = session.tokenizer.decodeStream();
    const cuts: number[] = [];
    all.forEach((id, i) => {
      stream.push(id);
      if (stream.holding) cuts.push(i + 1);
    });
    assert.ok(cuts.length > 0, "the demo model's gibberish should split some character");
    for (const n of [...cuts.slice(0, 4), all.length]) {
      const ids: number[] = [];
      let text = "";
      for await (const t of session.generate("Once upon a time", { maxTokens: n })) {
        ids.push(t.id);
        text += t.text;
      }
      assert.deepEqual(ids, all.slice(0, n), "same tokens for a shorter run");
      assert.equal(text, session.detokenize(ids), `text after ${n} tokens`);
    }
  } finally {
    session.close();
  }
});

Deno.test("generate: odd prompts get one clear line", async () => {
  const model = await demoModel();
  const base = ["generate", "--model", model, "-n", "4", "--quiet"];
  const outside = await sluice(...base, "--prompt-ids", "1,2,999999");
  assert.equal(outside.code, 1);
  assert.match(outside.stderr, /--prompt-ids: token id 999999 is outside the vocabulary of \d+/);
  assert.doesNotMatch(outside.stderr, /\n\s+at /, "no stack trace");

  const notNumber = await sluice(...base, "--prompt-ids", "1,x");
  assert.equal(notNumber.code, 1);
  assert.match(notNumber.stderr, /--prompt-ids expects token ids separated by commas, got "x"/);

  const chat = await sluice(...base, "--chat", "--prompt", "  ");
  assert.equal(chat.code, 1);
  assert.match(chat.stderr, /--chat needs a user message/);

  const long = await sluice(...base, "--ctx", "8", "--prompt", "one two three four five six seven");
  assert.equal(long.code, 1);
  assert.match(long.stderr, /the prompt has \d+ tokens but the context holds 8/);

  const ids = await sluice(...base, "--prompt-ids", "5,6,7", "--json");
  assert.equal(ids.code, 0, ids.stderr);
  assert.deepEqual(JSON.parse(ids.stdout).prompt_ids, [5, 6, 7]);

  const empty = await sluice(...base, "--prompt", "", "--json");
  assert.equal(empty.code, 0, empty.stderr);
  assert.equal(JSON.parse(empty.stdout).prompt_ids.length, 1, "an empty prompt starts from BOS");
});
