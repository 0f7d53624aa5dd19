/**
 * `deno task fuzz [--count 100000] [--seed 1] [--target NAME] [--work DIR]`: mutation fuzzing of
 * every parser of untrusted input (tools/dev/fuzz/targets.ts). Each input must either parse or be
 * rejected with a plain `Error` whose message names what is wrong; anything else is a finding:
 * - crash: a TypeError, RangeError, stack overflow or non-Error throw escaping the parser;
 * - hang: one input taking more than a second, three times running;
 * - allocation: resident memory growing by more than 1 GiB over the run;
 * - unhelpful: a rejection message leaking "undefined", "NaN" or "[object Object]".
 * Findings are written to `<work>/findings/` (the input bytes) so they can become regression
 * tests; the exit code is 1 when there is any. tests/fuzz_test.ts runs a quick pass in CI.
 *
 * @module
 */
import { join } from "node:path";
import { parseArgs } from "node:util";
import { Rng } from "./fuzz/mutate.ts";
import { type FuzzTarget, makeTargets } from "./fuzz/targets.ts";
import { mutate } from "./fuzz/mutate.ts";

/** One finding: what kind, the message, and the input that caused it. */
export interface Finding {
  kind: "crash" | "hang" | "allocation" | "unhelpful";
  message: string;
  input: Uint8Array;
}

/** The outcome of fuzzing one target. */
export interface FuzzReport {
  target: string;
  inputs: number;
  accepted: number;
  rejected: number;
  slowestMs: number;
  rssGrowthBytes: number;
  findings: Finding[];
}

const HANG_MS = 1000;
/** Reruns of an input slower than its limit before it counts as a hang. */
const HANG_RETRIES = 2;

/** Milliseconds one more run of `input` takes, whatever it throws (the first run judged that). */
async function timeOnce(target: FuzzTarget, input: Uint8Array): Promise<number> {
  const t0 = performance.now();
  try {
    await target.run(input);
  } catch {
    // Judged on the first run.
  }
  return performance.now() - t0;
}
const ALLOC_LIMIT = 2 ** 30;
const UNHELPFUL = /\bundefined\b|\bNaN\b|\[object Object\]/;

/** Whether `e` is a clean rejection: a plain Error, a Deno I/O error, or parseArgs' coded error. */
export function isCleanRejection(e: unknown): e is Error {
  if (!(e instanceof Error)) return false;
  if (e.constructor === Error) return true;
  if (Object.values(Deno.errors).some((k) => e.constructor === k)) return true;
  const code = (e as { code?: unknown }).code;
  return typeof code === "string" && code.startsWith("ERR_PARSE_ARGS");
}

/** Runs `count` mutated inputs (seeds first) through `target`. */
export async function fuzzTarget(
  target: FuzzTarget,
  count: number,
  seed: number,
): Promise<FuzzReport> {
  const rng = new Rng(seed);
  const report: FuzzReport = {
    target: target.name,
    inputs: 0,
    accepted: 0,
    rejected: 0,
    slowestMs: 0,
    rssGrowthBytes: 0,
    findings: [],
  };
  const rss0 = Deno.memoryUsage().rss;
  const seen = new Set<string>();
  const note = (f: Finding) => {
    // One finding per distinct message (numbers folded), not one per input.
    const key = `${f.kind}:${f.message.replace(/\d+/g, "#").slice(0, 200)}`;
    if (!seen.has(key)) report.findings.push(f);
    seen.add(key);
  };
  for (let i = 0; i < count; i++) {
    const input = i < target.seeds.length
      ? target.seeds[i]
      : (target.mutate ?? mutate)(rng, target.seeds);
    const t0 = performance.now();
    try {
      await target.run(input);
      report.accepted++;
    } catch (e) {
      if (!isCleanRejection(e)) {
        const err = e as Error;
        note({ kind: "crash", message: `${err?.constructor?.name}: ${err?.message ?? e}`, input });
      } else {
        report.rejected++;
        const leak = e.message.match(UNHELPFUL)?.[0];
        // Quoting the input back ("got NaN" for a NaN in the file) is fine; inventing it is not.
        if (leak && !new TextDecoder().decode(input).includes(leak)) {
          note({ kind: "unhelpful", message: e.message, input });
        }
      }
    }
    let ms = performance.now() - t0;
    const limit = target.hangMs ?? HANG_MS;
    // A loaded machine or a collection can stall any one run: an input is a hang only when it is
    // slow every time, and its fastest time is reported.
    for (let again = 0; again < HANG_RETRIES && ms > limit; again++) {
      ms = Math.min(ms, await timeOnce(target, input));
    }
    report.slowestMs = Math.max(report.slowestMs, ms);
    if (ms > limit) {
      note({ kind: "hang", message: `${ms.toFixed(0)} ms for one input`, input });
    }
    report.inputs++;
    if (i % 256 === 0) {
      const growth = Deno.memoryUsage().rss - rss0;
      report.rssGrowthBytes = Math.max(report.rssGrowthBytes, growth);
      if (growth > ALLOC_LIMIT) {
        note({ kind: "allocation", message: `resident memory grew by ${growth} bytes`, input });
        break;
      }
    }
  }
  return report;
}

async function main(args: string[]): Promise<number> {
  const { values: v } = parseArgs({
    args,
    options: {
      count: { type: "string", default: "100000" },
      seed: { type: "string", default: "1" },
      target: { type: "string" },
      work: { type: "string" },
      help: { type: "boolean", short: "h" },
    },
  });
  if (v.help) {
    console.log("usage: deno task fuzz [--count N] [--seed S] [--target NAME] [--work DIR]");
    return 0;
  }
  const work = v.work ?? Deno.makeTempDirSync({ prefix: "sluice-fuzz-" });
  const sharedDir = new URL("../../../shared/models", import.meta.url).pathname;
  let shared: string | null = sharedDir;
  try {
    Deno.statSync(join(sharedDir, "stories260k"));
  } catch {
    shared = null;
  }
  const { targets, skipped } = await makeTargets(work, shared);
  for (const s of skipped) console.error(`fuzz: ${s} skipped (no ../shared/models)`);
  let bad = 0;
  console.log(
    "| target               | inputs  | accepted | rejected | slowest ms | RSS growth | findings |",
  );
  console.log(
    "|----------------------|---------|----------|----------|------------|------------|----------|",
  );
  for (const t of targets.filter((t) => !v.target || t.name.includes(v.target))) {
    const r = await fuzzTarget(t, Number(v.count), Number(v.seed));
    console.log(
      `| ${r.target.padEnd(20)} | ${String(r.inputs).padStart(7)} | ${
        String(r.accepted).padStart(8)
      } | ` +
        `${String(r.rejected).padStart(8)} | ${r.slowestMs.toFixed(1).padStart(10)} | ` +
        `${(r.rssGrowthBytes / 2 ** 20).toFixed(0).padStart(6)} MiB | ${
          String(r.findings.length).padStart(8)
        } |`,
    );
    r.findings.forEach((f, i) => {
      const file = join(work, "findings", `${t.name.replace(/\W+/g, "_")}-${i}.bin`);
      Deno.mkdirSync(join(work, "findings"), { recursive: true });
      Deno.writeFileSync(file, f.input);
      console.log(`  ${f.kind}: ${f.message.slice(0, 300)} (input: ${file})`);
    });
    bad += r.findings.length;
  }
  for (const t of targets) await t.close?.();
  return bad ? 1 : 0;
}

if (import.meta.main) Deno.exit(await main(Deno.args));
