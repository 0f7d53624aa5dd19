/**
 * A cancel inside a prompt chunk (engine/transformer.ts `PassInterrupted`, engine/batch.ts): the
 * pass ends at the next layer boundary, not at the end of the chunk, and the sequence's state is
 * left consistent: an attention model's prompt cache keeps the chunks before the cancelled one
 * (never a half-run chunk), a recurrent one starts again from position 0, and what runs next equals
 * a cold run. In a batch, the other sequences' tokens stay those they get alone. Tested by the
 * order of events (the abort comes from a MoE observer inside the pass), not by timing.
 *
 * @module
 */
import assert from "node:assert/strict";
import { Batch } from "../engine/batch.ts";
import { Session } from "../engine/session.ts";
import { hasFixture, packedFixture } from "./fixtures.ts";

const PROMPT = [1, 403, 407, 261, 378, 299, 304, 277, 375, 466, 50, 163, 473, 286, 261, 376, 298];
const CHUNK = 6;

/** Ids of `gen` to its end. */
async function ids(gen: AsyncGenerator<{ id: number }>): Promise<number[]> {
  const out: number[] = [];
  for await (const t of gen) out.push(t.id);
  return out;
}

/** Opens fixture `name` with small prompt chunks; every MoE layer a pass runs is logged. */
async function open(name: string, parallel = 1) {
  const session = await Session.open(await packedFixture(name), {
    quiet: true,
    ctx: 64,
    prefillChunk: CHUNK,
    parallel,
    hotList: false,
  });
  const vocab = session.model.cfg.vocabSize;
  const log: { layer: number; nb: number; pos: number }[] = [];
  const hooks: ((layer: number, nb: number, pos: number) => void)[] = [];
  session.model.transformer.moeObservers.push((layer, _routes, _h, nb, positions) => {
    log.push({ layer, nb, pos: positions[0] });
    for (const f of hooks) f(layer, nb, positions[0]);
  });
  const moeLayers = session.model.cfg.layerKinds.flatMap((k, l) => k === "moe" ? [l] : []);
  return { session, prompt: PROMPT.map((id) => id % vocab), log, hooks, moeLayers };
}

for (
  const [name, recurrent] of [["stories260k-moe64", false], ["tiny-qwen3-next", true]] as const
) {
  Deno.test({
    name: `cancel: ${name}: a cancel inside a prompt chunk stops the pass at the next layer`,
    ignore: !hasFixture(name),
    fn: async () => {
      const { session, prompt, log, hooks, moeLayers } = await open(name);
      try {
        assert.ok(moeLayers.length >= 3, "the fixture needs three MoE layers");
        const greedy = { maxTokens: 6, ignoreEos: true };
        const cold = await ids(session.generate(prompt, greedy));
        session.resetCache();
        // Abort at the second MoE layer of the second chunk (positions CHUNK..).
        const abort = new AbortController();
        const at = moeLayers[1];
        hooks.push((layer, _nb, pos) => {
          if (pos === CHUNK && layer === at) abort.abort();
        });
        log.length = 0;
        const got = await ids(session.generate(prompt, { ...greedy, signal: abort.signal }));
        hooks.length = 0;
        assert.deepEqual(got, []);
        assert.ok(abort.signal.aborted);
        // The second chunk ran up to the layer of the abort, then nothing more.
        const second = log.filter((x) => x.pos === CHUNK).map((x) => x.layer);
        assert.deepEqual(second, moeLayers.filter((l) => l <= at));
        assert.ok(!log.some((x) => x.pos > CHUNK), "no later chunk ran");
        // No half-run chunk in the prompt cache.
        assert.deepEqual(session.cachedTokens, recurrent ? [] : prompt.slice(0, CHUNK));
        // What runs next equals a cold run, from the cache that was kept.
        const again = await ids(session.generate(prompt, greedy));
        assert.deepEqual(again, cold);
        assert.equal(session.timings.cachedTokens, recurrent ? 0 : CHUNK);
      } finally {
        session.close();
      }
    },
  });
}

for (
  const [name, recurrent] of [["stories260k-moe64", false], ["tiny-qwen3-next", true]] as const
) {
  Deno.test({
    name: `cancel: ${name}: a cancelled prompt beside a decoding sequence leaves its tokens alone`,
    ignore: !hasFixture(name),
    fn: async () => {
      const { session, prompt, log, hooks, moeLayers } = await open(name, 2);
      try {
        const vocab = session.model.cfg.vocabSize;
        const first = [1, 299, 460].map((id) => id % vocab);
        const greedy = { maxTokens: 8, ignoreEos: true };
        const alone = await ids(session.generate(first, greedy));
        const batch = new Batch(session);
        const a = batch.reserve()!, b = batch.reserve()!;
        const abort = new AbortController();
        const at = moeLayers[1];
        // The cancelled request's first pass holds a decode row of the other and its rows.
        hooks.push((layer, nb) => {
          if (nb > 1 && layer === at) abort.abort();
        });
        const gotA: number[] = [];
        let second: Promise<number[]> = Promise.resolve([]);
        log.length = 0;
        for await (const t of batch.generate(a, first, greedy)) {
          gotA.push(t.id);
          if (gotA.length === 2) {
            second = ids(batch.generate(b, prompt, { ...greedy, signal: abort.signal }));
          }
        }
        assert.deepEqual(await second, []);
        assert.deepEqual(gotA, alone, "the decoding sequence's tokens are its tokens alone");
        const shared = log.filter((x) => x.nb > 1).map((x) => x.layer);
        if (recurrent) {
          // The other's recurrent state cannot run its row again: the pass ends as it would.
          assert.deepEqual(shared, moeLayers);
        } else {
          assert.deepEqual(shared, moeLayers.filter((l) => l <= at), "the shared pass stopped");
          assert.deepEqual(session.cachedTokensOf(b), []);
        }
        assert.equal(batch.active, 0);
      } finally {
        session.close();
      }
    },
  });
}
