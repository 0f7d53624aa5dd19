/**
 * Prompt prefixes per user and per conversation (issue 25 item 3): a client with another API key
 * probing digit by digit learns nothing of a PIN that another client sent (its `cached_tokens`
 * are the same whatever the PIN); a user's prefix survives other users' requests; two
 * conversations of one user each continue their own prefix; and output through a restored
 * prefix is the cold-cache output.
 */
import assert from "node:assert/strict";
import { Session } from "../engine/session.ts";
import { demoModelPath } from "../tools/demo_model.ts";
import { startServer } from "../tools/serve/server.ts";
import { parseCommandArgs } from "../tools/cli/args.ts";
import { existsSync } from "node:fs";
import { PrefixCache } from "../engine/prefix_cache.ts";
import { coldText, fixtureDir, packedFixture } from "./fixtures.ts";

const RUN = { quiet: true, ctx: 256, threads: 1 };

/** A text completion of `key`; its text and cached prompt tokens. */
async function complete(
  url: string,
  key: string,
  prompt: string | number[],
  maxTokens = 1,
): Promise<{ text: string; cached: number; prompt: number }> {
  const r = await fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0 }),
    signal: AbortSignal.timeout(60_000),
  });
  const b = await r.json();
  assert.equal(r.status, 200, JSON.stringify(b));
  return {
    text: b.choices[0].text,
    cached: b.usage.prompt_tokens_details.cached_tokens,
    prompt: b.usage.prompt_tokens,
  };
}

const note = (pin: string) => `Account note: the PIN is ${pin}. Keep it safe.`;

/**
 * The attack: before each probe, alice sends her note; bob, with his own key, sends the note cut
 * after a guessed digit (and one more token, as the last prompt token always runs) and keeps the digit with the most cached tokens. Returns bob's guess,
 * every cached_tokens he saw, and alice's.
 */
async function attack(session: Session, pin: string) {
  const server = startServer(session, { port: 0, log: () => {}, apiKey: ["alice", "bob"] });
  try {
    // Each key is let in (either header), any other is not.
    const models = (headers: Record<string, string>) =>
      fetch(`${server.url}/v1/models`, { headers }).then(async (
        r,
      ) => (await r.body?.cancel(), r.status));
    assert.equal(await models({ authorization: "Bearer alice" }), 200);
    assert.equal(await models({ "x-api-key": "bob" }), 200);
    assert.equal(await models({ authorization: "Bearer mallory" }), 401);
    assert.equal(await models({ authorization: "Bearer alice,bob" }), 401);
    let guess = "";
    const seen: number[] = [];
    const alice: { cached: number; prompt: number }[] = [];
    for (let pos = 0; pos < pin.length; pos++) {
      let best = -1, bestDigit = "0";
      for (let d = 0; d <= 9; d++) {
        alice.push(await complete(server.url, "alice", note(pin)));
        const { cached } = await complete(
          server.url,
          "bob",
          `Account note: the PIN is ${guess}${d}?`,
        );
        seen.push(cached);
        if (cached > best) [best, bestDigit] = [cached, String(d)];
      }
      guess += bestDigit;
    }
    return { guess, seen, alice };
  } finally {
    await server.close();
  }
}

Deno.test({
  name: "prefix cache: another key probing digit by digit learns nothing of a PIN",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const session = await Session.open(await demoModelPath(true), RUN);
    try {
      const a = await attack(session, "472");
      const b = await attack(session, "915");
      // Bob's view is a function of his own requests only.
      assert.deepEqual(a.seen, b.seen, `bob guessed ${a.guess} for 472 and ${b.guess} for 915`);
      assert.notEqual(a.guess, "472");
      // Alice's own prefix survives bob's probes: from her second request on, all but the last
      // prompt token (which always runs) come from the cache.
      for (const run of [a, b]) {
        assert.equal(run.alice[0].cached, 0);
        for (const r of run.alice.slice(1)) assert.equal(r.cached, r.prompt - 1);
      }
    } finally {
      session.close();
    }
  },
});

