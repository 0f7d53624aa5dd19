/**
 * Reasoning through the server: a template written after Qwen3's (the generation prompt opens
 * `<think>` unless enable_thinking is false, when it writes an empty think block) served with
 * `useChatTemplate` (`--chat-template FILE`) on the demo model. With thinking on, the whole
 * greedy output is reasoning_content, streamed as such; with it off through
 * chat_template_kwargs or enable_thinking, it is content; the Anthropic endpoint answers the same
 * with a thinking block. A bad override is refused by name.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import { Session } from "../engine/session.ts";
import { demoModelPath } from "../tools/demo_model.ts";
import { startServer } from "../tools/serve/server.ts";
import { coldText, tempDir, THINK_TEMPLATE } from "./fixtures.ts";

const RUN = { quiet: true, ctx: 1024, threads: 1 };

Deno.test({
  name: "serve: reasoning_content from <think>, and the template kwargs that turn it off",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const dir = tempDir();
    const file = join(dir, "think.jinja");
    Deno.writeTextFileSync(file, THINK_TEMPLATE);
    const model = await demoModelPath(true);
    const session = await Session.open(model, RUN);
    assert.throws(() => session.useChatTemplate(join(dir, "missing.jinja")), /built-in: chatml/);
    session.useChatTemplate(file);
    const server = startServer(session, { port: 0, log: () => {} });
    const client = new OpenAI({ apiKey: "none", baseURL: `${server.url}/v1`, maxRetries: 0 });
    const messages = [{ role: "user" as const, content: "Why is the sky blue?" }];
    /** The greedy text of the chat, special tokens kept (as the server reads it). */
    const greedy = (extra?: Record<string, unknown>) =>
      coldText(session, session.chatIds(messages, extra), 16, true);
    try {
      const thinking = await greedy();
      assert.ok(!thinking.includes("</think>"), "the fixture's text must not close the thought");
      const r = await client.chat.completions.create({
        model: "m",
        messages,
        max_tokens: 16,
        temperature: 0,
      }).catch(() => null);
      assert.equal(r, null, "a wrong model name is refused");
      const id = (await client.models.list()).data[0].id;
      const on = await client.chat.completions.create({
        model: id,
        messages,
        max_tokens: 16,
        temperature: 0,
      });
      const msg = on.choices[0].message as { content: string | null; reasoning_content?: string };
      assert.equal(msg.reasoning_content, thinking);
      assert.equal(msg.content, "");
      const stream = await client.chat.completions.create({
        model: id,
        messages,
        max_tokens: 16,
        temperature: 0,
        stream: true,
      });
      let streamed = "";
      for await (const c of stream) {
        const d = c.choices[0]?.delta as { reasoning_content?: string; content?: string };
        streamed += d?.reasoning_content ?? "";
        assert.ok(!d?.content);
      }
      assert.equal(streamed, thinking);
      const plain = (await greedy({ enable_thinking: false })).replace(/^\s+/, "");
      for (
        const extra of [{ chat_template_kwargs: { enable_thinking: false } }, {
          enable_thinking: false,
        }]
      ) {
        const off = await client.chat.completions.create({
          model: id,
          messages,
          max_tokens: 16,
          temperature: 0,
          ...extra,
        });
        const m = off.choices[0].message as { content: string | null; reasoning_content?: string };
        assert.equal(m.content, plain);
        assert.equal(m.reasoning_content, undefined);
      }

      // Anthropic: the reasoning is a thinking block, whole and streamed; disabled, it is text.
      const claude = new Anthropic({ apiKey: "none", baseURL: server.url, maxRetries: 0 });
      const ask = { model: "m", messages, max_tokens: 16 };
      const whole = await claude.messages.create(ask);
      assert.deepEqual(whole.content, [{ type: "thinking", thinking, signature: "" }]);
      const streamed2 = await claude.messages.stream(ask).finalMessage();
      assert.deepEqual(streamed2.content, whole.content);
      const off = await claude.messages.create({ ...ask, thinking: { type: "disabled" } });
      assert.deepEqual(off.content, [{ type: "text", text: plain }]);
    } finally {
      await server.close();
      session.close();
    }
  },
});
