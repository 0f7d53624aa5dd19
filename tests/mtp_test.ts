/**
 * Exact speculative decoding with the multi-token-prediction layers checkpoints ship (`--spec
 * mtp`): pack keeps them apart from the main layers; the MTP step's logits against a float64
 * reference of the recipe (DeepSeek-V3 tech report §2.2); greedy and seeded tokens equal plain
 * decoding's on every fixture with MTP layers; the counters agree with the passes; a container
 * without MTP layers refuses `--spec mtp` naming the model. The fixtures' MTP weights are random,
 * so acceptance is low here: these tests show exactness, never speed.
 */
import "./shared_guard.ts";
import assert from "node:assert/strict";
import { cpSync, readFileSync, writeFileSync } from "node:fs";
import { PAGE } from "../engine/arena.ts";
import { openContainer } from "../engine/container.ts";
import { referenceWeightsFromCheckpoint } from "../engine/float_weights.ts";
import { Model } from "../engine/model.ts";
import { MTP_ROWS } from "../engine/run_state.ts";
import { ReferenceModel } from "../engine/reference/forward.ts";
import { argmax } from "../engine/sampler.ts";
import { Batch } from "../engine/batch.ts";
import { PrefixCache } from "../engine/prefix_cache.ts";
import { type GenerateOptions, Session } from "../engine/session.ts";
import { loadSession, mtpSaved, saveSession } from "../engine/session_state.ts";
import { inspectContainer } from "../tools/inspect.ts";
import { packCheckpoint } from "../tools/pack.ts";
import {
  budgetAboveFloor,
  fixtureDir,
  hasFixture,
  maxRelDiff,
  ONCE_UPON_A_TIME,
  packedFixture,
  runSluice,
  tempDir,
} from "./fixtures.ts";

const OPTS = { quiet: true, ctx: 256, threads: 1 };
/** Fixtures whose checkpoint ships MTP layers sluice runs. */
const MTP_FIXTURES = ["tiny-glm4-moe", "tiny-qwen3.5-moe", "tiny-glm5"];

const PROMPT_TEXT = "Once upon a time, there was a little girl named Lily. She liked to play.";

for (const name of MTP_FIXTURES) {
  Deno.test({
    name: `MTP steps (and a chain of two) within 1e-4 of the float64 reference: ${name}`,
    ignore: !hasFixture(name),
    fn: async () => {
      const { cfg, weight } = referenceWeightsFromCheckpoint(fixtureDir(name));
      assert.equal(cfg.mtp?.layers, 1);
      const ref = new ReferenceModel(cfg, weight);
      const model = await Model.open(await packedFixture(name), { ...OPTS, mtp: true });
      const t = model.transformer;
      let worst = 0;
      try {
        // The prompt, then the reference's greedy tokens, one position at a time; after each
        // pass the MTP cache holds every position before the last (the engine's catch-up, and
        // the same steps in the reference), then a draft of two chained steps is compared.
        const tokens = [...ONCE_UPON_A_TIME];
        let before: Float64Array | null = null;
        for (let pos = 0; pos < 40; pos++) {
          const want = ref.forward64(tokens[pos], pos);
          model.forward([tokens[pos]], pos);
          const hidden = ref.lastHidden;
          if (before) ref.mtp64(before, tokens[pos], pos - 1);
          before = hidden;
          if (pos + 1 >= tokens.length) tokens.push(argmax(want));
          if (pos % 3 !== 0) continue;
          const mine = t.mtpHidden(0, pos)!;
          assert.ok(maxRelDiff(mine, hidden) < 1e-4, `${name} hidden at ${pos}`);
          let r = ref.mtp64(hidden, tokens[pos + 1], pos);
          let e = t.mtpStep(0, mine, tokens[pos + 1], pos);
          worst = Math.max(worst, maxRelDiff(e.logits, r.logits));
          const draft = argmax(r.logits);
          r = ref.mtp64(r.hidden, draft, pos + 1);
          e = t.mtpStep(0, e.hidden, draft, pos + 1);
          worst = Math.max(worst, maxRelDiff(e.logits, r.logits));
        }
      } finally {
        model.close();
      }
      assert.ok(worst <= 1e-4, `${name}: MTP logits differ by ${worst} relative`);
    },
  });

  Deno.test({
    name: `--spec mtp gives the plain tokens, greedy and seeded, with consistent counters: ${name}`,
    ignore: !hasFixture(name),
    fn: async () => {
      const path = await packedFixture(name);
      const plain = await Session.open(path, OPTS);
      const fast = await Session.open(path, { ...OPTS, spec: { mtp: true, adaptive: false } });
      let drafted = 0, accepted = 0;
      try {
        const prompt = plain.tokenize(PROMPT_TEXT);
        for (
          const o of [
            { maxTokens: 48 },
            ...[1, 2].map((seed) => ({ maxTokens: 48, temperature: 0.9, topK: 40, seed })),
          ]
        ) {
          const want = [], got = [];
          for await (const t of plain.generate(prompt, { ignoreEos: true, ...o })) want.push(t.id);
          const before = { ...plain.timings.decode };
          fast.resetCache();
          for await (const t of fast.generate(prompt, { ignoreEos: true, ...o })) got.push(t.id);
          const c = fast.timings.decode;
          assert.deepEqual(got, want, `${name} ${JSON.stringify(o)}: tokens differ`);
          // Every pass emits its accepted drafts plus one token of the target's own; the first
          // token comes from the prefill's logits.
          const recurrent = fast.model.transformer.stateRegions().length > 0;
          if (recurrent) assert.ok(before.passes - c.passes <= c.accepted);
          else assert.equal(before.passes - c.passes, c.accepted, `${name}: passes saved`);
          assert.ok(c.accepted <= c.drafted && c.drafted > 0, `${c.accepted}/${c.drafted}`);
          drafted += c.drafted;
          accepted += c.accepted;
        }
      } finally {
        plain.close();
        fast.close();
      }
      // Random MTP weights: low acceptance, reported rather than asserted.
      console.log(`${name}: MTP drafts accepted ${accepted}/${drafted}`);
    },
  });
}