Deno.test({
  name: "prefix cache: two conversations of one user each continue their own prefix, cold output",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const model = await demoModelPath(true);
    const session = await Session.open(model, RUN);
    const ref = await Session.open(model, RUN);
    const more = (text: string) => ref.tokenizer.encode(text, { addSpecial: false });
    /**
     * Three alternating turns of two stories (prompts as ids, each the last prompt, the answer
     * and " and"); each turn's cached tokens, text, prompt, and the length of the last one.
     */
    const converse = async (cacheBytes: number) => {
      const server = startServer(session, { port: 0, log: () => {}, cacheBytes });
      const talks = ["Once upon a time a fox", "The old ship sailed north"].map((t) =>
        ref.tokenize(t)
      );
      const turns: {
        cached: number;
        prompt: number;
        text: string;
        asked: number[];
        before: number;
      }[] = [];
      try {
        for (let turn = 0; turn < 3; turn++) {
          for (let c = 0; c < talks.length; c++) {
            const r = await complete(server.url, "", talks[c], 6);
            turns.push({ ...r, asked: talks[c], before: turns.at(-2)?.prompt ?? 0 });
            talks[c] = [...talks[c], ...more(r.text + " and")];
          }
        }
        const metrics = await (await fetch(`${server.url}/metrics`)).text();
        const saved = Number(/^sluice_saved_prefixes (\d+)$/m.exec(metrics)?.[1]);
        // The other story waits as a saved prefix (none without a budget).
        assert.ok(cacheBytes > 0 ? saved >= 1 : saved === 0, metrics);
      } finally {
        await server.close();
      }
      return turns;
    };
    try {
      const kept = await converse(2 ** 20);
      for (const t of kept) {
        assert.equal(t.text, await coldText(ref, t.asked, 6));
      }
      // From the second turn on, each conversation resumes its own prefix (at least its last
      // prompt), though the other conversation ran in between.
      for (const t of kept.slice(2)) assert.ok(t.cached >= t.before, JSON.stringify(t));
      // Without saved prefixes only the live cache is reused, and it is always the other story's.
      const live = await converse(0);
      assert.deepEqual(live.map((t) => t.text), kept.map((t) => t.text));
      for (const t of live.slice(2)) assert.ok(t.cached < t.before, JSON.stringify(t));
    } finally {
      session.close();
      ref.close();
    }
  },
});

Deno.test("serve flags: --api-key may be given once per user", () => {
  const a = parseCommandArgs("serve", ["--api-key", "k1", "--api-key=k2"], {
    "api-key": { type: "string", multiple: true },
  });
  assert.deepEqual(a.all("api-key"), ["k1", "k2"]);
});

/**
 * Owner a's story, owner b's, then a's next turn (a's last prompt, its answer, more text) and a
 * retry of a's first prompt with another ending: through the PrefixCache each equals a cold run,
 * and a's turns reuse a's prefix although b ran in between. Returns the cached counts.
 */
async function ownersTakeTurns(path: string): Promise<number[]> {
  const session = await Session.open(path, { quiet: true, ctx: 96 });
  const ref = await Session.open(path, { quiet: true, ctx: 96 });
  const cache = new PrefixCache(session, { ownerBytes: 2 ** 24 });
  const cached: number[] = [];
  const run = async (owner: string, ids: number[]) => {
    cache.prepare(owner, ids);
    const got: number[] = [];
    for await (const t of session.generate(ids, { maxTokens: 5, temperature: 0 })) got.push(t.id);
    cache.finish();
    cached.push(session.timings.cachedTokens);
    ref.resetCache();
    const want: number[] = [];
    for await (const t of ref.generate(ids, { maxTokens: 5, temperature: 0 })) want.push(t.id);
    assert.deepEqual(got, want, `${owner}: ${ids.length} prompt tokens`);
    return got;
  };
  try {
    const a = session.tokenize("Once upon a time there was a");
    const answer = await run("a", a);
    await run("b", session.tokenize("The little dog said"));
    await run("a", [...a, ...answer, ...session.tokenize(" and the sun").slice(1)]);
    await run("a", [...a.slice(0, -2), ...session.tokenize(" Tom").slice(1)]);
    return cached;
  } finally {
    session.close();
    ref.close();
  }
}

