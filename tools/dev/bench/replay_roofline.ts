/**
 * The disk roofline of `bench stream` taken with the engine's own reads: a decode run logs every
 * read it issues (io/read_log.ts), then those reads are replayed from a dropped page cache through
 * a reader of the same kind and threads, with no compute, twice:
 * - queued: in the logged order, as many in flight as the run ever had, nothing waited for early.
 *   This is the disk's time for exactly these reads at the run's queue depth, so decode tokens ÷
 *   its seconds is the roofline tok/s;
 * - ordered: the logged order of submits and waits kept, so a layer's reads still wait where the
 *   run waited (for its router). Its time is the run's own I/O path with compute taken out.
 *
 * @module
 */

import { dropPageCache } from "../../../io/disk_probe.ts";
import { type ReadLogData, readsIn, replayReads } from "../../../io/read_log.ts";

/** One pair of replays of a decode's reads. */
export interface ReplayRoofline {
  /** Decode tokens whose reads were replayed. */
  tokens: number;
  reads: number;
  bytes: number;
  /** The queued replay: seconds, GB/s (1e9) and tokens ÷ seconds (the roofline). */
  seconds: number;
  gbps: number;
  tok_s: number;
  /** The ordered replay: seconds, GB/s and tokens ÷ seconds. */
  ordered_seconds: number;
  ordered_gbps: number;
  ordered_tok_s: number;
  /** Most reads in flight at once in the run (the queued replay's depth). */
  max_in_flight: number;
  /** Reader threads that replayed them (the run's own). */
  threads: number;
  /** Whether the page cache was dropped before each replay (root). */
  page_cache_dropped: boolean;
}

/**
 * Replays the reads `log` holds from positions ≥ `firstDecodePosition` (the `tokens` decode
 * steps; the prefill's reads are left out as the bench's counters leave them out), queued and
 * then ordered, each after a drop of the page cache, into `memory` when given (the run's own arena,
 * see {@link replayReads}). Throws when the log has no reads there.
 */
export function replayRoofline(
  log: ReadLogData,
  firstDecodePosition: number,
  tokens: number,
  memory?: WebAssembly.Memory,
): ReplayRoofline {
  const window = readsIn(log, firstDecodePosition);
  if (window.reads === 0) {
    throw new Error(`replay roofline: no reads logged from position ${firstDecodePosition} on`);
  }
  let dropped = dropPageCache();
  const q = replayReads(log, { from: firstDecodePosition, queued: true, memory });
  dropped = dropPageCache() && dropped;
  const o = replayReads(log, { from: firstDecodePosition, memory });
  return {
    tokens,
    reads: q.reads,
    bytes: q.bytes,
    seconds: q.seconds,
    gbps: q.bytes / q.seconds / 1e9,
    tok_s: tokens / q.seconds,
    ordered_seconds: o.seconds,
    ordered_gbps: o.bytes / o.seconds / 1e9,
    ordered_tok_s: tokens / o.seconds,
    max_in_flight: q.maxInFlight,
    threads: q.threads,
    page_cache_dropped: dropped,
  };
}