Deno.test({
  name:
    "pack keeps the MTP layer apart, the plan charges it only with --spec mtp, --no-mtp leaves it out",
  ignore: !hasFixture("tiny-glm4-moe"),
  fn: async () => {
    const path = await packedFixture("tiny-glm4-moe");
    const model = await Model.open(path, OPTS);
    const withMtp = await Model.open(path, { ...OPTS, mtp: true });
    try {
      const m = model.container.manifest;
      assert.equal(m.trunk.layers.length, 4);
      assert.equal(m.mtp?.layers.length, 1);
      assert.equal(m.mtp?.experts[0]?.layer, 4);
      assert.ok(m.mtp?.layers[0].tensors.mtp_proj, "eh_proj kept");
      assert.equal(model.transformer.mtp, false, "not run without --spec mtp");
      // The fixture README's count: 126,448 parameters in the MTP layer, none of the model's.
      assert.equal(inspectContainer(path).mtp?.params, 126448);
      assert.equal(inspectContainer(path).params.total, 456944);
      // The plan has the MTP layer's run, experts and cache only when it runs: its bank in the
      // expert cache, the rest in room the cache lends it (whole slots), nothing resident.
      const [off, on] = [model.plan, withMtp.plan];
      assert.equal(off.mtpRoomBytes, 0);
      assert.ok(on.mtpRoomBytes > m.mtp!.layers[0].bytes + on.layerStateBytes[0]);
      const stride = Math.max(...m.experts.map((b) => b?.stride ?? 0));
      assert.equal(on.mtpLoanSlots, Math.ceil(on.mtpRoomBytes / stride));
      assert.equal(on.fixedBytes, off.fixedBytes);
      assert.equal(on.totalExperts, off.totalExperts + 16);
      assert.equal(on.wholeModelBytes - off.wholeModelBytes, (16 + on.mtpLoanSlots) * stride);
    } finally {
      model.close();
      withMtp.close();
    }
    const lines: string[] = [];
    const out = `${tempDir()}/glm-no-mtp.sluice`;
    const res = await packCheckpoint(fixtureDir("tiny-glm4-moe"), out, {
      progress: "off",
      mtp: false,
      log: (l) => lines.push(l),
    });
    assert.equal(res.manifest.mtp, undefined);
    assert.equal(res.manifest.config.mtp, undefined);
    assert.ok(lines.some((l) => l.includes("skipping layer 4 (68 tensors)")), lines.join(" | "));
    // Refused at open, naming the container and the model.
    await assert.rejects(
      () => Session.open(out, { ...OPTS, spec: { mtp: true } }),
      /glm-no-mtp\.sluice: --spec mtp needs the model's multi-token-prediction layers, and this container of glm4_moe has none/,
    );
    // A container without MTP layers (as every container packed before them) opens and gives
    // the same tokens as one with them.
    const greedy = async (dir: string) => {
      const s = await Session.open(dir, OPTS);
      try {
        const ids = [];
        for await (const t of s.generate([...ONCE_UPON_A_TIME], { maxTokens: 12 })) ids.push(t.id);
        return ids;
      } finally {
        s.close();
      }
    };
    assert.deepEqual(await greedy(out), await greedy(path));
    // generate --spec mtp: the plain ids, and the drafts in --json's stats.
    const args = ["generate", "-m", path, "--prompt-ids", "1,403,407", "-n", "16", "--json"];
    const [a, b] = await Promise.all([
      runSluice(args),
      runSluice([...args, "--spec", "mtp", "--spec-always"]),
    ]);
    assert.equal(b.code, 0, b.stderr);
    const [pa, pb] = [JSON.parse(a.stdout), JSON.parse(b.stdout)];
    assert.deepEqual(pb.generated_ids, pa.generated_ids);
    assert.ok(pb.stats.draft_tokens > 0 && pa.stats.draft_tokens === 0, b.stdout);
    const r = await runSluice(["generate", "-m", out, "--spec", "mtp", "-p", "x", "-n", "2"]);
    assert.equal(r.code, 1);
    assert.match(r.stderr, /--spec mtp needs the model's multi-token-prediction layers/);
    assert.ok(!r.stderr.includes("    at "), r.stderr);
  },
});

Deno.test({
  name:
    "--spec mtp on a VQ3R-quantised container (the MTP bank's codebooks loaded) gives the plain tokens",
  ignore: !hasFixture("tiny-glm4-moe"),
  fn: async () => {
    const out = `${tempDir()}/glm-vq3r.sluice`;
    await packCheckpoint(fixtureDir("tiny-glm4-moe"), out, {
      progress: "off",
      experts: "vq3r",
      log: () => {},
    });
    const ids = async (spec?: { mtp: true }) => {
      const s = await Session.open(out, { ...OPTS, spec });
      try {
        const got = [];
        for await (const t of s.generate([...ONCE_UPON_A_TIME], { maxTokens: 24 })) got.push(t.id);
        return { got, drafted: s.timings.decode.drafted };
      } finally {
        s.close();
      }
    };
    const plain = await ids();
    const fast = await ids({ mtp: true });
    assert.deepEqual(fast.got, plain.got);
    assert.ok(fast.drafted > 0);
  },
});

Deno.test({
  name:
    "a manifest whose mtp section disagrees with its config, or overlaps a main run, is refused",
  ignore: !hasFixture("tiny-glm4-moe"),
  fn: async () => {
    const src = await packedFixture("tiny-glm4-moe");
    // deno-lint-ignore no-explicit-any
    const cases: [string, (m: any) => void, RegExp][] = [
      ["no config.mtp", (m) => delete m.config.mtp, /mtp: present exactly when config\.mtp is/],
      ["no mtp section", (m) => delete m.mtp, /mtp: present exactly when config\.mtp is/],
      ["two MTP layers", (m) => (m.config.mtp.layers = 2), /mtp\.layers: expected 2 runs/],
      [
        "an MTP run over layer 3's",
        (m) => (m.mtp.layers[0].offset = m.trunk.layers[3].offset),
        /trunk: layer \d overlaps layer \d/,
      ],
      ["a bank of another layer", (m) => (m.mtp.experts[0].layer = 3), /mtp\.experts\[0\]\.layer/],
    ];
    for (const [what, edit, want] of cases) {
      const dir = `${tempDir()}/bad-mtp-${what.replaceAll(" ", "-")}.sluice`;
      cpSync(src, dir, { recursive: true });
      const m = JSON.parse(readFileSync(`${dir}/manifest.json`, "utf-8"));
      edit(m);
      writeFileSync(`${dir}/manifest.json`, JSON.stringify(m));
      assert.throws(() => openContainer(dir), want, what);
    }
  },
});

for (const name of MTP_FIXTURES) {
  Deno.test({
    name:
      `with the MTP layer running, the arena after passes and drafts is the plan less its slack: ${name}`,
    ignore: !hasFixture(name),
    fn: async () => {
      const path = await packedFixture(name);
      const floor = await budgetAboveFloor(path, 0, { ...OPTS, lookahead: 0, mtp: true });
      for (const budget of [undefined, floor]) {
        const m = await Model.open(path, {
          ...OPTS,
          hotList: false,
          lookahead: 0,
          mtp: true,
          budget,
        });
        try {
          m.forward([1, 2, 3], 0);
          m.forward([4], 3);
          const step = m.transformer.mtpStep(0, m.transformer.mtpHidden(0, 3)!, 5, 3);
          m.transformer.mtpStep(0, step.hidden, 6, 4);
          const unused = m.plan.arenaBytes - m.arena.used;
          assert.ok(unused >= 0, `${name}: the arena used ${-unused} bytes past its plan`);
          // The planner's 32 pages for regions made on first use (engine/planner.ts).
          assert.ok(unused <= 32 * PAGE, `${name}: ${unused} planned bytes never allocated`);
        } finally {
          m.close();
        }
      }
    },
  });
}

Deno.test({
  name: "a --trace of a run with MTP drafts holds the main layers' routes only",
  ignore: !hasFixture("tiny-glm4-moe"),
  fn: async () => {
    const trace = `${tempDir()}/mtp-trace.jsonl`;
    const s = await Session.open(await packedFixture("tiny-glm4-moe"), {
      ...OPTS,
      trace,
      spec: { mtp: true, adaptive: false },
    });
    try {
      for await (const _ of s.generate([...ONCE_UPON_A_TIME], { maxTokens: 8 })) { /* drain */ }
      assert.ok(s.timings.decode.drafted > 0);
    } finally {
      s.close();
    }
    const layers = readFileSync(trace, "utf-8").trim().split("\n").slice(1)
      .map((l) => JSON.parse(l).layer as number);
    assert.ok(layers.length > 0 && layers.every((l) => l >= 1 && l < 4), `${new Set(layers)}`);
  },
});

Deno.test({
  name: "an idle MTP layer keeps no cache rows, and drafting shut by the gate leaves it idle",
  ignore: !hasFixture("tiny-glm4-moe"),
  fn: async () => {
    const path = await packedFixture("tiny-glm4-moe");
    const plain = await Model.open(path, OPTS);
    const m = await Model.open(path, { ...OPTS, mtp: true });
    try {
      const t = m.transformer, ids = [...ONCE_UPON_A_TIME];
      assert.deepEqual(m.forward(ids, 0), plain.forward(ids, 0));
      // Position p needs the token at p + 1: a prompt of n fills n − 1 rows.
      assert.equal(t.mtpCacheRows, ids.length - 1);
      t.mtpMode(0, "idle");
      for (let p = ids.length; p < ids.length + 4; p++) {
        assert.deepEqual(m.forward([p % 300], p), plain.forward([p % 300], p));
      }
      assert.equal(t.mtpCacheRows, ids.length - 1, "idle: no rows run");
      assert.deepEqual([t.mtpHeld, t.mtpTakes], [true, 1], "idle: the room stays");
      t.mtpMode(0, "off");
      assert.equal(t.mtpHeld, false, "off: the room is given back");
      m.forward([5], ids.length + 3);
      t.mtpMode(0, "run");
      m.forward([7], ids.length + 4);
      assert.equal(t.mtpCacheRows, ids.length, "resumed: the row before the pass");
      assert.ok(t.mtpHidden(0, ids.length + 4) !== null, "drafts can start again at once");
      assert.deepEqual([t.mtpHeld, t.mtpTakes], [true, 2], "run: the room is taken again");
    } finally {
      plain.close();
      m.close();
    }
    // Through the decode loop with the gate deciding: the tokens stay plain decoding's, and the
    // passes it ran without drafts kept no MTP rows.
    const s = await Session.open(path, { ...OPTS, spec: { mtp: true } });
    const p = await Session.open(path, OPTS);
    try {
      const prompt = s.tokenize(PROMPT_TEXT);
      const want = [], got = [];
      for await (const x of p.generate(prompt, { ignoreEos: true, maxTokens: 96 })) want.push(x.id);
      for await (const x of s.generate(prompt, { ignoreEos: true, maxTokens: 96 })) got.push(x.id);
      assert.deepEqual(got, want);
      // A pass with drafts keeps its rows (the pending token and each draft); one without, none.
      const c = s.timings.decode;
      const kept = prompt.length - 1 + (c.passes - c.gated) + c.drafted;
      assert.ok(s.model.transformer.mtpCacheRows <= kept, `${JSON.stringify(c)}`);
    } finally {
      s.close();
      p.close();
    }
  },
});

Deno.test({
  name:
    "with its drafting off, the MTP layer's room goes back to the expert cache: bytes read per token as without --spec mtp",
  ignore: !hasFixture("tiny-glm4-moe"),
  fn: async () => {
    const path = await packedFixture("tiny-glm4-moe");
    // The spec bench's budget: a quarter of the way from the floor to the whole model, where
    // the MTP layer's room is most of the expert cache.
    const probe = await Model.open(path, { ...OPTS, mtp: true });
    const { floor, wholeModelBytes } = probe.plan;
    probe.close();
    const budget = floor + 0.25 * (wholeModelBytes - floor);
    const steps = 96;
    /** Greedy tokens after the prompt, and what the engine read for them (experts and trunk). */
    const decode = async (mode: "plain" | "off" | "run") => {
      // No router lookahead: its guesses read as the disk allows, which no count can predict.
      const m = await Model.open(path, {
        ...OPTS,
        budget,
        lookahead: 0,
        hotList: false,
        mtp: mode !== "plain",
      });
      try {
        const ids = [...ONCE_UPON_A_TIME];
        let logits = m.forward(ids, 0);
        if (mode !== "plain") m.transformer.mtpMode(0, mode);
        const read = () => m.experts!.stats.bytesRead + m.trunk.stats.bytes;
        const bytes: number[] = [], n0 = ids.length;
        for (let p = n0; p < n0 + steps; p++) {
          const before = read();
          ids.push(argmax(logits));
          logits = m.forward([ids[p]], p);
          bytes.push(read() - before);
        }
        const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);
        const stride = Math.max(...m.container.manifest.experts.map((b) => b?.stride ?? 0));
        return {
          ids,
          bytes: sum(bytes),
          late: sum(bytes.slice(steps / 2)),
          stride,
          slots: m.plan.expertSlots * stride,
        };
      } finally {
        m.close();
      }
    };
    const plain = await decode("plain"), off = await decode("off"), run = await decode("run");
    assert.deepEqual(off.ids, plain.ids);
    assert.deepEqual(run.ids, plain.ids);
    // The lent slots come back empty and the others were filled by a prefill with fewer slots:
    // at most one refill of the cache separates the two, and the first tokens pay it.
    const what = `plain ${plain.bytes} (late ${plain.late}), off ${off.bytes} (late ${off.late})`;
    assert.ok(off.bytes <= plain.bytes + off.slots, what);
    // After it the caches differ only by eviction choices (LFRU draws a sample): the second half
    // reads within 4 records (0.08 a token) of plain decoding.
    assert.ok(Math.abs(off.late - plain.late) <= 4 * off.stride, what);
    // Holding the room (the layer running beside every pass) reads several records a token more
    // on this budget: the check above can fail.
    assert.ok(run.late > plain.late + steps * off.stride, `run: late ${run.late}; ${what}`);
  },
});

