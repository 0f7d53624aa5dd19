/**
 * Block reads from files straight into the shared wasm arena: the common interface, the checks
 * every implementation shares, and {@link openReader}, which picks the C shim (io/shim.ts) when it
 * can be built and loaded, else the pure-Deno fallback (io/fallback_reader.ts).
 *
 * @module
 */

import { FallbackReader } from "./fallback_reader.ts";
import { ShimReader, shimUnavailable } from "./shim.ts";

/**
 * Reader threads by default. Replaying a decode's own reads on the shared virtio disk moved
 * 1.06-1.5× more bytes per second with 4 threads than with 2 (NVMe wants a deeper queue still).
 */
export const DEFAULT_READER_THREADS = 4;

/** Alignment O_DIRECT needs for arena offset, length and file offset. */
export const DIRECT_ALIGN = 4096;

/** A read in flight; pass it back to the reader that issued it. */
export interface ReadTicket {
  /** Unique among the reader's reads in flight. */
  readonly id: number;
}

/**
 * How urgent a read is: the forward pass waits for DEMAND reads now; AHEAD reads (the next trunk
 * layer, hinted experts) are needed soon; SPECULATIVE reads (the lookahead) may be wasted, so they
 * must never delay the others.
 */
export const ReadPriority = { DEMAND: 0, AHEAD: 1, SPECULATIVE: 2 } as const;

/** One of {@link ReadPriority}'s values. */
export type ReadPriority = typeof ReadPriority[keyof typeof ReadPriority];

/** What a reader's threads did since it started (cumulative; compare two readings). */
export interface DiskStats {
  /** Milliseconds during which at least one read ran. */
  busyMs: number;
  /**
   * Disk time speculative reads held while a more urgent read was queued or running: all of the
   * time an urgent read waited for a thread, their share of the running reads while they ran
   * beside urgent ones (the disk's bandwidth is what they share).
   */
  blockedMs: number;
  /** Bytes of completed reads. */
  bytes: number;
  /** The reader's clock (ms) when these were taken. */
  atMs: number;
}

/** Positional file reads into the arena, several in flight at once. */
export interface BlockReader {
  /** "shim-direct": C shim bypassing the page cache; "shim-buffered": C shim through the page
   * cache; "fallback": node:fs reads on the calling thread. */
  readonly kind: "shim-direct" | "shim-buffered" | "fallback";
  /** Reads it runs at once: the shim's reader threads; 1 for the fallback. */
  readonly threads: number;
  /** Opens `path` read-only and returns a handle; throws naming the path and errno. */
  open(path: string): number;
  /** File size in bytes. */
  size(handle: number): number;
  /**
   * Starts reading `length` bytes at `fileOffset` into the arena at `arenaOffset`. Queued reads
   * start in {@link ReadPriority} order (most urgent first), oldest first within a priority.
   */
  submit(
    handle: number,
    arenaOffset: number,
    length: number,
    fileOffset: number,
    priority?: ReadPriority,
  ): ReadTicket;
  /** Blocks until the read completed; throws an Error naming errno, path, offset and length, or
   * the short count when the range runs past end of file. */
  wait(t: ReadTicket): void;
  /** True once the read completed (it is then reaped; a later wait returns at once). Throws like
   * {@link BlockReader.wait} when the read failed. */
  poll(t: ReadTicket): boolean;
  /**
   * Moves a read that has not started yet to `priority` (a guess the engine now waits for).
   * Returns whether it moved; false when it already started or finished.
   */
  reprioritize(t: ReadTicket, priority: ReadPriority): boolean;
  /**
   * Withdraws a read that has not started yet. True: it never runs and its ticket is spent (do
   * not wait on it). False: it already started or finished; wait on it as usual.
   */
  cancel(t: ReadTicket): boolean;
  /** The disk's accounting since the reader started, or null where the reader keeps none. */
  diskStats(): DiskStats | null;
  /** submit + wait. */
  read(handle: number, arenaOffset: number, length: number, fileOffset: number): void;
  /** Closes the file; throws while reads on it are still in flight. */
  closeFile(handle: number): void;
  /** Closes all files and joins the reader threads. Idempotent. */
  close(): void;
}

/** Options of {@link openReader}. */
export interface ReaderOptions {
  /** Reader threads of the shim, i.e. reads in flight at the disk (default
   * {@link DEFAULT_READER_THREADS}). */
  threads?: number;
  /** Bypass the page cache (default true). Then arena offset, length and file offset must be
   * multiples of 4096, for every reader kind, so code tested on the fallback also runs direct. */
  direct?: boolean;
  /** Use the node:fs fallback even when the shim is available. */
  forceFallback?: boolean;
  /** No notices on stderr. */
  quiet?: boolean;
}

const noticed = new Set<string>();

