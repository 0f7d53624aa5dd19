/**
 * What the recurrent mixers (KDA, Gated DeltaNet) share: a fixed-size state per layer and
 * sequence that carries from prefill into decode and cannot rewind, the positions those states
 * stand at, and the mixer plumbing around them.
 *
 * @module
 */
import type { Arena } from "../arena.ts";
import type { LayerWeights } from "../weights.ts";
import {
  type CacheRegion,
  type Mixer,
  PerSequence,
  type SequenceSpan,
  stateName,
  type StateRegion,
} from "./mixer.ts";

/**
 * Where each recurrent layer's state stands: the next position it expects. A recurrent state
 * cannot rewind, so a call must start at 0 (a restart) or exactly there.
 */
export class RecurrentPositions {
  #what: string;
  #next: number[];
  #first: number;

  /** `layers` are the recurrent layers in order; `what` names their kind in errors. */
  constructor(what: string, numLayers: number, layers: number[]) {
    this.#what = what;
    this.#next = new Array(numLayers).fill(0);
    this.#first = layers.length ? layers[0] : -1;
  }

  /** Declares every state to be at position `pos` (written back by a saved session). */
  resumeAt(pos: number): void {
    this.#next.fill(pos);
  }

  /** Records that layer `layer` has run up to position `next` − 1. */
  advance(layer: number, next: number): void {
    this.#next[layer] = next;
  }

  /**
   * Throws unless `pos` is 0 (a restart) or the next position of `layer` (of the first recurrent
   * layer when absent). A mixer's `begin` calls it before the first layer, so a refused call
   * changes no layer's state or cache.
   */
  check(pos: number, layer = this.#first): void {
    if (pos !== 0 && layer >= 0 && pos !== this.#next[layer]) {
      throw new Error(
        `layer ${layer}: ${this.#what} state is at position ${this.#next[layer]}, not ${pos} ` +
          `(a recurrent state cannot rewind; start again from position 0)`,
      );
    }
  }
}

/** One sequence's rows of a recurrent mixer's call: its layer state, `n` rows from row `first`. */
export interface RecurrentRun<S> {
  st: S;
  n: number;
  first: number;
}

/**
 * A recurrent mixer's fixed-size states, one set per sequence: per layer one arena region of
 * `bytes` (laid out by `place`), and the positions they stand at. `kind` names the mixer in
 * errors, `what` the regions in the arena.
 */
export class RecurrentStates<S extends { state: number }> {
  readonly #kind: string;
  readonly #bytes: number;
  readonly #seqs: PerSequence<{ layers: (S | null)[]; positions: RecurrentPositions }>;

  constructor(
    kind: string,
    what: string,
    arena: Arena,
    numLayers: number,
    layers: number[],
    sequences: number,
    bytes: number,
    place: (region: number) => S,
  ) {
    this.#kind = kind;
    this.#bytes = bytes;
    this.#seqs = new PerSequence(sequences, (seq) => {
      const states: (S | null)[] = new Array(numLayers).fill(null);
      for (const l of layers) {
        states[l] = place(arena.alloc(stateName(`${what} L${l}`, seq), bytes));
      }
      return { layers: states, positions: new RecurrentPositions(kind, numLayers, layers) };
    });
  }

  /** Selects sequence `seq`'s states. */
  select(seq: number): void {
    this.#seqs.select(seq);
  }

  /** Each layer's region of the selected sequence, in layer order. */
  stateRegions(): StateRegion[] {
    return this.#seqs.current.layers.flatMap((st) =>
      st ? [{ offset: st.state, bytes: this.#bytes }] : []
    );
  }

  /** Declares the selected sequence's states (written back by a saved session) to be at `pos`. */
  resumeAt(pos: number): void {
    this.#seqs.current.positions.resumeAt(pos);
  }

  /** Throws unless the selected sequence's states can continue at `pos` (see RecurrentPositions). */
  check(pos: number): void {
    this.#seqs.current.positions.check(pos);
  }

  /**
   * Layer `layer`'s states for the rows of a call, span after span (a span without `seq` is the
   * selected sequence's), each entered as {@link enter} does and zeroed by `zero` at position 0,
   * with the span's first row in the call.
   */
  runs(
    layer: number,
    spans: readonly { seq?: number; n: number; pos: number }[],
    zero: (st: S) => void,
  ): RecurrentRun<S>[] {
    let first = 0;
    return spans.map(({ seq, n, pos }) => {
      if (seq !== undefined) this.select(seq);
      const st = this.enter(layer, pos, n);
      if (pos === 0) zero(st);
      const run = { st, n, first };
      first += n;
      return run;
    });
  }

  /**
   * Layer `layer`'s state for a call of `nb` tokens from `pos`, recorded as run up to pos + nb;
   * throws when the layer has none or cannot continue at `pos`. A caller zeroes it at pos 0.
   */
  enter(layer: number, pos: number, nb: number): S {
    const { layers, positions } = this.#seqs.current;
    const st = layers[layer];
    if (!st) throw new Error(`layer ${layer} is not a ${this.#kind} layer`);
    positions.check(pos, layer);
    positions.advance(layer, pos + nb);
    return st;
  }
}

/**
 * A recurrent mixer: its states do not grow with the positions (no cache regions), each call
 * enters them span by span, and position 0 starts them from zero. A subclass sets `states` and
 * gives the rows' computation (`run`) and the zeroing (`zero`).
 */
export abstract class RecurrentMixer<S extends { state: number }> implements Mixer {
  /** The states of every sequence; set by the subclass's constructor. */
  protected abstract readonly states: RecurrentStates<S>;

  /** out = the mixer's output for `nb` tokens at positions pos..pos+nb−1 of layer `layer`. */
  forward(layer: number, lw: LayerWeights, h: number, out: number, nb: number, pos: number): void {
    this.run(lw, h, out, this.states.runs(layer, [{ n: nb, pos }], (st) => this.zero(st)));
  }

  /**
   * out = the mixer's output for the rows of several sequences, each on its own state: the
   * projections, gates, norms and output projection over all rows at once, the short convs and
   * the recurrence per sequence (the same bits as each sequence alone).
   */
  forwardSpans(
    layer: number,
    lw: LayerWeights,
    h: number,
    out: number,
    spans: readonly SequenceSpan[],
  ): void {
    this.run(lw, h, out, this.states.runs(layer, spans, (st) => this.zero(st)));
  }

  /** Selects sequence `seq`'s states. */
  select(seq: number): void {
    this.states.select(seq);
  }

  /** None: the state does not grow with the positions. */
  cacheRegions(): CacheRegion[] {
    return [];
  }

  /** Each layer's state region (state and conv windows), in layer order. */
  stateRegions(): StateRegion[] {
    return this.states.stateRegions();
  }

  /** Declares the states (written back by a saved session) to be at position `pos`. */
  resumeAt(pos: number): void {
    this.states.resumeAt(pos);
  }

  /** Refuses a position the states cannot continue from, before any layer runs. */
  begin(pos: number): void {
    this.states.check(pos);
  }

  /** The rows of `runs`, one after another in h and out, each on its own state. */
  protected abstract run(lw: LayerWeights, h: number, out: number, runs: RecurrentRun<S>[]): void;

  /** Starts a state at position 0. */
  protected abstract zero(st: S): void;
}
