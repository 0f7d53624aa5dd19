/**
 * Prompt prefixes kept per owner (a server's client: one per API key) beside the session's live
 * KV caches. The arena holds the caches of its sequences (one per generation a batch runs at
 * once, engine/batch.ts), each live cache belonging to the owner who last ran on it; the
 * prefixes of other conversations are kept as copies of their cache rows (and recurrent states),
 * as a session file holds them (engine/session_state.ts), and copied back when a request of the
 * same owner matches one by longest common prefix. An owner only ever reuses its own prefixes: the
 * live cache of another owner is never continued, so how many prompt tokens come from the cache
 * (and how long the prompt takes) says nothing about what anyone else sent.
 *
 * Each owner has its own byte budget and its own least-recently-used eviction, so one owner's
 * traffic cannot push out (and so reveal itself through) another's prefixes.
 *
 * @module
 */
import {
  cacheParts,
  concatBytes,
  type MtpSaved,
  mtpSaved,
  writeCacheParts,
} from "./session_state.ts";
import { commonPrefix, type Session } from "./session.ts";

/** One saved prefix: its tokens and a copy of their cache contents. */
interface Saved {
  owner: string;
  tokens: number[];
  bytes: Uint8Array;
  /** The MTP layer's rows (`--spec mtp`), where it kept them. */
  mtp: MtpSaved | null;
  /** When it was last saved or reused (a counter), for LRU eviction. */
  used: number;
}

/** How much a {@link PrefixCache} keeps. */
export interface PrefixCacheOptions {
  /** Bytes of saved prefixes each owner may keep (0: none; only the live cache is reused). */
  ownerBytes: number;
  /** Most saved prefixes per owner (default 4). */
  perOwner?: number;
  /**
   * Save the live cache at the end of every request ({@link finish}) rather than when another
   * request displaces it, so the copy's time is spent in its owner's request, not in the next
   * owner's (several owners: set it).
   */
  saveEagerly?: boolean;
}

/** The prefixes of each owner, and which owner each sequence's live cache belongs to. */
export class PrefixCache {
  readonly #session: Session;
  readonly #saved: Saved[] = [];
  readonly #ownerBytes: number;
  readonly #perOwner: number;
  readonly #eager: boolean;
  /** Per sequence: the owner of its live cache. */
  #liveOwner: (string | null)[] = [];
  /** Per sequence: whether its live cache as it is now is among the saved prefixes. */
  #liveSaved: boolean[] = [];
  /** Per sequence: when its live cache was last prepared (the clock), for choosing one. */
  #liveUsed: number[] = [];
  #clock = 0;

  /** A prefix cache over `session`'s live KV cache. */
  constructor(session: Session, opts: PrefixCacheOptions) {
    this.#session = session;
    this.#ownerBytes = opts.ownerBytes;
    this.#perOwner = opts.perOwner ?? 4;
    this.#eager = opts.saveEagerly ?? false;
  }

  /** Bytes of all saved prefixes. */
  get bytes(): number {
    return this.#saved.reduce((s, e) => s + size(e), 0);
  }

  /** Number of saved prefixes (the live cache not counted). */
  get count(): number {
    return this.#saved.length;
  }

  /** Token lists cached for `owner`: the live caches that are its, then its saved prefixes. */
  prefixes(owner: string): (readonly number[])[] {
    const live = this.#liveOwner.flatMap((o, seq) =>
      o === owner ? [this.#session.cachedTokensOf(seq)] : []
    );
    return [...live, ...this.#saved.filter((e) => e.owner === owner).map((e) => e.tokens)];
  }

  /** Tokens of `tokens` that a prompt `ids` can reuse. */
  #usable(tokens: readonly number[], ids: readonly number[]): number {
    const n = commonPrefix(tokens, ids, ids.length - 1);
    // A recurrent state (KDA) cannot rewind, nor a wrapped ring past its spare rows: such a
    // prefix serves only a prompt that extends all of it.
    return this.#session.model.transformer.canResume(n, tokens.length) ? n : 0;
  }

