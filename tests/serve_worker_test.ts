/**
 * The worker server (tools/serve/front.ts, what `mod.ts serve` runs; issue 25 item 2): the front
 * answers /health, /metrics, the pages, a wrong key and a full forward queue while the engine
 * worker's thread is provably inside a forward pass (held there by tests/held_back_worker.ts, so
 * the test is an ordering, not a timing); a cancelled stream frees the engine; a crashed engine
 * gives 500 or an error event, then 503, and a log line, never a hung client; bodies are bounded
 * in size and time; the openai and Anthropic clients get the in-process answers.
 */
import assert from "node:assert/strict";
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import { Model } from "../engine/model.ts";
import { Session } from "../engine/session.ts";
import { demoModelPath } from "../tools/demo_model.ts";
import { startWorkerServer, type WorkerServeOptions } from "../tools/serve/front.ts";
import { coldText } from "./fixtures.ts";

const KEY = "worker-key";
const RUN = { quiet: true, ctx: 2048, threads: 1 };
const HELD = new URL("./held_back_worker.ts", import.meta.url);
/** Every request here gives up after this long, so a hang fails instead of stalling. */
const limit = () => AbortSignal.timeout(60_000);
const JSON_TYPE = { "content-type": "application/json" };
const auth = { authorization: `Bearer ${KEY}` };

async function start(opts: WorkerServeOptions = {}) {
  return await startWorkerServer({ path: await demoModelPath(true), options: RUN }, {
    port: 0,
    log: () => {},
    ...opts,
  });
}

