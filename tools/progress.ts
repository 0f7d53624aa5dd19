/**
 * Byte-count progress reporting for long tools: a redrawn bar with rate and ETA on a terminal,
 * plain lines (every 10% or 5 s) otherwise, or nothing.
 *
 * @module
 */
import { formatBytes } from "../engine/units.ts";

export { formatBytes };

/** How progress is shown: "auto" picks "tty" when stderr is a terminal, else "lines". */
export type ProgressMode = "auto" | "tty" | "lines" | "off";

/** Options of {@link Progress}. */
export interface ProgressOptions {
  label: string;
  /** Total bytes expected. */
  total: number;
  mode?: ProgressMode;
  /** Sink for the text (default: stderr). */
  write?: (text: string) => void;
  /** Clock in milliseconds (tests pass a fake one). */
  now?: () => number;
}

const MB = 1e6;
const BAR_WIDTH = 28;

function formatSeconds(s: number): string {
  if (!Number.isFinite(s)) return "--:--";
  const m = Math.floor(s / 60), sec = Math.floor(s % 60);
  return m >= 60
    ? `${Math.floor(m / 60)}h${String(m % 60).padStart(2, "0")}m`
    : `${m}:${String(sec).padStart(2, "0")}`;
}

/** Reports bytes done out of a total. */
export class Progress {
  readonly #label: string;
  readonly #total: number;
  readonly #mode: Exclude<ProgressMode, "auto">;
  readonly #write: (text: string) => void;
  readonly #now: () => number;
  readonly #start: number;
  #done = 0;
  /** Bytes counted as done without work (a resume's head start): not part of the rate. */
  #skipped = 0;
  #lastDraw = -Infinity;
  #lastTenth = -1;
  #lastLineDone = -1;

  constructor(opts: ProgressOptions) {
    this.#label = opts.label;
    this.#total = Math.max(0, opts.total);
    const mode = opts.mode ?? "auto";
    this.#mode = mode === "auto" ? (Deno.stderr.isTerminal() ? "tty" : "lines") : mode;
    const enc = new TextEncoder();
    this.#write = opts.write ?? ((t) => Deno.stderr.writeSync(enc.encode(t)));
    this.#now = opts.now ?? (() => performance.now());
    this.#start = this.#now();
  }

  /** Bytes reported so far. */
  get done(): number {
    return this.#done;
  }

  /** Adds `bytes` to the count and redraws when due. */
  add(bytes: number): void {
    this.#done = Math.min(this.#total, this.#done + bytes);
    this.#draw(false);
  }

  /** Counts `bytes` already done before this run (kept from a resume), outside the rate. */
  skip(bytes: number): void {
    this.#skipped += bytes;
    this.add(bytes);
  }

  /** Draws the final state and ends the line. */
  finish(): void {
    this.#draw(true);
  }

  /** The status text: percentage, bytes, MB/s and ETA. */
  status(): string {
    const secs = (this.#now() - this.#start) / 1000;
    const rate = secs > 0 ? Math.max(0, this.#done - this.#skipped) / secs : 0;
    const eta = rate > 0 ? (this.#total - this.#done) / rate : Infinity;
    const pct = this.#total ? (100 * this.#done) / this.#total : 100;
    return `${this.#label} ${pct.toFixed(1).padStart(5)}% ${formatBytes(this.#done)} / ` +
      `${formatBytes(this.#total)} ${(rate / MB).toFixed(1)} MB/s ETA ${formatSeconds(eta)}`;
  }

  #draw(final: boolean): void {
    if (this.#mode === "off") return;
    const t = this.#now();
    if (this.#mode === "tty") {
      if (!final && t - this.#lastDraw < 100) return;
      this.#lastDraw = t;
      const frac = this.#total ? this.#done / this.#total : 1;
      const fill = Math.round(frac * BAR_WIDTH);
      const bar = "#".repeat(fill) + "-".repeat(BAR_WIDTH - fill);
      this.#write(`\r[${bar}] ${this.status()}\x1b[K${final ? "\n" : ""}`);
      return;
    }
    const tenth = this.#total ? Math.floor((10 * this.#done) / this.#total) : 10;
    const due = final ? this.#done !== this.#lastLineDone : tenth > this.#lastTenth;
    if (due || t - this.#lastDraw >= 5000) {
      this.#lastTenth = tenth;
      this.#lastDraw = t;
      this.#lastLineDone = this.#done;
      this.#write(this.status() + "\n");
    }
  }
}
