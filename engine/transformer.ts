/**
 * The forward pass, top to bottom: embedding, then per layer a mixer and a feed-forward, each on
 * its normed input from the residual stream and added back into it, then the final norm and the
 * LM head. A layer is made of parts (engine/parts/): the residual stream (plain, or Attention
 * Residuals), the layer's mixer (grouped-query, latent or linear attention, by `mixerOf`) and
 * the feed-forward (dense or MoE, by `layerKinds`). Which parts a model runs is its config's; this
 * loop names none of them. A config may soft-cap the final logits (`logitSoftcap`).
 *
 * A pass may hold the rows of several sequences (continuous batching, engine/batch.ts): each
 * sequence's rows run the mixers on that sequence's own state, while the residual stream, the
 * norms and the feed-forward run over all rows at once, so each expert is read once for the
 * batch. Every step but attention treats rows independently, so a sequence's logits do not depend
 * on what else is in the pass.
 *
 * With `mtp` (`--spec mtp`) the model's first multi-token-prediction layer runs beside every
 * pass on the positions it settled, and `mtpStep` chains it to draft (engine/speculate.ts).
 *
 * @module
 */
import { type GlobalTensor, type ModelConfig, mtpDraftLayerIds } from "../io/model_config.ts";
import type { Arena } from "./arena.ts";
import { embedRows } from "./embedding.ts";
import type { Ops } from "./ops.ts";
import { FeedForward, type MoeObserver } from "./parts/feed_forward.ts";
import {
  type CacheRegion,
  canResumeAt,
  heldRows,
  regionRows,
  type StateRegion,
  writeRegionRows,
} from "./parts/mixer.ts";
import type { SequenceSpan } from "./parts/mixer.ts";
import { LayerMixers } from "./parts/mod.ts";
import { residualPartOf, type ResidualStream } from "./parts/residual.ts";
import { LOGIT_ROWS, mtpRegions, mtpRows, skeletonRegions } from "./run_state.ts";
import type { TensorRef } from "./tensor.ts";
import type { Timeline } from "./stream/timeline.ts";
import type { ExpertSource, LayerWeights, TrunkSource } from "./weights.ts";

export type { CacheRegion, MoeObserver, StateRegion };

/**
 * Watches each forward pass at the two moments no layer's routing is known: the embedding rows are
 * ready before the first layer runs, and the last layer has run before the final norm and the LM
 * head (the lookahead guesses the next token's first MoE layer there).
 */
export interface PassObserver {
  /** `x` holds the embedding rows (hidden floats each) of the pass's `tokens`. */
  embedded(x: number, tokens: readonly number[]): void;
  tail(): void;
}

/** Weights that stay in the arena for the whole run. */
export interface GlobalWeights {
  embed: TensorRef;
  finalNorm: TensorRef;
  lmHead: TensorRef;
  /** Any global tensor of the model by name (a residual stream's own, for one). */
  get(t: GlobalTensor): TensorRef;
}

/** What a forward pass needs. */
export interface TransformerParts {
  cfg: ModelConfig;
  arena: Arena;
  ops: Ops;
  trunk: TrunkSource;
  experts: ExpertSource;
  globals: GlobalWeights;
  maxBatch: number;
  maxCtx: number;
  /** Sequences whose mixer state the arena holds (default 1). */
  sequences?: number;
  /** Run the first MTP layer beside every pass, in this room, so it can draft (`--spec mtp`). */
  mtp?: MtpRoom;
  /** Marks where each pass's time goes (engine/stream/timeline.ts); off when absent. */
  timeline?: Timeline;
}

/**
 * Where the MTP layer's state, scratch and weights live: room the expert cache lends while the
 * layer drafts and takes back while it does not (engine/model.ts), or resident room.
 */
export interface MtpRoom {
  /**
   * Takes the room: a view of it for the layer's mixer state and buffers (zero-filled), and the
   * layer's weights, read into its end.
   */
  take(): { arena: Arena; weights: LayerWeights };
  /** Gives the room back between passes; false when it stays (resident room). */
  give(): boolean;
}

/** What a sequence's drafting wants of the MTP layer (engine/speculate.ts's gate). */
export type MtpMode = "run" | "idle" | "off";

/** One step of the MTP layer: the draft logits and the hidden state the next step reads. */
export interface MtpStep {
  logits: Float32Array;
  /** The MTP layer's output after its head norm, what the LM head reads (hidden × 1). */
  hidden: Float32Array;
}

