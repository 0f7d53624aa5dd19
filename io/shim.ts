/**
 * FFI binding of the C I/O shim (io/shim.c): reader threads that pread straight into the shared
 * wasm arena, bypassing the page cache with O_DIRECT (Linux) / F_NOCACHE (macOS). The hot path
 * (submit / poll / wait) is plain blocking FFI calls of about 0.2 µs each.
 *
 * Needs `--allow-ffi` without a path scope (`UnsafePointer.of` requires it) and `--allow-read`.
 *
 * @module
 */

import { ensureShim, shimBuildFailure } from "./build_shim.ts";
import type { BlockReader, DiskStats, ReadTicket } from "./reader.ts";
import { checkRequest, noticeOnce, ReadPriority, shortReadMessage } from "./reader.ts";

const SYMBOLS = {
  sio_open: { parameters: ["buffer", "i32"], result: "i32" },
  sio_direct_supported: { parameters: [], result: "i32" },
  sio_strerror: { parameters: ["i32"], result: "pointer" },
  sio_close: { parameters: ["i32"], result: "i32" },
  sio_file_size: { parameters: ["i32"], result: "i64" },
  sio_queue_create: { parameters: ["i32", "i32", "buffer"], result: "pointer" },
  sio_submit: { parameters: ["pointer", "i32", "u64", "u64", "i64", "i32"], result: "i64" },
  sio_poll: { parameters: ["pointer", "i64"], result: "i32" },
  sio_wait: { parameters: ["pointer", "i64"], result: "i64" },
  sio_reclass: { parameters: ["pointer", "i64", "i32"], result: "i32" },
  sio_cancel: { parameters: ["pointer", "i64"], result: "i32" },
  sio_stats: { parameters: ["pointer", "buffer"], result: "void" },
  sio_queue_destroy: { parameters: ["pointer"], result: "void" },
  sio_advise_huge: { parameters: ["u64", "u64"], result: "i32" },
} as const;

type ShimLib = Deno.DynamicLibrary<typeof SYMBOLS>["symbols"];

const EINVAL = 22;
const EAGAIN = Deno.build.os === "darwin" ? 35 : 11;

/** Unreaped reads one reader may hold; submit throws beyond it. */
const QUEUE_CAPACITY = 1024;

// One dlopen per process, never closed: closing would unload code reader threads may still run.
let loaded: ShimLib | null = null;
let loadFailure: string | null = null;

function load(): ShimLib | null {
  if (loaded !== null || loadFailure !== null) return loaded;
  const path = ensureShim();
  if (path === null) {
    loadFailure = shimBuildFailure();
    return null;
  }
  try {
    loaded = Deno.dlopen(path, SYMBOLS).symbols;
  } catch (e) {
    loadFailure = `cannot load ${path}: ${(e as Error).message}`;
  }
  return loaded;
}

/** Why a shim reader cannot serve `memory` (build, load or permission failure, memory not
 * shared), or null when it can. Builds and loads the shim on first call. */
export function shimUnavailable(memory: WebAssembly.Memory): string | null {
  if (Deno.build.os !== "linux" && Deno.build.os !== "darwin") {
    return `no shim for ${Deno.build.os}`;
  }
  if (!(memory.buffer instanceof SharedArrayBuffer)) {
    return "the arena memory is not shared, so its address may move when it grows";
  }
  if (load() === null) return loadFailure;
  try {
    Deno.UnsafePointer.of(new Uint8Array(memory.buffer, 0, 0));
  } catch (e) {
    return `no pointer to the arena (needs --allow-ffi without a path): ${(e as Error).message}`;
  }
  return null;
}

function errnoText(lib: ShimLib, negErrno: number): string {
  const err = -negErrno;
  const p = lib.sio_strerror(err);
  const text = p === null ? "unknown error" : Deno.UnsafePointerView.getCString(p);
  return `errno ${err} (${text})`;
}

interface OpenFile {
  fd: number;
  path: string;
  inFlight: number;
  /** Opened with O_DIRECT (false where the filesystem refused it). */
  direct: boolean;
}

class ShimTicket implements ReadTicket {
  settled = false;
  error: Error | null = null;
  constructor(
    readonly id: number,
    readonly raw: bigint,
    readonly owner: ShimReader,
    readonly file: OpenFile,
    readonly arenaOffset: number,
    readonly length: number,
    readonly fileOffset: number,
  ) {}
}

/** Options of {@link ShimReader}. */
export interface ShimReaderOptions {
  /** Reader threads (1-64). */
  threads: number;
  /** Bypass the page cache; requires 4 KiB-aligned requests. */
  direct: boolean;
  /** No notices on stderr. */
  quiet: boolean;
}

