/**
 * `serve` with several requests at once (continuous batching, tools/serve/batcher.ts): clients
 * at the same time each get the answer they get alone (greedy and seeded), passes did hold
 * several of them (`/metrics`), the queue beyond the running requests still answers 429, and
 * each user's next turn continues its own cache.
 */
import assert from "node:assert/strict";
import { Session } from "../engine/session.ts";
import { startServer } from "../tools/serve/server.ts";
import { hasFixture, packedFixture } from "./fixtures.ts";

const NAME = "stories260k-moe";
const KEYS = ["key-a", "key-b", "key-c"];

/** A completion request's body: `prompt`, `max_tokens`, and sampling when `seed` is given. */
function body(prompt: string, seed?: number, maxTokens = 16): string {
  return JSON.stringify({
    model: "stories260k-moe",
    prompt,
    max_tokens: maxTokens,
    ignore_eos: true,
    ...(seed === undefined ? { temperature: 0 } : { temperature: 0.9, seed }),
  });
}

const REQUESTS = [
  { prompt: "Once upon a time", seed: undefined },
  { prompt: "The little dog ran to the park and", seed: 7 },
  { prompt: "Lily", seed: 99 },
];

Deno.test({
  name: "serve --parallel: concurrent requests get their answers alone, in shared passes",
  ignore: !hasFixture(NAME),
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const path = await packedFixture(NAME);
    const session = await Session.open(path, {
      quiet: true,
      ctx: 256,
      parallel: 3,
      prefillChunk: 8,
      threads: 1,
    });
    const server = startServer(session, { port: 0, apiKey: KEYS, queueSize: 1, log: () => {} });
    const call = async (key: string, b: string) => {
      const r = await fetch(`${server.url}/v1/completions`, {
        method: "POST",
        body: b,
        headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
        signal: AbortSignal.timeout(60_000),
      });
      return { status: r.status, body: await r.json() };
    };
    try {
      const alone = [];
      for (const [i, r] of REQUESTS.entries()) {
        alone.push((await call(KEYS[i], body(r.prompt, r.seed))).body.choices[0].text);
      }
      const passes = server.live.prometheus();
      const at = (text: string, name: string) =>
        Number(text.match(new RegExp(`^sluice_${name} (\\S+)$`, "m"))?.[1]);
      assert.equal(at(passes, "parallel"), 3);
      const together = await Promise.all(
        REQUESTS.map((r, i) => call(KEYS[i], body(r.prompt + " again", r.seed))),
      );
      const againAlone = [];
      for (const [i, r] of REQUESTS.entries()) {
        againAlone.push((await call(KEYS[i], body(r.prompt + " again", r.seed))).body);
      }
      assert.deepEqual(
        together.map((r) => r.body.choices[0].text),
        againAlone.map((b) => b.choices[0].text),
      );
      assert.ok(alone.every((t) => t.length > 0));
      // Each user's second identical request continues its own cache.
      for (const b of againAlone) {
        assert.ok(b.usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(b.usage));
      }
      const m = server.live.prometheus();
      assert.ok(at(m, "batch_size_mean") > 1, `batch_size_mean ${at(m, "batch_size_mean")}`);
      // Three running and one waiting fill it: a fifth is refused.
      const five = await Promise.all(
        [0, 1, 2, 0, 1].map((k, i) => call(KEYS[k], body(`Tom ${i}`, i, 200))),
      );
      assert.deepEqual(five.map((r) => r.status).sort(), [200, 200, 200, 200, 429]);
    } finally {
      await server.close();
      session.close();
    }
  },
});
