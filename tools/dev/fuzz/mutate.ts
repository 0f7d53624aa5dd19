/**
 * The fuzzer's mutations of a seed input: bit flips, byte overwrites, truncation, splices from
 * another seed, number tokens swapped for extreme values, deep nesting and invalid UTF-8. All
 * randomness comes from one seeded generator, so a run (and a crash it finds) is reproducible.
 *
 * @module
 */
import { concat } from "../../../engine/arrays.ts";

/** The pieces one after another, as a new input. */
const joined = (...parts: Uint8Array[]) => concat(parts, (n) => new Uint8Array(n));

/** A seeded xorshift32 generator. */
export class Rng {
  #x: number;
  constructor(seed: number) {
    this.#x = (seed >>> 0) || 0x9e3779b9;
  }
  /** A uniform integer in [0, 2^32). */
  u32(): number {
    let x = this.#x;
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    this.#x = x >>> 0;
    return this.#x;
  }
  /** A uniform integer in [0, n). */
  below(n: number): number {
    return n <= 0 ? 0 : this.u32() % n;
  }
  /** One element of `xs`. */
  pick<T>(xs: readonly T[]): T {
    return xs[this.below(xs.length)];
  }
}

/** Replacements for a number in a text input: the values parsers most often get wrong. */
export const HOSTILE_NUMBERS: readonly string[] = [
  "0",
  "-1",
  "-0",
  "1e308",
  "1e999",
  "-1e999",
  "4294967296",
  "9007199254740993",
  "18446744073709551616",
  "0.5",
  "1e-320",
  "2147483648",
  "NaN",
  "null",
  '"7"',
  "[]",
  "{}",
  "true",
];

const enc = new TextEncoder();
const dec = new TextDecoder();

/** One random mutation of `input`; `others` are seeds to splice from. */
export function mutateOnce(rng: Rng, input: Uint8Array, others: readonly Uint8Array[]): Uint8Array {
  const b = input.slice();
  const at = rng.below(Math.max(1, b.length));
  switch (rng.below(9)) {
    case 0: // bit flips
      for (let k = 1 + rng.below(4); k > 0 && b.length; k--) {
        b[rng.below(b.length)] ^= 1 << rng.below(8);
      }
      return b;
    case 1: // overwritten bytes, often with the interesting ones
      for (let k = 1 + rng.below(4); k > 0 && b.length; k--) {
        b[rng.below(b.length)] = rng.pick([
          0,
          0xff,
          0x7f,
          0x80,
          0x22,
          0x5c,
          0x7b,
          0x5b,
          rng.below(256),
        ]);
      }
      return b;
    case 2: // truncation
      return b.subarray(0, rng.below(b.length + 1));
    case 3: { // splice a piece of another seed in
      const o = rng.pick(others);
      const from = rng.below(o.length + 1);
      const piece = o.subarray(from, from + rng.below(64));
      return joined(b.subarray(0, at), piece, b.subarray(at + rng.below(16)));
    }
    case 4: { // a number token becomes an extreme value
      const text = dec.decode(b);
      const nums = [...text.matchAll(/-?\d+(\.\d+)?([eE][+-]?\d+)?/g)];
      if (!nums.length) return b;
      const m = rng.pick(nums);
      return enc.encode(
        text.slice(0, m.index) + rng.pick(HOSTILE_NUMBERS) + text.slice(m.index! + m[0].length),
      );
    }
    case 5: { // deep nesting
      const depth = rng.pick([100, 1000, 100000]);
      const open = rng.below(2) ? "[" : '{"a":';
      const close = open === "[" ? "]" : "}";
      return joined(
        b.subarray(0, at),
        enc.encode(open.repeat(depth) + "1" + close.repeat(depth)),
        b.subarray(at),
      );
    }
    case 6: // invalid UTF-8
      return joined(
        b.subarray(0, at),
        new Uint8Array(rng.pick([[0xff], [0xc0, 0x80], [0xed, 0xa0, 0x80], [0xe2, 0x82]])),
        b.subarray(at),
      );
    case 7: { // a duplicated chunk (repeated keys, doubled arrays)
      const len = rng.below(Math.min(256, b.length) + 1);
      return joined(b.subarray(0, at + len), b.subarray(at, at + len), b.subarray(at + len));
    }
    default: { // a deleted chunk
      return joined(b.subarray(0, at), b.subarray(at + 1 + rng.below(32)));
    }
  }
}

/** One to four stacked mutations of a random seed. */
export function mutate(rng: Rng, seeds: readonly Uint8Array[]): Uint8Array {
  let x = rng.pick(seeds);
  for (let k = 1 + rng.below(4); k > 0; k--) x = mutateOnce(rng, x, seeds);
  return x;
}
