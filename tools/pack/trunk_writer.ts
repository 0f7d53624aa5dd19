/**
 * Writes trunk tensors into trunk.bin: each region (the globals, or one layer's run) sequentially
 * at its offsets in the layout, zero padding between tensors, the CRC-32 of every byte kept on the way.
 *
 * @module
 */

import { writeSync } from "node:fs";
import { readF32 } from "../../io/checkpoint_weights.ts";
import type { Region } from "../../io/manifest_schema.ts";
import { crc32 } from "../../io/crc32.ts";
import { isCompactDtype } from "../../io/format.ts";
import type { Checkpoint } from "../../io/safetensors.ts";
import type { Progress } from "../progress.ts";
import { encodeMatrix, scaleBytesF32, streamTensor } from "./encode.ts";
import type { Placed } from "./layout.ts";

/** Writes sequentially from `start` in a file, keeping the CRC of everything written. */
class RegionWriter {
  crc = 0;
  #rel = 0;
  constructor(readonly fd: number, readonly start: number, readonly progress: Progress) {}

  write(bytes: Uint8Array): void {
    let done = 0;
    while (done < bytes.length) {
      done += writeSync(this.fd, bytes, done, bytes.length - done, this.start + this.#rel + done);
    }
    this.crc = crc32(bytes, this.crc);
    this.#rel += bytes.length;
    this.progress.add(bytes.length);
  }

  /** Writes zeros up to `rel` bytes from the region start. */
  padTo(rel: number): void {
    while (this.#rel < rel) this.write(new Uint8Array(Math.min(rel - this.#rel, 1 << 20)));
  }
}

function writeTensors(ckpt: Checkpoint, items: Placed[], w: RegionWriter, chunk: number): void {
  for (const { src, entry } of items) {
    w.padTo(entry.offset);
    if (isCompactDtype(entry.dtype)) {
      const [rows, cols] = entry.shape;
      const what = `${src.file}: tensor ${src.name}`;
      const enc = encodeMatrix(readF32(ckpt, src.name), rows, cols, entry.dtype, what);
      w.write(enc.data);
      w.padTo(entry.scale!.offset);
      w.write(enc.scale!);
      continue;
    }
    streamTensor(ckpt, src, entry.dtype, chunk, (b) => w.write(b));
    if (entry.scale) {
      w.padTo(entry.scale.offset);
      w.write(scaleBytesF32(ckpt, src));
    }
  }
}

/**
 * Writes the tensors `items` into the region of `bytes` bytes at `offset` of the file `fd`,
 * padded with zeros to its end; returns the region with its CRC-32.
 */
export function writeRegion(
  ckpt: Checkpoint,
  fd: number,
  offset: number,
  bytes: number,
  items: Placed[],
  progress: Progress,
  chunk: number,
): Region {
  const w = new RegionWriter(fd, offset, progress);
  writeTensors(ckpt, items, w, chunk);
  w.padTo(bytes);
  return { offset, bytes, crc32: w.crc };
}
