/**
 * Reads the tensors a pack keeps in their dtype straight into its staging slots, refusing NaN and
 * infinity. The reads run on the C I/O shim's reader threads (io/shim.ts, through the page cache:
 * safetensors offsets are not block-aligned), in pieces of {@link PIECE_BYTES}, and the pack's
 * thread scans each piece with the SIMD kernel as it lands while the next ones are read. So the
 * page-cache copy, the largest cost of the pack's thread once the scan was SIMD (docs/
 * PERFORMANCE.md, "Pack against the disk"), runs beside it. Where the shim cannot run (or with
 * `SLUICE_IO=fallback`), io/reader.ts's node:fs reader does the same reads on the pack's thread;
 * `SLUICE_IO=direct` does not apply, since the offsets are not aligned. Bytes outside the slots
 * are read with the checkpoint's own reads.
 *
 * @module
 */

import { type BlockReader, openReader, type ReadTicket } from "../../io/reader.ts";
import { ShimReader } from "../../io/shim.ts";
import { type Checkpoint, DTYPE_BYTES, type TensorInfo } from "../../io/safetensors.ts";
import { checkFinite, type FiniteScan } from "./finite.ts";

/** Bytes per read: small enough that the first lands soon, large enough to cost little each. */
export const PIECE_BYTES = 1 << 20;

/** Reader threads: two copies at once, on the two cores the pack shares with its writer. */
const THREADS = 2;

/** One in-place read of a kept tensor range (see the module text). */
export class KeptReader {
  readonly #ckpt: Checkpoint;
  readonly #memory: WebAssembly.Memory;
  readonly #scan: FiniteScan;
  readonly #reader: BlockReader;
  readonly #handles = new Map<string, number>();

  /** Which reader fills the slots: "shim-buffered" (the reader threads) or "fallback". */
  get kind(): BlockReader["kind"] {
    return this.#reader.kind;
  }

  /**
   * Reads `ckpt` into `memory`, the staging memory whose kernel `scan` is; on the pack's thread
   * through node:fs with `forceFallback` (as `SLUICE_IO=fallback` asks).
   */
  constructor(
    ckpt: Checkpoint,
    memory: WebAssembly.Memory,
    scan: FiniteScan,
    forceFallback = false,
  ) {
    this.#ckpt = ckpt;
    this.#memory = memory;
    this.#scan = scan;
    const opts = { threads: THREADS, direct: false, quiet: true, forceFallback };
    const reader = openReader(memory, opts);
    if (reader.kind === "shim-direct") {
      reader.close();
      this.#reader = new ShimReader(memory, opts);
    } else {
      this.#reader = reader;
    }
  }

  /**
   * Reads `dst.length` bytes of tensor `src` from byte `at` into `dst`, as the container keeps
   * them (its dtype unchanged), and throws naming the tensor and element on a NaN or infinity.
   */
  read(src: TensorInfo, at: number, dst: Uint8Array): void {
    const what = `${src.file}: tensor ${src.name}`;
    const width = DTYPE_BYTES[src.dtype];
    if (!Number.isSafeInteger(at) || at < 0 || at + dst.length > src.bytes) {
      throw new Error(`${what}: range [${at}, ${at + dst.length}) outside its ${src.bytes} bytes`);
    }
    if (dst.buffer !== this.#memory.buffer) {
      this.#ckpt.readRangeInto(src.name, at, dst);
      checkFinite(dst, src.dtype, what, at / width, this.#scan);
      return;
    }
    const reader = this.#reader;
    const tickets: ReadTicket[] = [];
    try {
      const h = this.#handle(src.file);
      for (let o = 0; o < dst.length; o += PIECE_BYTES) {
        const n = Math.min(PIECE_BYTES, dst.length - o);
        tickets.push(reader.submit(h, dst.byteOffset + o, n, src.offset + at + o));
      }
      for (const [i, t] of tickets.entries()) {
        reader.wait(t);
        const o = i * PIECE_BYTES;
        const piece = dst.subarray(o, o + PIECE_BYTES);
        checkFinite(piece, src.dtype, what, (at + o) / width, this.#scan);
      }
    } catch (e) {
      // The slot must not be written behind the failure: reap every read still in flight.
      for (const t of tickets) {
        try {
          reader.wait(t);
        } catch {
          // The first failure is the one to report.
        }
      }
      if ((e as Error).message.startsWith(what)) throw e;
      throw new Error(`${what}: ${(e as Error).message}`);
    }
  }

  /** Closes the files opened so far: the caller may replace them before the next read. */
  closeFiles(): void {
    for (const h of this.#handles.values()) this.#reader.closeFile(h);
    this.#handles.clear();
  }

  /** Joins the reader threads and closes every file. */
  close(): void {
    this.#reader.close();
    this.#handles.clear();
  }

  #handle(file: string): number {
    let h = this.#handles.get(file);
    if (h === undefined) {
      h = this.#reader.open(file);
      this.#handles.set(file, h);
    }
    return h;
  }
}