async function until(what: string, test: () => boolean | Promise<boolean>): Promise<void> {
  const end = Date.now() + 60_000;
  while (!(await test())) {
    assert.ok(Date.now() < end, `${what}: not within 60 s`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

async function getJson(url: string, headers: Record<string, string> = {}) {
  const r = await fetch(url, { headers, signal: limit() });
  return { status: r.status, body: await r.json() };
}

/** The value of one Prometheus metric. */
function metric(text: string, name: string): number {
  return Number(new RegExp(`^sluice_${name} (\\S+)$`, "m").exec(text)?.[1]);
}

async function metrics(url: string): Promise<string> {
  return await (await fetch(`${url}/metrics`, { headers: auth, signal: limit() })).text();
}

Deno.test({
  name: "serve worker: the front answers while the engine is inside a long prefill",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const hold = new SharedArrayBuffer(8);
    const words = new Int32Array(hold);
    const server = await start({
      apiKey: KEY,
      queueSize: 1,
      maxForwards: 2,
      keepAliveMs: 5,
      worker: { url: HELD, data: { hold } },
    });
    try {
      Atomics.store(words, 0, 1);
      let settled = false;
      const prompt = "the fox ran over a hill and ".repeat(130);
      const long = fetch(`${server.url}/v1/completions`, {
        method: "POST",
        headers: { ...JSON_TYPE, ...auth },
        body: JSON.stringify({ prompt, max_tokens: 2 }),
        signal: limit(),
      }).then(async (r) => ({ status: r.status, body: await r.json() }))
        .finally(() => settled = true);
      await until("the engine enters the prefill", () => Atomics.load(words, 1) === 1);

      // From here the engine's thread is blocked inside the forward pass until released.
      await until("/health shows the request", async () => {
        const h = await getJson(`${server.url}/health`);
        assert.equal(h.status, 200);
        assert.equal(h.body.status, "ok");
        return h.body.busy === true;
      });
      const state = await getJson(`${server.url}/ui/state`);
      assert.equal(state.body.current.phase, "prefill");
      assert.ok(state.body.current.promptTokens > 1500, JSON.stringify(state.body.current));
      // The counters as of the last yield: the engine has not yielded since the request came.
      assert.equal(metric(await metrics(server.url), "requests_total"), 0);
      const ui = await fetch(`${server.url}/ui`, { signal: limit() });
      assert.match(await ui.text(), /<html/i);
      const noKey = await getJson(`${server.url}/v1/models`);
      assert.equal(noKey.status, 401);
      // A second request is passed on (and waits); a third finds the forward queue full.
      const queued = fetch(`${server.url}/v1/completions`, {
        method: "POST",
        headers: { ...JSON_TYPE, ...auth },
        body: JSON.stringify({ prompt: "a fox", max_tokens: 3, stream: true }),
        signal: limit(),
      }).then((r) => r.text());
      await until("the second request is passed on", async () => {
        return (await getJson(`${server.url}/health`)).body.forwarded === 2;
      });
      const full = await fetch(`${server.url}/v1/completions`, {
        method: "POST",
        headers: { ...JSON_TYPE, ...auth },
        body: JSON.stringify({ prompt: "b", max_tokens: 1 }),
        signal: limit(),
      });
      assert.equal(full.status, 429);
      assert.equal((await full.json()).error.code, "queue_full");
      assert.equal(full.headers.get("retry-after"), "1");
      assert.equal(Atomics.load(words, 1), 1, "the engine was held all along");
      assert.equal(settled, false, "the prefill had not finished");

      Atomics.store(words, 0, 0);
      Atomics.notify(words, 0);
      const answer = await long;
      assert.equal(answer.status, 200);
      assert.ok(answer.body.usage.prompt_tokens > 1500, JSON.stringify(answer.body.usage));
      // It waited in the engine's queue behind the rest of the prefill, with keep-alive comments.
      const sse = await queued;
      assert.match(sse, /^: keep-alive$/m);
      assert.ok(sse.trimEnd().endsWith("data: [DONE]"));
      const after = await metrics(server.url);
      assert.equal(metric(after, "requests_total"), 2);
      // The 401 and the 429 the front answered count as errors too.
      assert.equal(metric(after, "request_errors_total"), 2);
    } finally {
      Atomics.store(words, 0, 0);
      Atomics.notify(words, 0);
      await server.close();
    }
  },
});

Deno.test({
  name: "serve worker: a cancelled stream frees the engine for the next request",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    // No queue: a request that comes while the engine is busy gets 429.
    const server = await start({ apiKey: KEY, queueSize: 0 });
    try {
      const r = await fetch(`${server.url}/v1/completions`, {
        method: "POST",
        headers: { ...JSON_TYPE, ...auth },
        body: JSON.stringify({ prompt: "x", max_tokens: 2000, ignore_eos: true, stream: true }),
        signal: limit(),
      });
      const reader = r.body!.pipeThrough(new TextDecoderStream()).getReader();
      let sse = "";
      while ((sse.match(/^data: \{/gm) ?? []).length < 3) sse += (await reader.read()).value;
      await reader.cancel();
      await until("the engine sees the cancel", async () => {
        return metric(await metrics(server.url), "requests_cancelled_total") === 1;
      });
      const text = await metrics(server.url);
      assert.equal(metric(text, "busy"), 0);
      assert.ok(metric(text, "generated_tokens_total") < 2000, text);
      const next = await fetch(`${server.url}/v1/completions`, {
        method: "POST",
        headers: { ...JSON_TYPE, ...auth },
        body: JSON.stringify({ prompt: "y", max_tokens: 2 }),
        signal: limit(),
      });
      assert.equal(next.status, 200, await next.clone().text());
      assert.equal((await next.json()).usage.completion_tokens, 2);
    } finally {
      await server.close();
    }
  },
});

Deno.test({
  name: "serve worker: a crashed engine answers 500 or an error event, then 503, and logs it",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    // Deno also prints the worker's uncaught error on stderr ("in worker \"sluice engine\"").
    for (const stream of [false, true]) {
      const logs: string[] = [];
      const server = await start({
        log: (l) => logs.push(l),
        worker: { url: HELD, data: { crash: true } },
      });
      try {
        const path = stream ? "/v1/chat/completions" : "/v1/completions";
        const r = await fetch(`${server.url}${path}`, {
          method: "POST",
          headers: JSON_TYPE,
          body: stream
            ? JSON.stringify({
              messages: [{ role: "user", content: "hi" }],
              max_tokens: 500,
              ignore_eos: true,
              stream,
            })
            : JSON.stringify({ prompt: "x", max_tokens: 500, ignore_eos: true }),
          signal: limit(),
        });
        if (stream) {
          assert.equal(r.status, 200);
          const sse = await r.text();
          assert.ok(!sse.includes("[DONE]"), "a broken stream never claims to be complete");
          const last = sse.trimEnd().split("\n").at(-1)!;
          assert.equal(JSON.parse(last.slice(6)).error.code, "engine_failed", sse.slice(-300));
        } else {
          assert.equal(r.status, 500);
          const body = await r.json();
          assert.equal(body.error.code, "engine_failed");
          assert.match(body.error.message, /simulated engine crash/);
        }
        assert.match((await server.failed).message, /simulated engine crash/);
        const health = await getJson(`${server.url}/health`);
        assert.equal(health.status, 503);
        assert.equal(health.body.status, "error");
        const later = await fetch(`${server.url}/v1/models`, { signal: limit() });
        assert.equal(later.status, 503);
        assert.equal((await later.json()).error.code, "engine_failed");
        assert.ok(
          logs.some((l) => /engine worker failed: .*simulated engine crash/.test(l)),
          logs.join("\n"),
        );
      } finally {
        await server.close();
      }
    }
  },
});

Deno.test({
  name: "serve worker: a pool thread and streamed experts inside the worker give the same tokens",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const path = await demoModelPath(true);
    const probe = await Model.open(path, RUN);
    const floor = probe.plan.floor;
    probe.close();
    const ref = await Session.open(path, RUN);
    // Two threads: the pool's worker is a worker of the engine's worker. At the floor the
    // experts stream from the container through the O_DIRECT reader (FFI, opened in the worker).
    const server = await startWorkerServer({
      path,
      options: { ...RUN, threads: 2, budget: floor, io: "direct" },
    }, { port: 0, log: () => {} });
    try {
      const prompt = "Once upon a time there was";
      const r = await fetch(`${server.url}/v1/completions`, {
        method: "POST",
        headers: JSON_TYPE,
        body: JSON.stringify({ prompt, max_tokens: 24, temperature: 0 }),
        signal: limit(),
      });
      assert.equal((await r.json()).choices[0].text, await coldText(ref, ref.tokenize(prompt), 24));
      const text = await (await fetch(`${server.url}/metrics`, { signal: limit() })).text();
      assert.ok(metric(text, "expert_misses_total") > 0, text);
      assert.ok(metric(text, "read_bytes_total") > 0, text);
    } finally {
      await server.close();
      ref.close();
    }
  },
});

