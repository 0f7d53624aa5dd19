/**
 * `POST /v1/messages` and `/v1/messages/count_tokens` through the official `@anthropic-ai/sdk`
 * client on the demo model: the text equals a greedy generation of the same chat, streamed events
 * add up to the whole message, a forced tool call comes back as a `tool_use` block with input that
 * matches the schema, `tool_result` blocks render into the next prompt, stop sequences and
 * max_tokens give their stop reasons, usage counts the prompt cache, and errors are Anthropic's.
 */
import assert from "node:assert/strict";
import Anthropic from "@anthropic-ai/sdk";
import { Session } from "../engine/session.ts";
import { demoModelPath } from "../tools/demo_model.ts";
import { startServer } from "../tools/serve/server.ts";
import { coldText } from "./fixtures.ts";

const RUN = { quiet: true, ctx: 1024, threads: 1 };
const KEY = "anthropic-test-key";

const WEATHER = {
  name: "get_weather",
  description: "Weather of a city",
  input_schema: {
    type: "object" as const,
    properties: {
      city: { type: "string", enum: ["Paris", "Oslo"] },
      days: { type: "integer", minimum: 1, maximum: 3 },
    },
    required: ["city", "days"],
    additionalProperties: false,
  },
};

Deno.test({
  name: "serve: the Anthropic Messages API through @anthropic-ai/sdk",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async (t) => {
    const model = await demoModelPath(true);
    const session = await Session.open(model, RUN);
    const ref = await Session.open(model, RUN);
    const server = startServer(session, { port: 0, apiKey: KEY, log: () => {} });
    const client = new Anthropic({
      apiKey: KEY,
      baseURL: server.url,
      maxRetries: 0,
      timeout: 60_000,
    });
    const system = "You are terse.";
    const messages = [{ role: "user" as const, content: "Tell me a story about a fox." }];
    const chat = [{ role: "system", content: system }, {
      role: "user",
      content: messages[0].content,
    }];
    try {
      await t.step("a message equals a greedy generation of the same chat", async () => {
        const r = await client.messages.create({
          model: "any-model-name",
          system,
          messages,
          max_tokens: 10,
        });
        assert.equal(r.type, "message");
        assert.equal(r.role, "assistant");
        assert.equal(r.stop_reason, "max_tokens");
        const text = r.content.map((b) => (b.type === "text" ? b.text : "")).join("");
        assert.equal(text, await coldText(ref, ref.chatIds(chat), 10));
        assert.equal(r.usage.output_tokens, 10);
        assert.equal(
          r.usage.input_tokens + (r.usage.cache_read_input_tokens ?? 0),
          ref.chatIds(chat).length,
        );
      });

      await t.step("the same chat again is read from the prompt cache", async () => {
        const r = await client.messages.create({
          model: "m",
          system,
          messages,
          max_tokens: 4,
        });
        assert.ok((r.usage.cache_read_input_tokens ?? 0) >= ref.chatIds(chat).length - 1);
      });

      await t.step("streamed events add up to the whole message", async () => {
        const whole = await client.messages.create({
          model: "m",
          system,
          messages,
          max_tokens: 12,
        });
        const stream = client.messages.stream({
          model: "m",
          system,
          messages,
          max_tokens: 12,
        });
        const kinds: string[] = [];
        for await (const e of stream) kinds.push(e.type);
        const final = await stream.finalMessage();
        assert.deepEqual(final.content, whole.content);
        assert.equal(final.stop_reason, "max_tokens");
        assert.equal(kinds[0], "message_start");
        assert.equal(kinds.at(-1), "message_stop");
        assert.ok(kinds.includes("content_block_delta"));
      });

      await t.step("stop_sequences end with stop_sequence naming it", async () => {
        const full = await coldText(ref, ref.chatIds(chat), 12);
        const stop = full.slice(5, 8);
        const r = await client.messages.create({
          model: "m",
          system,
          messages,
          max_tokens: 12,
          stop_sequences: [stop],
        });
        assert.equal(r.stop_reason, "stop_sequence");
        assert.equal(r.stop_sequence, stop);
        const text = r.content.map((b) => (b.type === "text" ? b.text : "")).join("");
        assert.equal(text, full.slice(0, full.indexOf(stop)));
      });

      await t.step("a forced tool: a tool_use block whose input matches the schema", async () => {
        for (const stream of [false, true]) {
          const params = {
            model: "m",
            messages: [{ role: "user" as const, content: "Weather in Oslo?" }],
            tools: [WEATHER],
            tool_choice: { type: "tool" as const, name: "get_weather" },
            max_tokens: 200,
          };
          const r = stream
            ? await client.messages.stream(params).finalMessage()
            : await client.messages.create(params);
          assert.equal(r.stop_reason, "tool_use");
          const use = r.content.find((b) => b.type === "tool_use");
          assert.ok(use && use.type === "tool_use");
          assert.equal(use.name, "get_weather");
          const input = use.input as { city: string; days: number };
          assert.ok(["Paris", "Oslo"].includes(input.city));
          assert.ok(Number.isInteger(input.days) && input.days >= 1 && input.days <= 3);
        }
      });

      await t.step("output_config.format: the text is JSON matching the schema", async () => {
        const r = await client.messages.create({
          model: "m",
          messages: [{ role: "user", content: "Weather in Oslo?" }],
          max_tokens: 200,
          thinking: { type: "disabled" },
          output_config: {
            effort: "low",
            format: { type: "json_schema", schema: WEATHER.input_schema },
          },
        });
        assert.equal(r.stop_reason, "end_turn");
        const text = r.content.map((b) => (b.type === "text" ? b.text : "")).join("");
        const v = JSON.parse(text);
        assert.ok(["Paris", "Oslo"].includes(v.city) && [1, 2, 3].includes(v.days), text);
      });

      await t.step("tool_use and tool_result blocks render into the prompt", async () => {
        const turn = [
          { role: "user" as const, content: "Weather in Oslo?" },
          {
            role: "assistant" as const,
            content: [
              { type: "thinking" as const, thinking: "Need the tool.", signature: "" },
              {
                type: "tool_use" as const,
                id: "toolu_1",
                name: "get_weather",
                input: { city: "Oslo", days: 1 },
              },
            ],
          },
          {
            role: "user" as const,
            content: [{
              type: "tool_result" as const,
              tool_use_id: "toolu_1",
              content: "Sleet, 1 C",
            }],
          },
        ];
        const counted = await client.messages.countTokens({
          model: "m",
          messages: turn,
          tools: [WEATHER],
        });
        const r = await client.messages.create({
          model: "m",
          messages: turn,
          tools: [WEATHER],
          max_tokens: 2,
        });
        assert.equal(
          r.usage.input_tokens + (r.usage.cache_read_input_tokens ?? 0),
          counted.input_tokens,
        );
        const plain = await client.messages.countTokens({ model: "m", messages: [turn[0]] });
        assert.ok(counted.input_tokens > plain.input_tokens);
      });

      await t.step("errors come back in Anthropic's shape", async () => {
        await assert.rejects(
          client.messages.create({ model: "m", messages, max_tokens: 0 }),
          (e: unknown) =>
            e instanceof Anthropic.BadRequestError && /max_tokens/.test(e.message) &&
            (e.error as { type?: string }).type === "error",
        );
        await assert.rejects(
          client.messages.create({
            model: "m",
            messages: [{
              role: "user",
              content: [{ type: "image", source: { type: "url", url: "x" } }],
            }],
            max_tokens: 5,
          }),
          (e: unknown) => e instanceof Anthropic.BadRequestError && /image/.test(e.message),
        );
        await assert.rejects(
          client.messages.create({
            model: "m",
            messages: [{ role: "user", content: [{ text: "hi" } as Anthropic.TextBlockParam] }],
            max_tokens: 5,
          }),
          (e: unknown) =>
            e instanceof Anthropic.BadRequestError &&
            /content\[0\]\.type: expected .*text.*it is missing/.test(e.message),
        );
        const wrongKey = new Anthropic({ apiKey: "wrong", baseURL: server.url, maxRetries: 0 });
        await assert.rejects(
          wrongKey.messages.create({ model: "m", messages, max_tokens: 5 }),
          (e: unknown) => e instanceof Anthropic.AuthenticationError,
        );
      });
    } finally {
      await server.close();
      session.close();
      ref.close();
    }
  },
});
