/**
 * Seeded value streams. Each tensor has its own xorshift32 stream, seeded from the seed and the
 * tensor's name, so the bytes do not depend on chunking, sharding or order. One 32-bit draw gives
 * one value: the sum of its four bytes (Irwin–Hall, n = 4), standardised, is a bell-shaped variate
 * with 1021 levels, mapped through a per-tensor table to `mean + std · n`.
 *
 * @module
 */

import type { SynthElemType } from "./types.ts";

/** FNV-1a of the seed and a name: the start state of that tensor's stream (never 0). */
export function streamSeed(seed: number, name: string): number {
  let h = 0x811c9dc5 ^ (seed >>> 0);
  h = Math.imul(h, 0x01000193);
  h ^= Math.floor(seed / 0x100000000) >>> 0;
  for (let i = 0; i < name.length; i++) {
    h ^= name.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h | 0 || 0x1234567;
}

/** Standard deviation of the sum of four uniform bytes. */
const IRWIN_HALL_STD = Math.sqrt((4 * (256 * 256 - 1)) / 12);

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** float32 → bf16 bits, rounding to nearest even. */
function bf16Bits(x: number): number {
  f32[0] = x;
  const u = u32[0];
  return ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) & 0xffff;
}

/** The value of FP8 E4M3 (fn: no infinities, 0x7f/0xff NaN) code `c`. */
export function e4m3Value(c: number): number {
  const e = (c >> 3) & 15, m = c & 7;
  const a = e === 0 ? m / 512 : (1 + m / 8) * 2 ** (e - 7);
  return c & 0x80 ? -a : a;
}

/** The finite E4M3 code nearest to x (ties to the smaller magnitude; beyond ±448 clamps). */
function e4m3Bits(x: number): number {
  const a = Math.abs(x);
  let best = 0;
  for (let c = 1; c <= 0x7e; c++) {
    if (Math.abs(e4m3Value(c) - a) < Math.abs(e4m3Value(best) - a)) best = c;
  }
  return x < 0 && best ? best | 0x80 : best;
}

/** A table of encoded values: bf16 bits, E4M3 codes or float32. */
export type ValueTable = Uint16Array | Uint8Array | Float32Array;

/** The 1021 encoded values `mean + std · n(s)` for byte sums s = 0..1020. */
export function valueTable(mean: number, std: number, dt: SynthElemType): ValueTable {
  const t = dt === "BF16"
    ? new Uint16Array(1021)
    : dt === "F8_E4M3"
    ? new Uint8Array(1021)
    : new Float32Array(1021);
  for (let s = 0; s <= 1020; s++) {
    const v = mean + (std * (s - 510)) / IRWIN_HALL_STD;
    t[s] = dt === "BF16" ? bf16Bits(v) : dt === "F8_E4M3" ? e4m3Bits(v) : v;
  }
  return t;
}

/** Fills `dst` from the stream in state `x` through `table`; returns the new state. */
export function fillFrom(dst: ValueTable, table: ValueTable, x: number): number {
  const n = dst.length;
  for (let i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    const y = Math.imul(x, 0x9e3779b1);
    dst[i] = table[(y & 255) + ((y >>> 8) & 255) + ((y >>> 16) & 255) + (y >>> 24)];
  }
  return x;
}

/** A small seeded generator for the routing simulation and permutations. */
export class Rng {
  #x: number;
  /** Starts the stream of `name` under `seed` (the same start state as a tensor's stream). */
  constructor(seed: number, name: string) {
    this.#x = streamSeed(seed, name);
  }
  /** Uniform in (0, 1). */
  next(): number {
    let x = this.#x;
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    this.#x = x;
    return ((Math.imul(x, 0x9e3779b1) >>> 0) + 0.5) / 4294967296;
  }
  /** Standard normal (Box–Muller, cosine branch). */
  normal(): number {
    return Math.sqrt(-2 * Math.log(this.next())) * Math.cos(2 * Math.PI * this.next());
  }
}
