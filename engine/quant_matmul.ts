/**
 * Prepared inputs of the compact formats' matvecs: the Q8 copy of an input vector that the
 * mxfp4 and int4g32 kernels read (quantize_act_q8), and the table of partial dot products that
 * the vq3r and vq4p kernels read (vq3r_lut, vq4p_lut). Each is made once per input vector on the
 * main thread and then shared by every matrix that reads the same vector in the same form: gate and up of an
 * expert, and, in the MoE layer, all experts a token is routed to. Preparation is deterministic
 * and per vector, so outputs never depend on threads, batching or expert arrival order.
 *
 * @module
 */
import { alignUp, isCodebookDtype } from "../io/format.ts";
import { allBanks, type Container } from "../io/container.ts";
import { q8Bytes } from "../wasm/quant_kernels.ts";
import { formatOf } from "./quant/mod.ts";
import { type Arena, PAGE } from "./arena.ts";
import { codebookArenaBytes } from "./codebooks.ts";
import { EXPERT_MATRICES } from "../io/model_config.ts";
import { batchDecodeBytes, inputFormOf, type TensorRef } from "./tensor.ts";
import { markExact, tensorRef } from "./weights.ts";

type Fn = (...a: (number | bigint)[]) => unknown;

/** Alignment of every prepared vector (the kernels load 16 bytes at a time). */
const PREP_ALIGN = 64;

/** The table builder of a lookup-table format (engine/quant/mod.ts). */
function tableOf(w: TensorRef): { kernel: string; bytes(cols: number): number } {
  const t = formatOf(w.dtype).table;
  if (!t) throw new Error(`${w.dtype} weights have no lookup table`);
  return t;
}

/** Bytes of one prepared input vector of `w` (0 for formats that read f32). */
export function preparedBytes(w: TensorRef): number {
  switch (inputFormOf(w)) {
    case "q8":
      return alignUp(q8Bytes(w.cols), PREP_ALIGN);
    case "lut":
      return alignUp(tableOf(w).bytes(w.paddedCols ?? w.cols), PREP_ALIGN);
    default:
      return 0;
  }
}

/**
 * Matrices with equal keys read the same prepared form of a vector: Q8 copies depend on the
 * columns only, tables also on the codebooks. "f32" for formats that need no preparation.
 */
export function preparedKey(w: TensorRef): string {
  const form = inputFormOf(w);
  if (form === "q8") return `q8:${w.cols}`;
  if (form === "lut") return `lut:${w.dtype}:${w.codebook}:${w.paddedCols}`;
  return "f32";
}

/** Scratch an MoE FFN needs for prepared expert inputs, for `maxBatch` tokens. */
export interface ExpertPrepSizes {
  /** Gate and up inputs of every token of a batch (shared by all experts of the layer). */
  shared: number;
  /** The down projection's inputs of one expert (up to `maxBatch` vectors). */
  local: number;
  /** One zero-padded copy of the longest vq3r / vq4p input vector. */
  pad: number;
  /**
   * Two decoded copies of exact weights (shipped MXFP4, INT4) for batches: gate's and up's, then
   * down's in the first (engine/tensor.ts exactBatchJob); 0 when none decode or batches are 1.
   */
  decoded: number;
}

/** The scratch sizes for experts with matrices `gate`, `up`, `down`. */
export function expertPrepSizes(
  gate: TensorRef,
  up: TensorRef,
  down: TensorRef,
  maxBatch: number,
): ExpertPrepSizes {
  const sameInput = preparedKey(gate) === preparedKey(up);
  const shared = maxBatch * (preparedBytes(gate) + (sameInput ? 0 : preparedBytes(up)));
  const local = maxBatch * preparedBytes(down);
  const padCols = Math.max(
    ...[gate, up, down].map((w) => inputFormOf(w) === "lut" ? w.paddedCols ?? w.cols : 0),
  );
  const slot = Math.max(...[gate, up, down].map(batchDecodeBytes));
  const decoded = maxBatch > 1 && slot > 0 ? 2 * alignUp(slot, PAGE) : 0;
  return { shared, local, pad: padCols * 4, decoded };
}