  /**
   * Of the sequences `free` (none generating), the one to run `owner`'s prompt `ids` on: the
   * one whose live cache of the owner serves most of it, else one whose live cache is no one's,
   * else the one prepared longest ago.
   */
  choose(owner: string, ids: readonly number[], free: readonly number[]): number {
    const s = this.#session;
    const own = (seq: number) =>
      this.#liveOwner[seq] === owner ? this.#usable(s.cachedTokensOf(seq), ids) : 0;
    const best = free.reduce((a, b) => (own(b) > own(a) ? b : a));
    if (own(best) > 0) return best;
    const empty = free.find((seq) => (this.#liveOwner[seq] ?? null) === null);
    if (empty !== undefined) return empty;
    return free.reduce((a, b) => ((this.#liveUsed[b] ?? 0) < (this.#liveUsed[a] ?? 0) ? b : a));
  }

  /**
   * Readies sequence `seq`'s live cache for a generation of `ids` by `owner`: it ends up holding
   * the owner's cached prefix that shares most tokens with `ids` (the live cache or a saved one
   * written back), or nothing. A live cache that would lose tokens is saved for its owner first.
   */
  prepare(owner: string, ids: readonly number[], seq = 0): void {
    const s = this.#session;
    const live = s.cachedTokensOf(seq);
    const usable = (tokens: readonly number[]) => this.#usable(tokens, ids);
    const liveOwn = this.#liveOwner[seq] === owner && live.length > 0;
    let use = liveOwn ? usable(live) : 0;
    let best: Saved | null = null;
    for (const e of this.#saved) {
      if (e.owner !== owner) continue;
      const u = usable(e.tokens);
      if (u > use) [best, use] = [e, u];
    }
    if (live.length > 0 && (best !== null || !liveOwn || use < live.length)) this.#saveLive(seq);
    if (best) {
      writeCacheParts(s, best.bytes, best.tokens.length, use, seq, best.mtp);
      s.adoptCache(best.tokens.slice(0, use), seq);
      best.used = ++this.#clock;
      // The live cache holds all of it now and is saved again when displaced.
      if (use === best.tokens.length) this.#saved.splice(this.#saved.indexOf(best), 1);
    } else if (!liveOwn) s.resetCache(seq);
    // The draft model's cache would otherwise make drafting another owner's prefix faster.
    if (this.#liveOwner[seq] !== owner) s.speculation?.forgetDraftCache();
    this.#liveOwner[seq] = owner;
    this.#liveSaved[seq] = false;
    this.#liveUsed[seq] = ++this.#clock;
  }

  /** Ends a generation on sequence `seq` (saving its live cache now when eager). */
  finish(seq = 0): void {
    if (this.#eager) this.#saveLive(seq);
  }

  /** Copies sequence `seq`'s live cache into its owner's saved prefixes, within their budget. */
  #saveLive(seq: number): void {
    const owner = this.#liveOwner[seq] ?? null;
    const tokens = [...this.#session.cachedTokensOf(seq)];
    if (this.#liveSaved[seq] || owner === null || tokens.length === 0) return;
    this.#liveSaved[seq] = true;
    const mine = () => this.#saved.filter((e) => e.owner === owner);
    // Nothing new when a saved prefix already holds these tokens (and maybe more).
    if (mine().some((e) => commonPrefix(e.tokens, tokens, tokens.length) === tokens.length)) return;
    const parts = cacheParts(this.#session, tokens.length, seq);
    const mtp = mtpSaved(this.#session, tokens.length, seq);
    const bytes = parts.reduce((n, p) => n + p.length, 0) + (mtp?.bytes.length ?? 0);
    if (bytes > this.#ownerBytes) return;
    const drop = (e: Saved) => this.#saved.splice(this.#saved.indexOf(e), 1);
    // A saved prefix of these tokens is superseded.
    for (const e of mine()) {
      if (commonPrefix(e.tokens, tokens, e.tokens.length) === e.tokens.length) drop(e);
    }
    const used = () => mine().reduce((n, e) => n + size(e), 0);
    while (mine().length >= this.#perOwner || used() + bytes > this.#ownerBytes) {
      drop(mine().reduce((a, b) => (a.used <= b.used ? a : b)));
    }
    this.#saved.push({ owner, tokens, bytes: concatBytes(parts), mtp, used: ++this.#clock });
  }
}

/** Bytes a saved prefix holds. */
function size(e: Saved): number {
  return e.bytes.length + (e.mtp?.bytes.length ?? 0);
}
