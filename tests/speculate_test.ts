/**
 * Exact speculative decoding: with prompt-lookup or model drafts verified in one batched pass,
 * greedy tokens are those of plain decoding on every family tried (a KDA model, whose state is
 * restored and re-run after a rejection, and a sliding-window ring past its window included);
 * prompt-lookup drafts leave seeded sampled tokens unchanged; a sampled model draft keeps the
 * target's distribution (chi-square over seeds against the exact probabilities).
 */
import assert from "node:assert/strict";
import { samplingDistribution } from "../engine/sampler.ts";
import { type GenerateOptions, Session, type SessionOptions } from "../engine/session.ts";
import { ngramDraft, parseSpec, SpecGate } from "../engine/speculate.ts";
import { startServer } from "../tools/serve/server.ts";
import { budgetAboveFloor, packedFixture, runSluice } from "./fixtures.ts";

const OPTS = { quiet: true, ctx: 512, threads: 1 };

/** Generated ids and the decode counters of one run. */
async function run(s: Session, prompt: number[], opts: GenerateOptions) {
  const ids: number[] = [];
  for await (const t of s.generate(prompt, { ignoreEos: true, ...opts })) ids.push(t.id);
  return { ids, ...s.timings.decode };
}

/** A prompt that repeats itself, so prompt lookup finds long matches. */
function repeating(s: Session): number[] {
  const line = "Once upon a time, there was a little girl named Lily. She liked to play.";
  return s.tokenize(`${line} ${line} ${line}`);
}

Deno.test("prompt lookup drafts the continuation of the latest earlier match", () => {
  assert.deepEqual(ngramDraft([1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3], 3, 2), [7, 8]);
  assert.deepEqual(ngramDraft([5, 1, 2, 6, 4, 2], 3, 4), [6, 4, 2]);
  assert.deepEqual(ngramDraft([1, 2, 3], 2, 4), []);
  assert.deepEqual(parseSpec("ngram"), { ngram: 3 });
  assert.deepEqual(parseSpec("ngram:5"), { ngram: 5 });
  assert.deepEqual(parseSpec("mtp"), { mtp: true });
  assert.throws(() => parseSpec("ngrams"), /--spec: expected ngram/);
  assert.throws(() => parseSpec("ngram:0"), /--spec/);
});

/**
 * Share of `steps` decode steps the gate drafts when a drafted step costs `specMs` per token and
 * emits `tokens` (one draft kept by default); a plain step costs 1 ms.
 */
function draftedShare(specMs: number, steps: number, tokens = 2): number {
  const gate = new SpecGate(true);
  let drafted = 0;
  for (let i = 0; i < steps; i++) {
    const d = gate.drafting;
    drafted += d ? 1 : 0;
    gate.record(d, d ? specMs * tokens : 1, d ? tokens : 1);
  }
  return drafted / steps;
}

Deno.test("the gate keeps drafting while it measures faster and backs off while it is slower", () => {
  assert.ok(draftedShare(0.5, 2000) > 0.85, "drafting at half the time per token");
  assert.ok(draftedShare(1.5, 2000) < 0.03, "drafting at 1.5x the time per token");
  // Nothing kept: off whatever the clock says (here drafting looks twice as fast), the backoff
  // doubling from 32: probes after 4 plain steps, then 32, 64, ..., 1024 steps apart.
  const never = draftedShare(0.5, 2000, 1);
  assert.ok(never > 0 && never <= (7 * SpecGate.PROBE) / 2000, `${never}`);
  // A probe costing 9 ms more than plain per step (36 in all) is followed by at least 36 / 0.02
  // plain steps (capped at 1024): probes after 4 steps and 1024 later.
  const costly = draftedShare(10, 2000, 1);
  assert.ok(costly > 0 && costly <= (2 * SpecGate.PROBE) / 2000, `${costly}`);
  // The plain steps before the first probe read a cold cache (10 ms, as the probe's steps): the
  // probe looks free, but judged again against the warm plain steps after it (1 ms), it cost
  // 36 ms, so the gate stays off rather than probing again after 32 steps.
  const gate = new SpecGate(true);
  let probes = 0;
  for (let i = 0; i < 600; i++) {
    const d = gate.drafting;
    probes += d ? 1 : 0;
    gate.record(d, d || i < SpecGate.MEASURE ? 10 : 1, 1);
  }
  assert.equal(probes, SpecGate.PROBE);
  // Held open, it always drafts.
  const open = new SpecGate(false);
  open.record(true, 100, 1);
  assert.ok(open.drafting);
});

