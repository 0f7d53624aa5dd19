/**
 * `serve` through the real `openai` npm client on a loopback port: chat, streaming, completions
 * and models; greedy output equal to `generate`; the OpenAI error shapes; a client aborting
 * mid-stream; two clients at once; the prompt cache; keep-alive comments and the metrics.
 */
import assert from "node:assert/strict";
import OpenAI from "openai";
import { Session } from "../engine/session.ts";
import { demoModelPath } from "../tools/demo_model.ts";
import { startServer } from "../tools/serve/server.ts";
import { coldText, packedFixture, runSluice, sharedMissing } from "./fixtures.ts";

const MOD = new URL("../mod.ts", import.meta.url).pathname;
const KEY = "test-key";
const RUN = { quiet: true, ctx: 512, threads: 1 };
/** Every request of these tests gives up after this long, so a hang fails instead of stalling. */
const limit = () => AbortSignal.timeout(30_000);

/** `mod.ts generate --json` on a model and prompt: the reference the server must match. */
async function generateCli(model: string, args: string[]): Promise<{ text: string }> {
  const r = await runSluice(["generate", "--model", model, "--json", "--ctx", "512", ...args]);
  assert.equal(r.code, 0, r.stderr);
  return JSON.parse(r.stdout);
}

async function post(url: string, body: string, headers: Record<string, string> = {}) {
  const r = await fetch(url, {
    method: "POST",
    body,
    headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json", ...headers },
    signal: limit(),
  });
  return { status: r.status, headers: r.headers, body: await r.json() };
}

