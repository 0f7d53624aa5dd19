/**
 * Continuous batching (engine/batch.ts) on every family: sequences that share passes, joining
 * while others decode so their prompt chunks interleave with decode rows, each get the tokens
 * they get alone (greedy, and sampled with their own seed), and passes did hold several sequences.
 * Also the planner's accounting of the sequences' state.
 *
 * @module
 */
import assert from "node:assert/strict";
import { Batch } from "../engine/batch.ts";
import { planInput, planMemory } from "../engine/planner.ts";
import { openContainer } from "../engine/container.ts";
import type { GenerateOptions } from "../engine/session.ts";
import { Session } from "../engine/session.ts";
import { hasFixture, packedFixture, runSluice } from "./fixtures.ts";

/** Three sequences; a small prefill chunk makes prompts run over several passes beside decode rows. */
const BATCH_OPTS = { quiet: true, ctx: 64, prefillChunk: 6, parallel: 3, hotList: false };

/** One fixture of each family (llama, mixtral, qwen3_moe, glm4_moe, gpt_oss, deepseek_v3/kimi_k2,
 * kimi_linear, kimi_k3, qwen3_5_moe, qwen3_next, gemma4, minimax_m2, deepseek_v4, glm_moe_dsa). */
const FAMILIES = [
  "stories260k",
  "stories260k-moe64",
  "stories260k-qwen3moe",
  "tiny-glm4-moe",
  "tiny-gpt-oss",
  "tiny-deepseek-v3",
  "tiny-kimi-linear",
  "tiny-kimi-k3",
  "tiny-qwen3.5-moe",
  "tiny-qwen3-next",
  "tiny-gemma4-moe",
  "tiny-minimax-m2",
  "tiny-deepseek-v4",
  "tiny-glm5",
];

/**
 * Three requests: a greedy one and two sampled ones, prompts of different lengths (ids taken
 * modulo the vocabulary, which is 256 for the smallest fixture).
 */
const REQUESTS: { prompt: number[]; opts: GenerateOptions }[] = [
  { prompt: [1, 403, 407, 261, 378], opts: { maxTokens: 10 } },
  {
    prompt: [1, 378, 261, 407, 403, 299, 304, 277, 375, 466, 50, 163, 473],
    opts: { maxTokens: 9, temperature: 0.9, topK: 40, seed: 7 },
  },
  { prompt: [1, 299, 460], opts: { maxTokens: 8, temperature: 1.1, topP: 0.9, seed: 12345 } },
];

/** Ids of `gen` to its end. */
async function ids(gen: AsyncGenerator<{ id: number }>): Promise<number[]> {
  const out: number[] = [];
  for await (const t of gen) out.push(t.id);
  return out;
}

for (const name of FAMILIES) {
  Deno.test({
    name: `batch: ${name}: each sequence's tokens are its tokens alone, whatever shares its passes`,
    ignore: !hasFixture(name),
    fn: async () => {
      const session = await Session.open(await packedFixture(name), BATCH_OPTS);
      try {
        const vocab = session.model.cfg.vocabSize;
        const requests = REQUESTS.map((r) => ({ ...r, prompt: r.prompt.map((id) => id % vocab) }));
        const alone: number[][] = [];
        for (const r of requests) {
          session.resetCache();
          alone.push(await ids(session.generate(r.prompt, { ...r.opts, ignoreEos: true })));
        }
        const batch = new Batch(session);
        const got: number[][] = [[], [], []];
        const gens = requests.map((r) => {
          const seq = batch.reserve()!;
          return batch.generate(seq, r.prompt, { ...r.opts, ignoreEos: true });
        });
        // The second joins after the first's second token, the third after the second's first.
        const run = async (i: number, next?: () => void, after = 0) => {
          for await (const t of gens[i]) {
            got[i].push(t.id);
            if (got[i].length === after) next?.();
          }
        };
        let third: Promise<void> = Promise.resolve();
        let second: Promise<void> = Promise.resolve();
        const first = run(0, () => {
          second = run(1, () => third = run(2), 1);
        }, 2);
        await first;
        await second;
        await third;
        assert.deepEqual(got, alone);
        assert.ok(
          batch.totals.sequences > batch.totals.passes,
          `no pass held two sequences (${batch.totals.passes} passes)`,
        );
        assert.equal(batch.active, 0);
      } finally {
        session.close();
      }
    },
  });
}

