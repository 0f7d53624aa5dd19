/**
 * The trunk ring: dense per-layer weights under a memory budget. Layers 0..n−1 are pinned at their
 * exact sizes; the rest stream through a few uniform ring slots, and while layer L computes, the
 * next unpinned layer is read on a shim thread (only with ≥ 2 slots: with one slot the read would
 * overwrite the layer being computed). The forward pass scans layers cyclically, which defeats
 * LRU, so the hit rate is exactly pinned / layers, by construction.
 *
 * @module
 */
import type { Arena } from "../arena.ts";
import type { LayerWeights, TrunkSource } from "../weights.ts";
import { bindLayer } from "../weights.ts";
import type { LayerRun } from "../../io/container.ts";
import { type BlockReader, ReadPriority, type ReadTicket, waitAll } from "../../io/reader.ts";

/** How the trunk is split between pinned layers and ring slots. */
export interface TrunkPlan {
  /** Layers 0..pinned−1 stay in the arena. */
  pinned: number;
  /** Ring slots for the other layers (0 only when every layer is pinned). */
  slots: number;
  /** Read the next unpinned layer while the current one computes. */
  readahead: boolean;
  /**
   * Called with each layer's run as it lands (pinned layers once, ring slots on every read):
   * `--verify` checks the region CRC here.
   */
  check?: (layer: number, arenaOffset: number) => void;
  /** Called with each pinned layer's bytes as it lands (load progress). */
  landed?: (bytes: number) => void;
}

/** Largest single read request: several requests keep both reader threads busy. */
const REQUEST_BYTES = 4 << 20;

/** Trunk-ring counters for the stats block. */
export interface TrunkStats {
  /** Layer visits served from a pinned layer. */
  hits: number;
  /** Layer visits to unpinned layers (read ahead, on demand, or still in their slot). */
  reads: number;
  /** Of those, visits whose layer the read-ahead had read into its slot. */
  readahead: number;
  /** Bytes read from trunk.bin. */
  bytes: number;
  /** Milliseconds the forward pass waited for trunk reads. */
  waitMs: number;
}

interface Slot {
  offset: number;
  layer: number;
  tickets: ReadTicket[];
  inUse: boolean;
  lastUse: number;
  /** Holds a layer the read-ahead read that no visit has used yet. */
  ahead: boolean;
}

/** Pinned prefix + ring slots over trunk.bin. */
export class TrunkRing implements TrunkSource {
  readonly plan: TrunkPlan;
  readonly stats: TrunkStats = { hits: 0, reads: 0, readahead: 0, bytes: 0, waitMs: 0 };
  #reader: BlockReader;
  #file: number;
  #runs: LayerRun[];
  #pinned: LayerWeights[] = [];
  #slots: Slot[] = [];
  #clock = 0;

  /** Allocates the pinned layers and ring slots in `arena` and reads the pinned layers. */
  constructor(arena: Arena, reader: BlockReader, file: number, runs: LayerRun[], plan: TrunkPlan) {
    if (plan.pinned < runs.length && plan.slots < 1) {
      throw new Error(`trunk ring: ${runs.length - plan.pinned} unpinned layers need ring slots`);
    }
    this.plan = plan;
    this.#reader = reader;
    this.#file = file;
    this.#runs = runs;
    for (let l = 0; l < plan.pinned; l++) {
      const off = arena.alloc(`trunk layer ${l} (pinned)`, runs[l].bytes);
      waitAll(reader, this.#readRun(l, off, ReadPriority.DEMAND), `trunk layer ${l}`);
      plan.check?.(l, off);
      plan.landed?.(runs[l].bytes);
      this.#pinned.push(bindLayer(l, runs[l], off));
    }
    const slotBytes = Math.max(0, ...runs.slice(plan.pinned).map((r) => r.bytes));
    for (let s = 0; s < (plan.pinned < runs.length ? plan.slots : 0); s++) {
      const offset = arena.alloc(`trunk ring slot ${s}`, slotBytes);
      this.#slots.push({ offset, layer: -1, tickets: [], inUse: false, lastUse: -1, ahead: false });
    }
  }

  #readRun(
    layer: number,
    offset: number,
    priority: ReadPriority,
    run = this.#runs[layer],
  ): ReadTicket[] {
    const tickets: ReadTicket[] = [];
    for (let o = 0; o < run.bytes; o += REQUEST_BYTES) {
      const len = Math.min(REQUEST_BYTES, run.bytes - o);
      tickets.push(this.#reader.submit(this.#file, offset + o, len, run.offset + o, priority));
    }
    this.stats.bytes += run.bytes;
    return tickets;
  }

  /** The slot holding (or reading) `layer`, or a free one, least recently used first. */
  #slotFor(layer: number): Slot {
    const own = this.#slots.find((s) => s.layer === layer);
    if (own) return own;
    let best: Slot | undefined;
    for (const s of this.#slots) {
      if (s.inUse || s.tickets.length > 0) continue;
      if (!best || s.lastUse < best.lastUse) best = s;
    }
    if (!best) throw new Error(`trunk ring: no free slot for layer ${layer}`);
    return best;
  }

