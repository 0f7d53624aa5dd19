/**
 * Where a forward pass's time goes while experts stream: the pass marks each change of phase
 * (a layer's mixer, its routing, an expert's compute, a wait for a read, the tail after the last
 * layer) and the timeline adds the wall time since the previous mark, and the time the disk was
 * busy meanwhile (the reader's own accounting, `diskStats().busyMs`), to that phase of that
 * layer. So it shows whether the disk idled while the CPU worked (a compute phase's wall time less
 * its disk time) and the CPU waited while the disk worked (the waits). Off unless asked for
 * (`RunOptions.timeline`): a mark costs a clock read and a reader call.
 *
 * @module
 */

/** The phases a forward pass marks. */
export const PHASES = ["mixer", "route", "expert", "wait", "tail"] as const;

/**
 * One phase of a pass: `mixer` = trunk layer bound, norms, mixer, residual; `route` = router,
 * routing, the expert source's hint (reads queued) and the observers (the lookahead's
 * prediction); `expert` = an expert's matvecs, the weighted sum and shared experts; `wait` = the
 * forward pass blocked on a read (an expert record or a trunk layer); `tail` = after the last layer:
 * final norm, LM head, and whatever runs until the next pass starts (sampling, embedding).
 */
export type Phase = typeof PHASES[number];

/** Wall and disk-busy milliseconds of one phase. */
export interface PhaseTime {
  wallMs: number;
  /** Of the wall time, milliseconds during which at least one read ran. */
  diskMs: number;
}

/** Totals of a timeline: by phase, and by layer and phase (the tail has layer −1). */
export interface TimelineTotals {
  phases: Record<Phase, PhaseTime>;
  /** Per layer, in layer order, the layer's phases (no `tail`). */
  layers: Record<Phase, PhaseTime>[];
  /** Waits during which another expert of the same layer was already resident, and all waits. */
  waitsWithReady: number;
  waits: number;
}

function emptyPhases(): Record<Phase, PhaseTime> {
  return Object.fromEntries(PHASES.map((p) => [p, { wallMs: 0, diskMs: 0 }])) as Record<
    Phase,
    PhaseTime
  >;
}

/** Accumulates phase times from marks. */
export class Timeline {
  #busy: () => number;
  #phase: Phase | null = null;
  #layer = -1;
  #t = 0;
  #disk = 0;
  #totals: TimelineTotals = { phases: emptyPhases(), layers: [], waitsWithReady: 0, waits: 0 };

  /** `busyMs` reads the reader's cumulative disk-busy milliseconds. */
  constructor(busyMs: () => number) {
    this.#busy = busyMs;
  }

  /** Ends the current phase and starts `phase` of `layer` (−1 outside the layers). */
  mark(phase: Phase, layer: number): void {
    const t = performance.now(), disk = this.#busy();
    if (this.#phase !== null) {
      const dt = t - this.#t, dd = Math.min(dt, disk - this.#disk);
      const add = (p: PhaseTime) => {
        p.wallMs += dt;
        p.diskMs += dd;
      };
      add(this.#totals.phases[this.#phase]);
      if (this.#layer >= 0) {
        const layers = this.#totals.layers;
        while (layers.length <= this.#layer) layers.push(emptyPhases());
        add(layers[this.#layer][this.#phase]);
      }
    }
    this.#phase = phase;
    this.#layer = layer;
    this.#t = t;
    this.#disk = disk;
  }

  /** Counts a wait for a read, and whether another expert was ready to compute meanwhile. */
  countWait(otherReady: boolean): void {
    this.#totals.waits++;
    if (otherReady) this.#totals.waitsWithReady++;
  }

  /** Zeroes the totals; the open phase counts from now. */
  reset(): void {
    this.#totals = { phases: emptyPhases(), layers: [], waitsWithReady: 0, waits: 0 };
    this.#t = performance.now();
    this.#disk = this.#busy();
  }

  /** A copy of the totals so far (the open phase not included). */
  get totals(): TimelineTotals {
    return structuredClone(this.#totals);
  }
}