Deno.test({
  name: "serve: the openai client, errors, abort, concurrency, prompt cache, metrics",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async (t) => {
    const model = await demoModelPath(true);
    const session = await Session.open(model, RUN);
    const ref = await Session.open(model, RUN);
    const logs: string[] = [];
    const server = startServer(session, {
      port: 0,
      apiKey: KEY,
      queueSize: 1,
      maxBodyBytes: 64 * 1024,
      keepAliveMs: 5,
      log: (l) => logs.push(l),
    });
    const client = new OpenAI({
      apiKey: KEY,
      baseURL: `${server.url}/v1`,
      maxRetries: 0,
      timeout: 30_000,
    });
    try {
      const id = "demo-" + model.split("/demo-")[1].replace(/\.sluice$/, "");

      await t.step("models", async () => {
        const list = await client.models.list();
        assert.deepEqual(list.data.map((m) => m.id), [id]);
        assert.equal((await client.models.retrieve(id)).id, id);
      });

      const user = [{ role: "user" as const, content: "Tell me a story about a fox." }];
      await t.step("chat completion equals a greedy generate of the same prompt", async () => {
        const r = await client.chat.completions.create({
          model: id,
          messages: user,
          max_tokens: 12,
          temperature: 0,
        });
        const ids = ref.chatIds(user);
        assert.equal(r.choices[0].message.content, await coldText(ref, ids, 12));
        assert.equal(r.choices[0].finish_reason, "length");
        assert.equal(r.usage?.prompt_tokens, ids.length);
        assert.equal(r.usage?.completion_tokens, 12);
      });

      await t.step("text completion equals `mod.ts generate`", async () => {
        const prompt = "Once upon a time there was";
        const r = await client.completions.create({
          model: id,
          prompt,
          max_tokens: 20,
          temperature: 0,
        });
        const cli = await generateCli(model, ["--prompt", prompt, "-n", "20"]);
        assert.equal(r.choices[0].text, cli.text);
        assert.equal(r.usage?.completion_tokens, 20);
      });

      await t.step(
        "streamed chat: chunks add up to the non-streamed answer, usage last",
        async () => {
          const stream = await client.chat.completions.create({
            model: id,
            messages: user,
            max_tokens: 12,
            temperature: 0,
            stream: true,
            stream_options: { include_usage: true },
          });
          let text = "", finish = null, usage = null, chunks = 0;
          for await (const c of stream) {
            chunks++;
            if (c.choices[0]) {
              text += c.choices[0].delta.content ?? "";
              finish = c.choices[0].finish_reason ?? finish;
            }
            if (c.usage) usage = c.usage;
          }
          assert.ok(chunks >= 12);
          assert.equal(text, await coldText(ref, ref.chatIds(user), 12));
          assert.equal(finish, "length");
          assert.equal(usage?.completion_tokens, 12);
        },
      );

      await t.step("stop strings cut the text and end with finish_reason stop", async () => {
        const full = await coldText(ref, ref.chatIds(user), 12);
        const stop = full.slice(6, 9);
        const r = await client.chat.completions.create({
          model: id,
          messages: user,
          max_tokens: 12,
          temperature: 0,
          stop: [stop],
        });
        assert.equal(r.choices[0].message.content, full.slice(0, full.indexOf(stop)));
        assert.equal(r.choices[0].finish_reason, "stop");
      });

      await t.step("the next turn reuses the prompt cache and gives the cold tokens", async () => {
        // A story no earlier step asked for: a longer answer to the same prompt, which the server
        // keeps as a saved prefix, would otherwise be the one continued (tests/prefix_cache_test.ts).
        const owl = [{ role: "user" as const, content: "Tell me a story about an owl." }];
        const first = await client.chat.completions.create({
          model: id,
          messages: owl,
          max_tokens: 10,
          temperature: 0,
        });
        const turn2 = [
          ...owl,
          { role: "assistant" as const, content: first.choices[0].message.content ?? "" },
          { role: "user" as const, content: "And then what happened?" },
        ];
        const r = await client.chat.completions.create({
          model: id,
          messages: turn2,
          max_tokens: 10,
          temperature: 0,
        });
        // The served turn keeps the first answer's sampled ids: the reference runs turn 1 too.
        await coldText(ref, ref.chatIds(owl), 10);
        const held = ref.cachedTokens.length;
        const ids = ref.chatIds(turn2);
        assert.equal(r.choices[0].message.content, await coldText(ref, ids, 10));
        const cached = r.usage?.prompt_tokens_details?.cached_tokens ?? 0;
        assert.equal(cached, held);
        assert.ok(cached < ids.length);
      });

      await t.step("bad requests get OpenAI errors naming the field", async () => {
        const url = `${server.url}/v1/chat/completions`;
        const bad = await post(url, "{not json");
        assert.equal(bad.status, 400);
        assert.equal(bad.body.error.code, "invalid_json");
        const noMessages = await post(url, JSON.stringify({ model: id }));
        assert.equal(noMessages.status, 400);
        assert.equal(noMessages.body.error.param, "messages");
        const hot = await post(url, JSON.stringify({ messages: user, temperature: "hot" }));
        assert.equal(hot.status, 400);
        assert.equal(hot.body.error.param, "temperature");
        assert.match(hot.body.error.message, /temperature: expected a number/);
        const big = await post(url, JSON.stringify({ messages: user, pad: "x".repeat(70_000) }));
        assert.equal(big.status, 413);
        const key = await post(url, JSON.stringify({ messages: user }), {
          authorization: "Bearer wrong",
        });
        assert.equal(key.status, 401);
        assert.equal(key.body.error.type, "authentication_error");
        const logprobs = await post(url, JSON.stringify({ messages: user, top_logprobs: 2 }));
        assert.equal(logprobs.status, 400);
        assert.equal(logprobs.body.error.param, "top_logprobs");
        const tooLong = await post(
          `${server.url}/v1/completions`,
          JSON.stringify({ prompt: Array(600).fill(5) }),
        );
        assert.equal(tooLong.status, 400);
        assert.equal(tooLong.body.error.code, "context_length_exceeded");
        await assert.rejects(
          client.chat.completions.create({ model: "no-such-model", messages: user }),
          (e: unknown) => e instanceof OpenAI.NotFoundError && /no-such-model/.test(e.message),
        );
        const unknown = await fetch(`${server.url}/v2/nothing`, {
          signal: limit(),
          headers: { authorization: `Bearer ${KEY}` },
        });
        assert.equal(unknown.status, 404);
        assert.equal((await unknown.json()).error.code, "not_found");
        const health = await fetch(`${server.url}/health`, { signal: limit() });
        assert.equal((await health.json()).status, "ok");
      });

      await t.step("tokenize and detokenize", async () => {
        const tk = await post(`${server.url}/tokenize`, JSON.stringify({ content: "a fox" }));
        assert.deepEqual(tk.body.tokens, ref.tokenize("a fox"));
        const dt = await post(
          `${server.url}/detokenize`,
          JSON.stringify({ tokens: tk.body.tokens }),
        );
        assert.equal(dt.body.content, ref.detokenize(tk.body.tokens));
        const bad = await post(`${server.url}/detokenize`, JSON.stringify({ tokens: [-1] }));
        assert.equal(bad.status, 400);
        assert.equal(bad.body.error.param, "tokens");
      });

      await t.step("an aborted stream stops its generation; a full queue gets 429", async () => {
        const before = server.live.totals.generatedTokens;
        const controller = new AbortController();
        const stream = await client.chat.completions.create(
          { model: id, messages: user, max_tokens: 400, temperature: 0, stream: true },
          { signal: controller.signal },
        );
        let seen = 0;
        // Queue size 1: one waits, the next is refused.
        const waiting = client.completions.create({ model: id, prompt: "a", max_tokens: 2 });
        await new Promise((r) => setTimeout(r, 50));
        const full = await post(`${server.url}/v1/completions`, JSON.stringify({ prompt: "b" }));
        assert.equal(full.status, 429);
        assert.equal(full.headers.get("retry-after"), "1");
        try {
          for await (const _ of stream) if (++seen === 3) controller.abort();
        } catch (e) {
          // The client reports the abort as an error or just ends the stream, by version.
          assert.ok(e instanceof Error && /abort/i.test(e.name + e.message), String(e));
        }
        assert.equal(seen, 3);
        const next = await waiting;
        assert.equal(next.usage?.completion_tokens, 2);
        const cancelled = server.live.totals.generatedTokens - before - 2;
        assert.ok(cancelled >= 3 && cancelled < 400, `cancelled after ${cancelled} tokens`);
        assert.equal(server.live.totals.cancelled, 1);
      });

      await t.step("a JSON client that goes away cancels its generation", async () => {
        const before = { ...server.live.totals };
        const gone = new AbortController();
        const request = fetch(`${server.url}/v1/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
          body: JSON.stringify({ prompt: "x", max_tokens: 400, ignore_eos: true }),
          signal: gone.signal,
        });
        // Leave once the server is generating for it.
        for (let i = 0; !server.live.current; i++) {
          assert.ok(i < 10_000, "the request never started");
          await new Promise((r) => setTimeout(r, 1));
        }
        gone.abort();
        await assert.rejects(request);
        const end = Date.now() + 10_000;
        while (server.live.current || server.live.totals.requests === before.requests) {
          assert.ok(Date.now() < end, "the abandoned request never finished");
          await new Promise((r) => setTimeout(r, 10));
        }
        assert.equal(server.live.totals.cancelled, before.cancelled + 1);
        assert.ok(server.live.totals.generatedTokens - before.generatedTokens < 400);
      });

      await t.step("two clients at once are both served, one after the other", async () => {
        const a = [{ role: "user" as const, content: "First client." }];
        const raw = fetch(`${server.url}/v1/chat/completions`, {
          method: "POST",
          signal: limit(),
          headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
          body: JSON.stringify({ messages: a, max_tokens: 40, temperature: 0, stream: true }),
        }).then((r) => r.text());
        const b = [{ role: "user" as const, content: "Second client." }];
        const second = client.chat.completions.create({
          model: id,
          messages: b,
          max_tokens: 8,
          temperature: 0,
        });
        const [sse, rb] = await Promise.all([raw, second]);
        const text = sse.split("\n").filter((l) => l.startsWith("data: {"))
          .map((l) => JSON.parse(l.slice(6)).choices[0]?.delta?.content ?? "").join("");
        assert.ok(sse.trimEnd().endsWith("data: [DONE]"));
        assert.equal(text, await coldText(ref, ref.chatIds(a), 40));
        assert.equal(rb.choices[0].message.content, await coldText(ref, ref.chatIds(b), 8));
      });

      await t.step("a queued stream gets keep-alive comments", async () => {
        const long = client.completions.create({ model: id, prompt: "x", max_tokens: 400 });
        await new Promise((r) => setTimeout(r, 20));
        const sse = await fetch(`${server.url}/v1/completions`, {
          method: "POST",
          signal: limit(),
          headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
          body: JSON.stringify({ prompt: "y", max_tokens: 2, stream: true }),
        }).then((r) => r.text());
        await long;
        assert.match(sse, /^: keep-alive$/m);
        assert.ok(sse.trimEnd().endsWith("data: [DONE]"));
      });

      await t.step("metrics: Prometheus text with the counters", async () => {
        const r = await fetch(`${server.url}/metrics`, {
          signal: limit(),
          headers: { authorization: `Bearer ${KEY}` },
        });
        assert.match(r.headers.get("content-type") ?? "", /^text\/plain; version=0\.0\.4/);
        const text = await r.text();
        const value = (name: string) =>
          Number(new RegExp(`^sluice_${name} (\\S+)$`, "m").exec(text)?.[1]);
        assert.equal(value("generated_tokens_total"), server.live.totals.generatedTokens);
        assert.ok(value("prompt_cached_tokens_total") > 0);
        assert.ok(value("expert_hits_total") > 0);
        assert.ok(value("expert_cache_records") > 0);
        assert.ok(value("expert_cache_records") >= value("expert_cache_lent_records"));
        assert.equal(value("requests_cancelled_total"), 2);
        assert.equal(value("queue_depth"), 0);
        assert.ok(value("resident_memory_bytes") > 0);
        assert.match(text, /^# TYPE sluice_read_bytes_total counter$/m);
        assert.match(text, /^sluice_io_wait_seconds_total /m);
      });
      assert.ok(logs.some((l) => l.includes("cancelled")), logs.join("\n"));
    } finally {
      await server.close();
      session.close();
      ref.close();
    }
  },
});

Deno.test("serve: the command prints its address, answers, and stops on SIGTERM", async () => {
  const model = await demoModelPath(true);
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", MOD, "serve", "--model", model, "--port", "0", "--ctx", "256"],
    stdin: "null",
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const watchdog = setTimeout(() => child.kill("SIGKILL"), 60_000);
  const lines = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
  let err = "", url: string | undefined;
  while (!url) {
    const { value, done } = await lines.read();
    if (done) break;
    err += value;
    url = /listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(err)?.[1];
  }
  assert.ok(url, err);
  const health = await (await fetch(`${url}/health`, { signal: limit() })).json();
  assert.equal(health.status, "ok");
  child.kill("SIGTERM");
  while (!(await lines.read()).done);
  assert.equal((await child.status).code, 0);
  clearTimeout(watchdog);
});

Deno.test({
  name: "serve: greedy completions of stories260k-moe equal `mod.ts generate`",
  ignore: sharedMissing() !== null,
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const model = await packedFixture("stories260k-moe");
    const session = await Session.open(model, RUN);
    const server = startServer(session, { port: 0, log: () => {} });
    const client = new OpenAI({ apiKey: "none", baseURL: `${server.url}/v1`, maxRetries: 0 });
    try {
      for (const prompt of ["Once upon a time", "The little dog"]) {
        const r = await client.completions.create({
          model: "stories260k-moe",
          prompt,
          max_tokens: 30,
          temperature: 0,
        });
        const cli = await generateCli(model, ["--prompt", prompt, "-n", "30"]);
        assert.equal(r.choices[0].text, cli.text, prompt);
      }
      // No chat template: the built-in ChatML one, with a notice, and its end of turn stops.
      assert.match(session.chatTemplate.notice ?? "", /no chat template/);
      const messages = [{ role: "user" as const, content: "Tell me about the dog." }];
      const prompt = session.chatPrompt(messages);
      assert.equal(
        prompt,
        "<s><|im_start|>user\nTell me about the dog.</s>\n<|im_start|>assistant\n",
      );
      const r = await client.chat.completions.create({
        model: "stories260k-moe",
        messages,
        max_tokens: 30,
        temperature: 0,
      });
      const ref = await generateCli(model, ["--chat", "--prompt", messages[0].content, "-n", "30"]);
      assert.equal(r.choices[0].message.content, ref.text.split("<|im_start|>")[0]);
    } finally {
      await server.close();
      session.close();
    }
  },
});