/** The MTP layer's mixers, buffers and weights in its room, while the room is taken. */
interface MtpHeld {
  mixers: LayerMixers;
  /** The hidden states the MTP layer reads (mtpRows rows). */
  hidden: number;
  /** Per row [normed embedding; normed hidden state] (mtpRows rows of 2 × hidden). */
  cat: number;
  lw: LayerWeights;
}

/** The MTP layer, its room, and per sequence the hidden rows of its last pass. */
interface MtpState {
  layer: number;
  room: MtpRoom;
  /** What lives in the room while it is taken; null while it is given back. */
  held: MtpHeld | null;
  /** Per sequence: the main pass's hidden rows after the final norm, from position `pos`. */
  last: ({ pos: number; rows: Float32Array } | null)[];
}

/** One sequence's rows of a pass: `tokens` at positions pos.. on sequence `seq`'s state. */
export interface SequenceRows {
  /** Whose mixer state the rows run on (0 ≤ seq < sequences). */
  seq: number;
  tokens: number[];
  pos: number;
  /** Logits of every token rather than of the last. */
  allLogits?: boolean;
}

/**
 * A pass its `stop` poll ended between two layers (engine/batch.ts: a request cancelled inside a
 * prompt chunk). Layers after `layer` did not run: its rows' cache rows beyond what their
 * sequences hold are half-written, and a recurrent state advanced in some layers only.
 */
export class PassInterrupted extends Error {
  constructor(readonly layer: number) {
    super(`the forward pass was stopped after layer ${layer}`);
    this.name = "PassInterrupted";
  }
}

/** A model's forward pass over its arena. */
export class Transformer {
  readonly cfg: ModelConfig;
  #p: TransformerParts;
  #stream: ResidualStream;
  #mixers: LayerMixers;
  #ffn: FeedForward;
  #h: number;
  #tmp: number;
  #logits: number;
  #calls = 0;
  /** Per sequence: passes that ran rows on its state. */
  #writes: number[];
  #mtp: MtpState | null = null;
  /**
   * What each generation's drafting wants of the MTP layer, by sequence; a sequence without one
   * (reading a prompt, or not generating) keeps its rows but does not hold the room.
   */
  #mtpMode = new Map<number, MtpMode>();
  #mtpCacheRows = 0;
  #mtpTakes = 0;

  constructor(p: TransformerParts) {
    this.#p = p;
    this.cfg = p.cfg;
    const { cfg, ops, arena, maxBatch } = p;
    this.#stream = residualPartOf(cfg).create(ops, arena, cfg, (t) => p.globals.get(t), maxBatch);
    this.#writes = new Array(p.sequences ?? 1).fill(0);
    this.#mixers = new LayerMixers(ops, arena, cfg, maxBatch, p.maxCtx, this.#writes.length);
    this.#ffn = new FeedForward(ops, arena, cfg, p.experts, maxBatch, p.timeline);
    const [h, tmp, logits] = skeletonRegions(cfg, maxBatch);
    this.#h = arena.alloc("hidden h", h);
    this.#tmp = arena.alloc("hidden tmp", tmp);
    this.#logits = arena.alloc("logits", logits);
    if (p.mtp) {
      const [layer] = mtpDraftLayerIds(cfg);
      if (layer === undefined) throw new Error(`${cfg.modelType}: the model has no MTP layer`);
      if (cfg.residual) {
        throw new Error(`${cfg.modelType}: MTP drafts need a plain residual stream`);
      }
      this.#mtp = {
        layer,
        room: p.mtp,
        held: null,
        last: new Array(this.#writes.length).fill(null),
      };
    }
  }

  /** The pass's timeline, when the run keeps one. */
  get timeline(): Timeline | undefined {
    return this.#p.timeline;
  }

  /** Observers of each pass's embedding and tail (may be empty). */
  readonly passObservers: PassObserver[] = [];

  /** Observers of MoE routing (may be empty). */
  get moeObservers(): MoeObserver[] {
    return this.#ffn.observers;
  }

  /** Sequence `seq`'s position-indexed caches (see {@link Mixer.cacheRegions}). */
  cacheRegions(seq = 0): CacheRegion[] {
    this.#mixers.select(seq);
    return this.#mixers.cacheRegions();
  }

  /**
   * Whether sequence `seq`'s caches, holding positions 0..had−1, can continue at position `at`:
   * always from 0 (all runs again) and at `had`; a recurrent state never rewinds, and a sliding
   * window's ring only as far as {@link canResumeAt} allows.
   */
  canResume(at: number, had: number, seq = 0): boolean {
    if (at === 0 || at === had) return true;
    return this.stateRegions(seq).length === 0 && canResumeAt(this.cacheRegions(seq), had, at);
  }

