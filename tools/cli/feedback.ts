/**
 * What `generate` and `chat` say while they work: colour (NO_COLOR and --color), a progress
 * line with MB/s during the model load (redrawn on a terminal) and one line when it is done, a
 * progress line with tok/s during a long prefill (redrawn on a terminal, one final line
 * otherwise), and the notice when the context is full.
 *
 * @module
 */
import type { RunStats } from "../../engine/stats.ts";
import { formatBytes } from "../../engine/units.ts";
import type { Args, Flags } from "./args.ts";

/** `--color` / `--no-color` (llama.cpp: `-co`). */
export const COLOR_FLAGS: Flags = {
  color: { type: "boolean", dashed: ["co"] },
  "no-color": { type: "boolean" },
};

/** The --help lines of {@link COLOR_FLAGS}. */
export const COLOR_HELP =
  `  --color, -co          colour even when not on a terminal or when NO_COLOR is set
  --no-color            no colour (also the environment variable NO_COLOR)`;

/**
 * Whether output to `stream` is coloured: --color wins, then --no-color and NO_COLOR (read from
 * `env`, the process's unless given), then TTY.
 */
export function colorOn(
  a: Args,
  stream: { isTerminal(): boolean },
  env: { get(name: string): string | undefined } = Deno.env,
): boolean {
  if (a.bool("color") && a.bool("no-color")) {
    throw new Error("give --color or --no-color, not both");
  }
  if (a.bool("color")) return true;
  if (a.bool("no-color") || (env.get("NO_COLOR") ?? "") !== "") return false;
  return stream.isTerminal();
}

/** SGR codes used. */
const SGR = { bold: 1, dim: 2, yellow: 33 } as const;

/** `text` in a style when `on`. */
export function paint(on: boolean, style: keyof typeof SGR, text: string): string {
  return on && text !== "" ? `\x1b[${SGR[style]}m${text}\x1b[0m` : text;
}

/** A prefill that runs this long gets a progress line (on a terminal) or a final line. */
const LONG_PREFILL_MS = 1000;

/**
 * An `onPrefill` callback showing prompt progress on stderr: on a terminal a line redrawn after
 * each chunk once the prefill has run {@link LONG_PREFILL_MS}, else one line at the end of a
 * prefill that long. `then` runs after each report (the chat lets signals in there).
 */
export function prefillProgress(
  opts: {
    tty?: boolean;
    color?: boolean;
    /** Prompt tokens not run (reused from the prompt cache), known once the prefill starts. */
    cached?: () => number;
    write?: (s: string) => void;
    now?: () => number;
  } = {},
  then?: () => void | Promise<void>,
): (done: number, total: number) => Promise<void> {
  const tty = opts.tty ?? Deno.stderr.isTerminal();
  const enc = new TextEncoder();
  const write = opts.write ?? ((s: string) => Deno.stderr.writeSync(enc.encode(s)));
  const now = opts.now ?? (() => performance.now());
  const t0 = now();
  let drawn = false;
  return async (done, total) => {
    const ms = now() - t0;
    const rate = ms > 0 ? (1000 * (done - (opts.cached?.() ?? 0))) / ms : 0;
    const text = `prompt ${done}/${total} tokens, ${rate.toFixed(1)} tok/s, ` +
      `${(ms / 1000).toFixed(1)} s`;
    if (tty && ms >= LONG_PREFILL_MS) {
      write(`\r${paint(opts.color ?? false, "dim", text)}\x1b[K${done === total ? "\n" : ""}`);
      drawn = true;
    } else if (done === total && (ms >= LONG_PREFILL_MS || drawn)) {
      write(`${drawn ? "\r" : ""}${paint(opts.color ?? false, "dim", text)}\n`);
    }
    await then?.();
  };
}

/** Least time between two redraws of the load line (a load reports every landed batch). */
const LOAD_REDRAW_MS = 100;

/**
 * Load progress on stderr: on a terminal `onLoad` (engine/model.ts) redraws a line as reads land,
 * with bytes, share, MB/s and time, and erases it when the load is done so the lines after it
 * ({@link loadLine}) take its place; `end` erases it too (a load that failed). Nothing otherwise,
 * where the load line is the one final line.
 */
export function loadProgress(
  opts: { tty?: boolean; color?: boolean; write?: (s: string) => void; now?: () => number } = {},
): { onLoad: (done: number, total: number) => void; end: () => void } {
  const tty = opts.tty ?? Deno.stderr.isTerminal();
  const enc = new TextEncoder();
  const write = opts.write ?? ((s: string) => Deno.stderr.writeSync(enc.encode(s)));
  const now = opts.now ?? (() => performance.now());
  const t0 = now();
  let last = -Infinity;
  let drawn = false;
  const end = () => {
    if (drawn) write("\r\x1b[K");
    drawn = false;
  };
  const onLoad = (done: number, total: number) => {
    if (!tty) return;
    const ms = now() - t0;
    if (done >= total) return end();
    if (ms - last < LOAD_REDRAW_MS) return;
    last = ms;
    const pct = total > 0 ? (100 * done) / total : 100;
    const rate = ms > 0 ? (1000 * done) / ms / 1e6 : 0;
    const text = `loading ${formatBytes(done)} / ${formatBytes(total)} (${pct.toFixed(0)}%), ` +
      `${rate.toFixed(0)} MB/s, ${(ms / 1000).toFixed(1)} s`;
    write(`\r${paint(opts.color ?? false, "dim", text)}\x1b[K`);
    drawn = true;
  };
  return { onLoad, end };
}

/** The one line after a model load: time, bytes read and the read rate. */
export function loadLine(s: RunStats): string {
  const secs = s.load_ms / 1000;
  const rate = secs > 0 ? s.load_bytes / 1e6 / secs : 0;
  return `loaded in ${secs.toFixed(2)} s: ${formatBytes(s.load_bytes)} read (${
    rate.toFixed(0)
  } MB/s)`;
}

/** The notice when a generation stopped because the context was full, or null. */
export function contextFullNotice(s: RunStats, ctx: number): string | null {
  if (s.stop_reason !== "context") return null;
  return `(the context is full: ${ctx} tokens; start with a larger --ctx to go further)`;
}
