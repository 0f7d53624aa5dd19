/**
 * The expert cache: which expert records live in which arena slot. One class serves both the
 * engine (slots are arena regions the caller fills) and tools/dev/sim.ts (slots are just numbers), so
 * a hit rate the simulator prints is the hit rate the engine gets for the same routing.
 *
 * Policies:
 * - `decay` (the engine's default): frequency with exponential decay over the whole history. Each
 *   demand use of a key adds 1 to its score, and every score halves each `halfLife` demand
 *   accesses (default 8 × slots); scores of evicted keys are remembered, so a readmitted record
 *   resumes from its decayed past. The victim is the unpinned resident with the lowest score,
 *   ties to the least recently used. A newcomer with no history therefore goes first, which acts
 *   as admission control: a one-off record costs one slot, not a useful one. On the FLAME (12, 24
 *   slots per layer) and Mixtral (2, 3, 4, 6) traces, per layer and shared, it matched or beat
 *   LFRU and plain LFU in all 12 cases and LRU in 10 (docs/LEARNED.md).
 * - `lfru` (DESIGN.md): a record is admitted with count 1, each demand hit adds 1, and the victim
 *   is the lowest count among a random sample of resident unpinned records, ties going to the
 *   least recently used.
 * - `lru`: plain least recently used.
 *
 * Count aging is off by default. Measured with tools/dev/sim.ts on the FLAME and Mixtral traces
 * (3 seeds), halving every count each N demand accesses moved hit rates by -0.02..+0.01 on three
 * of the four (trace, per-layer/global) cases and helped only Mixtral with one shared cache
 * (+0.07 at 37.5% with N = 300, where the prompt-to-decode switch strands old counts); counts
 * already restart at 1 on every eviction, which bounds staleness. `agingPeriod` turns it on.
 * `keepCounts` (off by default, as DESIGN.md admits at count 1) remembers evicted counts; it
 * raised hit rates by 0 to 0.055 and never lowered them in the measured cases.
 *
 * Every operation is O(1) or O(sample), apart from the rare fallback scan when every sampled record
 * is pinned: the engine calls it per expert per token.
 *
 * @module
 */

/** Eviction policy of an {@link ExpertCache}. */
export type CachePolicy = "decay" | "lfru" | "lru";

/** Every {@link CachePolicy}, the default first. */
export const CACHE_POLICIES: readonly CachePolicy[] = ["decay", "lfru", "lru"];

/**
 * Decay half-life in multiples of the slot count when {@link CacheOptions.halfLife} is absent.
 * Measured on both traces (tools/dev/sim.ts): 8 was within 0.02 of the best per-trace half-life in
 * every case; 1 × slots lost up to 0.11 on FLAME, 32 × up to 0.03 on Mixtral.
 */
const HALF_LIFE_SLOTS = 8;

/**
 * Decay scores grow as 2^(accesses / halfLife) instead of shrinking (the same order, no per-key
 * work); every score is rescaled when the exponent passes this.
 */
const RESCALE_EXPONENT = 512;

/** Construction options of an {@link ExpertCache}. */
export interface CacheOptions {
  /** Number of record slots (arena regions); at least 1. */
  slots: number;
  policy: CachePolicy;
  /** LFRU: how many resident records are compared to pick a victim (default 8). */
  sample?: number;
  /** Seed of the victim-sampling PRNG (default 1); the same seed replays the same evictions. */
  seed?: number;
  /** LFRU: halve every count each this many demand accesses; 0 or absent = never. */
  agingPeriod?: number;
  /**
   * LFRU: remember the counts of evicted records and resume from them on readmission (one number
   * per key ever seen), instead of restarting at 1. Remembered counts do not age.
   */
  keepCounts?: boolean;
  /** Decay: demand accesses over which a score halves (default 8 × slots). */
  halfLife?: number;
}

/** Result of a demand access. */
export interface Access {
  /** Slot holding the record (on a miss: the slot the caller must fill). */
  slot: number;
  hit: boolean;
  /** Key whose record was evicted to make room, or null. */
  evicted: number | null;
  /** The hit was a record brought by a prefetch, used for the first time. */
  prefetched: boolean;
}

