/**
 * The agent side of `serve` through the real `openai` client on the random-weight demo model:
 * a required or named tool call comes back as parseable arguments that match the tool's schema
 * (the grammar forces it, whatever the weights), streamed as `delta.tool_calls` too; the calls
 * and the tool's answer render back into the next prompt; `response_format` gives schema-valid
 * JSON; log probabilities describe the sampled tokens; n > 1 and seeds are reproducible.
 */
import assert from "node:assert/strict";
import OpenAI from "openai";
import { Session } from "../engine/session.ts";
import { demoModelPath } from "../tools/demo_model.ts";
import { startServer } from "../tools/serve/server.ts";

const RUN = { quiet: true, ctx: 1024, threads: 1 };

const WEATHER = {
  type: "function" as const,
  function: {
    name: "get_weather",
    description: "Weather of a city",
    parameters: {
      type: "object",
      properties: {
        city: { type: "string", enum: ["Paris", "Oslo", "Lima"] },
        days: { type: "integer", minimum: 1, maximum: 7 },
      },
      required: ["city", "days"],
      additionalProperties: false,
    },
  },
};
const CLOCK = {
  type: "function" as const,
  function: {
    name: "get_time",
    parameters: {
      type: "object",
      properties: { utc: { type: "boolean" } },
      required: ["utc"],
      additionalProperties: false,
    },
  },
};

/** The weather arguments, checked against their schema by hand. */
function checkWeather(args: string): void {
  const v = JSON.parse(args);
  assert.deepEqual(Object.keys(v).sort(), ["city", "days"], args);
  assert.ok(["Paris", "Oslo", "Lima"].includes(v.city), args);
  assert.ok(Number.isInteger(v.days) && v.days >= 1 && v.days <= 7, args);
}