Deno.test({
  name:
    "a saved session and the prompt cache keep the MTP layer's rows: after a restore they and the drafts are a cold run's",
  ignore: !hasFixture("tiny-glm4-moe"),
  fn: async () => {
    const path = await packedFixture("tiny-glm4-moe");
    // Held open, so the layer keeps its room and rows throughout.
    const open = () => Session.open(path, { ...OPTS, spec: { mtp: true, adaptive: false } });
    const generate = async (s: Session, prompt: number[], maxTokens: number) => {
      const ids: number[] = [];
      for await (const t of s.generate(prompt, { ignoreEos: true, maxTokens })) ids.push(t.id);
      const { drafted, accepted } = s.timings.decode;
      return { ids, drafted, accepted };
    };
    /** The MTP layer's rows and the hidden state it reads next, for the cached positions. */
    const rows = (s: Session) => {
      const snap = mtpSaved(s, s.cachedTokens.length);
      assert.ok(snap, "the MTP layer keeps rows");
      return snap.bytes;
    };
    const first = [...ONCE_UPON_A_TIME];
    const file = `${tempDir()}/mtp.session`;
    const cold = await open(), warm = await open(), resumed = await open();
    try {
      // Cold: two turns on one session.
      const a = await generate(cold, first, 12);
      const second = [...first, ...a.ids, 403, 407];
      const coldTurn = await generate(cold, second, 16);
      // Saved after the first turn, loaded into a fresh session, then the second turn.
      await generate(warm, first, 12);
      saveSession(warm, file);
      loadSession(resumed, file);
      assert.deepEqual(rows(resumed), rows(warm), "the rows as saved");
      const resumedTurn = await generate(resumed, second, 16);
      assert.deepEqual(resumedTurn, coldTurn);
      assert.deepEqual(rows(resumed), rows(cold), "the rows after the turn: a cold run's");
      // The prompt cache: another owner's request displaces the live cache, whose rows are
      // saved and written back for the first owner's next turn.
      const cache = new PrefixCache(warm, { ownerBytes: 2 ** 24 });
      warm.resetCache();
      cache.prepare("a", first);
      await generate(warm, first, 12);
      cache.finish();
      cache.prepare("b", [1, 9, 9, 9]);
      await generate(warm, [1, 9, 9, 9], 8);
      cache.finish();
      cache.prepare("a", second);
      assert.equal(warm.cachedTokens.length, first.length + 11, "a's prefix written back");
      const cachedTurn = await generate(warm, second, 16);
      assert.deepEqual(cachedTurn, coldTurn);
      assert.deepEqual(rows(warm), rows(cold), "the rows after the turn: a cold run's");
    } finally {
      cold.close();
      warm.close();
      resumed.close();
    }
  },
});

