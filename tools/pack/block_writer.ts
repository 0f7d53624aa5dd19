/**
 * Large, block-aligned sequential writes for the packer, done behind its back. Buffered writes on
 * the test machine's virtual disk ran at 186 MB/s (dirty-page throttling) against 1.4 GB/s with
 * O_DIRECT (docs/PERFORMANCE.md, "Pack against the disk"), and the pack's reads waited on the disk
 * too. So the packer fills 4 KiB-aligned staging slots of {@link STAGE_BYTES} in shared memory and
 * a worker thread (block_write_worker.ts) writes each full slot with O_DIRECT while the pack's
 * thread reads and encodes into the next one. The slots live in a shared WebAssembly.Memory, so
 * the NaN / infinity scan of what is read into them runs as a SIMD kernel in place
 * (tools/pack/finite.ts). Where O_DIRECT is refused (tmpfs, some FUSE mounts) or the slots'
 * address cannot be learnt (no FFI permission), the same writes go through the page cache. The
 * bytes written are the same either way.
 *
 * @module
 */

import { BLOCK_ALIGN } from "../../io/format.ts";
import {
  instantiateKernels,
  KERNEL_RESERVED_BYTES,
  loadKernelModule,
  sharedMemory64,
} from "../../wasm/mod.ts";
import { FiniteScan } from "./finite.ts";

/** Bytes per staging slot: large enough that a write's fixed cost is lost in it. */
export const STAGE_BYTES = 16 << 20;

/** Staging slots: one being filled while the others are written. */
const SLOTS = 3;
/** Control word counting finished closes (after the slot states 0..SLOTS-1). */
export const CTL_DONE = SLOTS;
/** Control word set to 1 by the worker on its first failure. */
export const CTL_ERROR = SLOTS + 1;

/** The first message to the worker: the shared memory. */
export interface WriterSetup {
  control: SharedArrayBuffer;
  stages: SharedArrayBuffer;
  stageOffset: number;
  stageBytes: number;
  errorBuffer: SharedArrayBuffer;
}

/** The worker's requests, served in order. */
export type WriteRequest =
  | { op: "open"; id: number; path: string; create: boolean; direct: boolean }
  | { op: "write"; id: number; slot: number; len: number; pos: number }
  | { op: "close"; id: number; sync: boolean };

/**
 * The write-behind thread of one pack and its staging slots, each at least `slotBytes`. Open files
 * through {@link PackWriter.file}, wait for the ones ended with {@link PackWriter.settle} before
 * recording them as done; {@link PackWriter.close} ends the thread. Made by
 * {@link PackWriter.open}.
 */
export class PackWriter {
  readonly #worker: Worker;
  readonly #ctl: Int32Array;
  readonly #error: SharedArrayBuffer;
  readonly #stages: Uint8Array[];
  /** Whether the slots are block-aligned, so O_DIRECT may be asked for. */
  readonly aligned: boolean;
  #next = 0;
  #ids = 0;
  /** Closes asked of the worker so far. */
  #closes = 0;
  #scan: FiniteScan | null = null;
  /** The shared memory the slots live in. */
  readonly memory: WebAssembly.Memory;

  /**
   * Starts the worker and the kernels' instantiation side by side, and returns once both can take
   * work (the worker queues what it is sent before it has loaded).
   */
  static async open(slotBytes = STAGE_BYTES): Promise<PackWriter> {
    const module = loadKernelModule();
    const stageBytes = Math.ceil(Math.max(slotBytes, BLOCK_ALIGN) / BLOCK_ALIGN) * BLOCK_ALIGN;
    // The kernels' own data sits below KERNEL_RESERVED_BYTES; the slots go above it.
    const memory = sharedMemory64(KERNEL_RESERVED_BYTES + SLOTS * stageBytes + BLOCK_ALIGN);
    const writer = new PackWriter(memory, stageBytes);
    try {
      writer.#scan = new FiniteScan(memory, await instantiateKernels(await module, memory));
    } catch (e) {
      writer.close();
      throw e;
    }
    return writer;
  }

