/**
 * The prompt cache and saved sessions: a prompt that extends the previous one runs only its new
 * tokens and gives the tokens of a cold run; a saved and reloaded session continues as one that
 * never stopped; a damaged file or another container's session is refused.
 */
import assert from "node:assert/strict";
import { readFileSync, writeFileSync } from "node:fs";
import { Session } from "../engine/session.ts";
import { loadSession, readSessionFile, saveSession } from "../engine/session_state.ts";
import { demoModelPath } from "../tools/demo_model.ts";
import { packedFixture, sharedMissing, tempDir } from "./fixtures.ts";

const OPTS = { quiet: true, ctx: 256, threads: 1 };

async function ids(s: Session, prompt: number[], n: number): Promise<number[]> {
  const out: number[] = [];
  for await (const t of s.generate(prompt, { maxTokens: n, ignoreEos: true })) out.push(t.id);
  return out;
}

Deno.test("a prompt extending the cached one runs only its new tokens, same tokens as cold", async () => {
  const model = await demoModelPath(true);
  const warm = await Session.open(model, OPTS);
  const cold = await Session.open(model, OPTS);
  try {
    const p1 = warm.tokenize("the first turn of a conversation");
    const g1 = await ids(warm, p1, 12);
    assert.equal(warm.timings.cachedTokens, 0);
    // Longer than one prefill chunk, so the warm run's chunks start elsewhere than the cold run's.
    const more = Array.from({ length: 70 }, (_, i) => 5 + ((i * 37) % 1000));
    const p2 = [...p1, ...g1, ...more];
    const g2 = await ids(warm, p2, 12);
    // The last generated token was sampled but never run, so it is prefilled with the new ones.
    assert.equal(warm.timings.cachedTokens, p1.length + g1.length - 1);
    cold.resetCache();
    assert.deepEqual(g2, await ids(cold, p2, 12));
    assert.equal(cold.timings.cachedTokens, 0);
    // Forward calls made around the session overwrite the KV cache: nothing is reused then.
    warm.model.forward([9, 9, 9], 0);
    assert.equal(warm.cachedTokens.length, 0);
    const again = await ids(warm, p2, 12);
    assert.equal(warm.timings.cachedTokens, 0);
    assert.deepEqual(again, g2);
    // A prompt that diverges early reuses only the shared part.
    const p3 = [...p1.slice(0, 3), 7, 8, 9];
    const g3 = await ids(warm, p3, 8);
    assert.equal(warm.timings.cachedTokens, 3);
    cold.resetCache();
    assert.deepEqual(g3, await ids(cold, p3, 8));
  } finally {
    warm.close();
    cold.close();
  }
});

Deno.test("under a budget that streams experts, warm turns give the resident model's tokens", async () => {
  const model = await demoModelPath(true);
  const resident = await Session.open(model, OPTS);
  const tight = await Session.open(model, { ...OPTS, budget: 8 * 2 ** 20 });
  try {
    assert.ok(tight.model.plan.expertSlots < 64, "experts stream");
    let prompt = tight.tokenize("a conversation under a small budget");
    for (let turn = 0; turn < 3; turn++) {
      const got = await ids(tight, prompt, 10);
      resident.resetCache();
      assert.deepEqual(got, await ids(resident, prompt, 10), `turn ${turn}`);
      if (turn > 0) assert.ok(tight.timings.cachedTokens > 0);
      prompt = [...prompt, ...got, 17, 18, 19];
    }
    assert.ok(tight.stats().expert_misses > 0, "experts were streamed");
  } finally {
    resident.close();
    tight.close();
  }
});

Deno.test("each turn's compute_ms is its own time less its own I/O wait", async () => {
  const s = await Session.open(await demoModelPath(true), { ...OPTS, budget: 8 * 2 ** 20 });
  try {
    let prompt = s.tokenize("a conversation whose experts are read from disk");
    let waited = s.stats().io_wait_ms;
    for (let turn = 0; turn < 3; turn++) {
      const got = await ids(s, prompt, 10);
      const st = s.stats();
      // io_wait_ms is a running count since the load; compute_ms is this turn's alone.
      const wait = st.io_wait_ms - waited;
      assert.ok(wait >= 0, `turn ${turn}: io_wait_ms went down`);
      const want = st.prompt_ms + st.generate_ms - wait;
      assert.ok(Math.abs(st.compute_ms - want) < 1e-6, `turn ${turn}: ${st.compute_ms} ≠ ${want}`);
      waited = st.io_wait_ms;
      prompt = [...prompt, ...got, 17, 18, 19];
    }
    assert.ok(waited > 0, "the turns waited for reads, so an earlier turn's wait would show");
  } finally {
    s.close();
  }
});

