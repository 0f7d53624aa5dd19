/**
 * `deno task test` (and `test:llamacpp`): type-checks the project once ({@link CHECKED}, what CI
 * checks, the worker modules included), then runs `deno test -A --parallel --no-check` over the
 * given files (default tests/) and ends with one line saying how many tests skipped and why, from
 * the reasons the test modules record (tests/skips.ts) and the JUnit report's skipped count.
 * Exits with the check's code if it fails, else the test run's. `--serial` runs the modules one
 * after the other (the llama.cpp comparisons: two modules installing node-llama-cpp into one
 * folder at once break npm's install).
 *
 * Checked inside `deno test`, each worker a test starts (a model's compute pool, pack's block
 * writer, ...) type-checks its module again: 576 checks of 1 to 2 s of CPU each in one run of the
 * suite (docs/PERFORMANCE.md). One check up front covers the same code.
 *
 * @module
 */
import { existsSync } from "node:fs";

/** What the one type check covers: the same as CI's `deno check`. */
export const CHECKED: readonly string[] = ["mod.ts", "engine", "io", "wasm", "tools", "tests"];

/** The summary line: "skipped 12 of 380 tests: 10 need ../shared/models, 2 need tmux". */
export function skipSummary(total: number, skipped: number, reasons: readonly string[]): string {
  if (skipped === 0) return `no test of ${total} skipped`;
  const counts = new Map<string, number>();
  for (const r of reasons) counts.set(r, (counts.get(r) ?? 0) + 1);
  const parts = [...counts].sort((a, b) => b[1] - a[1]).map(([r, n]) => `${n} ${r}`);
  // A module can skip without recording why (or record more reasons than tests it registers).
  const known = reasons.length;
  if (skipped > known) parts.push(`${skipped - known} for other reasons (marked "ignored" above)`);
  return `skipped ${skipped} of ${total} tests: ${parts.join(", ")}`;
}

/** Test and skipped counts of a Deno JUnit report. */
export function junitCounts(xml: string): { total: number; skipped: number } {
  const total = Number(/<testsuites [^>]*\btests="(\d+)"/.exec(xml)?.[1] ?? 0);
  const skipped = xml.match(/<skipped\s*\/>/g)?.length ?? 0;
  return { total, skipped };
}

/**
 * The `n` test files whose tests took longest in a Deno JUnit report, with their summed test
 * times in seconds, slowest first. (In a parallel run the files overlap, so the sums add up to
 * more than the run's wall time.)
 */
export function slowestFiles(xml: string, n: number): { file: string; seconds: number }[] {
  const sums = new Map<string, number>();
  for (const m of xml.matchAll(/<testcase\b[^>]*\bclassname="([^"]*)"[^>]*\btime="([\d.]+)"/g)) {
    sums.set(m[1], (sums.get(m[1]) ?? 0) + Number(m[2]));
  }
  return [...sums].map(([file, seconds]) => ({ file: file.replace(/^\.\//, ""), seconds }))
    .sort((a, b) => b.seconds - a.seconds).slice(0, n);
}

if (import.meta.main) {
  const check = await new Deno.Command(Deno.execPath(), { args: ["check", ...CHECKED] }).spawn()
    .status;
  if (!check.success) Deno.exit(check.code);
  const dir = Deno.makeTempDirSync({ prefix: "sluice-test-" });
  const log = `${dir}/skips.log`;
  const junit = `${dir}/junit.xml`;
  Deno.writeTextFileSync(log, "");
  const args = Deno.args.filter((a) => a !== "--serial");
  const parallel = args.length === Deno.args.length ? ["--parallel"] : [];
  // Files or folders given (not a flag's value, such as --filter's): else every test.
  const files = args.some((a) => !a.startsWith("-") && existsSync(a)) ? [] : ["tests/"];
  const run = await new Deno.Command(Deno.execPath(), {
    args: ["test", "-A", "--no-check", ...parallel, `--junit-path=${junit}`, ...args, ...files],
    env: { SLUICE_SKIP_LOG: log },
    stdin: "null",
  }).spawn().status;
  try {
    const xml = Deno.readTextFileSync(junit);
    const { total, skipped } = junitCounts(xml);
    const reasons = Deno.readTextFileSync(log).split("\n").filter((l) => l !== "");
    const slow = slowestFiles(xml, 5).map((f) => `${f.file} ${f.seconds.toFixed(0)} s`);
    if (slow.length > 0) console.log(`slowest files: ${slow.join(", ")}`);
    console.log(skipSummary(total, skipped, reasons));
  } catch {
    // No report: the run failed before any test (its error is above).
  }
  Deno.removeSync(dir, { recursive: true });
  Deno.exit(run.code);
}
