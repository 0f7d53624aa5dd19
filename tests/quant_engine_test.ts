/**
 * The engine on containers with compact formats against the float64 reference forward fed with
 * the container's own weights, dequantised (engine/float_weights.ts): the quantisation
 * error is then shared, and what is left is the kernels'. int8 and vq3r read f32 inputs (vq3r
 * through f32 tables) and must agree within 1e-4; mxfp4 and int4 read Q8 copies of their inputs
 * (int8 per 32-block) and vq4p int8 tables, whose rounding the reference does not make, so they
 * get a bound sized for that. Greedy tokens must agree in every case, outputs must not depend on threads or batching,
 * and a quantised stories260k-moe must still write readable text.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { Model } from "../engine/model.ts";
import { referenceWeightsFromContainer } from "../engine/float_weights.ts";
import { ReferenceModel } from "../engine/reference/forward.ts";
import { argmax } from "../engine/sampler.ts";
import { loadTokenizer } from "../engine/tokenizer.ts";
import { type ExpertsOption, packCheckpoint, type PackOptions } from "../tools/pack.ts";
import { assertNearReference, fixtureDir, packedFixture, tempDir } from "./fixtures.ts";

const PROMPT = [1, 403, 407, 261, 378];
const STEPS = 30;

const packs = new Map<string, Promise<string>>();

/** stories260k-moe packed with `opts`, once per process. */
function packed(name: string, opts: PackOptions): Promise<string> {
  let p = packs.get(name);
  if (!p) {
    const out = join(tempDir(), `engine-${name}.sluice`);
    p = packCheckpoint(fixtureDir("stories260k-moe"), out, {
      ...opts,
      vq3r: { sampleSize: 4096, iterations: 3 },
      progress: "off",
      log: () => {},
    }).then(() => out);
    packs.set(name, p);
  }
  return p;
}

const CASES: { name: string; opts: PackOptions; tol: number }[] = [
  { name: "int8+trunk-int8", opts: { experts: "int8", trunk: "int8" }, tol: 1e-4 },
  { name: "vq3r", opts: { experts: "vq3r" }, tol: 1e-4 },
  // Q8 inputs: a per-32-block int8 rounding of every activation (about 0.4% of the block max).
  { name: "mxfp4", opts: { experts: "mxfp4" }, tol: 5e-2 },
  { name: "int4", opts: { experts: "int4" }, tol: 5e-2 },
  // Int8 tables: each lookup is rounded to 1/126 of the table's largest entry.
  { name: "vq4p", opts: { experts: "vq4p" }, tol: 5e-2 },
];

for (const { name, opts, tol } of CASES) {
  Deno.test(`engine on a ${name} container matches the reference on its weights`, async () => {
    const dir = await packed(name, opts);
    const { cfg, weight } = referenceWeightsFromContainer(dir);
    const run = { ctx: 64, prompt: PROMPT, steps: STEPS, bound: tol, name };
    await assertNearReference(dir, new ReferenceModel(cfg, weight), run);
  });
}

for (const experts of ["mxfp4", "vq3r", "vq4p"] as ExpertsOption[]) {
  Deno.test(`${experts}: logits do not depend on threads or prefill batching`, async () => {
    const dir = await packed(experts, { experts });
    const seq = [...PROMPT, 300, 301, 302];
    const runs: Float32Array[] = [];
    for (const [threads, batched] of [[1, true], [2, true], [2, false]] as const) {
      const model = await Model.open(dir, { quiet: true, ctx: 32, threads });
      try {
        if (batched) runs.push(model.forward(seq, 0, true));
        else {
          const parts = seq.map((t, p) => model.forward([t], p));
          const all = new Float32Array(parts.length * parts[0].length);
          parts.forEach((p, i) => all.set(p, i * p.length));
          runs.push(all);
        }
      } finally {
        model.close();
      }
    }
    assert.deepEqual(runs[1], runs[0], "1 vs 2 threads");
    assert.deepEqual(runs[2], runs[0], "batched prefill vs one token at a time");
  });
}

Deno.test("quantised stories260k-moe still tells a story", async () => {
  const base = await packedFixture("stories260k-moe");
  const tok = await loadTokenizer(base);
  const prompt = tok.encode("Once upon a time");
  const greedy = async (dir: string) => {
    const model = await Model.open(dir, { quiet: true, ctx: 160 });
    try {
      const ids = [...prompt];
      let logits = model.forward(ids, 0);
      for (let i = 0; i < 100; i++) {
        ids.push(argmax(logits));
        logits = model.forward([ids.at(-1)!], ids.length - 1);
      }
      return ids.slice(prompt.length);
    } finally {
      model.close();
    }
  };
  const want = await greedy(base);
  for (const experts of ["mxfp4", "vq3r"] as ExpertsOption[]) {
    const got = await greedy(await packed(experts, { experts }));
    const text = tok.decode(got, { skipSpecial: true });
    assert.ok(
      /^[\x20-\x7e\n]+$/.test(text),
      `${experts}: unprintable text ${JSON.stringify(text)}`,
    );
    const words = text.split(/\s+/).filter((w) => /^[A-Za-z]+[.,!?"']*$/.test(w));
    assert.ok(words.length >= 15, `${experts}: few words in ${JSON.stringify(text)}`);
    // The first tokens follow the unquantised model before small differences compound.
    assert.deepEqual(got.slice(0, 3), want.slice(0, 3), `${experts}: ${text}`);
  }
});
