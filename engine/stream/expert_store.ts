/**
 * Expert records in arena slots, managed by the {@link ExpertCache} policy: the engine's
 * {@link ExpertSource}. When the router has chosen a layer's experts, `hint` starts the reads of
 * the missing ones (up to a depth) on the shim's threads; `acquire` waits only for the record it
 * needs next; speculative lookahead reads use the disk only when no demand read is queued. A guess
 * its layer then uses becomes a demand read if it has not started; one it does not use is
 * withdrawn if it has not started. The store measures what guesses save and cost
 * ({@link SpeculationCosts}) for the lookahead's gate.
 *
 * @module
 */
import type { Arena } from "../arena.ts";
import { bindExpert, type ExpertSource, type ExpertWeights } from "../weights.ts";
import type { ExpertBank } from "../../io/container.ts";
import { type ExpertCache, expertKey } from "./expert_cache.ts";
import {
  type BlockReader,
  type DiskStats,
  pollAll,
  ReadPriority,
  type ReadTicket,
  waitAll,
} from "../../io/reader.ts";
import { DecayedRatio, type SpeculationCosts } from "./lookahead.ts";

/** Records read at once while warming the cache at open. */
const WARM_BATCH = 16;

/**
 * Demand reads a hint keeps in flight by default: every miss of a decode token's layer (top-k up
 * to 32), so the disk never waits for an expert to finish computing before the next read starts.
 */
export const DEFAULT_READAHEAD_DEPTH = 32;

/**
 * Most requests hinted reads keep queued or running, whatever the depth: the shim's queue holds
 * 1024 reads, shared with the trunk ring and the guesses, and records of the largest models are
 * tens of requests each.
 */
const MAX_AHEAD_REQUESTS = 128;

/** Largest single read request of a record (a multiple of 4 KiB). */
export const REQUEST_BYTES = 2 << 20;

/**
 * Largest single request of a guess (a multiple of 4 KiB). A guess's requests run only while no
 * demand read is queued or running, but one that has started runs to its end: when the layer
 * routes, the demand reads wait behind the guesses' running requests, up to one per reader
 * thread. Smaller requests bound that wait; the rest of a wrong guess is withdrawn unstarted.
 */
export const GUESS_REQUEST_BYTES = 512 << 10;

/** The request size of reads of `priority`: a guess's, or any other record read's. */
function requestBytes(priority: ReadPriority): number {
  return priority === ReadPriority.SPECULATIVE ? GUESS_REQUEST_BYTES : REQUEST_BYTES;
}

/** Where a layer's bank is open: the reader handle of each shard and how experts map to them. */
export interface BankFiles {
  bank: ExpertBank;
  /** Reader handles of the shard files; expert e lives in shard e % n at offset (e / n) × stride. */
  handles: number[];
  paths: string[];
}

/** Options of {@link ExpertStore}. */
export interface ExpertStoreOptions {
  /** Reads to keep in flight after a hint; 0 reads each expert when it is needed. */
  readaheadDepth: number;
  /** Checks a record that just landed (header, and CRC with --verify); throws on mismatch. */
  check: (
    layer: number,
    expert: number,
    slotOffset: number,
    file: string,
    fileOffset: number,
  ) => void;
  /**
   * The cache's last this many slots are not in the store's region: they are lent room
   * (engine/kv_lending.ts) placed by {@link ExpertStore.lend}, retired until then.
   */
  lentSlots?: number;
}

/** Counters for the stats block. */
export interface ExpertStoreStats {
  bytesRead: number;
  /** Reads started by hint() before the expert was needed. */
  readahead: number;
  /** Speculative (lookahead) reads issued, and those a demand access then used. */
  speculative: number;
  speculativeUsed: number;
  /** Speculative reads withdrawn (wholly or in part) because their layer did not use them. */
  speculativeCancelled: number;
  /** Milliseconds acquire() waited for reads. */
  waitMs: number;
}