/** Prints a one-line notice on stderr once per process per distinct text. */
export function noticeOnce(text: string, quiet = false): void {
  if (quiet || noticed.has(text)) return;
  noticed.add(text);
  console.error(`sluice io: ${text}`);
}

/** Throws unless the request is made of non-negative safe integers, is aligned when `direct`, and
 * lies inside the arena of `arenaBytes` bytes. `what` names the file for the message. */
export function checkRequest(
  what: string,
  arenaOffset: number,
  length: number,
  fileOffset: number,
  direct: boolean,
  arenaBytes: number,
): void {
  for (
    const [name, v] of [["arena offset", arenaOffset], ["length", length], [
      "file offset",
      fileOffset,
    ]] as const
  ) {
    if (!Number.isSafeInteger(v) || v < 0) {
      throw new Error(`read of ${what}: ${name} ${v} is not a non-negative integer`);
    }
  }
  if (
    direct &&
    (arenaOffset % DIRECT_ALIGN !== 0 || length % DIRECT_ALIGN !== 0 ||
      fileOffset % DIRECT_ALIGN !== 0)
  ) {
    throw new Error(
      `read of ${what}: direct I/O needs arena offset (${arenaOffset}), length (${length}) and ` +
        `file offset (${fileOffset}) to be multiples of ${DIRECT_ALIGN}`,
    );
  }
  if (arenaOffset + length > arenaBytes) {
    throw new Error(
      `read of ${what}: arena range [${arenaOffset}, ${arenaOffset + length}) exceeds the arena ` +
        `(${arenaBytes} bytes)`,
    );
  }
}

/** The message for a read that stopped at end of file. */
export function shortReadMessage(
  path: string,
  got: number,
  length: number,
  fileOffset: number,
  fileSize: number,
): string {
  return `short read from ${path}: got ${got} of ${length} bytes at offset ${fileOffset} ` +
    `(file size ${fileSize}); reads must lie within the file`;
}

function ioOverride(): "fallback" | "buffered" | "direct" | undefined {
  let v: string | undefined;
  try {
    v = Deno.env.get("SLUICE_IO");
  } catch {
    return undefined; // no --allow-env: no override
  }
  if (v === undefined || v === "") return undefined;
  if (v === "fallback" || v === "buffered" || v === "direct") return v;
  throw new Error(`SLUICE_IO=${v}: expected one of fallback, buffered, direct`);
}

/**
 * Opens a reader that fills `memory` (the shared wasm arena). Picks the C shim with `threads`
 * reader threads (O_DIRECT / F_NOCACHE unless `direct: false`); falls back to node:fs reads, with
 * a one-line notice on stderr saying why (unless `quiet`), when the shim cannot be built or loaded
 * or the memory is not shared.
 *
 * The environment variable `SLUICE_IO` overrides the options: `fallback` forces the node:fs
 * reader, `buffered` the shim through the page cache, `direct` the shim bypassing it.
 */
export function openReader(memory: WebAssembly.Memory, opts: ReaderOptions = {}): BlockReader {
  const override = ioOverride();
  const direct = override === "buffered"
    ? false
    : override === "direct"
    ? true
    : opts.direct ?? true;
  const quiet = opts.quiet ?? false;
  if (override === "fallback" || (override === undefined && opts.forceFallback)) {
    const why = override === "fallback" ? "SLUICE_IO=fallback" : "forceFallback was requested";
    noticeOnce(`using the node:fs fallback reader (${why})`, quiet);
    return new FallbackReader(memory, direct);
  }
  const why = shimUnavailable(memory);
  if (why !== null) {
    noticeOnce(`C I/O shim not used (${why}); using the slower node:fs fallback reader`, quiet);
    return new FallbackReader(memory, direct);
  }
  return new ShimReader(memory, {
    threads: opts.threads ?? DEFAULT_READER_THREADS,
    direct,
    quiet,
  });
}

/** Runs `fn`; a failed read is rethrown with `what` (the layer or expert it was for) in front. */
function naming<T>(what: string, fn: () => T): T {
  try {
    return fn();
  } catch (e) {
    throw new Error(`${what}: ${(e as Error).message}`);
  }
}

/**
 * Waits for `tickets`; a failed read is rethrown with `what` (the layer or expert it was for) in
 * front of the reader's message, which names the file and offset. The tickets not reached stay
 * in flight for the owner's abandon().
 */
export function waitAll(reader: BlockReader, tickets: ReadTicket[], what: string): void {
  naming(what, () => {
    for (const t of tickets) reader.wait(t);
  });
}

/** Whether every one of `tickets` has landed, without waiting; a failed read throws as in waitAll. */
export function pollAll(reader: BlockReader, tickets: ReadTicket[], what: string): boolean {
  return naming(what, () => tickets.every((t) => reader.poll(t)));
}
