/**
 * Trains the VQ3R codebooks of a MoE layer's vq3r matrix kinds (engine/quant/vq3r.ts) and writes
 * them into codebooks.bin at their offsets in the layout.
 *
 * @module
 */

import { writeSync } from "node:fs";
import { EXPERT_MATRICES, type ExpertMatrix } from "../../io/model_config.ts";
import { trainVq3r, vq3rKernelCodebooks } from "../../engine/quant/vq3r.ts";
import { crc32 } from "../../io/crc32.ts";
import type { Checkpoint } from "../../io/safetensors.ts";
import type { Vq3rPackOptions } from "./options.ts";
import type { BankLayout } from "./layout.ts";
import { readMatrixF32 } from "../../engine/checkpoint_matrix.ts";

/**
 * Trains the VQ3R codebooks of each vq3r matrix kind of one MoE layer on evenly spaced experts,
 * writes them (kernel layout) into codebooks.bin at their offsets in the layout, and returns the
 * training layout for encoding plus the CRC of each written set.
 */
export function trainBankCodebooks(
  ckpt: Checkpoint,
  l: number,
  bank: BankLayout,
  fd: number,
  opts: Vq3rPackOptions,
  log: (line: string) => void,
  count: { done: number; total: number },
): {
  books: Partial<Record<ExpertMatrix, Float32Array>>;
  crcs: Partial<Record<ExpertMatrix, number>>;
} {
  const books: Partial<Record<ExpertMatrix, Float32Array>> = {};
  const crcs: Partial<Record<ExpertMatrix, number>> = {};
  const E = bank.experts.length;
  const n = Math.max(1, Math.min(E, opts.trainExperts ?? 16));
  for (const m of EXPERT_MATRICES) {
    const offset = bank.codebookOffsets[m];
    if (offset === undefined) continue;
    const t0 = performance.now();
    const mats = Array.from({ length: n }, (_, i) => {
      const src = bank.experts[Math.floor((i * E) / n)].get(m)!;
      return { data: readMatrixF32(ckpt, src), rows: src.rows, cols: src.cols };
    });
    const book = trainVq3r(mats, {
      seed: opts.seed,
      sampleSize: opts.sampleSize,
      iterations: opts.iterations,
    });
    const kernel = vq3rKernelCodebooks(book);
    const bytes = new Uint8Array(kernel.buffer);
    for (let done = 0; done < bytes.length;) {
      done += writeSync(fd, bytes, done, bytes.length - done, offset + done);
    }
    books[m] = book;
    crcs[m] = crc32(bytes);
    count.done++;
    log(
      `pack: VQ3R codebooks ${count.done}/${count.total}: layer ${l} ${m}, ${n} experts sampled, ` +
        `${((performance.now() - t0) / 1000).toFixed(1)} s`,
    );
  }
  return { books, crcs };
}