Deno.test({
  name: "serve (agents): tool calls, structured output, logprobs, n, seeds",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async (t) => {
    const model = await demoModelPath(true);
    const session = await Session.open(model, RUN);
    const server = startServer(session, { port: 0, log: () => {} });
    const client = new OpenAI({
      apiKey: "none",
      baseURL: `${server.url}/v1`,
      maxRetries: 0,
      timeout: 60_000,
    });
    const user = [{ role: "user" as const, content: "What is the weather in Oslo?" }];
    try {
      const model = (await client.models.list()).data[0].id;
      await t.step("tool_choice required: a call with schema-valid arguments", async () => {
        for (const seed of [1, 2, 3]) {
          const r = await client.chat.completions.create({
            model,
            messages: user,
            tools: [WEATHER, CLOCK],
            tool_choice: "required",
            temperature: 1,
            seed,
            max_tokens: 200,
          });
          const c = r.choices[0];
          assert.equal(c.finish_reason, "tool_calls");
          const calls = c.message.tool_calls ?? [];
          assert.equal(calls.length, 1);
          const call = calls[0];
          assert.ok(call.type === "function");
          if (call.function.name === "get_weather") checkWeather(call.function.arguments);
          else assert.equal(typeof JSON.parse(call.function.arguments).utc, "boolean");
        }
      });

      await t.step("a named tool, streamed: delta.tool_calls add up to the call", async () => {
        const stream = await client.chat.completions.create({
          model,
          messages: user,
          tools: [WEATHER, CLOCK],
          tool_choice: { type: "function", function: { name: "get_weather" } },
          temperature: 1,
          seed: 9,
          max_tokens: 200,
          stream: true,
        });
        let name = "", args = "", finish = null, id = "";
        for await (const chunk of stream) {
          const d = chunk.choices[0]?.delta;
          for (const tc of d?.tool_calls ?? []) {
            assert.equal(tc.index, 0);
            id ||= tc.id ?? "";
            name += tc.function?.name ?? "";
            args += tc.function?.arguments ?? "";
          }
          finish = chunk.choices[0]?.finish_reason ?? finish;
        }
        assert.equal(name, "get_weather");
        assert.ok(id.startsWith("call_"));
        checkWeather(args);
        assert.equal(finish, "tool_calls");
      });

      await t.step("the call and the tool's answer render into the next prompt", async () => {
        const turn = [
          ...user,
          {
            role: "assistant" as const,
            content: null,
            tool_calls: [{
              id: "call_1",
              type: "function" as const,
              function: { name: "get_weather", arguments: '{"city": "Oslo", "days": 2}' },
            }],
          },
          { role: "tool" as const, tool_call_id: "call_1", content: "Snow, -3 C" },
        ];
        const r = await client.chat.completions.create({
          model,
          messages: turn,
          tools: [WEATHER],
          max_tokens: 3,
          temperature: 0,
        });
        assert.ok(r.usage!.prompt_tokens > 0);
        const prompt = session.chatPrompt([
          ...user,
          {
            role: "assistant",
            content: "",
            tool_calls: [{
              id: "call_1",
              type: "function",
              function: { name: "get_weather", arguments: { city: "Oslo", days: 2 } },
            }],
          },
          { role: "tool", content: "Snow, -3 C", tool_call_id: "call_1" },
        ]);
        assert.ok(prompt.includes("Snow, -3 C"));
        const bad = await fetch(`${server.url}/v1/chat/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({
            messages: [
              ...user,
              {
                role: "assistant",
                tool_calls: [{ function: { name: "get_weather", arguments: "{oops" } }],
              },
            ],
          }),
        });
        assert.equal(bad.status, 400);
        assert.equal(
          (await bad.json()).error.param,
          "messages[1].tool_calls[0].function.arguments",
        );
      });

      await t.step("response_format json_schema: the content parses and matches", async () => {
        for (const seed of [4, 5]) {
          const r = await client.chat.completions.create({
            model,
            messages: user,
            response_format: {
              type: "json_schema",
              json_schema: { name: "weather", strict: true, schema: WEATHER.function.parameters },
            },
            temperature: 1,
            seed,
            max_tokens: 200,
          });
          assert.equal(r.choices[0].finish_reason, "stop");
          checkWeather(r.choices[0].message.content ?? "");
        }
        const refused = await fetch(`${server.url}/v1/chat/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({
            messages: user,
            response_format: {
              type: "json_schema",
              json_schema: {
                name: "w",
                schema: { type: "object", properties: { a: { $ref: "#/nope" } } },
              },
            },
          }),
        });
        assert.equal(refused.status, 400);
        const why = (await refused.json()).error;
        assert.equal(why.param, "response_format");
        // The grammar engine's own reason, not its stderr.
        assert.match(why.message, /Cannot find field nope/);
        // The grammar engine still works after refusing a schema.
        const again = await client.chat.completions.create({
          model,
          messages: user,
          response_format: { type: "json_object" },
          temperature: 0,
          max_tokens: 200,
        });
        assert.equal(again.choices[0].finish_reason, "stop");
        assert.equal(typeof JSON.parse(again.choices[0].message.content ?? ""), "object");
      });

      await t.step("logprobs: the sampled token's, with the greedy pick on top", async () => {
        const r = await client.chat.completions.create({
          model,
          messages: user,
          logprobs: true,
          top_logprobs: 3,
          temperature: 0,
          max_tokens: 6,
        });
        const lp = r.choices[0].logprobs?.content ?? [];
        assert.equal(lp.length, r.usage?.completion_tokens);
        for (const e of lp) {
          assert.ok(e.logprob <= 0);
          assert.equal(e.top_logprobs.length, 3);
          assert.equal(e.top_logprobs[0].logprob, e.logprob);
          assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob);
        }
        assert.equal(lp.map((e) => e.token).join(""), r.choices[0].message.content);
      });

      await t.step(
        "logit_bias: +100 makes a token every pick, -100 bans the greedy one",
        async () => {
          // The greedy first token, from the engine itself (the server is idle between steps).
          let greedyId = -1;
          for await (
            const tok of session.generate(session.chatIds(user), { maxTokens: 1, temperature: 0 })
          ) greedyId = tok.id;
          const fox = session.tokenize(" fox").at(-1)!;
          const forced = await client.chat.completions.create({
            model,
            messages: user,
            temperature: 0,
            max_tokens: 4,
            logit_bias: { [fox]: 100 },
          });
          assert.equal(forced.choices[0].message.content, session.detokenize([fox, fox, fox, fox]));
          // Ban the greedy first token: the first pick becomes another.
          const banned = await client.completions.create({
            model,
            prompt: session.chatIds(user),
            temperature: 0,
            max_tokens: 1,
            logit_bias: { [greedyId]: -100 },
          });
          const unbanned = await client.completions.create({
            model,
            prompt: session.chatIds(user),
            temperature: 0,
            max_tokens: 1,
          });
          assert.equal(unbanned.choices[0].text, session.detokenize([greedyId]));
          assert.notEqual(banned.choices[0].text, unbanned.choices[0].text);
          const tooBig = await fetch(`${server.url}/v1/chat/completions`, {
            method: "POST",
            headers: { "content-type": "application/json" },
            body: JSON.stringify({ messages: user, logit_bias: { "999999": 1 } }),
          });
          assert.equal(tooBig.status, 400);
          assert.equal((await tooBig.json()).error.param, "logit_bias");
        },
      );

      await t.step("text completions: legacy logprobs with the top alternatives", async () => {
        const r = await client.completions.create({
          model,
          prompt: "Once upon a time",
          logprobs: 2,
          temperature: 0,
          max_tokens: 5,
        });
        const lp = r.choices[0].logprobs!;
        assert.equal(lp.tokens!.length, 5);
        assert.equal(lp.tokens!.join(""), r.choices[0].text);
        assert.deepEqual(lp.text_offset, [
          0,
          ...lp.tokens!.slice(0, -1).map((_, i) => lp.tokens!.slice(0, i + 1).join("").length),
        ]);
        for (let i = 0; i < 5; i++) {
          const top = Object.values(lp.top_logprobs![i]);
          assert.ok(top.length >= 1 && top.length <= 2);
          assert.equal(Math.max(...top), lp.token_logprobs![i]);
        }
      });

      await t.step("n = 2 with a seed: two choices, the same again for the same seed", async () => {
        const ask = () =>
          client.chat.completions.create({
            model,
            messages: user,
            n: 2,
            seed: 42,
            temperature: 1,
            max_tokens: 8,
            user: "tester",
          });
        const a = await ask();
        const b = await ask();
        assert.equal(a.choices.length, 2);
        assert.deepEqual(a.choices.map((c) => c.index), [0, 1]);
        assert.deepEqual(
          a.choices.map((c) => c.message.content),
          b.choices.map((c) => c.message.content),
        );
        assert.notEqual(a.choices[0].message.content, a.choices[1].message.content);
        assert.equal(a.usage?.completion_tokens, 16);
      });
    } finally {
      await server.close();
      session.close();
    }
  },
});
