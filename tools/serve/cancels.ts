/**
 * Cancels the engine sees inside a forward pass (tools/serve/front.ts sets them, back.ts reads
 * them between a pass's layers).
 *
 * @module
 */

/** Slots of {@link CancelFlags}: far more than the requests the front passes on at once. */
const CANCEL_SLOTS = 4096;

/**
 * Which requests' clients went away, in shared memory: the front sets them as it learns, and the
 * engine reads them from inside a forward pass, where its worker's messages wait. Request `id`
 * is flagged in slot id mod {@link CANCEL_SLOTS} (a later id in the same slot takes it over; its
 * abort message still arrives).
 */
export class CancelFlags {
  readonly flags: Int32Array<SharedArrayBuffer>;

  constructor(buffer = new SharedArrayBuffer(CANCEL_SLOTS * 4)) {
    this.flags = new Int32Array(buffer);
  }

  /** Flags request `id` as cancelled. */
  set(id: number): void {
    Atomics.store(this.flags, id % this.flags.length, id);
  }

  /** Whether request `id` is flagged. */
  has(id: number): boolean {
    return Atomics.load(this.flags, id % this.flags.length) === id;
  }
}
