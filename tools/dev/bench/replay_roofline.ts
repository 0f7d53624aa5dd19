/**
 * The disk roofline of `bench stream` taken with the engine's own reads: a decode run logs every
 * read it issues (io/read_log.ts), then those reads are replayed from a dropped page cache through
 * a reader of the same kind, same threads, in the same order of submits and waits (so at the same
 * queue depth), with no compute. Roofline tok/s = decoded tokens ÷ replay seconds: what the run
 * would reach if compute were free and its reads took what the disk takes for them now.
 *
 * @module
 */

import { dropPageCache } from "../../../io/disk_probe.ts";
import { type ReadLogData, readsIn, replayReads } from "../../../io/read_log.ts";

/** One replay of a decode's reads. */
export interface ReplayRoofline {
  /** Decode tokens whose reads were replayed. */
  tokens: number;
  reads: number;
  bytes: number;
  seconds: number;
  /** Bytes ÷ seconds, GB/s (1e9). */
  gbps: number;
  /** Tokens ÷ seconds. */
  tok_s: number;
  /** Most reads in flight at once (the run's own queue depth). */
  max_in_flight: number;
  /** Reader threads that replayed them (the run's own). */
  threads: number;
  /** Whether the page cache was dropped first (root). */
  page_cache_dropped: boolean;
}

/**
 * Replays the reads `log` holds from positions ≥ `firstDecodePosition` (the `tokens` decode
 * steps; the prefill's reads are left out as the bench's counters leave them out), after dropping
 * the page cache. Throws when the log has no reads there.
 */
export function replayRoofline(
  log: ReadLogData,
  firstDecodePosition: number,
  tokens: number,
): ReplayRoofline {
  const window = readsIn(log, firstDecodePosition);
  if (window.reads === 0) {
    throw new Error(`replay roofline: no reads logged from position ${firstDecodePosition} on`);
  }
  const dropped = dropPageCache();
  const r = replayReads(log, { from: firstDecodePosition });
  return {
    tokens,
    reads: r.reads,
    bytes: r.bytes,
    seconds: r.seconds,
    gbps: r.bytes / r.seconds / 1e9,
    tok_s: tokens / r.seconds,
    max_in_flight: r.maxInFlight,
    threads: r.threads,
    page_cache_dropped: dropped,
  };
}
