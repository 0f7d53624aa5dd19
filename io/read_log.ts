/**
 * A log of the reads a run issues, and their replay. {@link logReads} wraps a {@link BlockReader}
 * so that every submit (file, offset, length, arena offset, priority, the position of the forward
 * call that issued it) and every reap (the first wait, or the first poll that found it done) lands
 * in a {@link ReadLog}; without a log the reader is returned unwrapped, so logging costs nothing
 * when off. {@link replayReads} then issues exactly those reads again, in the same order of
 * submits and reaps, through a reader of the same kind and threads with nothing computed in between: the time
 * the run's own reads need from the disk, its I/O roofline.
 *
 * @module
 */

import { type BlockReader, openReader, type ReadPriority, type ReadTicket } from "./reader.ts";
import { sharedMemory64 } from "../wasm/mod.ts";

/** One logged read. */
export interface LoggedRead {
  /** Index into {@link ReadLogData.files}. */
  file: number;
  offset: number;
  length: number;
  arenaOffset: number;
  priority: ReadPriority;
  /** Position of the forward call that issued it (-1: while opening the model). */
  position: number;
  /** Withdrawn before it started (a lookahead guess its layer did not use): never read. */
  cancelled?: boolean;
}

/** A read log as plain data (what a child process can send back as JSON). */
export interface ReadLogData {
  /** Kind of the reader that was logged. */
  kind: BlockReader["kind"] | null;
  /** Its reader threads (reads in flight at the disk). */
  threads: number;
  files: string[];
  reads: LoggedRead[];
  /** Submits and reaps in the order they happened: read r's submit is `r`, its reap `~r`. */
  events: number[];
}

/** Collects the reads of a reader wrapped by {@link logReads}. */
export class ReadLog implements ReadLogData {
  kind: BlockReader["kind"] | null = null;
  threads = 0;
  files: string[] = [];
  reads: LoggedRead[] = [];
  events: number[] = [];
  /** Position stamped on the reads submitted from now on (Model.forward sets it). */
  position = -1;
  readonly #fileIndex = new Map<string, number>();

  /** A log holding `data` (e.g. parsed from JSON). */
  static from(data: ReadLogData): ReadLog {
    const log = new ReadLog();
    log.kind = data.kind;
    log.threads = data.threads;
    log.files = [...data.files];
    log.reads = [...data.reads];
    log.events = [...data.events];
    log.files.forEach((f, i) => log.#fileIndex.set(f, i));
    return log;
  }

  /** Index of `path` in {@link files}, added on first use. */
  fileIndex(path: string): number {
    let i = this.#fileIndex.get(path);
    if (i === undefined) {
      i = this.files.push(path) - 1;
      this.#fileIndex.set(path, i);
    }
    return i;
  }

  /** The plain data, for JSON. */
  toJSON(): ReadLogData {
    return {
      kind: this.kind,
      threads: this.threads,
      files: this.files,
      reads: this.reads,
      events: this.events,
    };
  }
}

/**
 * Reads submitted at positions in [from, to) and not withdrawn, their bytes and the positions they
 * span.
 */
export function readsIn(
  log: ReadLogData,
  from = 0,
  to = Infinity,
): { reads: number; bytes: number; positions: number } {
  let reads = 0, bytes = 0;
  const positions = new Set<number>();
  for (const r of log.reads) {
    if (r.position < from || r.position >= to || r.cancelled) continue;
    reads++;
    bytes += r.length;
    positions.add(r.position);
  }
  return { reads, bytes, positions: positions.size };
}

class LoggingReader implements BlockReader {
  readonly kind: BlockReader["kind"];
  readonly threads: number;
  readonly #inner: BlockReader;
  readonly #log: ReadLog;
  readonly #paths = new Map<number, number>();
  /** Logged read index of each ticket not yet reaped. */
  readonly #pending = new Map<ReadTicket, number>();

