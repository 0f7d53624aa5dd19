/**
 * A block reader for ordering tests: its reads land only when waited on (or, after
 * {@link HeldReader.release}, when polled), so what is queued stays queued as on a slow disk.
 * Given an arena, a landing read writes 0xAB over its destination, so a test can see where it went.
 *
 * @module
 */
import type { Arena } from "../engine/arena.ts";
import type { BlockReader, ReadTicket } from "../io/reader.ts";

/** See the module doc. */
export class HeldReader implements BlockReader {
  readonly kind = "fallback";
  readonly threads = 1;
  #next = 0;
  #free = false;
  /** Reads in flight by id: destination offset and length. */
  readonly pending = new Map<number, [number, number]>();
  /** Every read submitted, in order: destination offset and length. */
  readonly submitted: [number, number][] = [];
  /** Most reads in flight at once. */
  most = 0;
  readonly #arena: Arena | null;

  constructor(arena: Arena | null = null) {
    this.#arena = arena;
  }
  /** From now on a poll lands the read it asks about. */
  release(): void {
    this.#free = true;
  }
  open(): number {
    return 0;
  }
  size(): number {
    return 1 << 40;
  }
  submit(_h: number, at: number, length: number): ReadTicket {
    const id = this.#next++;
    this.pending.set(id, [at, length]);
    this.submitted.push([at, length]);
    this.most = Math.max(this.most, this.pending.size);
    return { id };
  }
  wait(t: ReadTicket): void {
    const r = this.pending.get(t.id);
    if (r && this.#arena) this.#arena.u8(r[0], r[1]).fill(0xab);
    this.pending.delete(t.id);
  }
  poll(t: ReadTicket): boolean {
    if (this.#free) this.wait(t);
    return !this.pending.has(t.id);
  }
  reprioritize(): boolean {
    return false;
  }
  cancel(): boolean {
    return false;
  }
  diskStats(): null {
    return null;
  }
  read(): void {}
  closeFile(): void {}
  close(): void {}
}
