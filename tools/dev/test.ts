/**
 * `deno task test` (and `test:llamacpp`): runs `deno test -A --parallel` over the given files
 * (default tests/) and ends with one line saying how many tests skipped and why, from the reasons
 * the test modules record (tests/skips.ts) and the JUnit report's skipped count. Exits with the
 * test run's code. `--serial` runs the modules one after the other (the llama.cpp comparisons:
 * two modules installing node-llama-cpp into one folder at once break npm's install).
 *
 * @module
 */
import { existsSync } from "node:fs";

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

if (import.meta.main) {
  const dir = Deno.makeTempDirSync({ prefix: "sluice-test-" });
  const log = `${dir}/skips.log`;
  const junit = `${dir}/junit.xml`;
  Deno.writeTextFileSync(log, "");
  const args = Deno.args.filter((a) => a !== "--serial");
  const parallel = args.length === Deno.args.length ? ["--parallel"] : [];
  // Files or folders given (not a flag's value, such as --filter's): else every test.
  const files = args.some((a) => !a.startsWith("-") && existsSync(a)) ? [] : ["tests/"];
  const run = await new Deno.Command(Deno.execPath(), {
    args: ["test", "-A", ...parallel, `--junit-path=${junit}`, ...args, ...files],
    env: { SLUICE_SKIP_LOG: log },
    stdin: "null",
  }).spawn().status;
  try {
    const { total, skipped } = junitCounts(Deno.readTextFileSync(junit));
    const reasons = Deno.readTextFileSync(log).split("\n").filter((l) => l !== "");
    console.log(skipSummary(total, skipped, reasons));
  } catch {
    // No report: the run failed before any test (its error is above).
  }
  Deno.removeSync(dir, { recursive: true });
  Deno.exit(run.code);
}