  private constructor(memory: WebAssembly.Memory, stageBytes: number) {
    this.memory = memory;
    const stages = memory.buffer as SharedArrayBuffer;
    let stageOffset = KERNEL_RESERVED_BYTES;
    try {
      const p = Deno.UnsafePointer.of(new Uint8Array(stages));
      const addr = Number(Deno.UnsafePointer.value(p) % BigInt(BLOCK_ALIGN));
      stageOffset += (BLOCK_ALIGN - addr) % BLOCK_ALIGN;
      this.aligned = true;
    } catch {
      this.aligned = false;
    }
    this.#stages = Array.from(
      { length: SLOTS },
      (_, i) => new Uint8Array(stages, stageOffset + i * stageBytes, stageBytes),
    );
    const control = new SharedArrayBuffer(4 * (CTL_ERROR + 1));
    this.#ctl = new Int32Array(control);
    this.#error = new SharedArrayBuffer(4096);
    this.#worker = new Worker(new URL("./block_write_worker.ts", import.meta.url).href, {
      type: "module",
    });
    const setup: WriterSetup = {
      control,
      stages,
      stageOffset,
      stageBytes,
      errorBuffer: this.#error,
    };
    this.#worker.postMessage(setup);
  }

  /** The NaN / infinity scan of the slots, in place. */
  get scan(): FiniteScan {
    return this.#scan!;
  }

  /** Bytes per slot. */
  get slotBytes(): number {
    return this.#stages[0].length;
  }

  /**
   * A writer of `path` (created and truncated when `create`, else it must exist) from byte
   * `start` on.
   */
  file(path: string, start: number, create: boolean): BlockWriter {
    const id = ++this.#ids;
    const direct = this.aligned && start % BLOCK_ALIGN === 0;
    this.#send({ op: "open", id, path, create, direct });
    return new BlockWriter(this, id, path, start, direct);
  }

  /** Ends the worker; staged data not flushed is dropped. */
  close(): void {
    this.#worker.terminate();
  }

  /** @internal The next free slot, waiting for the worker if all are being written. */
  acquire(): { slot: number; buf: Uint8Array } {
    const slot = this.#next;
    this.#next = (this.#next + 1) % SLOTS;
    while (Atomics.load(this.#ctl, slot) !== 0) Atomics.wait(this.#ctl, slot, 1);
    this.check();
    Atomics.store(this.#ctl, slot, 1);
    return { slot, buf: this.#stages[slot] };
  }

  /** @internal Hands a filled slot to the worker. */
  write(id: number, slot: number, len: number, pos: number): void {
    this.#send({ op: "write", id, slot, len, pos });
  }

  /** @internal Has file `id` closed after its writes (synced first when `sync`). */
  closeFile(id: number, sync: boolean): void {
    this.#send({ op: "close", id, sync });
    this.#closes++;
  }

  /** A mark of the files ended so far, for {@link PackWriter.durable}. */
  mark(): number {
    return this.#closes;
  }

  /**
   * Whether every file ended before mark `m` is written, synced and closed, without waiting;
   * throws the worker's first failure.
   */
  durable(m: number): boolean {
    // Count first: a close the worker made after a failure (unsynced) then meets the failure.
    const done = Atomics.load(this.#ctl, CTL_DONE);
    this.check();
    return done >= m;
  }

  /**
   * Waits until every file ended so far is written, synced and closed; throws the worker's first
   * failure.
   */
  settle(): void {
    for (;;) {
      const done = Atomics.load(this.#ctl, CTL_DONE);
      if (done >= this.#closes) break;
      Atomics.wait(this.#ctl, CTL_DONE, done);
    }
    this.check();
  }

  /** @internal Throws the worker's first failure, as the error it was (code and message). */
  check(): void {
    if (!Atomics.load(this.#ctl, CTL_ERROR)) return;
    const n = new DataView(this.#error).getUint32(0, true);
    const text = new TextDecoder().decode(new Uint8Array(this.#error, 4, n).slice());
    const [code, message] = JSON.parse(text) as [string, string];
    throw Object.assign(new Error(message), code ? { code } : {});
  }

  #send(req: WriteRequest): void {
    this.#worker.postMessage(req);
  }
}

/**
 * Writes one file sequentially from byte `start` through the slots of a {@link PackWriter}. Every
 * write but the last is a whole slot; with O_DIRECT the total must be whole BLOCK_ALIGN blocks,
 * which the layout guarantees for trunk regions and bank records.
 */
export class BlockWriter {
  #slot: number;
  #stage: Uint8Array;
  #fill = 0;
  #pos: number;

  constructor(
    readonly pack: PackWriter,
    readonly id: number,
    readonly path: string,
    start: number,
    readonly direct: boolean,
  ) {
    this.#pos = start;
    ({ slot: this.#slot, buf: this.#stage } = pack.acquire());
  }

  /** Bytes a slot holds. */
  get capacity(): number {
    return this.#stage.length;
  }

  /**
   * The next `n` bytes of the file as a view of the staging slot (flushed first if they do not
   * fit), for the caller to fill in place; n ≤ {@link capacity}. The view holds earlier data.
   */
  reserve(n: number): Uint8Array {
    if (n > this.#stage.length) {
      throw new Error(`${this.path}: ${n} bytes reserved in a ${this.#stage.length}-byte slot`);
    }
    if (this.#fill + n > this.#stage.length) this.flush();
    const view = this.#stage.subarray(this.#fill, this.#fill + n);
    this.#fill += n;
    return view;
  }

  /**
   * The next min(`max`, room left) bytes of the file as a view of the staging slot (a full slot
   * is flushed first), for the caller to fill in place; max > 0.
   */
  next(max: number): Uint8Array {
    if (this.#fill === this.#stage.length) this.flush();
    const n = Math.min(max, this.#stage.length - this.#fill);
    const view = this.#stage.subarray(this.#fill, this.#fill + n);
    this.#fill += n;
    return view;
  }

  /** Appends a copy of `bytes`. */
  append(bytes: Uint8Array): void {
    for (let done = 0; done < bytes.length;) {
      const n = Math.min(bytes.length - done, this.#stage.length - this.#fill);
      this.#stage.set(bytes.subarray(done, done + n), this.#fill);
      this.#fill += n;
      done += n;
      if (this.#fill === this.#stage.length) this.flush();
    }
  }

  /** Hands what is staged to the worker and takes the next slot. */
  flush(): void {
    this.#hand();
    ({ slot: this.#slot, buf: this.#stage } = this.pack.acquire());
  }

  /**
   * Hands the rest to the worker, which then makes the file's data durable (fdatasync) and closes
   * it; {@link PackWriter.settle} waits for that.
   */
  end(): void {
    this.#hand();
    this.pack.closeFile(this.id, true);
  }

  #hand(): void {
    const n = this.#fill;
    if (this.direct && n % BLOCK_ALIGN) {
      throw new Error(
        `${this.path}: ${n} bytes at ${this.#pos} are not whole ${BLOCK_ALIGN}-byte blocks`,
      );
    }
    this.pack.write(this.id, this.#slot, n, this.#pos);
    this.#pos += n;
    this.#fill = 0;
  }

  /** Closes the file without writing what is staged (after a failure), and waits. */
  discard(): void {
    this.pack.write(this.id, this.#slot, 0, this.#pos);
    this.pack.closeFile(this.id, false);
    try {
      this.pack.settle();
    } catch {
      // The failure being handled is the one to report.
    }
  }
}