  constructor(inner: BlockReader, log: ReadLog) {
    this.#inner = inner;
    this.#log = log;
    this.kind = inner.kind;
    this.threads = inner.threads;
    log.kind = inner.kind;
    log.threads = inner.threads;
  }

  open(path: string): number {
    const h = this.#inner.open(path);
    this.#paths.set(h, this.#log.fileIndex(path));
    return h;
  }

  size(handle: number): number {
    return this.#inner.size(handle);
  }

  submit(
    handle: number,
    arenaOffset: number,
    length: number,
    fileOffset: number,
    priority: ReadPriority = 0,
  ): ReadTicket {
    const t = this.#inner.submit(handle, arenaOffset, length, fileOffset, priority);
    const log = this.#log;
    const r = log.reads.push({
      file: this.#paths.get(handle)!,
      offset: fileOffset,
      length,
      arenaOffset,
      priority,
      position: log.position,
    }) - 1;
    log.events.push(r);
    this.#pending.set(t, r);
    return t;
  }

  #reaped(t: ReadTicket): void {
    const r = this.#pending.get(t);
    if (r === undefined) return;
    this.#pending.delete(t);
    this.#log.events.push(~r);
  }

  wait(t: ReadTicket): void {
    try {
      this.#inner.wait(t);
    } finally {
      this.#reaped(t);
    }
  }

  poll(t: ReadTicket): boolean {
    let done = true;
    try {
      done = this.#inner.poll(t);
    } finally {
      if (done) this.#reaped(t);
    }
    return done;
  }

  reprioritize(t: ReadTicket, priority: ReadPriority): boolean {
    const moved = this.#inner.reprioritize(t, priority);
    const r = this.#pending.get(t);
    // A promoted guess is replayed in the class it was read in.
    if (moved && r !== undefined) this.#log.reads[r].priority = priority;
    return moved;
  }

  cancel(t: ReadTicket): boolean {
    const withdrawn = this.#inner.cancel(t);
    const r = this.#pending.get(t);
    if (withdrawn && r !== undefined) {
      this.#pending.delete(t);
      this.#log.reads[r].cancelled = true;
    }
    return withdrawn;
  }

  diskStats(): ReturnType<BlockReader["diskStats"]> {
    return this.#inner.diskStats();
  }

  read(handle: number, arenaOffset: number, length: number, fileOffset: number): void {
    this.wait(this.submit(handle, arenaOffset, length, fileOffset));
  }

  closeFile(handle: number): void {
    this.#inner.closeFile(handle);
    this.#paths.delete(handle);
  }

  close(): void {
    this.#inner.close();
  }
}

/** `reader`, logging every submit and reap into `log`; `reader` itself when `log` is undefined. */
export function logReads(reader: BlockReader, log: ReadLog | undefined): BlockReader {
  return log === undefined ? reader : new LoggingReader(reader, log);
}

/** What {@link replayReads} measured. */
export interface ReplayResult {
  /** Wall time from the first submit to the last reap. */
  seconds: number;
  reads: number;
  bytes: number;
  /** Distinct positions (tokens) the replayed reads came from. */
  positions: number;
  /** Most reads in flight at once (the logged run's own most, in either mode). */
  maxInFlight: number;
  /** Kind and threads of the reader that replayed them. */
  kind: BlockReader["kind"];
  threads: number;
}

/** Options of {@link replayReads}. */
export interface ReplayOptions {
  /** Replay the reads submitted at positions in [from, to) (default: all). */
  from?: number;
  to?: number;
  /**
   * Keep the queue full instead of waiting where the run waited: submit in the logged order and
   * wait for the oldest read whenever as many are in flight as the run ever had. The run's
   * dependencies (a layer's reads wait for its router) are dropped, so this is the disk's time for
   * exactly these reads at the run's queue depth; the default, ordered replay keeps them.
   */
  queued?: boolean;
  /** The reader to replay through (default: a new one of the logged kind and threads, on a new
   * arena as large as the logged reads reach, its pages faulted in first, closed afterwards). */
  reader?: BlockReader;
  /**
   * The memory the new reader reads into instead of a new arena: the run's own, once the run is
   * done with it (its contents are overwritten). A second arena the size of the first would
   * double what a memory cap sees.
   */
  memory?: WebAssembly.Memory;
}