Deno.test({
  name: "PrefixCache: owners' turns equal cold runs, a restored prefix resumes (attention)",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const [a, b, next, retry] = await ownersTakeTurns(await demoModelPath(true));
    assert.deepEqual([a, b], [0, 0], "b never continues a's cache");
    assert.ok(next > 0 && retry > 0, `${next} and ${retry} cached`);
  },
});

Deno.test({
  name:
    "a sliding window's wrapped ring rewinds only over its spare rows (Gemma 4, live and saved)",
  ignore: !existsSync(fixtureDir("tiny-gemma4-moe")),
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    // tiny-gemma4-moe's sliding layers keep a ring of window 32 + chunk 16 − 1 = 47 rows; the
    // prompts run far past it, so a rewind of more than 16 positions must recompute everything.
    const path = await packedFixture("tiny-gemma4-moe");
    const opts = { quiet: true, ctx: 320, prefillChunk: 16 };
    const session = await Session.open(path, opts);
    const ref = await Session.open(path, opts);
    const cache = new PrefixCache(session, { ownerBytes: 2 ** 26 });
    const logprobs = async (s: Session, ids: number[]) => {
      const out: unknown[] = [];
      for await (const t of s.generate(ids, { maxTokens: 3, temperature: 0, logprobs: 3 })) {
        out.push(t.logprob);
      }
      return out;
    };
    try {
      const story = session.tokenize(
        "The cat sat on the mat and looked at the moon for a long while. ".repeat(8),
      );
      const cached: Record<string, number> = {};
      const check = async (what: string, owner: string, ids: number[]) => {
        cache.prepare(owner, ids);
        const got = await logprobs(session, ids);
        cache.finish();
        cached[what] = session.timings.cachedTokens;
        ref.resetCache();
        assert.deepEqual(got, await logprobs(ref, ids), what);
      };
      const tail = session.tokenize(" Tom went home").slice(1);
      await check("first", "a", story);
      // Live cache: 13 positions back (the answer's 3 and 10 of the prompt) are within reach.
      await check("near", "a", [...story.slice(0, -10), ...tail]);
      // 40 back is not: it must run cold, not reuse a ring whose rows were overwritten.
      await check("far", "a", [...story.slice(0, -40), ...tail]);
      // b displaces a; a's saved prefix is written back, whole and rewound.
      await check("b", "b", session.tokenize("The little dog said"));
      await check("saved near", "a", [...story.slice(0, -40), ...tail, ...tail]);
      await check("b again", "b", session.tokenize("The little dog said"));
      await check("saved far", "a", [...story.slice(0, -80), ...tail]);
      assert.ok(cached.near > 32, `near: ${cached.near}`);
      assert.equal(cached.far, 0);
      assert.ok(cached["saved near"] > 32, `saved near: ${cached["saved near"]}`);
      assert.equal(cached["saved far"], 0);
    } finally {
      session.close();
      ref.close();
    }
  },
});

Deno.test({
  name: "PrefixCache: a recurrent model resumes only a prefix its prompt extends whole (KDA)",
  ignore: !existsSync(fixtureDir("tiny-kimi-linear")),
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const [a, b, next, retry] = await ownersTakeTurns(await packedFixture("tiny-kimi-linear"));
    assert.deepEqual([a, b], [0, 0]);
    assert.ok(next > 0, `${next} cached`);
    // The retry cuts a's prompt short: a recurrent state cannot rewind, so it runs cold.
    assert.equal(retry, 0);
  },
});