/** Counters of an {@link ExpertCache}; read them, never write them. */
export interface CacheStats {
  hits: number;
  misses: number;
  /** Records admitted by {@link ExpertCache.prefetch}. */
  prefetches: number;
  /** Prefetched records that a demand access used before they were evicted. */
  prefetchUsed: number;
  /** Records evicted to make room (by demand misses and by prefetches). */
  evictions: number;
}

/**
 * Cache key of an expert: `layer × numExperts + expert`. Layer is the index among the model's
 * layers (MoE or all, as long as the caller is consistent).
 */
export function expertKey(layer: number, expert: number, numExperts: number): number {
  if (!Number.isInteger(layer) || layer < 0) throw new Error(`expertKey: bad layer ${layer}`);
  if (!Number.isInteger(expert) || expert < 0 || expert >= numExperts) {
    throw new Error(`expertKey: expert ${expert} of layer ${layer} not in [0, ${numExperts})`);
  }
  return layer * numExperts + expert;
}

const FREE = -1;
const NONE = -1;

/** Slot-indexed record cache with LFRU or LRU eviction, pinning and speculative prefetch. */
export class ExpertCache {
  /** Running counters. */
  readonly stats: CacheStats = { hits: 0, misses: 0, prefetches: 0, prefetchUsed: 0, evictions: 0 };
  readonly slots: number;
  readonly policy: CachePolicy;
  readonly sample: number;
  readonly agingPeriod: number;
  readonly keepCounts: boolean;
  /** Decay half-life in demand accesses (0 for the other policies). */
  readonly halfLife: number;

  readonly #slotOfKey = new Map<number, number>();
  readonly #keyOfSlot: Int32Array;
  /** LFRU: the count; decay: the score, scaled by 2^(#scaleBase / halfLife). */
  readonly #count: Float64Array;
  /** Aging epoch at which `#count` was last brought up to date. */
  readonly #epoch: Float64Array;
  /** Recency stamp: larger = more recently used. */
  readonly #lastUse: Float64Array;
  readonly #pins: Int32Array;
  readonly #prefetched: Uint8Array;
  /** Recency list over slots, head = least recently used (LRU victims, fallback scans). */
  readonly #prev: Int32Array;
  readonly #next: Int32Array;
  #head = NONE;
  #tail = NONE;
  /** Stack of never-used or dropped slots. */
  readonly #free: number[] = [];
  /** Counts of evicted records (keepCounts), or scores of evicted keys (decay). */
  readonly #history = new Map<number, number>();
  /** Decay: demand access count at which a use is worth exactly 1 in stored scores. */
  #scaleBase = 0;
  /** A permutation of the slots; its prefix is reshuffled to draw samples without repeats. */
  readonly #order: Int32Array;
  #clock = 0;
  #demand = 0;
  /** Number of slots whose record has at least one pin, retired slots included. */
  #pinnedSlots = 0;
  /** Slots taken out of use ({@link retire}): held as pinned, so no victim search picks them. */
  readonly #retired: Uint8Array;
  #retiredSlots = 0;
  #rng: number;

