/**
 * The arena: one shared wasm64 memory that holds everything big (scratch, KV cache, trunk layers,
 * expert slots). Sized once up front: a `memory.grow` by one thread is not seen by kernels running
 * on another until they return (PLATFORM.md §7), so sluice never grows it.
 *
 * @module
 */
import { alignUp } from "../io/format.ts";
import { createArenaMemory, KERNEL_RESERVED_BYTES } from "../wasm/mod.ts";

/** Alignment that O_DIRECT reads need for destination, length and file offset. */
export const PAGE = 4096;

/** One named allocation, kept for the memory report. */
export interface ArenaRegion {
  name: string;
  offset: number;
  bytes: number;
}

/**
 * A bump allocator over the shared memory. Regions are never freed one by one: the engine plans
 * its memory once (resident trunk, ring slots, expert slots, KV cache, scratch) and allocates it
 * at start-up, so a free list would only add ways to fragment.
 */
export class Arena {
  /** The shared memory every worker instantiates the kernels on. */
  readonly memory: WebAssembly.Memory;
  /** Total bytes of the memory (of a lent view: the end of its room). */
  readonly capacity: number;
  readonly regions: ArenaRegion[] = [];
  #top: number;

  /**
   * Creates an arena of `bytes` in all (rounded up to 64 KiB pages), the kernels' reserved low
   * region included, so a memory plan's total is exactly what the process commits; with `lent`,
   * a view of `bytes` of that memory from its offset (see {@link within}).
   */
  constructor(bytes: number, lent?: { memory: WebAssembly.Memory; offset: number }) {
    if (lent) {
      this.capacity = lent.offset + bytes;
      this.memory = lent.memory;
      this.#top = lent.offset;
      return;
    }
    this.capacity = alignUp(Math.max(bytes, KERNEL_RESERVED_BYTES + PAGE), 65536);
    this.memory = createArenaMemory(this.capacity);
    this.#top = alignUp(KERNEL_RESERVED_BYTES, PAGE);
  }

  /**
   * A bump allocator over `bytes` of this arena's memory from `offset` (page-aligned), for room
   * that is not always the caller's (the MTP layer's, lent by the expert cache): it allocates
   * from `offset` up, and its regions are not zero-filled.
   */
  within(offset: number, bytes: number): Arena {
    if (offset % PAGE !== 0 || offset + bytes > this.capacity) {
      throw new Error(`arena: cannot lend [${offset}, ${offset + bytes}) of ${this.capacity}`);
    }
    return new Arena(bytes, { memory: this.memory, offset });
  }

  /** Bytes handed out so far, including the reserved low region. */
  get used(): number {
    return this.#top;
  }

  /** Bytes still free. */
  get free(): number {
    return this.capacity - this.#top;
  }

  /**
   * Allocates `bytes` (rounded up to `align`) at an `align`-aligned offset; zero-filled (in a
   * lent view: as the lender left it).
   */
  alloc(name: string, bytes: number, align = PAGE): number {
    const offset = alignUp(this.#top, align);
    const size = alignUp(Math.max(bytes, 1), align);
    if (offset + size > this.capacity) {
      throw new Error(
        `arena: cannot allocate ${name} (${size} bytes): ${this.capacity - offset} of ` +
          `${this.capacity} bytes left; the memory plan is wrong`,
      );
    }
    this.#top = offset + size;
    this.regions.push({ name, offset, bytes: size });
    return offset;
  }

  /** A Float32Array view of `n` floats at byte offset `off`. */
  f32(off: number, n: number): Float32Array {
    return new Float32Array(this.memory.buffer, off, n);
  }

  /** An Int32Array view of `n` ints at byte offset `off`. */
  i32(off: number, n: number): Int32Array {
    return new Int32Array(this.memory.buffer, off, n);
  }

  /** A byte view of `n` bytes at byte offset `off`. */
  u8(off: number, n: number): Uint8Array {
    return new Uint8Array(this.memory.buffer, off, n);
  }
}