/** Opens `name` plain and with `spec`, and checks both give the same tokens for `opts`. */
async function sameTokens(
  name: string,
  spec: SessionOptions["spec"],
  opts: GenerateOptions[],
  runOpts: SessionOptions = {},
) {
  const path = await packedFixture(name);
  const plain = await Session.open(path, { ...OPTS, ...runOpts });
  const fast = await Session.open(path, {
    ...OPTS,
    ...runOpts,
    spec: { adaptive: false, ...spec },
  });
  let drafted = 0, accepted = 0;
  const recurrent = fast.model.transformer.stateRegions().length > 0;
  try {
    for (const o of opts) {
      const prompt = repeating(plain);
      const want = await run(plain, prompt, o);
      fast.resetCache();
      const got = await run(fast, prompt, o);
      assert.deepEqual(got.ids, want.ids, `${name} ${JSON.stringify(o)}: tokens differ`);
      // Each kept draft saves a pass; a recurrent state re-runs the kept tokens after a rejection.
      const saved = want.passes - got.passes;
      if (recurrent) assert.ok(saved <= got.accepted, `${name}: ${saved} passes saved`);
      else assert.equal(saved, got.accepted, `${name}: passes saved`);
      drafted += got.drafted;
      accepted += got.accepted;
    }
  } finally {
    plain.close();
    fast.close();
  }
  return { drafted, accepted };
}

/** Both branches of the verification ran: some drafts kept, some refused. */
function bothBranches(r: { drafted: number; accepted: number }) {
  assert.ok(r.accepted > 0 && r.accepted < r.drafted, `${r.accepted}/${r.drafted} accepted`);
}

const GREEDY: GenerateOptions = { maxTokens: 60 };
const SEEDED: GenerateOptions[] = [1, 2, 3].map((seed) => ({
  maxTokens: 60,
  temperature: 0.9,
  topK: 40,
  seed,
}));

for (const name of ["stories260k-moe", "tiny-deepseek-v3", "tiny-glm4-moe", "tiny-kimi-linear"]) {
  Deno.test(`prompt lookup gives the plain tokens, greedy and seeded: ${name}`, async () => {
    // The random-weight KDA model repeats itself only now and then: a longer run finds some.
    const greedy = name === "tiny-kimi-linear" ? { maxTokens: 200 } : GREEDY;
    bothBranches(await sameTokens(name, { ngram: 3 }, [greedy, ...SEEDED]));
  });
}

Deno.test("a stories260k draft gives the plain greedy tokens: stories260k-moe64", async () => {
  const draft = await packedFixture("stories260k");
  const r = await sameTokens("stories260k-moe64", { draft, draftMax: 4 }, [GREEDY]);
  // A trained pair: the draft is nearly always right.
  assert.ok(r.accepted > 0.8 * r.drafted, `${r.accepted}/${r.drafted} accepted`);
});

Deno.test("drafts verified while experts stream (lookahead on a verify batch) give the plain tokens", async () => {
  const path = await packedFixture("stories260k-moe64");
  const budget = await budgetAboveFloor(path, 2 * 2 ** 20, { ctx: OPTS.ctx });
  const r = await sameTokens("stories260k-moe64", { ngram: 2, draftMax: 6 }, [GREEDY, ...SEEDED], {
    budget,
    lookahead: 2,
  });
  bothBranches(r);
});

