/**
 * `deno task bench grammar [--vocab 2048,32000,151936,201088] [--steps 300] [--json]`: what
 * structured output costs per token. For each vocabulary size, the synthetic byte-level BPE
 * tokenizer of that size (tools/synth/tokenizer.ts) is read into the token bytes XGrammar needs
 * and indexed by it once, a JSON schema with strings, enums, numbers, arrays and nested
 * objects is compiled, and then a random walk through it measures each step's mask: XGrammar's bitmask, and applying it to a
 * logits row of the vocabulary's length. Side by side, one decode step of the demo model in the
 * same run, so the mask is seen against the token it gates (a real MoE step is far slower).
 *
 * @module
 */
import { parseArgs } from "node:util";
import { seededUniform } from "../../../engine/sampler.ts";
import { Session } from "../../../engine/session.ts";
import { demoModelPath } from "../../demo_model.ts";
import { loadTokenizer } from "../../../engine/tokenizer.ts";
import { applyBitmask, loadXGrammar, vocabularyTexts } from "../../serve/grammar.ts";
import { writeSynthTokenizer } from "../../synth/tokenizer.ts";

/** The schema walked: the shape of a tool call's arguments or an extraction result. */
const SCHEMA = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 24 },
    kind: { enum: ["city", "town", "village"] },
    population: { type: "integer", minimum: 0 },
    coords: { type: "array", items: { type: "number" }, minItems: 2, maxItems: 2 },
    tags: { type: "array", items: { type: "string", maxLength: 12 }, maxItems: 4 },
    mayor: {
      type: "object",
      properties: { name: { type: "string", maxLength: 24 }, since: { type: "integer" } },
      required: ["name"],
    },
  },
  required: ["name", "kind", "population", "coords"],
};

/** One vocabulary size's figures. */
export interface GrammarBenchRow {
  vocab: number;
  /** Decoding every id to the text XGrammar needs (vocabularyTexts). */
  texts_ms: number;
  index_ms: number;
  compile_ms: number;
  steps: number;
  mask_ms_mean: number;
  mask_ms_p50: number;
  mask_ms_p99: number;
  /** Of the mean: applying the bitmask to the logits row. */
  apply_ms_mean: number;
}

function percentile(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))];
}

/** Runs the bench. */
export async function main(args: string[]): Promise<void> {
  const { values } = parseArgs({
    args,
    options: {
      vocab: { type: "string", default: "2048,32000,151936,201088" },
      steps: { type: "string", default: "300" },
      json: { type: "boolean", default: false },
    },
  });
  const sizes = values.vocab.split(",").map(Number);
  const steps = Number(values.steps);
  const xg = await loadXGrammar();
  const rows: GrammarBenchRow[] = [];
  for (const n of sizes) {
    const rand = seededUniform(n);
    const dir = Deno.makeTempDirSync({ prefix: "sluice-bench-grammar-" });
    writeSynthTokenizer(dir, n);
    const tok = await loadTokenizer(dir);
    const tt = performance.now();
    const vocab = vocabularyTexts(dir, tok, n);
    const t0 = performance.now();
    Deno.removeSync(dir, { recursive: true });
    const info = await xg.TokenizerInfo.createTokenizerInfo(
      vocab,
      "byte_level",
      false,
      n,
      tok.eosIds,
    );
    const compiler = await xg.GrammarCompiler.createGrammarCompiler(info);
    const t1 = performance.now();
    const compiled = await compiler.compileGrammar(
      await xg.Grammar.fromJSONSchema(JSON.stringify(SCHEMA), false, -1, [", ", ": "], true),
    );
    const t2 = performance.now();
    let matcher = await xg.GrammarMatcher.createGrammarMatcher(compiled);
    const logits = new Float32Array(n);
    const mask: number[] = [];
    let apply = 0;
    for (let s = 0; s < steps; s++) {
      const a = performance.now();
      const bits = await matcher.getNextTokenBitmask();
      const b = performance.now();
      applyBitmask(bits, logits);
      const c = performance.now();
      mask.push(c - a);
      apply += c - b;
      const allowed: number[] = [];
      for (let id = 0; id < n; id++) if (logits[id] === 0) allowed.push(id);
      logits.fill(0);
      const pick = allowed[Math.floor(rand() * allowed.length)];
      matcher.acceptToken(pick);
      if (matcher.isTerminated()) {
        matcher.dispose();
        matcher = await xg.GrammarMatcher.createGrammarMatcher(compiled);
      }
    }
    matcher.dispose();
    const sorted = [...mask].sort((x, y) => x - y);
    rows.push({
      vocab: n,
      texts_ms: t0 - tt,
      index_ms: t1 - t0,
      compile_ms: t2 - t1,
      steps,
      mask_ms_mean: mask.reduce((x, y) => x + y, 0) / steps,
      mask_ms_p50: percentile(sorted, 0.5),
      mask_ms_p99: percentile(sorted, 0.99),
      apply_ms_mean: apply / steps,
    });
  }
  const session = await Session.open(await demoModelPath(true), { quiet: true, ctx: 512 });
  const ids = session.tokenize("Once upon a time");
  const decodeTokens = 64;
  for await (const _ of session.generate(ids, { maxTokens: 8, temperature: 0 }));
  session.resetCache();
  for await (const _ of session.generate(ids, { maxTokens: decodeTokens, temperature: 0 }));
  const decodeMs = session.timings.generateMs / session.timings.generatedTokens;
  session.close();
  if (values.json) {
    console.log(JSON.stringify({ rows, demo_decode_ms_per_token: decodeMs }, null, 2));
    return;
  }
  console.log("grammar mask per token (XGrammar wasm, JSON schema walk)");
  console.log(
    "vocab    texts ms  index ms  compile ms  mask mean  p50     p99     apply   mask ÷ demo step",
  );
  for (const r of rows) {
    console.log(
      `${String(r.vocab).padEnd(8)} ${r.texts_ms.toFixed(0).padStart(8)}  ${
        r.index_ms.toFixed(0).padStart(8)
      }  ${r.compile_ms.toFixed(0).padStart(10)}  ${r.mask_ms_mean.toFixed(3).padStart(9)}  ${
        r.mask_ms_p50.toFixed(3)
      }   ${r.mask_ms_p99.toFixed(3)}   ${r.apply_ms_mean.toFixed(3)}   ${
        (r.mask_ms_mean / decodeMs).toFixed(3)
      }`,
    );
  }
  console.log(`demo model decode step: ${decodeMs.toFixed(2)} ms/token (same run)`);
}
