/**
 * Chat turns keep their tokens: the next turn's prompt keeps the prompt cache's ids (the last
 * prompt and the answer as sampled) where the re-rendered conversation starts with their text,
 * so only the new messages run; the ids still spell the rendered text exactly, and a cold
 * session given them generates the same tokens.
 */
import assert from "node:assert/strict";
import { renderChat } from "../engine/chat.ts";
import { Session } from "../engine/session.ts";
import { demoModelPath } from "../tools/demo_model.ts";

const OPTS = { quiet: true, ctx: 1024, threads: 1 };

/** Greedy ids and text of up to `n` tokens from `ids`. */
async function answer(s: Session, ids: number[], n: number) {
  const out = { ids: [] as number[], text: "" };
  for await (const t of s.generate(ids, { maxTokens: n })) {
    out.ids.push(t.id);
    out.text += t.text;
  }
  return out;
}

Deno.test("a chat turn runs only the tokens after the previous answer", async () => {
  const model = await demoModelPath(true);
  const warm = await Session.open(model, OPTS);
  const cold = await Session.open(model, OPTS);
  try {
    const messages = [{ role: "user", content: "hello there" }];
    let before = 0, after = 0;
    for (const next of ["and then?", "tell me more", "thanks", "bye"]) {
      const held = [...warm.cachedTokens];
      const ids = warm.chatIds(messages);
      const text = renderChat(warm.model.container.dir, messages, { addGenerationPrompt: true });
      // Every cached id is kept, and the ids spell the rendered conversation.
      assert.deepEqual(ids.slice(0, held.length), held);
      assert.equal(warm.tokenizer.decode(ids), text);
      // Re-tokenizing the whole text (what the chat did before) keeps fewer.
      const fresh = warm.tokenizer.encode(text, { addSpecial: false });
      let common = 0;
      while (common < held.length && fresh[common] === held[common]) common++;
      before += fresh.length - common;
      after += ids.length - held.length;
      const got = await answer(warm, ids, 24);
      assert.equal(warm.timings.cachedTokens, Math.min(held.length, ids.length - 1));
      cold.resetCache();
      assert.deepEqual(got.ids, (await answer(cold, ids, 24)).ids);
      messages.push({ role: "assistant", content: got.text }, { role: "user", content: next });
    }
    assert.ok(after < before, `recomputed ${after} tokens, re-tokenizing would run ${before}`);
  } finally {
    warm.close();
    cold.close();
  }
});