for (const name of MTP_FIXTURES) {
  Deno.test({
    name:
      `--parallel 3: each batched sequence drafts with the MTP layer, its tokens its own alone: ${name}`,
    ignore: !hasFixture(name),
    fn: async () => {
      const path = await packedFixture(name);
      const opts = { ...OPTS, ctx: 64, prefillChunk: 8, hotList: false };
      const requests: [number[], GenerateOptions][] = [
        [[1, 403, 407, 261, 378], { maxTokens: 12 }],
        [[1, 378, 261, 407, 403, 299, 304, 277, 375], { maxTokens: 10, temperature: 0.9, seed: 7 }],
        [[1, 299, 460], { maxTokens: 9, temperature: 1.1, topP: 0.9, seed: 12345 }],
      ];
      const plain = await Session.open(path, opts);
      const alone: number[][] = [];
      try {
        for (const [prompt, o] of requests) {
          plain.resetCache();
          const ids = [];
          for await (const t of plain.generate(prompt, { ...o, ignoreEos: true })) ids.push(t.id);
          alone.push(ids);
        }
      } finally {
        plain.close();
      }
      const session = await Session.open(path, {
        ...opts,
        parallel: 3,
        spec: { mtp: true, adaptive: false },
      });
      try {
        const batch = new Batch(session);
        const seqs = requests.map(() => batch.reserve()!);
        const got = await Promise.all(requests.map(async ([prompt, o], i) => {
          const ids = [];
          for await (const t of batch.generate(seqs[i], prompt, { ...o, ignoreEos: true })) {
            ids.push(t.id);
          }
          return ids;
        }));
        assert.deepEqual(got, alone);
        for (const seq of seqs) {
          const d = batch.timings(seq).decode;
          assert.ok(d.drafted > 0, `sequence ${seq}: ${JSON.stringify(d)}`);
        }
        assert.ok(batch.totals.sequences > batch.totals.passes, "passes held several sequences");
      } finally {
        session.close();
      }
    },
  });
}

Deno.test({
  name:
    "the MTP layer's rows of a long prompt pass (run in pieces of MTP_ROWS) are those of running it token by token",
  ignore: !hasFixture("tiny-glm4-moe"),
  fn: async () => {
    const path = await packedFixture("tiny-glm4-moe");
    const prompt = Array.from({ length: 2 * MTP_ROWS + 7 }, (_, i) => (i * 37 + 1) % 256);
    const [whole, single] = [await open(), await open()];
    async function open() {
      return await Session.open(path, { ...OPTS, spec: { mtp: true, adaptive: false } });
    }
    try {
      whole.model.forward(prompt, 0);
      prompt.forEach((t, p) => single.model.forward([t], p));
      whole.adoptCache(prompt);
      single.adoptCache(prompt);
      const [a, b] = [mtpSaved(whole, prompt.length), mtpSaved(single, prompt.length)];
      assert.ok(a && b);
      assert.deepEqual(a.bytes, b.bytes);
    } finally {
      whole.close();
      single.close();
    }
  },
});