Deno.test("a saved session reloads into a fresh process state and continues identically", async () => {
  const model = await demoModelPath(true);
  const path = `${tempDir()}/turn1.session`;
  const a = await Session.open(model, OPTS);
  let want: number[], p2: number[];
  try {
    const p1 = a.tokenize("once there was a saved session");
    const g1 = await ids(a, p1, 10);
    const bytes = saveSession(a, path, { note: "kept" });
    assert.ok(bytes > 0);
    p2 = [...p1, ...g1, ...a.tokenize("and then")];
    want = await ids(a, p2, 15);
  } finally {
    a.close();
  }
  const b = await Session.open(model, OPTS);
  try {
    const header = loadSession(b, path);
    assert.deepEqual(header.app, { note: "kept" });
    const got = await ids(b, p2, 15);
    assert.ok(b.timings.cachedTokens > 0, "the loaded state was reused");
    assert.deepEqual(got, want);
    // One flipped byte in the cache rows, or not a session at all: refused.
    const bad = readFileSync(path);
    bad[bad.length - 100] ^= 0xff;
    const damaged = `${tempDir()}/damaged.session`;
    writeFileSync(damaged, bad);
    assert.throws(() => loadSession(b, damaged), /damaged \(its CRC-32 does not match\)/);
    writeFileSync(damaged, "not a session");
    assert.throws(() => loadSession(b, damaged), /not a sluice session file/);
  } finally {
    b.close();
  }
});

Deno.test({
  name: "a session of one container is refused by another",
  ignore: sharedMissing() !== null,
  fn: async () => {
    const path = `${tempDir()}/demo.session`;
    const a = await Session.open(await demoModelPath(true), OPTS);
    try {
      await ids(a, a.tokenize("hello"), 3);
      saveSession(a, path);
    } finally {
      a.close();
    }
    const b = await Session.open(await packedFixture("stories260k-moe"), OPTS);
    try {
      assert.throws(
        () => loadSession(b, path),
        /belongs to container "demo-.*\.sluice" \(manifest sha256 .*\), not to .*stories260k-moe/,
      );
      assert.equal(b.cachedTokens.length, 0);
    } finally {
      b.close();
    }
  },
});

Deno.test({
  name:
    "a session past a sliding window's ring saves the ring's rows, reloads, and continues as cold",
  ignore: sharedMissing() !== null,
  fn: async () => {
    // tiny-gemma4-moe: sliding layers keep a ring of 32 + 16 − 1 = 47 rows at chunk 16.
    const model = await packedFixture("tiny-gemma4-moe");
    const opts = { quiet: true, ctx: 320, prefillChunk: 16 };
    const path = `${tempDir()}/ring.session`;
    const a = await Session.open(model, opts);
    const prompt = a.tokenize("The cat sat on the mat and looked at the moon. ".repeat(10));
    let held: number;
    try {
      await ids(a, prompt, 4);
      saveSession(a, path);
      held = a.cachedTokens.length;
    } finally {
      a.close();
    }
    assert.ok(held > 100);
    // Ring regions are saved as their 47 rows, the others as every position held.
    const { header } = readSessionFile(path);
    assert.deepEqual([...new Set(header.rows)].sort((x, y) => x - y), [47, held]);
    const b = await Session.open(model, opts);
    const cold = await Session.open(model, opts);
    try {
      loadSession(b, path);
      const more = [...b.cachedTokens, ...b.tokenize(" and then").slice(1)];
      assert.deepEqual(await ids(b, more, 6), await ids(cold, more, 6));
      assert.equal(b.timings.cachedTokens, held);
    } finally {
      b.close();
      cold.close();
    }
    const other = await Session.open(model, { ...opts, prefillChunk: 8 });
    try {
      assert.throws(() => loadSession(other, path), /rings were saved with other sizes/);
    } finally {
      other.close();
    }
  },
});