/**
 * Issues the logged reads submitted at positions in [from, to) again, in the logged order of
 * submits and reaps (a reap waits for its read), or `queued` at the run's most reads in flight,
 * into the same arena offsets, with nothing else in between; reads still in flight at the end are
 * waited for. Throws like the reader.
 */
export function replayReads(log: ReadLogData, opts: ReplayOptions = {}): ReplayResult {
  const from = opts.from ?? -Infinity, to = opts.to ?? Infinity;
  const keep = (r: number) =>
    log.reads[r].position >= from && log.reads[r].position < to && !log.reads[r].cancelled;
  let events = log.events.filter((e) => keep(e >= 0 ? e : ~e));
  let depth = 0;
  for (let i = 0, n = 0; i < events.length; i++) {
    depth = Math.max(depth, n += events[i] >= 0 ? 1 : -1);
  }
  if (opts.queued) events = events.filter((e) => e >= 0);
  let reader = opts.reader;
  let own = false;
  if (reader === undefined) {
    let top = 4096;
    for (const e of events) {
      if (e >= 0) top = Math.max(top, log.reads[e].arenaOffset + log.reads[e].length);
    }
    const memory = opts.memory ?? sharedMemory64(top);
    if (memory.buffer.byteLength < top) {
      throw new Error(
        `replay: the memory holds ${memory.buffer.byteLength} bytes, reads reach ${top}`,
      );
    }
    reader = openReader(memory, {
      direct: log.kind !== "shim-buffered",
      forceFallback: log.kind === "fallback",
      threads: log.threads > 0 ? log.threads : undefined,
      quiet: true,
    });
    own = true;
    // Fault the pages in before the clock starts: the run's decode found its slots touched by
    // the prefill, and faults inside the reads would charge the replay for what the run never paid.
    if (!opts.memory) new Uint8Array(memory.buffer).fill(0);
  }
  const handles = new Map<number, number>();
  const tickets = new Map<number, ReadTicket>();
  let bytes = 0, reads = 0, maxInFlight = 0;
  const positions = new Set<number>();
  try {
    for (const e of events) {
      const r = log.reads[e >= 0 ? e : ~e];
      if (!handles.has(r.file)) handles.set(r.file, reader.open(log.files[r.file]));
    }
    const t0 = performance.now();
    for (const e of events) {
      if (e >= 0) {
        const r = log.reads[e];
        tickets.set(
          e,
          reader.submit(handles.get(r.file)!, r.arenaOffset, r.length, r.offset, r.priority),
        );
        bytes += r.length;
        reads++;
        positions.add(r.position);
        maxInFlight = Math.max(maxInFlight, tickets.size);
        if (opts.queued && tickets.size >= depth) {
          const [oldest, t] = tickets.entries().next().value!;
          tickets.delete(oldest);
          reader.wait(t);
        }
      } else {
        const t = tickets.get(~e);
        if (t === undefined) continue;
        tickets.delete(~e);
        reader.wait(t);
      }
    }
    for (const t of tickets.values()) reader.wait(t);
    tickets.clear();
    const seconds = (performance.now() - t0) / 1000;
    return {
      seconds,
      reads,
      bytes,
      positions: positions.size,
      maxInFlight,
      kind: reader.kind,
      threads: reader.threads,
    };
  } finally {
    for (const t of tickets.values()) {
      try {
        reader.wait(t);
      } catch {
        // Already failing: the first error is the one thrown.
      }
    }
    if (own) reader.close();
    else for (const h of handles.values()) reader.closeFile(h);
  }
}
