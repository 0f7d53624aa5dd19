/**
 * The OpenAI wire format without a model: stop strings cut streamed text where the generation
 * ends (at the first token whose text completes one), holding back no more and no less; request
 * checks name the bad field, unknown fields are ignored, unsupported combinations are refused.
 */
import assert from "node:assert/strict";
import { seededUniform } from "../engine/sampler.ts";
import { ApiError, parseCompletion, StopMatcher } from "../tools/serve/openai.ts";

Deno.test("stop strings: streamed pieces add up to the text cut at the first stop seen", () => {
  const rand = seededUniform(13);
  const pick = (s: string) => s[Math.floor(rand() * s.length)];
  for (let trial = 0; trial < 2000; trial++) {
    const text = Array.from({ length: 1 + Math.floor(rand() * 40) }, () => pick("abc \n")).join("");
    const stops = Array.from(
      { length: 1 + Math.floor(rand() * 3) },
      () => Array.from({ length: 1 + Math.floor(rand() * 4) }, () => pick("abc \n")).join(""),
    );
    // Token boundaries, then the reference: generation ends at the first boundary whose text so
    // far holds a stop string, and the answer is that text cut at the earliest stop in it.
    const ends: number[] = [];
    for (let at = 0; at < text.length;) {
      ends.push(at = Math.min(text.length, at + 1 + Math.floor(rand() * 5)));
    }
    let cut = text.length;
    for (const end of ends) {
      const hits = stops.map((x) => text.slice(0, end).indexOf(x)).filter((i) => i >= 0);
      if (hits.length > 0) {
        cut = Math.min(...hits);
        break;
      }
    }
    const m = new StopMatcher(stops);
    let out = "";
    for (let k = 0, at = 0; k < ends.length && !m.stopped; at = ends[k++]) {
      out += m.push(text.slice(at, ends[k]));
    }
    if (!m.stopped) out += m.flush();
    assert.equal(out, text.slice(0, cut), JSON.stringify({ text, stops }));
    assert.equal(m.stopped, cut < text.length);
  }
});

Deno.test("request checks name the field and keep what is valid", () => {
  const fails = (body: unknown, chat: boolean, param: string) => {
    assert.throws(
      () => parseCompletion(body, chat),
      (e: unknown) => e instanceof ApiError && e.status === 400 && e.param === param,
      `${JSON.stringify(body)} should name ${param}`,
    );
  };
  const msgs = [{ role: "user", content: "hi" }];
  fails({ messages: [] }, true, "messages");
  fails({ messages: [{ content: "x" }] }, true, "messages[0].role");
  fails(
    { messages: [{ role: "user", content: [{ type: "image_url" }] }] },
    true,
    "messages[0].content[0]",
  );
  fails({ messages: msgs, top_p: 0 }, true, "top_p");
  fails({ messages: msgs, max_tokens: 1.5 }, true, "max_tokens");
  fails({ messages: msgs, stop: ["a", "b", "c", "d", "e"] }, true, "stop");
  fails({ messages: msgs, n: 9 }, true, "n");
  fails({ messages: msgs, tools: {} }, true, "tools");
  fails(
    { messages: msgs, tools: [{ type: "function", function: { name: "a b" } }] },
    true,
    "tools[0].function.name",
  );
  const tool = { type: "function", function: { name: "f", parameters: { type: "object" } } };
  fails({ messages: msgs, tools: [tool, tool] }, true, "tools[1].function.name");
  fails({ messages: msgs, tool_choice: "required" }, true, "tool_choice");
  fails({ messages: msgs, tools: [tool], tool_choice: "sometimes" }, true, "tool_choice");
  fails(
    { messages: msgs, tools: [tool], tool_choice: { type: "function", function: { name: "g" } } },
    true,
    "tool_choice.function.name",
  );
  fails({ messages: msgs, tools: [tool], parallel_tool_calls: 1 }, true, "parallel_tool_calls");
  fails({ messages: msgs, response_format: { type: "xml" } }, true, "response_format.type");
  fails(
    { messages: msgs, response_format: { type: "json_schema", json_schema: { schema: {} } } },
    true,
    "response_format.json_schema.name",
  );
  fails(
    { messages: msgs, tools: [tool], response_format: { type: "json_object" } },
    true,
    "response_format",
  );
  fails(
    { messages: msgs, response_format: { type: "json_object" }, ignore_eos: true },
    true,
    "ignore_eos",
  );
  fails({ messages: msgs, top_logprobs: 3 }, true, "top_logprobs");
  fails({ messages: msgs, logprobs: true, top_logprobs: 21 }, true, "top_logprobs");
  fails({ prompt: "a", logprobs: 6 }, false, "logprobs");
  fails({ prompt: "a", tools: [tool] }, false, "tools");
  fails({ messages: msgs, user: 7 }, true, "user");
  fails({ messages: msgs, logit_bias: [1] }, true, "logit_bias");
  fails({ messages: msgs, logit_bias: { "-3": 1 } }, true, "logit_bias");
  fails({ messages: msgs, logit_bias: { "5": 101 } }, true, "logit_bias.5");
  fails({ messages: msgs, chat_template_kwargs: [] }, true, "chat_template_kwargs");
  fails(
    { messages: msgs, chat_template_kwargs: { tools: [] } },
    true,
    "chat_template_kwargs.tools",
  );
  fails({ messages: msgs, enable_thinking: "yes" }, true, "enable_thinking");
  fails({ messages: msgs, reasoning_effort: "max" }, true, "reasoning_effort");
  fails({ messages: msgs, stream: "yes" }, true, "stream");
  fails({ prompt: ["a", "b"] }, false, "prompt");
  fails({ prompt: [1, -2] }, false, "prompt");
  assert.throws(() => parseCompletion([], true), /must be a JSON object/);
  const r = parseCompletion({
    messages: [{
      role: "user",
      content: [{ type: "text", text: "a" }, { type: "text", text: "b" }],
    }],
    max_completion_tokens: 7,
    max_tokens: 99,
    stop: "END",
    stream: true,
    stream_options: { include_usage: true },
    seed: 5,
  }, true);
  assert.equal(r.messages?.[0].content, "ab");
  assert.equal(r.maxTokens, 7);
  assert.deepEqual(r.stop, ["END"]);
  assert.ok(r.stream && r.includeUsage);
  assert.equal(r.seed, 5);
  assert.deepEqual(parseCompletion({ prompt: [1, 2, 3] }, false).prompt, [1, 2, 3]);
  const agent = parseCompletion({
    messages: msgs,
    tools: [tool],
    tool_choice: { type: "function", function: { name: "f" } },
    parallel_tool_calls: false,
    logprobs: true,
    top_logprobs: 2,
    n: 3,
    user: "u1",
    chat_template_kwargs: { enable_thinking: false },
    reasoning_effort: "low",
    some_future_field: { ignored: true },
  }, true);
  assert.deepEqual(agent.toolChoice, { name: "f" });
  assert.equal(agent.parallelToolCalls, false);
  assert.equal(agent.logprobs, 2);
  assert.equal(agent.n, 3);
  assert.deepEqual(agent.templateKwargs, { enable_thinking: false, reasoning_effort: "low" });
  assert.equal(parseCompletion({ messages: msgs, tools: [tool] }, true).toolChoice, "auto");
  assert.deepEqual(
    [...parseCompletion({ prompt: "a", logit_bias: { "7": -100, "9": 2.5 } }, false).logitBias],
    [[7, -100], [9, 2.5]],
  );
});
