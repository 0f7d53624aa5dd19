/**
 * Bounds of the run options that size things (threads, prefill batch, context), checked before
 * a model loads, so a bad value is one clear line instead of minutes of work or gigabytes of RAM.
 *
 * @module
 */

/** Most prompt tokens per forward pass a run may ask for (`--prefill-chunk`). */
export const MAX_PREFILL_CHUNK = 512;

/**
 * Prompt tokens per forward pass by default; the activation buffers are sized for this batch. 128
 * rather than 64: each routed expert then sees about twice the tokens per GEMM (2 × 6 register
 * tiles instead of a tile and a GEMV remainder) and every weight, expert records included, is
 * read once per 128 prompt tokens; a 128-token prefill took 13% less CPU (docs/PERFORMANCE.md).
 */
export const DEFAULT_PREFILL_CHUNK = 128;

/**
 * Contexts of at least this many positions prefill {@link MAX_PREFILL_CHUNK} tokens per pass by
 * default: a long prompt's experts then see ~4× the tokens per GEMM and every weight is read once
 * per 512 tokens (1.2–1.3× the prefill tok/s of 128-token chunks at Qwen3-30B-A3B's width,
 * docs/PERFORMANCE.md), for activation buffers that are small beside such a context's KV cache
 * (84 against 32 MiB at that width). Shorter contexts keep 128, so interactive and served runs
 * keep their smaller passes.
 */
export const LONG_CONTEXT = 8192;

/** Largest context the KV cache may be sized for (positions). */
export const MAX_CONTEXT = 1 << 24;

function wholeNumber(v: number, what: string, min: number, max: number): number {
  if (!Number.isInteger(v) || v < min || v > max) {
    throw new Error(`${what} must be a whole number in ${min}..${max}, got ${v}`);
  }
  return v;
}

/**
 * Checks `prefillChunk` (`--prefill-chunk`) and returns it or the default for a context of `ctx`
 * positions.
 */
export function prefillChunkOf(v: number | undefined, ctx = 0): number {
  if (v === undefined) return ctx >= LONG_CONTEXT ? MAX_PREFILL_CHUNK : DEFAULT_PREFILL_CHUNK;
  return wholeNumber(v, "--prefill-chunk", 1, MAX_PREFILL_CHUNK);
}

/** Checks `ctx` (`--ctx`) when given. */
export function checkContext(v: number | undefined): void {
  if (v !== undefined) wholeNumber(v, "--ctx", 1, MAX_CONTEXT);
}

/**
 * The compute threads to start for a request of `requested` on a machine of `cores`: more than
 * the cores only makes the threads' spin-waits compete for them, so a larger request is lowered
 * to the core count with a notice (llama.cpp's habit of saying what it does with a thread count).
 */
export function threadsOf(
  requested: number | undefined,
  cores: number,
  notice: (line: string) => void,
): number {
  if (requested === undefined) return cores;
  wholeNumber(requested, "--threads", 1, Number.MAX_SAFE_INTEGER);
  if (requested <= cores) return requested;
  notice(`sluice: --threads ${requested} is more than the ${cores} cores; using ${cores}`);
  return cores;
}

/**
 * Share of expert record landings whose payload CRC is checked by default. `bench integrity`
 * measured a CRC on every landing at +53% to +110% of streaming decode time (loaded 2-core
 * machine, docs/PERFORMANCE.md), so one landing in 64 adds 0.8% to 1.7%, under the 2% allowed.
 */
export const DEFAULT_CRC_SAMPLE = 1 / 64;

/** Checks `crcSample` and returns it or the default. */
export function crcSampleOf(v: number | undefined): number {
  if (v === undefined) return DEFAULT_CRC_SAMPLE;
  if (!(v >= 0 && v <= 1)) throw new Error(`--crc-sample must be in 0..1, got ${v}`);
  return v;
}