/** Expert records cached in arena slots. */
export class ExpertStore implements ExpertSource {
  readonly cache: ExpertCache;
  readonly stats: ExpertStoreStats = {
    bytesRead: 0,
    readahead: 0,
    speculative: 0,
    speculativeUsed: 0,
    speculativeCancelled: 0,
    waitMs: 0,
  };
  #reader: BlockReader;
  #banks: (BankFiles | null)[];
  /** Arena offset of each cache slot's record. */
  #offsets: number[];
  /** Slots of the store's own region (the rest are room the KV cache lends). */
  #ownSlots: number;
  /** Own slots whose room is lent out by {@link loan}. */
  #loaned: number[] = [];
  #stride: number;
  #numExperts: number;
  #opts: ExpertStoreOptions;
  /**
   * Reads in flight by cache key. `partial`: a withdrawn guess whose started requests are still
   * running; its slot holds no record, so it is dropped when they land.
   */
  #inflight = new Map<
    number,
    {
      tickets: ReadTicket[];
      layer: number;
      expert: number;
      speculative: boolean;
      partial?: boolean;
    }
  >();
  /** Measured for {@link speculationCosts}: disk ms per byte, the share of a used guess landed
   * when asked for, blocked disk time per guess in records, regret. The blocked time starts at a
   * whole record, so until it is measured the gate reads at precision ≥ 1/2. */
  #msPerByte = new DecayedRatio(1e-6);
  #hidden = new DecayedRatio(1);
  #blockedRecords = new DecayedRatio(1);
  #regret = new DecayedRatio(0);
  /** Wait per hinted layer (ms), and the wait counter at the last hint. */
  #layerWait = new DecayedRatio(0);
  #waitAtHint = 0;
  #lastDisk: DiskStats | null = null;
  #lastGuesses = 0;
  /** Records evicted to admit a guess and not read again since, with the cache's eviction count
   * then. */
  #evictedByGuess = new Map<number, number>();
  /** Hinted misses whose reads have not started, in routing order. */
  #misses = new Map<number, { layer: number; expert: number; slot: number }>();
  /** Keys acquired by a hint and not yet released. */
  #held = new Set<number>();

  constructor(
    arena: Arena,
    reader: BlockReader,
    banks: (BankFiles | null)[],
    cache: ExpertCache,
    opts: ExpertStoreOptions,
  ) {
    this.#reader = reader;
    this.#banks = banks;
    this.#opts = opts;
    this.cache = cache;
    const any = banks.find((b) => b !== null);
    if (!any) throw new Error("expert store: the model has no MoE layers");
    this.#stride = Math.max(...banks.filter((b) => b).map((b) => b!.bank.stride));
    this.#numExperts = any.bank.count;
    // One arena slot of one record stride per cache slot but the lent ones.
    const slots = cache.slots - (opts.lentSlots ?? 0);
    this.#ownSlots = slots;
    const base = arena.alloc(`expert slots (${slots} × ${this.#stride} B)`, slots * this.#stride);
    this.#offsets = Array.from({ length: slots }, (_, s) => base + s * this.#stride);
    for (let s = slots; s < cache.slots; s++) cache.retire(s);
  }

  /** Record bytes one slot holds: the largest stride of the banks. */
  get stride(): number {
    return this.#stride;
  }

  /**
   * Places the lent slots (the cache's last `offsets.length`) at these arena offsets, each
   * {@link stride} bytes of room that something else owns and lends; they stay retired until
   * {@link restore}d.
   */
  lend(offsets: readonly number[]): void {
    const first = this.#ownSlots;
    if (offsets.length !== this.cache.slots - first || this.#offsets.length !== first) {
      throw new Error(
        `expert store: ${offsets.length} lent slots placed, expected ${this.#opts.lentSlots ?? 0}`,
      );
    }
    this.#offsets.push(...offsets);
  }

  /**
   * Takes slot `slot` out of the cache because its room is wanted back: a read still landing in
   * it is waited for first, and its record is evicted. Called between passes, when no record is
   * in use; one that is (acquired and not released) is a bug and throws.
   */
  reclaim(slot: number): void {
    const key = this.cache.keyAt(slot);
    if (key !== null) {
      if (this.#held.has(key)) {
        throw new Error(`expert store: slot ${slot} is reclaimed while its record is in use`);
      }
      this.#land(key);
    }
    this.cache.retire(slot);
  }

  /** Puts a reclaimed (or not yet used) lent slot back in the cache, empty. */
  restore(slot: number): void {
    if (this.#offsets[slot] === undefined) {
      throw new Error(`expert store: slot ${slot} is not placed`);
    }
    this.cache.restore(slot);
  }

  #key(layer: number, expert: number): number {
    return expertKey(layer, expert, this.#numExperts);
  }

  #slotOffset(slot: number): number {
    return this.#offsets[slot];
  }