/**
 * Arena bytes a container needs beyond the planner's float scratch to run its compact expert
 * formats with batches of up to `maxBatch` tokens: the VQ3R / VQ4P codebooks, the prepared-input
 * scratch and the decoded copies of exact weights (each region rounded up to a page).
 */
export function quantArenaBytes(c: Container, maxBatch: number): number {
  let worst = 0;
  for (const bank of allBanks(c.manifest)) {
    if (!bank) continue;
    const [g, u, d] = EXPERT_MATRICES.map((m) => {
      const ref = tensorRef(bank.matrices[m], 0);
      // Distinct stand-in codebook addresses: gate and up of a vq3r bank never share tables.
      if (isCodebookDtype(ref.dtype)) ref.codebook = bank.codebooks?.[m]?.offset ?? 0;
      markExact(ref, bank);
      return ref;
    });
    const s = expertPrepSizes(g, u, d, maxBatch);
    const need = [s.shared, s.local, s.pad, s.decoded].reduce(
      (a, b) => a + (b ? alignUp(b, PAGE) : 0),
      0,
    );
    worst = Math.max(worst, need);
  }
  return worst + codebookArenaBytes(c);
}

/**
 * A scratch region for prepared inputs, handed out front to back and freed all at once by
 * {@link reset}.
 */
export class InputPrep {
  readonly offset: number;
  readonly bytes: number;
  #top = 0;
  #k: Record<string, Fn>;
  #arena: Arena;
  #pad: number;
  #padBytes: number;

  /**
   * A region of `bytes` at arena offset `offset`; `pad` (`padBytes` long) holds zero-padded
   * copies of vq3r / vq4p inputs whose length is not a multiple of 8.
   */
  constructor(
    arena: Arena,
    kernels: Record<string, Fn>,
    offset: number,
    bytes: number,
    pad: number,
    padBytes: number,
  ) {
    this.#arena = arena;
    this.#k = kernels;
    this.offset = offset;
    this.bytes = bytes;
    this.#pad = pad;
    this.#padBytes = padBytes;
  }

  /**
   * Room for `nb` prepared input vectors of `w`, one after another, left for a kernel to fill
   * (the first one's arena offset).
   */
  reserve(w: TensorRef, nb: number): number {
    const size = preparedBytes(w);
    if (this.#top + nb * size > this.bytes) {
      throw new Error(
        `prepared-input scratch of ${this.bytes} bytes cannot hold ${nb} × ${size} more bytes ` +
          `for ${w.dtype} [${w.rows}, ${w.cols}]: the memory plan is wrong`,
      );
    }
    const dst = this.offset + this.#top;
    this.#top += nb * size;
    return dst;
  }

  /** Frees every prepared vector. */
  reset(): void {
    this.#top = 0;
  }

  /**
   * Prepares `nb` input vectors for `w` (vector b at `x + b · w.cols · 4`) and returns the arena
   * offset of each prepared form; undefined when `w`'s format reads f32.
   */
  prepare(w: TensorRef, x: number, nb: number): number[] | undefined {
    const form = inputFormOf(w);
    if (form === "f32") return undefined;
    const first = this.reserve(w, nb), size = preparedBytes(w);
    const out: number[] = [];
    for (let b = 0; b < nb; b++) {
      const dst = first + b * size;
      const xb = x + b * w.cols * 4;
      if (form === "q8") {
        this.#k.quantize_act_q8(BigInt(xb), BigInt(dst), w.cols);
      } else {
        if (w.codebook === undefined) throw new Error(`${w.dtype} weights need their codebooks`);
        const cols = w.paddedCols ?? w.cols;
        let src = xb;
        if (cols !== w.cols) {
          // The padding columns of the weights are zero-coded, but x must be zero there too.
          if (cols * 4 > this.#padBytes) {
            throw new Error(`${w.dtype} pad buffer too small for ${cols}`);
          }
          const padded = this.#arena.f32(this.#pad, cols);
          padded.set(this.#arena.f32(xb, w.cols));
          padded.fill(0, w.cols);
          src = this.#pad;
        }
        this.#k[tableOf(w).kernel](BigInt(w.codebook), BigInt(src), BigInt(dst), cols);
      }
      out.push(dst);
    }
    return out;
  }
}