Deno.test("a stories260k draft gives the plain greedy tokens: tiny-kimi-linear", async () => {
  const draft = await packedFixture("stories260k");
  // The random-weight target refuses the trained draft: every pass restores the KDA state.
  const r = await sameTokens("tiny-kimi-linear", { draft, draftMax: 4 }, [GREEDY]);
  assert.ok(r.drafted > 0 && r.accepted < r.drafted, `${r.accepted}/${r.drafted} accepted`);
});

Deno.test("drafts past a sliding window's ring give the plain tokens: tiny-gpt-oss", async () => {
  // Window 128, ring 128 + 8 − 1 slots: 240 positions wrap it while drafts of 7 run ahead.
  const r = await sameTokens("tiny-gpt-oss", { ngram: 2, draftMax: 7 }, [{ maxTokens: 200 }], {
    prefillChunk: 8,
  });
  bothBranches(r);
});

/** χ² critical value at upper tail 0.001 (Wilson–Hilferty). */
function chi2Critical(df: number): number {
  const z = 3.09;
  return df * (1 - 2 / (9 * df) + z * Math.sqrt(2 / (9 * df))) ** 3;
}

Deno.test("a sampled model draft keeps the target's distribution (chi-square over seeds)", async () => {
  // The Qwen3-MoE stories model and stories260k agree on about 3 of 4 draws at this setting.
  const target = await packedFixture("stories260k-qwen3moe");
  const sampling: GenerateOptions = { temperature: 2, topK: 3 };
  const spec = await Session.open(target, {
    ...OPTS,
    spec: { draft: await packedFixture("stories260k"), draftMax: 1, adaptive: false },
  });
  const exact = await Session.open(target, OPTS);
  try {
    const prompt = spec.tokenize("Once upon a time");
    // Exact probability of every 3-token continuation (top-3 leaves 27).
    const probs = new Map<string, number>();
    const dist = (ctx: number[]) =>
      samplingDistribution(exact.model.forward(ctx, 0), ctx, sampling);
    const p1 = dist(prompt);
    for (let a = 0; a < p1.length; a++) {
      if (p1[a] === 0) continue;
      const p2 = dist([...prompt, a]);
      for (let b = 0; b < p2.length; b++) {
        if (p2[b] === 0) continue;
        const p3 = dist([...prompt, a, b]);
        p3.forEach((p, c) => p > 0 && probs.set(`${a},${b},${c}`, p1[a] * p2[b] * p));
      }
    }
    // Token 2 is a verified draft (kept, or drawn from the residual), token 3 the bonus token.
    const seeds = 2000;
    const counts = new Map<string, number>();
    let drafted = 0, accepted = 0;
    for (let seed = 0; seed < seeds; seed++) {
      const r = await run(spec, prompt, { ...sampling, maxTokens: 3, seed });
      const key = r.ids.join(",");
      assert.ok(probs.has(key), `seed ${seed}: ${key} has probability 0`);
      counts.set(key, (counts.get(key) ?? 0) + 1);
      drafted += r.drafted;
      accepted += r.accepted;
    }
    assert.ok(accepted > 0.2 * drafted && accepted < 0.9 * drafted, `${accepted}/${drafted}`);
    // Bins expected below 5 are pooled into one.
    let chi2 = 0, bins = 0, restE = 0, restO = 0;
    for (const [key, p] of probs) {
      const e = p * seeds, o = counts.get(key) ?? 0;
      if (e < 5) {
        restE += e;
        restO += o;
      } else {
        chi2 += (o - e) ** 2 / e;
        bins++;
      }
    }
    if (restE > 0) {
      chi2 += (restO - restE) ** 2 / restE;
      bins++;
    }
    const crit = chi2Critical(bins - 1);
    assert.ok(chi2 < crit, `chi-square ${chi2.toFixed(1)} over ${bins} bins ≥ ${crit.toFixed(1)}`);
  } finally {
    spec.close();
    exact.close();
  }
});