  /** Creates an empty cache of `opts.slots` slots. */
  constructor(opts: CacheOptions) {
    const { slots, policy } = opts;
    if (!Number.isInteger(slots) || slots < 1) {
      throw new Error(`ExpertCache: slots must be a positive integer, got ${slots}`);
    }
    if (!CACHE_POLICIES.includes(policy)) {
      throw new Error(
        `ExpertCache: policy must be one of ${CACHE_POLICIES.join(", ")}, got ${policy}`,
      );
    }
    const sample = opts.sample ?? 8;
    if (!Number.isInteger(sample) || sample < 1) {
      throw new Error(`ExpertCache: sample must be a positive integer, got ${sample}`);
    }
    const aging = opts.agingPeriod ?? 0;
    if (!Number.isInteger(aging) || aging < 0) {
      throw new Error(`ExpertCache: agingPeriod must be a non-negative integer, got ${aging}`);
    }
    this.slots = slots;
    this.policy = policy;
    this.sample = sample;
    this.agingPeriod = aging;
    this.keepCounts = opts.keepCounts ?? false;
    const halfLife = policy === "decay" ? opts.halfLife ?? HALF_LIFE_SLOTS * slots : 0;
    if (policy === "decay" && !(halfLife > 0)) {
      throw new Error(`ExpertCache: halfLife must be positive, got ${opts.halfLife}`);
    }
    this.halfLife = halfLife;
    this.#keyOfSlot = new Int32Array(slots).fill(FREE);
    this.#count = new Float64Array(slots);
    this.#epoch = new Float64Array(slots);
    this.#lastUse = new Float64Array(slots);
    this.#pins = new Int32Array(slots);
    this.#prefetched = new Uint8Array(slots);
    this.#retired = new Uint8Array(slots);
    this.#prev = new Int32Array(slots).fill(NONE);
    this.#next = new Int32Array(slots).fill(NONE);
    this.#order = new Int32Array(slots);
    for (let s = 0; s < slots; s++) this.#order[s] = s;
    // Pop order 0, 1, 2, ... so warm-up fills slots in ascending order.
    for (let s = slots - 1; s >= 0; s--) this.#free.push(s);
    this.#rng = (opts.seed ?? 1) >>> 0;
  }

  /** Number of resident records. */
  get size(): number {
    return this.#slotOfKey.size;
  }

  /** Slots in use: {@link slots} less the retired ones. */
  get capacity(): number {
    return this.slots - this.#retiredSlots;
  }