Deno.test({
  name: "serve worker: the status posted inside a forward pass leaves the prompt cache whole",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    // Each request posts a status from its first forward pass; each prompt extends the last
    // one, so each reuses all the cache holds (the previous prompt and its answer).
    const server = await start();
    try {
      let prompt = "Once upon a time there was a fox.";
      let held = 0;
      for (let turn = 0; turn < 3; turn++) {
        const r = await fetch(`${server.url}/v1/completions`, {
          method: "POST",
          headers: JSON_TYPE,
          body: JSON.stringify({ prompt, max_tokens: 8, temperature: 0 }),
          signal: limit(),
        });
        const body = await r.json();
        const cached = body.usage.prompt_tokens_details.cached_tokens;
        if (turn > 0) assert.ok(cached >= held, `turn ${turn}: ${cached} cached, ${held} held`);
        held = body.usage.prompt_tokens;
        prompt += body.choices[0].text + " And then the fox ran home.";
      }
    } finally {
      await server.close();
    }
  },
});

Deno.test({
  name: "serve worker: a model that cannot be opened is an error naming it",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const dir = await Deno.makeTempDir();
    try {
      await assert.rejects(
        startWorkerServer({ path: `${dir}/none.sluice`, options: RUN }, { port: 0 }),
        (e: Error) => e.message.includes("none.sluice"),
      );
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});

Deno.test({
  name: "serve worker: the openai and Anthropic clients, bounded bodies",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async (t) => {
    const ref = await Session.open(await demoModelPath(true), RUN);
    const server = await start({ apiKey: KEY, maxBodyBytes: 64 * 1024, bodyTimeoutMs: 300 });
    try {
      const user = [{ role: "user" as const, content: "Tell me a story about a fox." }];
      await t.step("a streamed openai chat equals the greedy generation", async () => {
        const client = new OpenAI({ apiKey: KEY, baseURL: `${server.url}/v1`, maxRetries: 0 });
        const model = (await client.models.list()).data[0].id;
        const stream = await client.chat.completions.create({
          model,
          messages: user,
          max_tokens: 12,
          temperature: 0,
          stream: true,
        });
        let text = "";
        for await (const c of stream) text += c.choices[0]?.delta.content ?? "";
        assert.equal(text, await coldText(ref, ref.chatIds(user), 12));
      });
      await t.step("an Anthropic message equals the greedy generation", async () => {
        const client = new Anthropic({ apiKey: KEY, baseURL: server.url, maxRetries: 0 });
        const r = await client.messages.create({ model: "m", messages: user, max_tokens: 10 });
        const text = r.content.map((b) => (b.type === "text" ? b.text : "")).join("");
        assert.equal(text, await coldText(ref, ref.chatIds(user), 10));
        const big = await fetch(`${server.url}/v1/messages`, {
          method: "POST",
          headers: { ...JSON_TYPE, "x-api-key": KEY },
          body: JSON.stringify({ messages: user, max_tokens: 1, pad: "x".repeat(70_000) }),
          signal: limit(),
        });
        assert.equal(big.status, 413);
        assert.equal((await big.json()).error.type, "request_too_large");
      });
      await t.step("a body that does not arrive in time gets 408", async () => {
        const body = new ReadableStream<Uint8Array>({
          start: (c) => c.enqueue(new TextEncoder().encode('{"prompt": "a')),
        });
        const r = await fetch(`${server.url}/v1/completions`, {
          method: "POST",
          headers: { ...JSON_TYPE, ...auth },
          body,
          signal: limit(),
        });
        assert.equal(r.status, 408);
        assert.equal((await r.json()).error.code, "body_timeout");
      });
      await t.step("errors of the engine keep their shape", async () => {
        const r = await fetch(`${server.url}/v1/chat/completions`, {
          method: "POST",
          headers: { ...JSON_TYPE, ...auth },
          body: "{not json",
          signal: limit(),
        });
        assert.equal(r.status, 400);
        assert.equal((await r.json()).error.code, "invalid_json");
      });
    } finally {
      await server.close();
      ref.close();
    }
  },
});

Deno.test({
  name: "serve worker: a client that goes away inside a prompt chunk stops it at the next layer",
  sanitizeResources: false,
  fn: async () => {
    const hold = new SharedArrayBuffer(12);
    const words = new Int32Array(hold);
    const server = await start({ apiKey: KEY, worker: { url: HELD, data: { hold } } });
    try {
      Atomics.store(words, 0, 1);
      const client = new AbortController();
      const prompt = "the fox ran over a hill and ".repeat(130);
      const gone = fetch(`${server.url}/v1/completions`, {
        method: "POST",
        headers: { ...JSON_TYPE, ...auth },
        body: JSON.stringify({ prompt, max_tokens: 2, stream: true }),
        signal: client.signal,
      }).then((r) => r.text()).catch(() => "gone");
      await until("the engine enters the prefill", () => Atomics.load(words, 1) === 1);
      // Held at the first MoE layer of the first prompt chunk (of several: 1500+ tokens).
      const before = Atomics.load(words, 2);
      client.abort();
      assert.equal(await gone, "gone");
      await until("the front flags the cancel", async () => {
        return (await getJson(`${server.url}/health`)).body.cancelled === 1;
      });
      Atomics.store(words, 0, 0);
      Atomics.notify(words, 0);
      await until("the engine lets the request go", async () => {
        return (await getJson(`${server.url}/health`)).body.forwarded === 0;
      });
      // The engine saw the flag at the next MoE layer and stopped the pass after it: of the
      // chunk's four MoE layers, one more ran, and no later chunk.
      assert.equal(Atomics.load(words, 2) - before, 1);
      // The engine serves on, from a consistent cache.
      const after = await fetch(`${server.url}/v1/completions`, {
        method: "POST",
        headers: { ...JSON_TYPE, ...auth },
        body: JSON.stringify({ prompt: "a fox", max_tokens: 3 }),
        signal: limit(),
      });
      assert.equal(after.status, 200);
      await after.body?.cancel();
    } finally {
      Atomics.store(words, 0, 0);
      Atomics.notify(words, 0);
      await server.close();
    }
  },
});
