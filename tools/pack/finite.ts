/**
 * The NaN / infinity scan of every weight a pack writes: one such value turns every logit into
 * NaN downstream (greedy then picks token 0 forever), so the pack refuses it, naming the tensor
 * and the element.
 *
 * @module
 */

import type { Kernels } from "../../wasm/mod.ts";
import { NAN_WEIGHTS_REFUSED } from "../../engine/checkpoint_matrix.ts";

/** Bytes per value and the all-ones exponent (infinity or NaN) of a float dtype. */
interface NonFinite {
  bytes: 1 | 2 | 4;
  mask: number;
}

/** The {@link NonFinite} of each float dtype. */
const NON_FINITE: Record<string, NonFinite> = {
  F32: { bytes: 4, mask: 0x7f800000 },
  BF16: { bytes: 2, mask: 0x7f80 },
  F16: { bytes: 2, mask: 0x7c00 },
  // E4M3 has no infinity; S.1111.111 is its NaN.
  F8_E4M3: { bytes: 1, mask: 0x7f },
};

/**
 * Whether any of the `n` 16-bit values at `src` has all the bits of `mask` (< 0x8000) set, two
 * at a time: (v & M) ^ M has a zero lane exactly there, and a lane below 0x8000 is zero iff
 * subtracting 1 from it borrows into bit 15. About twice the speed of a value-by-value loop.
 */
function hasAllOnesLane(src: Uint8Array, n: number, mask: number): boolean {
  const pairs = src.byteOffset % 4 === 0 ? n >> 1 : 0;
  const words = new Uint32Array(src.buffer, src.byteOffset - (src.byteOffset % 4), pairs);
  const m2 = (mask | (mask << 16)) >>> 0;
  for (let i = 0; i < pairs; i++) {
    const x = (words[i] & m2) ^ m2;
    if (((x - 0x00010001) & ~x & 0x80008000) !== 0) return true;
  }
  for (let i = pairs * 2; i < n; i++) {
    if (((src[2 * i] | (src[2 * i + 1] << 8)) & mask) === mask) return true;
  }
  return false;
}

/** Index of the first of the `n` values of `spec` in `bytes` that is NaN or infinite, else n. */
function firstNonFinite(bytes: Uint8Array, n: number, spec: NonFinite): number {
  const aligned = bytes.byteOffset % spec.bytes === 0;
  const src = aligned ? bytes : bytes.slice();
  const view = spec.bytes === 4
    ? new Uint32Array(src.buffer, src.byteOffset, n)
    : spec.bytes === 2
    ? new Uint16Array(src.buffer, src.byteOffset, n)
    : src;
  const { mask } = spec;
  if (spec.bytes === 2 && !hasAllOnesLane(src, n, mask)) return n;
  for (let i = 0; i < n; i++) {
    if ((view[i] & mask) === mask) return i;
  }
  return n;
}

/** Values per kernel call: the kernel counts in int32. */
const KERNEL_VALUES = 1 << 28;

/**
 * The NaN / infinity scan as a wasm SIMD kernel (kernels/finite.c, 3–5× the speed of the scan in
 * JS) over one shared memory: bytes that lie in it, such as the packer's staging slots
 * (tools/pack/block_writer.ts), are scanned where they are, with no copy.
 */
export class FiniteScan {
  readonly #buffer: ArrayBufferLike;
  readonly #find: Kernels["find_all_ones"];

  constructor(memory: WebAssembly.Memory, kernels: Pick<Kernels, "find_all_ones">) {
    this.#buffer = memory.buffer;
    this.#find = kernels.find_all_ones;
  }

  /** Whether `bytes` lie in this scan's memory. */
  covers(bytes: Uint8Array): boolean {
    return bytes.buffer === this.#buffer;
  }

  /**
   * Index of the first of the `n` values of `width` bytes in `bytes` (which it must
   * {@link covers}) whose bits under `mask` are all set, else n.
   */
  first(bytes: Uint8Array, n: number, width: number, mask: number): number {
    for (let i = 0; i < n; i += KERNEL_VALUES) {
      const m = Math.min(KERNEL_VALUES, n - i);
      const k = this.#find(BigInt(bytes.byteOffset + i * width), m, width, mask);
      if (k < m) return i + k;
    }
    return n;
  }
}

/**
 * Throws when `bytes` (little-endian values of safetensors dtype `dtype`) hold a NaN or an
 * infinity; `first` is the element index of bytes[0] within the tensor, for the message. Bytes in
 * the memory of `scan` are scanned by its kernel, others in JS; both find the same element.
 */
export function checkFinite(
  bytes: Uint8Array,
  dtype: string,
  what: string,
  first = 0,
  scan?: FiniteScan,
): void {
  const spec = NON_FINITE[dtype];
  if (!spec) return;
  const n = Math.floor(bytes.length / spec.bytes);
  const bad = scan?.covers(bytes)
    ? scan.first(bytes, n, spec.bytes, spec.mask)
    : firstNonFinite(bytes, n, spec);
  if (bad < n) {
    throw new Error(
      `${what}: element ${first + bad} is NaN or infinite; ${NAN_WEIGHTS_REFUSED}`,
    );
  }
}

/** {@link checkFinite} for float32 values. */
export function checkFiniteF32(x: Float32Array, what: string, first = 0): void {
  checkFinite(new Uint8Array(x.buffer, x.byteOffset, x.byteLength), "F32", what, first);
}

/**
 * The hint after a failed pack or pull that kept its partial work (`kept` says where, e.g.
 * "partial pack kept in x.tmp"): rerun to resume, unless the checkpoint's own weights were
 * refused, which a rerun would meet again.
 */
export function resumeHint(e: unknown, kept: string): string {
  return (e as Error)?.message?.includes(NAN_WEIGHTS_REFUSED)
    ? ` (the checkpoint itself holds these values, so a rerun fails the same way: fix or ` +
      `replace the checkpoint; ${kept} for then)`
    : ` (${kept}; rerun to resume)`;
}
