/**
 * The pure-Deno reader used where the C shim cannot be built or loaded: positional node:fs reads
 * on the calling thread into a view of the arena, so every submit completes before it returns.
 *
 * @module
 */

import { closeSync, fstatSync, openSync, readSync } from "node:fs";
import type { BlockReader, ReadTicket } from "./reader.ts";
import { checkRequest, shortReadMessage } from "./reader.ts";

interface OpenFile {
  fd: number;
  path: string;
}

class FallbackTicket implements ReadTicket {
  constructor(readonly id: number, readonly owner: FallbackReader) {}
}

function describe(e: unknown): string {
  const err = e as { code?: string; errno?: number; message?: string };
  return err.code ? `errno ${err.code} (${err.message})` : String(err.message ?? e);
}

/** node:fs reader; `direct` only enforces the 4 KiB alignment that direct I/O would need. */
export class FallbackReader implements BlockReader {
  /** Always "fallback". */
  readonly kind = "fallback" as const;
  /** Reads run one at a time, on the calling thread. */
  readonly threads = 1;
  readonly #memory: WebAssembly.Memory;
  readonly #direct: boolean;
  readonly #files = new Map<number, OpenFile>();
  #nextHandle = 1;
  #nextTicket = 1;
  #closed = false;

  /** A reader filling `memory`; see {@link ReaderOptions.direct} for `direct`. */
  constructor(memory: WebAssembly.Memory, direct: boolean) {
    this.#memory = memory;
    this.#direct = direct;
  }

  #file(handle: number): OpenFile {
    if (this.#closed) throw new Error("fallback reader: used after close()");
    const f = this.#files.get(handle);
    if (!f) throw new Error(`fallback reader: unknown file handle ${handle}`);
    return f;
  }

  /** Opens `path` read-only; throws naming the path and errno. */
  open(path: string): number {
    if (this.#closed) throw new Error("fallback reader: used after close()");
    let fd: number;
    try {
      fd = openSync(path, "r");
    } catch (e) {
      throw new Error(`cannot open ${path}: ${describe(e)}`);
    }
    const handle = this.#nextHandle++;
    this.#files.set(handle, { fd, path });
    return handle;
  }

  /** File size in bytes. */
  size(handle: number): number {
    return fstatSync(this.#file(handle).fd).size;
  }

  /** Reads synchronously; the returned ticket is already complete. */
  submit(handle: number, arenaOffset: number, length: number, fileOffset: number): ReadTicket {
    this.read(handle, arenaOffset, length, fileOffset);
    return new FallbackTicket(this.#nextTicket++, this);
  }

  /** Returns at once: every read completed in submit. */
  wait(t: ReadTicket): void {
    if (!(t instanceof FallbackTicket) || t.owner !== this) {
      throw new Error(`fallback reader: ticket ${t.id} was not issued by this reader`);
    }
  }

  /** Always true: every read completed in submit. */
  poll(t: ReadTicket): boolean {
    this.wait(t);
    return true;
  }

  /** Never moves anything: every read completed in submit. */
  reprioritize(t: ReadTicket): boolean {
    this.wait(t);
    return false;
  }

  /** Never withdraws anything: every read completed in submit. */
  cancel(t: ReadTicket): boolean {
    this.wait(t);
    return false;
  }

  /** Reads run on the calling thread, so no disk time is kept apart from the caller's. */
  diskStats(): null {
    return null;
  }

  /** Reads `length` bytes at `fileOffset` into the arena at `arenaOffset`. */
  read(handle: number, arenaOffset: number, length: number, fileOffset: number): void {
    const f = this.#file(handle);
    const arena = this.#memory.buffer;
    checkRequest(f.path, arenaOffset, length, fileOffset, this.#direct, arena.byteLength);
    const view = new Uint8Array(arena, arenaOffset, length);
    let got = 0;
    while (got < length) {
      let n: number;
      try {
        n = readSync(f.fd, view, got, length - got, fileOffset + got);
      } catch (e) {
        throw new Error(
          `read of ${f.path} failed at offset ${fileOffset}, length ${length}: ${describe(e)}`,
        );
      }
      if (n === 0) {
        throw new Error(shortReadMessage(f.path, got, length, fileOffset, this.size(handle)));
      }
      got += n;
    }
  }

  /** Closes the file. */
  closeFile(handle: number): void {
    closeSync(this.#file(handle).fd);
    this.#files.delete(handle);
  }

  /** Closes all files. Idempotent. */
  close(): void {
    if (this.#closed) return;
    for (const f of this.#files.values()) closeSync(f.fd);
    this.#files.clear();
    this.#closed = true;
  }
}