  /** Sequence `seq`'s recurrent states (see {@link Mixer.stateRegions}). */
  stateRegions(seq = 0): StateRegion[] {
    this.#mixers.select(seq);
    return this.#mixers.stateRegions();
  }

  /** Declares sequence `seq`'s restored recurrent states to be at position `pos`. */
  resumeAt(pos: number, seq = 0): void {
    this.#mixers.select(seq);
    this.#mixers.resumeAt(pos);
  }

  /** Forward calls so far. */
  get calls(): number {
    return this.#calls;
  }

  /**
   * Passes so far that ran rows on sequence `seq`'s state: a prompt cache knows by it whether
   * anyone else wrote that sequence's KV cache.
   */
  writes(seq = 0): number {
    return this.#writes[seq] ?? 0;
  }

  /** Sequences whose state the arena holds. */
  get sequences(): number {
    return this.#writes.length;
  }

  /** Most tokens one call may take. */
  get maxBatch(): number {
    return this.#p.maxBatch;
  }

  /**
   * Called before anything writes sequence `seq`'s cache rows below position `end` (each pass,
   * a restored session): the rows the KV cache lends out are taken back first
   * (engine/kv_lending.ts). Null when nothing is lent.
   */
  reserveRows: ((seq: number, end: number) => void) | null = null;

  /** Diagnosis only (engine/finite_check.ts): sees each layer's output `x` of `n` floats. */
  layerProbe: ((layer: number, x: number, n: number) => void) | null = null;

  /**
   * Runs `tokens` at positions pos..pos+n−1 and returns the logits of the last token, or of every
   * token when `allLogits` (n × vocab floats). The returned array is a copy.
   */
  forward(tokens: number[], pos: number, allLogits = false): Float32Array {
    return this.forwardBatch([{ seq: 0, tokens, pos, allLogits }])[0];
  }

  /**
   * Runs one pass over the rows of several sequences (each sequence at most once) and returns,
   * per sequence in order, the logits of its last token, or of every token when `allLogits`.
   * A sequence's logits are those of running its rows alone. `stop` is polled after each layer
   * but the last: when it says so the pass ends there with {@link PassInterrupted}.
   */
  forwardBatch(batch: readonly SequenceRows[], stop?: () => boolean): Float32Array[] {
    const { cfg, arena, ops, trunk, globals } = this.#p;
    const tokens = batch.flatMap((r) => r.tokens);
    const nb = tokens.length;
    const d = cfg.hiddenSize;
    const eps = cfg.rmsNormEps;
    // Qwen3-Next / Qwen3.5: every skeleton norm scales by (1 + w).
    const unit = cfg.normUnitOffset;
    if (batch.some((r) => r.tokens.length < 1) || nb < 1 || nb > this.maxBatch) {
      throw new Error(`forward: ${nb} tokens, at most ${this.maxBatch}`);
    }
    const seqs = new Set(batch.map((r) => r.seq));
    if (seqs.size < batch.length) throw new Error("forward: a sequence appears twice in one pass");
    for (const r of batch) {
      this.#mixers.select(r.seq);
      this.#mixers.begin(r.pos, r.tokens.length);
    }
    for (const r of batch) this.reserveRows?.(r.seq, r.pos + r.tokens.length);
    this.#calls++;
    for (const s of seqs) this.#writes[s]++;
    const positions = batch.flatMap((r) => r.tokens.map((_, i) => r.pos + i));
    const spans = batch.map((r) => ({ seq: r.seq, n: r.tokens.length, pos: r.pos }));
    const stream = this.#stream, h = this.#h;
    embedRows(arena, globals.embed, tokens, stream.x);
    const timeline = this.#p.timeline;
    timeline?.mark("route", 0);
    for (const o of this.passObservers) o.embedded(stream.x, tokens);
    stream.start(nb);
    for (let layer = 0; layer < cfg.numLayers; layer++) {
      timeline?.mark("wait", layer);
      const lw = trunk.acquire(layer);
      timeline?.mark("mixer", layer);
      this.#layer(layer, lw, this.#mixers, spans, positions, tokens);
      this.layerProbe?.(layer, stream.x, nb * d);
      trunk.release(layer);
      if (layer < cfg.numLayers - 1 && stop?.()) throw new PassInterrupted(layer);
    }
    timeline?.mark("tail", -1);
    for (const o of this.passObservers) o.tail();
    // The rows whose logits are asked for, gathered to the front of h after the final norm.
    const picked: number[] = [];
    let end = 0;
    for (const r of batch) {
      end += r.tokens.length;
      for (let i = r.allLogits ? end - r.tokens.length : end - 1; i < end; i++) picked.push(i);
    }
    // The MTP layer reads every row as the LM head would (after the final norm).
    const first = batch.length === 1 && !this.#mtp ? picked[0] : 0;
    ops.rmsnorm(stream.output(first, nb), globals.finalNorm.ptr, h, d, nb - first, eps, unit);
    const hidden = this.#mtp ? ops.f32(h, nb * d).slice() : null;
    // Each row moves to a lower or equal row no later row is read from.
    picked.forEach((r, i) =>
      r - first !== i && ops.copy(h + i * d * 4, h + (r - first) * d * 4, d)
    );
    const logits = this.#head(picked.length);
    if (hidden) {
      let r0 = 0;
      for (const r of batch) {
        this.#mtpCatchUp(r, hidden.subarray(r0 * d, (r0 + r.tokens.length) * d));
        r0 += r.tokens.length;
      }
    }
    const vocab = cfg.vocabSize;
    let at = 0;
    return batch.map((r) => {
      const n = r.allLogits ? r.tokens.length : 1;
      at += n;
      return logits.subarray((at - n) * vocab, at * vocab);
    });
  }