Deno.test({
  name: "batch: the plan holds each sequence's state, and parallel beyond the pass rows is refused",
  ignore: !hasFixture("stories260k-moe"),
  fn: async () => {
    const input = planInput(openContainer(await packedFixture("stories260k-moe")));
    const one = planMemory(input, { ctx: 256, maxBatch: 16 });
    const four = planMemory(input, { ctx: 256, maxBatch: 16, sequences: 4 });
    assert.equal(four.sequences, 4);
    assert.equal(four.kvBytes, 4 * one.kvBytes);
    assert.equal(four.fixedBytes - one.fixedBytes, 3 * one.kvBytes);
    assert.throws(
      () => planMemory(input, { ctx: 256, maxBatch: 16, sequences: 17 }),
      /17 parallel sequences: expected 1 to 16/,
    );
  },
});

Deno.test({
  name: "batch: plan --parallel shows the sequences' state; auto picks from the budget",
  ignore: !hasFixture("stories260k-moe"),
  fn: async () => {
    const path = await packedFixture("stories260k-moe");
    const plan = async (...args: string[]) => {
      const r = await runSluice(["plan", "-m", path, "-c", "256", "--json", ...args]);
      assert.equal(r.code, 0, r.stderr);
      return JSON.parse(r.stdout);
    };
    const [one, three, auto] = [
      await plan(),
      await plan("-np", "3"),
      await plan("--parallel", "auto"),
    ];
    assert.equal(three.sequences, 3);
    assert.equal(three.kvBytes, 3 * one.kvBytes);
    assert.ok(auto.sequences >= 1 && auto.sequences <= 4, `auto: ${auto.sequences}`);
    const bad = await runSluice(["plan", "-m", path, "--parallel", "0"]);
    assert.notEqual(bad.code, 0);
    assert.match(bad.stderr, /--parallel must be a positive integer/);
  },
});

Deno.test({
  name: "batch: a cancelled or refused generation leaves the others running to their own tokens",
  ignore: !hasFixture("stories260k-moe"),
  fn: async () => {
    const session = await Session.open(await packedFixture("stories260k-moe"), BATCH_OPTS);
    try {
      const { prompt, opts } = REQUESTS[1];
      const alone = await ids(session.generate(prompt, { ...opts, ignoreEos: true }));
      const batch = new Batch(session);
      const [a, b, c] = [batch.reserve()!, batch.reserve()!, batch.reserve()!];
      assert.equal(batch.reserve(), null, "three sequences, all taken");
      const stop = new AbortController();
      const cancelled: number[] = [];
      const kept = ids(batch.generate(a, prompt, { ...opts, ignoreEos: true }));
      const gone = (async () => {
        for await (const t of batch.generate(b, [1, 403], { maxTokens: 20, signal: stop.signal })) {
          cancelled.push(t.id);
          if (cancelled.length === 2) stop.abort();
        }
      })();
      const refused = ids(batch.generate(c, new Array(64).fill(403))).then(
        () => assert.fail("a prompt filling the context must be refused"),
        (e) => assert.match(String(e), /context holds 64/),
      );
      assert.deepEqual(await kept, alone);
      await gone;
      await refused;
      assert.equal(cancelled.length, 2);
      assert.equal(batch.active, 0);
      [a, b, c].forEach((seq) => batch.release(seq));
      assert.deepEqual(batch.free, [0, 1, 2]);
    } finally {
      session.close();
    }
  },
});