Deno.test("a draft with another vocabulary, or with a recurrent state, is refused", async () => {
  const target = await packedFixture("stories260k-moe");
  await assert.rejects(
    Session.open(target, { ...OPTS, spec: { draft: await packedFixture("tiny-kimi-k3") } }),
    /--draft .*tiny-kimi-k3.*vocabulary has 256 ids, the model's 512/,
  );
  await assert.rejects(
    Session.open(target, { ...OPTS, spec: { draft: await packedFixture("tiny-kimi-linear") } }),
    /recurrent-state \(KDA\) model cannot rewind/,
  );
});

Deno.test("serve's /metrics and generate's stats report drafted, accepted and tokens per pass", async () => {
  const path = await packedFixture("stories260k-moe");
  const session = await Session.open(path, { ...OPTS, spec: { ngram: 3, adaptive: false } });
  const server = startServer(session, { port: 0, log: () => {} });
  try {
    const prompt = repeating(session);
    const r = await fetch(`${server.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt, max_tokens: 40, ignore_eos: true }),
    });
    assert.equal(r.status, 200);
    await r.body?.cancel();
    const stats = session.stats();
    assert.ok(stats.draft_accepted > 0 && stats.draft_tokens > stats.draft_accepted);
    assert.equal(stats.tokens_per_pass, 40 / (stats.decode_passes + 1));
    assert.ok(stats.tokens_per_pass > 1);
    const metrics = await (await fetch(`${server.url}/metrics`)).text();
    const value = (name: string) =>
      Number(new RegExp(`^sluice_${name} (\\S+)$`, "m").exec(metrics)?.[1]);
    assert.equal(value("draft_tokens_total"), stats.draft_tokens);
    assert.equal(value("draft_accepted_total"), stats.draft_accepted);
    assert.equal(value("decode_passes_total"), stats.decode_passes + 1);
    assert.equal(value("tokens_per_pass"), stats.tokens_per_pass);
  } finally {
    await server.close();
    session.close();
  }
});

Deno.test("generate --spec / --draft: flags checked before loading, stats block and --json", async () => {
  const model = await packedFixture("stories260k-moe");
  const bad = await runSluice(["generate", "-m", model, "--spec", "trigram", "-p", "x"]);
  assert.notEqual(bad.code, 0);
  assert.match(bad.stderr, /--spec: expected ngram or ngram:N/);
  const lonely = await runSluice(["generate", "-m", model, "--draft-max", "3", "-p", "x"]);
  assert.match(lonely.stderr, /--draft-max and --spec-always need --spec ngram or --draft MODEL/);
  const both = await runSluice(["generate", "-m", model, "--spec", "ngram", "--draft", model]);
  assert.match(both.stderr, /not both/);
  const line = "Once upon a time, there was a little girl named Lily. She liked to play.";
  const args = [
    "generate",
    "-m",
    model,
    "-p",
    `${line} ${line} ${line}`,
    "-n",
    "30",
    "--ignore-eos",
  ];
  const plain = await runSluice([...args, "--json"]);
  const json = await runSluice([...args, "--json", "--spec", "ngram:3", "--spec-always"]);
  const a = JSON.parse(plain.stdout), b = JSON.parse(json.stdout);
  assert.deepEqual(b.generated_ids, a.generated_ids);
  assert.ok(b.stats.draft_accepted > 0 && b.stats.tokens_per_pass > 1, json.stdout);
  assert.equal(a.stats.draft_tokens, 0);
  const block = await runSluice([...args, "--spec", "ngram", "--spec-always"]);
  assert.equal(block.code, 0, block.stderr);
  assert.match(block.stderr, /tokens per pass\ndrafts +\d+ drafted, \d+ accepted/);
});