  #location(
    layer: number,
    expert: number,
  ): { handle: number; path: string; offset: number; bank: ExpertBank } {
    const b = this.#banks[layer];
    if (!b) throw new Error(`layer ${layer} has no experts`);
    if (expert < 0 || expert >= b.bank.count) {
      throw new Error(`layer ${layer} has no expert ${expert} (it has ${b.bank.count})`);
    }
    const n = b.handles.length;
    const shard = expert % n;
    return {
      handle: b.handles[shard],
      path: b.paths[shard],
      offset: Math.floor(expert / n) * b.bank.stride,
      bank: b.bank,
    };
  }

  /**
   * Submits one record as requests of at most {@link REQUEST_BYTES} (a guess's of
   * {@link GUESS_REQUEST_BYTES}), so the reader threads work on it together and its matvecs can
   * start sooner than a single large read would allow.
   */
  #readRecord(
    handle: number,
    slot: number,
    bytes: number,
    offset: number,
    priority: ReadPriority,
  ): ReadTicket[] {
    const tickets: ReadTicket[] = [];
    const request = requestBytes(priority);
    for (let o = 0; o < bytes; o += request) {
      const len = Math.min(request, bytes - o);
      tickets.push(this.#reader.submit(handle, slot + o, len, offset + o, priority));
    }
    return tickets;
  }

  /** Starts the read of a hinted miss. */
  #startRead(key: number, ahead: boolean): void {
    const miss = this.#misses.get(key);
    if (!miss) return;
    this.#misses.delete(key);
    const { handle, offset, bank } = this.#location(miss.layer, miss.expert);
    // DEMAND: the current layer's experts come before the trunk's read-ahead of the next layer.
    const slot = this.#slotOffset(miss.slot);
    const tickets = this.#readRecord(handle, slot, bank.stride, offset, ReadPriority.DEMAND);
    this.stats.bytesRead += bank.stride;
    if (ahead) this.stats.readahead++;
    this.#inflight.set(key, {
      tickets,
      layer: miss.layer,
      expert: miss.expert,
      speculative: false,
    });
  }

  /** Demand records in flight, and their requests not yet reaped. */
  #demandInFlight(): { records: number; requests: number } {
    let records = 0, requests = 0;
    for (const f of this.#inflight.values()) {
      if (f.speculative) continue;
      records++;
      requests += f.tickets.length;
    }
    return { records, requests };
  }

  /**
   * Starts hinted reads, in routing order, until `readaheadDepth` demand records are in flight
   * (or {@link MAX_AHEAD_REQUESTS} requests, once at least one record is).
   */
  #pump(): void {
    for (const key of this.#misses.keys()) {
      const { records, requests } = this.#demandInFlight();
      if (records >= this.#opts.readaheadDepth) return;
      if (records > 0 && requests >= MAX_AHEAD_REQUESTS) return;
      this.#startRead(key, true);
    }
  }

  /** Lands speculative reads that completed, so their slots become evictable again. */
  #reap(): void {
    for (const [key, f] of this.#inflight) {
      if (f.speculative && f.tickets.every((t) => this.#reader.poll(t))) this.#land(key);
    }
  }

  /** Most experts one hint may name: every one of them is pinned until released. */
  get groupSize(): number {
    return this.cache.capacity;
  }

  hint(layer: number, ids: readonly number[]): void {
    this.#layerWait.add(this.stats.waitMs - this.#waitAtHint, 1);
    this.#waitAtHint = this.stats.waitMs;
    this.#reap();
    const keys = ids.map((e) => this.#key(layer, e));
    // A withdrawn guess still landing holds no record: land and drop it before it is asked for.
    for (const k of keys) if (this.#inflight.get(k)?.partial) this.#land(k);
    const landed = this.#settleGuesses(layer, new Set(keys));
    // Speculative reads hold pins; land them if the demand group would not fit beside them.
    if (this.cache.capacity - this.#pinned() < keys.length) this.drain();
    const accesses = this.cache.acquire(keys);
    accesses.forEach((a, i) => {
      if (a.prefetched) {
        this.stats.speculativeUsed++;
        this.#hidden.add(landed.get(keys[i]) ?? 1, 1);
      }
      if (!a.hit) this.#regretted(keys[i]);
      this.#held.add(keys[i]);
      if (!a.hit) this.#misses.set(keys[i], { layer, expert: ids[i], slot: a.slot });
    });
    this.#pump();
  }

  /**
   * Counts a demand miss of a record a guess evicted as regret, unless a cache's worth of evictions
   * came after it (it would have gone anyway).
   */
  #regretted(key: number): void {
    const at = this.#evictedByGuess.get(key);
    if (at === undefined) return;
    this.#evictedByGuess.delete(key);
    if (this.cache.stats.evictions - at < this.cache.slots) this.#regret.add(1, 0);
  }

  /**
   * When `layer`'s experts are known: each guess for it still in flight that is wanted has its
   * unstarted requests made demand reads (they go before this layer's misses, queued next), and
   * each that is not wanted has them withdrawn. Returns, by key, the share of each wanted guess
   * that had already landed.
   */
  #settleGuesses(layer: number, wanted: Set<number>): Map<number, number> {
    const landed = new Map<number, number>();
    for (const [key, f] of this.#inflight) {
      if (!f.speculative || f.partial || f.layer !== layer) continue;
      if (wanted.has(key)) {
        let done = 0;
        for (const t of f.tickets) {
          if (this.#reader.poll(t)) done++;
          else this.#reader.reprioritize(t, ReadPriority.DEMAND);
        }
        landed.set(key, done / f.tickets.length);
        continue;
      }
      const left = f.tickets.filter((t) => !this.#reader.cancel(t));
      if (left.length === f.tickets.length) continue;
      // Withdrawn requests never reach the disk: bytesRead counts what is read. Request i of a
      // guess was submitted at the guesses' request size but the last, which holds the rest.
      const stride = this.#banks[f.layer]!.bank.stride;
      const request = requestBytes(ReadPriority.SPECULATIVE);
      f.tickets.forEach((t, i) => {
        if (!left.includes(t)) this.stats.bytesRead -= Math.min(request, stride - i * request);
      });
      this.stats.speculativeCancelled++;
      f.tickets = left;
      f.partial = true;
      if (left.length === 0) this.#land(key);
    }
    return landed;
  }

  /**
   * What guesses saved and cost lately: the record's disk time at the bandwidth the reader threads
   * reach while busy, the share of used guesses landed in time, the time reads the engine needed
   * waited behind guesses, per guess, and the regret of the slots guesses took. Reading it
   * updates the disk-time figures from the reader's accounting.
   */
  get speculationCosts(): SpeculationCosts {
    const now = this.#reader.diskStats();
    const last = this.#lastDisk;
    const recordMs = () => this.#stride * this.#msPerByte.value;
    if (now && last && now.bytes > last.bytes) {
      this.#msPerByte.add(now.busyMs - last.busyMs, now.bytes - last.bytes);
    }
    const guesses = this.stats.speculative - this.#lastGuesses;
    if (now && last && guesses > 0) {
      this.#blockedRecords.add((now.blockedMs - last.blockedMs) / recordMs(), guesses);
      this.#lastGuesses = this.stats.speculative;
    }
    if (now) this.#lastDisk = now;
    return {
      recordMs: recordMs(),
      hidden: this.#hidden.value,
      blockedMs: this.#blockedRecords.value * recordMs(),
      regret: this.#regret.value,
      waitMs: this.#layerWait.value,
    };
  }

  #pinned(): number {
    let n = this.#held.size;
    for (const f of this.#inflight.values()) if (f.speculative) n++;
    return n;
  }

  /** Waits for the read of `key` if one is in flight, then checks the record. */
  #land(key: number): void {
    const f = this.#inflight.get(key);
    if (!f) return;
    const t0 = performance.now();
    waitAll(this.#reader, f.tickets, `expert ${f.expert} of layer ${f.layer}`);
    this.stats.waitMs += performance.now() - t0;
    this.#inflight.delete(key);
    if (f.partial) {
      this.cache.unpin(key);
      this.cache.drop(key);
      return;
    }
    const { path, offset } = this.#location(f.layer, f.expert);
    this.#opts.check(f.layer, f.expert, this.#slotOffset(this.cache.slotOf(key)!), path, offset);
    if (f.speculative) this.cache.unpin(key);
  }

  acquire(layer: number, expert: number): ExpertWeights {
    const key = this.#key(layer, expert);
    if (!this.#held.has(key)) this.hint(layer, [expert]);
    this.#startRead(key, false);
    this.#land(key);
    const { bank } = this.#location(layer, expert);
    return bindExpert(bank, this.#slotOffset(this.cache.slotOf(key)!));
  }

  ready(layer: number, expert: number): boolean {
    const key = this.#key(layer, expert);
    if (!this.#held.has(key) || this.#misses.has(key)) return false;
    const f = this.#inflight.get(key);
    return !f || pollAll(this.#reader, f.tickets, `expert ${f.expert} of layer ${f.layer}`);
  }

  release(layer: number, expert: number): void {
    const key = this.#key(layer, expert);
    if (!this.#held.delete(key)) {
      throw new Error(`expert ${expert} of layer ${layer} released twice`);
    }
    this.cache.release([key]);
    this.#pump();
  }

  holds(layer: number, expert: number): boolean {
    const key = this.#key(layer, expert);
    return this.cache.has(key) || this.#inflight.has(key);
  }

  /**
   * Speculatively reads experts predicted for `layer`. The reads go in the lowest priority class,
   * so the shim starts them only when no demand or read-ahead read is queued: a guess uses disk
   * time that would otherwise idle. Returns how many reads started.
   */
  speculate(layer: number, ids: readonly number[], max: number): number {
    let started = 0;
    for (const expert of ids) {
      if (started >= max) break;
      if (this.holds(layer, expert)) continue;
      const key = this.#key(layer, expert);
      const got = this.cache.prefetch(key);
      if (!got) break;
      this.#evictedByGuess.delete(key);
      if (got.evicted !== null) {
        this.#evictedByGuess.set(got.evicted, this.cache.stats.evictions);
        this.#regret.add(0, 1);
      }
      this.cache.pin(key);
      const { handle, offset, bank } = this.#location(layer, expert);
      const tickets = this.#readRecord(
        handle,
        this.#slotOffset(got.slot),
        bank.stride,
        offset,
        ReadPriority.SPECULATIVE,
      );
      this.stats.bytesRead += bank.stride;
      this.stats.speculative++;
      this.#inflight.set(key, { tickets, layer, expert, speculative: true });
      started++;
    }
    return started;
  }

  /**
   * Fills free slots with the given experts, hottest first (the learned hot list); `landed` gets
   * the bytes of each batch as it lands (load progress).
   */
  warm(experts: [number, number][], landed?: (bytes: number) => void): void {
    const fresh = experts.filter(([l, e]) =>
      this.#banks[l] && e < this.#banks[l]!.bank.count && !this.cache.has(this.#key(l, e))
    );
    this.cache.warm(fresh.map(([l, e]) => this.#key(l, e)));
    let batch = 0;
    const drain = () => {
      this.drain();
      landed?.(batch);
      batch = 0;
    };
    for (const [layer, expert] of fresh) {
      const key = this.#key(layer, expert);
      const slot = this.cache.slotOf(key);
      if (slot === undefined || this.#inflight.has(key)) continue;
      const { handle, offset, bank } = this.#location(layer, expert);
      const tickets = this.#readRecord(
        handle,
        this.#slotOffset(slot),
        bank.stride,
        offset,
        ReadPriority.DEMAND,
      );
      this.stats.bytesRead += bank.stride;
      batch += bank.stride;
      this.#inflight.set(key, { tickets, layer, expert, speculative: true });
      this.cache.pin(key);
      // Bounded batches: the shim's queue holds a fixed number of reads.
      if (this.#inflight.size >= WARM_BATCH) drain();
    }
    drain();
  }

  /**
   * Lends the room of the top `n` slots of the store's own region between passes (the MTP
   * layer's state and weights while it drafts), at least `keep` slots staying in use; reads in
   * flight land first and the slots' records are evicted. Returns the room's arena offset.
   */
  loan(n: number, keep: number): number {
    if (this.#held.size > 0) throw new Error("expert store: cannot lend slots during a pass");
    if (this.#loaned.length > 0) throw new Error("expert store: slots are already lent out");
    const own = this.#ownSlots;
    if (!Number.isInteger(n) || n < 0 || n > own || this.cache.capacity - n < keep) {
      throw new Error(
        `expert store: cannot lend ${n} of ${this.cache.capacity} slots, keeping ${keep}`,
      );
    }
    this.drain();
    for (let s = own - n; s < own; s++) {
      const key = this.cache.keyAt(s);
      if (key !== null && this.cache.isPinned(key)) {
        throw new Error(`expert store: slot ${s} is pinned and cannot be lent`);
      }
    }
    for (let s = own - n; s < own; s++) {
      this.cache.retire(s);
      this.#loaned.push(s);
    }
    return this.#slotOffset(own - n);
  }

  /** Takes back the room {@link loan} lent out; its slots come back empty. */
  repay(): void {
    for (const s of this.#loaned) this.cache.restore(s);
    this.#loaned.length = 0;
  }

  /** Zeroes the store's counters (after loading, so they count the run only). */
  resetStats(): void {
    Object.assign(this.stats, {
      bytesRead: 0,
      readahead: 0,
      speculative: 0,
      speculativeUsed: 0,
      speculativeCancelled: 0,
      waitMs: 0,
    });
    this.#lastGuesses = 0;
    this.#waitAtHint = 0;
  }

  /** Waits for every read in flight and checks what landed. */
  drain(): void {
    for (const key of [...this.#inflight.keys()]) this.#land(key);
  }

  /** Waits for every read in flight, ignoring errors and records: the store is closing. */
  abandon(): void {
    for (const f of this.#inflight.values()) {
      try {
        for (const t of f.tickets) this.#reader.wait(t);
      } catch {
        // The read failed, but nobody will use this record.
      }
    }
    this.#inflight.clear();
  }
}