  /**
   * Takes `slot` out of use (its room is wanted back, engine/kv_lending.ts): evicts its record,
   * which must not be pinned, and no admission uses the slot until {@link restore}. Returns the
   * key evicted, or null.
   */
  retire(slot: number): number | null {
    if (this.#retired[slot]) throw new Error(`ExpertCache.retire: slot ${slot} is retired`);
    if (this.#pins[slot] > 0) throw new Error(`ExpertCache.retire: slot ${slot} is pinned`);
    const key = this.keyAt(slot);
    if (key === null) this.#free.splice(this.#free.indexOf(slot), 1);
    else {
      this.#evict(slot);
      this.stats.evictions++;
    }
    this.#retired[slot] = 1;
    this.#retiredSlots++;
    // Held as pinned: every check of unpinned room and every victim search then skips it.
    this.#pins[slot] = 1;
    this.#pinnedSlots++;
    return key;
  }

  /** Puts a retired slot back in use, empty. */
  restore(slot: number): void {
    if (!this.#retired[slot]) throw new Error(`ExpertCache.restore: slot ${slot} is not retired`);
    this.#retired[slot] = 0;
    this.#retiredSlots--;
    this.#pins[slot] = 0;
    this.#pinnedSlots--;
    this.#free.push(slot);
  }

  /** Whether `key` is resident (possibly prefetched and not yet used). */
  has(key: number): boolean {
    return this.#slotOfKey.has(key);
  }

  /** Slot of a resident key, or undefined. */
  slotOf(key: number): number | undefined {
    return this.#slotOfKey.get(key);
  }

  /** Key held by `slot`, or null when the slot is free. */
  keyAt(slot: number): number | null {
    const k = this.#keyOfSlot[slot];
    return k === FREE ? null : k;
  }

  /**
   * Demand access. A hit refreshes recency (and, for LFRU, adds 1 to the count unless this is the
   * first use of a prefetched record; for decay, adds one use to the score). A miss takes a free
   * slot or evicts a victim that is not pinned and admits `key` there (LFRU: count 1; decay: its
   * remembered score plus this use); the caller fills the slot. Throws when every slot
   * is pinned.
   */
  access(key: number): Access {
    this.#demand++;
    const slot = this.#slotOfKey.get(key);
    if (slot !== undefined) {
      this.stats.hits++;
      this.#age(slot);
      const prefetched = this.#prefetched[slot] === 1;
      if (prefetched) {
        this.#prefetched[slot] = 0;
        this.stats.prefetchUsed++;
      }
      if (this.policy === "decay") {
        // The weight first: computing it may rescale every stored score.
        const w = this.#useWeight();
        this.#count[slot] += w;
      } else if (!prefetched) this.#count[slot]++;
      this.#touch(slot);
      return { slot, hit: true, evicted: null, prefetched };
    }
    this.stats.misses++;
    const room = this.#makeRoom();
    if (room === null) {
      throw new Error(
        `ExpertCache: cannot admit key ${key}: all ${this.slots} slots are pinned (in use or in flight)`,
      );
    }
    this.#admit(key, room.slot, false);
    return { slot: room.slot, hit: false, evicted: room.evicted, prefetched: false };
  }

  /**
   * Demand access of one (token, layer)'s routed experts, handed over at once as the engine does:
   * the resident ones are taken first (so a miss never evicts a record this same call needs), then
   * the misses are admitted; every key ends up pinned once. Returns the accesses in `keys` order.
   * Call {@link release} with the same keys when their matvecs are done. Throws when the keys
   * cannot all be held (more keys than unpinned slots).
   */
  acquire(keys: readonly number[]): Access[] {
    let newlyPinned = 0;
    for (const k of keys) if (!this.isPinned(k)) newlyPinned++;
    if (this.#pinnedSlots + newlyPinned > this.slots) {
      throw new Error(
        `ExpertCache.acquire: ${keys.length} keys need pinning but only ` +
          `${this.slots - this.#pinnedSlots} of ${this.slots} slots are unpinned`,
      );
    }
    const out = new Array<Access>(keys.length);
    for (let i = 0; i < keys.length; i++) {
      if (this.#slotOfKey.has(keys[i])) {
        out[i] = this.access(keys[i]);
        this.pin(keys[i]);
      }
    }
    for (let i = 0; i < keys.length; i++) {
      if (out[i] === undefined) {
        out[i] = this.access(keys[i]);
        this.pin(keys[i]);
      }
    }
    return out;
  }

  /** Unpins keys pinned by {@link acquire}. */
  release(keys: readonly number[]): void {
    for (const k of keys) this.unpin(k);
  }

  /**
   * Speculative admission. Returns null when `key` is already resident or no record can be
   * evicted; otherwise admits it (LFRU: count 1; decay: its remembered score, no use added; marked
   * prefetched) and returns its slot for the caller to fill. Its first demand use is a hit that
   * does not add to an LFRU count.
   */
  prefetch(key: number): { slot: number; evicted: number | null } | null {
    if (this.#slotOfKey.has(key)) return null;
    const room = this.#makeRoom();
    if (room === null) return null;
    this.stats.prefetches++;
    this.#admit(key, room.slot, true);
    return room;
  }

  /** Protects a resident record from eviction (in use, or its read in flight). Pins nest. */
  pin(key: number): void {
    const slot = this.#residentSlot(key, "pin");
    if (this.#pins[slot]++ === 0) this.#pinnedSlots++;
  }

  /** Undoes one {@link pin}. */
  unpin(key: number): void {
    const slot = this.#residentSlot(key, "unpin");
    if (this.#pins[slot] === 0) throw new Error(`ExpertCache.unpin: key ${key} is not pinned`);
    if (--this.#pins[slot] === 0) this.#pinnedSlots--;
  }

  /** Whether a resident key is pinned. */
  isPinned(key: number): boolean {
    const slot = this.#slotOfKey.get(key);
    return slot !== undefined && this.#pins[slot] > 0;
  }

  /**
   * Removes an unpinned record and frees its slot (e.g. its read failed, so the slot holds
   * garbage). Returns whether it was resident.
   */
  drop(key: number): boolean {
    const slot = this.#slotOfKey.get(key);
    if (slot === undefined) return false;
    if (this.#pins[slot] > 0) throw new Error(`ExpertCache.drop: key ${key} is pinned`);
    this.#unlink(slot);
    this.#slotOfKey.delete(key);
    this.#keyOfSlot[slot] = FREE;
    this.#free.push(slot);
    return true;
  }

  /**
   * Pre-admits keys (a hot list, hottest first) while free slots remain, with count 1, without
   * touching the stats. Keys already resident are skipped.
   */
  warm(keys: number[]): void {
    for (const key of keys) {
      if (this.#free.length === 0) return;
      if (!this.#slotOfKey.has(key)) this.#admit(key, this.#free.pop()!, false);
    }
  }

  /** Resident keys, least recently used first (for hot-list export and tests). */
  keys(): number[] {
    const out: number[] = [];
    for (let s = this.#head; s !== NONE; s = this.#next[s]) out.push(this.#keyOfSlot[s]);
    return out;
  }

  /**
   * LFRU count of a resident key after aging, or its decay score in units of a use now (undefined
   * when not resident).
   */
  countOf(key: number): number | undefined {
    const slot = this.#slotOfKey.get(key);
    if (slot === undefined) return undefined;
    this.#age(slot);
    if (this.policy !== "decay") return this.#count[slot];
    const w = this.#useWeight();
    return this.#count[slot] / w;
  }

  #residentSlot(key: number, op: string): number {
    const slot = this.#slotOfKey.get(key);
    if (slot === undefined) throw new Error(`ExpertCache.${op}: key ${key} is not resident`);
    return slot;
  }

  #admit(key: number, slot: number, prefetched: boolean): void {
    this.#slotOfKey.set(key, slot);
    this.#keyOfSlot[slot] = key;
    if (this.policy === "decay") {
      // A prefetch is not a use: its first demand access adds the weight instead.
      const w = prefetched ? 0 : this.#useWeight();
      this.#count[slot] = (this.#history.get(key) ?? 0) + w;
    } else this.#count[slot] = 1 + (this.keepCounts ? this.#history.get(key) ?? 0 : 0);
    this.#epoch[slot] = this.#currentEpoch();
    this.#pins[slot] = 0;
    this.#prefetched[slot] = prefetched ? 1 : 0;
    if (prefetched) {
      // An unused guess is the first to go: it enters as the least recently used record, so it
      // never displaces a record that real tokens have used. Its first demand use moves it.
      this.#lastUse[slot] = -++this.#clock;
      this.#pushHead(slot);
    } else {
      this.#lastUse[slot] = ++this.#clock;
      this.#pushTail(slot);
    }
  }

  /** A free slot, or the slot of an evicted victim, or null when everything is pinned. */
  #makeRoom(): { slot: number; evicted: number | null } | null {
    if (this.#free.length > 0) return { slot: this.#free.pop()!, evicted: null };
    if (this.#pinnedSlots === this.slots) return null;
    const slot = this.policy === "lru"
      ? this.#oldestUnpinned()
      : this.policy === "decay"
      ? this.#lowestScore()
      : this.#lfruVictim();
    if (slot === NONE) return null;
    const evicted = this.#evict(slot);
    this.stats.evictions++;
    return { slot, evicted };
  }

  /** Removes the record of an occupied slot, remembering its count or score; returns its key. */
  #evict(slot: number): number {
    const evicted = this.#keyOfSlot[slot];
    if (this.keepCounts || this.policy === "decay") this.#history.set(evicted, this.#count[slot]);
    this.#slotOfKey.delete(evicted);
    this.#keyOfSlot[slot] = FREE;
    this.#unlink(slot);
    return evicted;
  }

  #oldestUnpinned(): number {
    for (let s = this.#head; s !== NONE; s = this.#next[s]) if (this.#pins[s] === 0) return s;
    return NONE;
  }

  /** Decay: the unpinned resident with the lowest score, ties to the least recently used. */
  #lowestScore(): number {
    let best = NONE;
    for (let s = this.#head; s !== NONE; s = this.#next[s]) {
      if (this.#pins[s] === 0 && (best === NONE || this.#count[s] < this.#count[best])) best = s;
    }
    return best;
  }

  /**
   * Decay: what one demand use now adds to a stored score, 2^((accesses − base) / halfLife).
   * Rescales every stored score (resident and remembered) before the weight can overflow.
   */
  #useWeight(): number {
    let e = (this.#demand - this.#scaleBase) / this.halfLife;
    if (e > RESCALE_EXPONENT) {
      const f = 2 ** -e;
      for (let s = 0; s < this.slots; s++) this.#count[s] *= f;
      for (const [k, v] of this.#history) this.#history.set(k, v * f);
      this.#scaleBase = this.#demand;
      e = 0;
    }
    return 2 ** e;
  }

  /** Lowest (aged) count among a sample of unpinned resident slots; ties to the older one. */
  #lfruVictim(): number {
    // Only called with every slot occupied, so any slot index is a resident record.
    const n = this.slots;
    const draws = Math.min(this.sample, n);
    let best = NONE;
    for (let i = 0; i < draws; i++) {
      // Partial Fisher-Yates on a persistent permutation: distinct slots, O(sample), no garbage.
      const j = i + (draws === n ? 0 : this.#random(n - i));
      const s = this.#order[j];
      this.#order[j] = this.#order[i];
      this.#order[i] = s;
      if (this.#pins[s] === 0 && this.#better(s, best)) best = s;
    }
    if (best !== NONE) return best;
    // Every sampled record is pinned: fall back to a full scan so a victim is found if one exists.
    for (let s = this.#head; s !== NONE; s = this.#next[s]) {
      if (this.#pins[s] === 0 && this.#better(s, best)) best = s;
    }
    return best;
  }

  /** Whether slot `a` is a better victim than `b` (NONE = no candidate yet). */
  #better(a: number, b: number): boolean {
    if (b === NONE) return true;
    this.#age(a);
    this.#age(b);
    const ca = this.#count[a], cb = this.#count[b];
    return ca < cb || (ca === cb && this.#lastUse[a] < this.#lastUse[b]);
  }

  #currentEpoch(): number {
    return this.agingPeriod > 0 ? Math.floor(this.#demand / this.agingPeriod) : 0;
  }

  /** Applies the halvings a record missed since it was last brought up to date. */
  #age(slot: number): void {
    if (this.agingPeriod === 0) return;
    const now = this.#currentEpoch();
    const missed = now - this.#epoch[slot];
    if (missed > 0) {
      // Halve, keeping at least 1 so that every resident record still counts as admitted once.
      this.#count[slot] = Math.max(1, Math.floor(this.#count[slot] / 2 ** Math.min(missed, 60)));
      this.#epoch[slot] = now;
    }
  }

  #touch(slot: number): void {
    this.#lastUse[slot] = ++this.#clock;
    if (slot === this.#tail) return;
    this.#unlink(slot);
    this.#pushTail(slot);
  }

  #pushTail(slot: number): void {
    this.#prev[slot] = this.#tail;
    this.#next[slot] = NONE;
    if (this.#tail === NONE) this.#head = slot;
    else this.#next[this.#tail] = slot;
    this.#tail = slot;
  }

  #pushHead(slot: number): void {
    this.#next[slot] = this.#head;
    this.#prev[slot] = NONE;
    if (this.#head === NONE) this.#tail = slot;
    else this.#prev[this.#head] = slot;
    this.#head = slot;
  }

  #unlink(slot: number): void {
    const p = this.#prev[slot], n = this.#next[slot];
    if (p === NONE) this.#head = n;
    else this.#next[p] = n;
    if (n === NONE) this.#tail = p;
    else this.#prev[n] = p;
    this.#prev[slot] = NONE;
    this.#next[slot] = NONE;
  }

  /** Uniform integer in [0, n) from a mulberry32 stream (deterministic from the seed). */
  #random(n: number): number {
    this.#rng = (this.#rng + 0x6d2b79f5) | 0;
    let t = this.#rng;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return Math.floor((((t ^ (t >>> 14)) >>> 0) / 4294967296) * n);
  }
}