  /**
   * One layer of the skeleton on the stream's `nb` rows: the normed mixer input through the
   * layer's mixer (each sequence's span on its own state), then the normed feed-forward input
   * through the feed-forward, each added back.
   */
  #layer(
    layer: number,
    lw: LayerWeights,
    mixers: LayerMixers,
    spans: readonly SequenceSpan[],
    positions: readonly number[],
    tokens: readonly number[],
  ): void {
    const { cfg, ops } = this.#p;
    const stream = this.#stream, h = this.#h, tmp = this.#tmp;
    const d = cfg.hiddenSize, eps = cfg.rmsNormEps, unit = cfg.normUnitOffset;
    const nb = tokens.length;
    ops.rmsnorm(stream.input("mixer", layer, lw, nb), lw.get("attn_norm").ptr, h, d, nb, eps, unit);
    // Attention is per sequence: each one's rows on its own state.
    mixers.forwardSpans(layer, lw, h, tmp, spans);
    stream.add("mixer", layer, tmp, nb);
    const x = stream.input("ffn", layer, lw, nb);
    ops.rmsnorm(x, lw.get("ffn_norm").ptr, h, d, nb, eps, unit);
    this.#ffn.forward(layer, lw, h, x, tmp, nb, positions, tokens);
    stream.add("ffn", layer, tmp, nb);
  }

  /** The LM head (and soft cap) over the first `rows` rows of h, in pieces of LOGIT_ROWS. */
  #head(rows: number): Float32Array {
    const { cfg, ops, globals } = this.#p;
    const d = cfg.hiddenSize, vocab = cfg.vocabSize;
    const logits = new Float32Array(rows * vocab);
    for (let r0 = 0; r0 < rows; r0 += LOGIT_ROWS) {
      const n = Math.min(LOGIT_ROWS, rows - r0);
      ops.matmul({ w: globals.lmHead, x: this.#h + r0 * d * 4, y: this.#logits, nb: n });
      if (cfg.logitSoftcap) ops.softcap(this.#logits, n * vocab, cfg.logitSoftcap);
      logits.set(ops.f32(this.#logits, n * vocab), r0 * vocab);
    }
    return logits;
  }

  /** Whether the MTP layer runs beside every pass (it can draft). */
  get mtp(): boolean {
    return this.#mtp !== null;
  }

  /** Rows the MTP layer has run to keep its cache (drafting steps aside). */
  get mtpCacheRows(): number {
    return this.#mtpCacheRows;
  }

  /** Times the MTP layer took its room (and read its weights). */
  get mtpTakes(): number {
    return this.#mtpTakes;
  }

  /** Whether the MTP layer holds its room now. */
  get mtpHeld(): boolean {
    return this.#mtp?.held != null;
  }

  /** The MTP layer's mixers, buffers and weights, its room taken first when it was given back. */
  #mtpHold(): MtpHeld {
    const m = this.#mtp!;
    if (m.held) return m.held;
    const { cfg, ops } = this.#p;
    const { arena, weights } = m.room.take();
    this.#mtpTakes++;
    const rows = mtpRows(this.#p.maxBatch);
    const [hidden, cat] = mtpRegions(cfg, rows);
    const mixers = new LayerMixers(
      ops,
      arena,
      cfg,
      rows,
      this.#p.maxCtx,
      this.#writes.length,
      [m.layer],
    );
    m.held = {
      mixers,
      hidden: arena.alloc("mtp hidden", hidden),
      cat: arena.alloc("mtp embedding and hidden", cat),
      lw: weights,
    };
    return m.held;
  }

  /**
   * The main pass's hidden state at position `pos` of sequence `seq` after the final norm (what
   * the LM head reads, and what the MTP layer was trained on), when its last pass ran that
   * position; else null.
   */
  mtpHidden(seq: number, pos: number): Float32Array | null {
    const last = this.#mtp?.last[seq];
    const d = this.cfg.hiddenSize;
    if (!last || pos < last.pos || (pos - last.pos + 1) * d > last.rows.length) return null;
    return last.rows.subarray((pos - last.pos) * d, (pos - last.pos + 1) * d);
  }

  /**
   * What a prompt cache or saved session keeps of sequence `seq`'s MTP layer for positions
   * 0..n−1: each of its cache regions' rows (views into the arena; the row of n − 1 is rewritten
   * by the next pass before anything reads it), then the main hidden state at n − 1 that the
   * next pass's first MTP row reads. Null while the room is given back or that hidden state is
   * not at hand: there is nothing worth keeping.
   */
  mtpSnapshot(seq: number, n: number): { rowBytes: number[]; parts: Uint8Array[] } | null {
    const held = this.#mtp?.held, hidden = this.mtpHidden(seq, n - 1);
    if (!held || !hidden) return null;
    held.mixers.select(seq);
    const regions = held.mixers.cacheRegions();
    return {
      rowBytes: regions.map((r) => r.rowBytes),
      parts: [
        ...regionRows(this.#p.arena, regions, n),
        new Uint8Array(hidden.buffer, hidden.byteOffset, hidden.byteLength),
      ],
    };
  }

  /**
   * Sequence `seq`'s KV cache was written back to its first `n` positions (a prompt cache or
   * session): with `snapshot` (the bytes of an {@link mtpSnapshot} of `stored` ≥ n positions
   * with regions of `rowBytes`), the MTP layer's rows are written back too, its room taken, and
   * where n = stored the next pass continues its cache as a cold run would; without one (or of
   * another layout) its rows are left stale. Returns whether the rows were restored.
   */
  mtpRestore(
    seq: number,
    snapshot: { rowBytes: number[]; bytes: Uint8Array } | null,
    stored: number,
    n: number,
  ): boolean {
    const m = this.#mtp;
    if (!m) return false;
    // The hidden rows of the sequence's last pass belong to what ran before the restore.
    m.last[seq] = null;
    if (!snapshot || n < 1) return false;
    const held = this.#mtpHold();
    held.mixers.select(seq);
    const regions = held.mixers.cacheRegions(), d = this.cfg.hiddenSize;
    const { rowBytes, bytes } = snapshot;
    const size = regions.reduce((a, r) => a + heldRows(r, stored) * r.rowBytes, 0) + d * 4;
    const same = regions.length === rowBytes.length &&
      regions.every((r, i) => r.rowBytes === rowBytes[i]);
    if (!same || bytes.length !== size) return false;
    const at = writeRegionRows(this.#p.arena, regions, bytes, stored, n);
    if (n === stored) {
      // A copy (the bytes may be a view into a file's buffer, at any alignment).
      const rows = new Float32Array(d);
      new Uint8Array(rows.buffer).set(bytes.subarray(at, at + d * 4));
      m.last[seq] = { pos: n - 1, rows };
    }
    return true;
  }

  /**
   * Fills the MTP layer's cache for the positions a pass of sequence `r.seq` settled: position p
   * reads the main hidden state at p and the token at p + 1 (DeepSeek-V3 tech report §2.2), so
   * this pass's rows give every position before its last, and the previous pass's last row the
   * one before this pass's first. What a draft wrote past them is overwritten here before any
   * query reads it.
   */
  #mtpCatchUp(r: SequenceRows, rows: Float32Array): void {
    const m = this.#mtp!, d = this.cfg.hiddenSize;
    const before = this.mtpHidden(r.seq, r.pos - 1);
    const n = r.tokens.length - 1 + (before ? 1 : 0);
    if (n > 0 && (this.#mtpMode.get(r.seq) ?? "run") === "run") {
      this.#mtpCacheRows += n;
      const hidden = new Float32Array(n * d);
      if (before) hidden.set(before);
      hidden.set(rows.subarray(0, (r.tokens.length - 1) * d), before ? d : 0);
      const tokens = before ? r.tokens : r.tokens.slice(1);
      const pos = before ? r.pos - 1 : r.pos, step = mtpRows(this.#p.maxBatch);
      for (let i = 0; i < n; i += step) {
        const k = Math.min(step, n - i);
        this.#mtpRun(r.seq, hidden.subarray(i * d, (i + k) * d), tokens.slice(i, i + k), pos + i);
      }
    }
    m.last[r.seq] = { pos: r.pos, rows };
  }

  /**
   * Says what sequence `seq`'s drafting wants of the MTP layer: "run" keeps its cache beside its
   * passes; "idle" (the gate measuring plain steps) stops that, since the layer would cost a pass
   * for nothing; "off" (the gate holding drafting off for a while) also gives the layer's room
   * back to the expert cache once no generation drafts, so a layer that does not pay takes no
   * room from the main model; null (its generation ended) keeps its rows beside later passes
   * (the next prompt's) without holding the room. Positions passed while idle keep stale cache
   * rows, and a room taken again starts with zero rows: both can only lower later drafts'
   * acceptance, never change a token.
   */
  mtpMode(seq: number, mode: MtpMode | null): void {
    if (mode === null) this.#mtpMode.delete(seq);
    else this.#mtpMode.set(seq, mode);
    const m = this.#mtp;
    if (!m?.held || mode !== "off") return;
    if ([...this.#mtpMode.values()].includes("run")) return;
    if (m.room.give()) m.held = null;
  }

  /**
   * One MTP step on sequence `seq`: `token` (the one after position `pos`) with `hidden`, the
   * main pass's (or the previous step's) normed hidden state at `pos`; its logits predict the
   * token two after `pos`. Chained steps each read the hidden state the step before returns.
   */
  mtpStep(seq: number, hidden: Float32Array, token: number, pos: number): MtpStep {
    if (!this.#mtp) throw new Error("mtpStep: the MTP layer is not running (--spec mtp)");
    return this.#mtpRun(seq, hidden, [token], pos, true)!;
  }

  /**
   * The MTP layer on rows at positions pos..: h' = M·[RMSNorm_e(Emb(token)); RMSNorm_h(hidden)]
   * (the embedding is zero at position 0, as vLLM and SGLang run it), then one decoder layer on
   * its own cache, then with `logits` its head norm and the shared LM head on the last row; the
   * head norm's output is the hidden state a chained step reads.
   */
  #mtpRun(
    seq: number,
    hidden: Float32Array,
    tokens: number[],
    pos: number,
    logits = false,
  ): MtpStep | null {
    const { cfg, arena, ops, globals } = this.#p;
    const m = this.#mtp!, d = cfg.hiddenSize, eps = cfg.rmsNormEps, unit = cfg.normUnitOffset;
    const nb = tokens.length;
    const stream = this.#stream, h = this.#h, tmp = this.#tmp;
    const held = this.#mtpHold(), lw = held.lw;
    held.mixers.select(seq);
    held.mixers.begin(pos, nb);
    embedRows(arena, globals.embed, tokens, tmp);
    if (pos === 0) ops.f32(tmp, d).fill(0);
    ops.rmsnorm(tmp, lw.get("mtp_enorm").ptr, h, d, nb, eps, unit);
    ops.f32(held.hidden, nb * d).set(hidden);
    ops.rmsnorm(held.hidden, lw.get("mtp_hnorm").ptr, tmp, d, nb, eps, unit);
    for (let r = 0; r < nb; r++) {
      ops.copy(held.cat + 2 * r * d * 4, h + r * d * 4, d);
      ops.copy(held.cat + (2 * r + 1) * d * 4, tmp + r * d * 4, d);
    }
    ops.matmul({ w: lw.get("mtp_proj"), x: held.cat, y: stream.x, nb });
    stream.start(nb);
    const positions = tokens.map((_, i) => pos + i);
    this.#layer(m.layer, lw, held.mixers, [{ seq, n: nb, pos }], positions, tokens);
    if (!logits) return null;
    ops.rmsnorm(stream.output(nb - 1, nb), lw.get("mtp_head_norm").ptr, h, d, 1, eps, unit);
    return { hidden: ops.f32(h, d).slice(), logits: this.#head(1) };
  }
}