  #load(slot: Slot, layer: number, priority: ReadPriority): void {
    slot.layer = layer;
    slot.tickets = this.#readRun(layer, slot.offset, priority);
    slot.ahead = priority === ReadPriority.AHEAD;
  }

  acquire(layer: number): LayerWeights {
    if (layer < this.plan.pinned) {
      this.stats.hits++;
      return this.#pinned[layer];
    }
    this.stats.reads++;
    const slot = this.#slotFor(layer);
    if (slot.layer !== layer) this.#load(slot, layer, ReadPriority.DEMAND);
    // A layer still in its slot from an earlier visit was not read ahead for this one.
    else if (slot.ahead) this.stats.readahead++;
    slot.ahead = false;
    const t0 = performance.now();
    const landed = slot.tickets.length > 0;
    waitAll(this.#reader, slot.tickets, `trunk layer ${layer}`);
    this.stats.waitMs += performance.now() - t0;
    slot.tickets = [];
    if (landed) this.plan.check?.(layer, slot.offset);
    slot.inUse = true;
    slot.lastUse = this.#clock++;
    this.#readAhead(layer);
    return bindLayer(layer, this.#runs[layer], slot.offset);
  }

  /** Starts reading the unpinned layer after `layer` (cyclically) into another slot. */
  #readAhead(layer: number): void {
    if (!this.plan.readahead || this.#slots.length < 2) return;
    const first = this.plan.pinned;
    const next = layer + 1 < this.#runs.length ? layer + 1 : first;
    if (next === layer || next < first) return;
    if (this.#slots.some((s) => s.layer === next)) return;
    const slot = this.#slotFor(next);
    this.#load(slot, next, ReadPriority.AHEAD);
  }

  release(layer: number): void {
    const slot = this.#slots.find((s) => s.layer === layer);
    if (slot) slot.inUse = false;
  }

  /**
   * Reads `run`, layer `layer`'s, which the ring does not hold (the MTP layer's), into arena room
   * at `offset` that the caller owns, waits for it, and binds it.
   */
  readInto(layer: number, run: LayerRun, offset: number): LayerWeights {
    const t0 = performance.now();
    waitAll(
      this.#reader,
      this.#readRun(layer, offset, ReadPriority.DEMAND, run),
      `trunk layer ${layer}`,
    );
    this.stats.waitMs += performance.now() - t0;
    this.plan.check?.(layer, offset);
    return bindLayer(layer, run, offset);
  }

  /** Zeroes the counters (after loading, so they count the run only). */
  resetStats(): void {
    Object.assign(this.stats, { hits: 0, reads: 0, readahead: 0, bytes: 0, waitMs: 0 });
  }

  /** Waits for reads still in flight, ignoring their errors: the ring is closing. */
  abandon(): void {
    for (const s of this.#slots) {
      for (const t of s.tickets) {
        try {
          this.#reader.wait(t);
        } catch {
          // The read failed, but nobody will use this slot again.
        }
      }
      s.tickets = [];
      s.layer = -1;
    }
  }
}