/** Reader backed by the C shim's thread pool. Check {@link shimUnavailable} first. */
export class ShimReader implements BlockReader {
  /** "shim-direct" when the page cache is bypassed, else "shim-buffered". */
  readonly kind: "shim-direct" | "shim-buffered";
  /** Reader threads. */
  readonly threads: number;
  readonly #lib: ShimLib;
  readonly #memory: WebAssembly.Memory;
  readonly #direct: boolean;
  readonly #quiet: boolean;
  readonly #files = new Map<number, OpenFile>();
  #queue: Deno.PointerValue;
  #base: number;
  #arenaBytes: number;
  readonly #onUnload = () => this.close();

  /** Starts the reader threads; throws when the shim is unavailable or the queue cannot start. */
  constructor(memory: WebAssembly.Memory, opts: ShimReaderOptions) {
    const why = shimUnavailable(memory);
    if (why !== null) throw new Error(`C I/O shim unavailable: ${why}`);
    const lib = loaded!;
    this.#lib = lib;
    this.#memory = memory;
    this.#direct = opts.direct && lib.sio_direct_supported() === 1;
    this.kind = this.#direct ? "shim-direct" : "shim-buffered";
    this.threads = opts.threads;
    this.#quiet = opts.quiet;
    const buf = memory.buffer;
    this.#base = Number(Deno.UnsafePointer.value(Deno.UnsafePointer.of(new Uint8Array(buf))));
    this.#arenaBytes = buf.byteLength;
    // Huge pages for the memory the reads fill; where refused, the reads run on 4 KiB pages.
    lib.sio_advise_huge(BigInt(this.#base), BigInt(this.#arenaBytes));
    const err = new Int32Array(1);
    this.#queue = lib.sio_queue_create(opts.threads, QUEUE_CAPACITY, err);
    if (this.#queue === null) {
      throw new Error(`cannot start ${opts.threads} I/O reader threads: ${errnoText(lib, err[0])}`);
    }
    // Reader threads must be joined before the process exits.
    globalThis.addEventListener("unload", this.#onUnload);
  }

  #file(handle: number): OpenFile {
    if (this.#queue === null) throw new Error("shim reader: used after close()");
    const f = this.#files.get(handle);
    if (!f) throw new Error(`shim reader: unknown file handle ${handle}`);
    return f;
  }

  /** Opens `path`; where the filesystem refuses O_DIRECT (EINVAL) it reopens buffered, with a
   * notice. Throws naming the path and errno. */
  open(path: string): number {
    if (this.#queue === null) throw new Error("shim reader: used after close()");
    if (path.includes("\0")) throw new Error(`cannot open ${JSON.stringify(path)}: NUL in path`);
    const cpath = new TextEncoder().encode(path + "\0");
    let fd = this.#lib.sio_open(cpath, this.#direct ? 1 : 0);
    let direct = this.#direct;
    if (fd === -EINVAL && this.#direct) {
      direct = false;
      fd = this.#lib.sio_open(cpath, 0);
      if (fd >= 0) {
        noticeOnce(
          `O_DIRECT refused for ${path} (EINVAL); reading it through the page cache`,
          this.#quiet,
        );
      }
    }
    if (fd < 0) throw new Error(`cannot open ${path}: ${errnoText(this.#lib, fd)}`);
    this.#files.set(fd, { fd, path, inFlight: 0, direct });
    return fd;
  }

  /** Whether the file of `handle` bypasses the page cache (its filesystem took O_DIRECT). */
  isDirect(handle: number): boolean {
    return this.#file(handle).direct;
  }

  /** File size in bytes. */
  size(handle: number): number {
    const f = this.#file(handle);
    const n = Number(this.#lib.sio_file_size(f.fd));
    if (n < 0) throw new Error(`cannot stat ${f.path}: ${errnoText(this.#lib, n)}`);
    return n;
  }

  /** Queues the read on a reader thread and returns at once. */
  submit(
    handle: number,
    arenaOffset: number,
    length: number,
    fileOffset: number,
    priority: ReadPriority = ReadPriority.DEMAND,
  ): ReadTicket {
    const f = this.#file(handle);
    if (arenaOffset + length > this.#arenaBytes) this.#arenaBytes = this.#growBase();
    checkRequest(f.path, arenaOffset, length, fileOffset, this.#direct, this.#arenaBytes);
    const dst = BigInt(this.#base + arenaOffset);
    const raw = this.#lib.sio_submit(
      this.#queue,
      f.fd,
      dst,
      BigInt(length),
      BigInt(fileOffset),
      priority,
    );
    if (raw < 0n) {
      const n = Number(raw);
      const why = n === -EAGAIN
        ? `${QUEUE_CAPACITY} reads already in flight; wait on earlier tickets first`
        : errnoText(this.#lib, n);
      throw new Error(`cannot queue read of ${f.path} at offset ${fileOffset}: ${why}`);
    }
    f.inFlight++;
    return new ShimTicket(Number(raw), raw, this, f, arenaOffset, length, fileOffset);
  }

  /** The arena size after a grow; the base address of a shared memory does not move. */
  #growBase(): number {
    const buf = this.#memory.buffer;
    const base = Number(Deno.UnsafePointer.value(Deno.UnsafePointer.of(new Uint8Array(buf))));
    if (base !== this.#base) throw new Error("shim reader: the arena moved after a grow");
    this.#lib.sio_advise_huge(
      BigInt(base + this.#arenaBytes),
      BigInt(buf.byteLength - this.#arenaBytes),
    );
    return buf.byteLength;
  }

  #ticket(t: ReadTicket): ShimTicket {
    if (!(t instanceof ShimTicket) || t.owner !== this) {
      throw new Error(`shim reader: ticket ${t.id} was not issued by this reader`);
    }
    return t;
  }

  /** Records the outcome of a reaped read: a count (maybe short) or -errno. */
  #settle(t: ShimTicket, result: number): void {
    t.settled = true;
    t.file.inFlight--;
    const where = `${t.file.path} at offset ${t.fileOffset}, length ${t.length}`;
    if (result < 0) {
      t.error = new Error(`read of ${where} failed: ${errnoText(this.#lib, result)}`);
    } else if (result !== t.length) {
      const size = Number(this.#lib.sio_file_size(t.file.fd));
      t.error = new Error(shortReadMessage(t.file.path, result, t.length, t.fileOffset, size));
    }
  }

  /** Blocks until the read completed; throws naming errno, path, offset and length. */
  wait(t: ReadTicket): void {
    const st = this.#ticket(t);
    if (!st.settled) {
      if (this.#queue === null) throw new Error("shim reader: used after close()");
      this.#settle(st, Number(this.#lib.sio_wait(this.#queue, st.raw)));
    }
    if (st.error) throw st.error;
  }

  /** True once the read completed; throws like {@link ShimReader.wait} when it failed. */
  poll(t: ReadTicket): boolean {
    const st = this.#ticket(t);
    if (!st.settled) {
      if (this.#queue === null) throw new Error("shim reader: used after close()");
      if (this.#lib.sio_poll(this.#queue, st.raw) === 0) return false;
      this.wait(st);
    }
    if (st.error) throw st.error;
    return true;
  }

  /** Moves a read that has not started to `priority`; false when it already started. */
  reprioritize(t: ReadTicket, priority: ReadPriority): boolean {
    const st = this.#ticket(t);
    if (st.settled || this.#queue === null) return false;
    return this.#lib.sio_reclass(this.#queue, st.raw, priority) === 1;
  }

  /** Withdraws a read that has not started (its ticket is then spent); false when it started. */
  cancel(t: ReadTicket): boolean {
    const st = this.#ticket(t);
    if (st.settled || this.#queue === null) return false;
    if (this.#lib.sio_cancel(this.#queue, st.raw) !== 1) return false;
    st.settled = true;
    st.file.inFlight--;
    st.error = new Error(
      `read of ${st.file.path} at offset ${st.fileOffset}, length ${st.length} was cancelled`,
    );
    return true;
  }

  /** The reader threads' disk accounting since the reader started. */
  diskStats(): DiskStats | null {
    if (this.#queue === null) return null;
    const out = new BigInt64Array(4);
    this.#lib.sio_stats(this.#queue, out);
    return {
      busyMs: Number(out[0]) / 1e6,
      blockedMs: Number(out[1]) / 1e6,
      bytes: Number(out[2]),
      atMs: Number(out[3]) / 1e6,
    };
  }

  /** submit + wait. */
  read(handle: number, arenaOffset: number, length: number, fileOffset: number): void {
    this.wait(this.submit(handle, arenaOffset, length, fileOffset));
  }

  /** Closes the file; throws while reads on it are in flight (the fd could be reused under them). */
  closeFile(handle: number): void {
    const f = this.#file(handle);
    if (f.inFlight > 0) {
      throw new Error(`cannot close ${f.path}: ${f.inFlight} reads still in flight; wait on them`);
    }
    this.#files.delete(handle);
    const r = this.#lib.sio_close(f.fd);
    if (r < 0) throw new Error(`cannot close ${f.path}: ${errnoText(this.#lib, r)}`);
  }

  /** Finishes queued reads, joins the reader threads and closes all files. Idempotent. */
  close(): void {
    if (this.#queue === null) return;
    this.#lib.sio_queue_destroy(this.#queue);
    this.#queue = null;
    globalThis.removeEventListener("unload", this.#onUnload);
    for (const f of this.#files.values()) this.#lib.sio_close(f.fd);
    this.#files.clear();
  }
}
