/**
 * Writes trunk tensors into trunk.bin: each region (the globals, or one layer's run) sequentially
 * at its offsets in the layout, zero padding between tensors, the CRC-32 of every byte kept on the way.
 *
 * @module
 */

import { readF32 } from "../../io/checkpoint_weights.ts";
import type { Region } from "../../io/manifest_schema.ts";
import { crc32 } from "../../io/crc32.ts";
import { isCompactDtype } from "../../io/format.ts";
import type { Checkpoint, TensorInfo } from "../../io/safetensors.ts";
import type { Progress } from "../progress.ts";
import { encodeMatrix, KEPT_DTYPE, scaleBytesF32, streamTensor } from "./encode.ts";
import type { KeptReader } from "./kept_reader.ts";
import type { Placed } from "./layout.ts";
import type { BlockWriter, PackWriter } from "./block_writer.ts";

/** Writes sequentially from the region's start, keeping the CRC of everything written. */
class RegionWriter {
  crc = 0;
  #rel = 0;
  constructor(
    readonly out: BlockWriter,
    readonly progress: Progress,
    readonly kept: KeptReader,
  ) {}

  write(bytes: Uint8Array): void {
    this.out.append(bytes);
    this.#count(bytes);
  }

  /** Reads tensor `src`, kept in its dtype, straight into the staging slots. */
  readKept(src: TensorInfo): void {
    for (let at = 0; at < src.bytes;) {
      const view = this.out.next(src.bytes - at);
      this.kept.read(src, at, view);
      this.#count(view);
      at += view.length;
    }
  }

  #count(bytes: Uint8Array): void {
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
    if (KEPT_DTYPE[src.dtype] === entry.dtype) w.readKept(src);
    else streamTensor(ckpt, src, entry.dtype, chunk, (b) => w.write(b));
    if (entry.scale) {
      w.padTo(entry.scale.offset);
      w.write(scaleBytesF32(ckpt, src));
    }
  }
}

/**
 * Writes the tensors `items` into the region of `bytes` bytes at `offset` of the existing file
 * `path`, through `writer`, padded with zeros to its end; returns the region with its CRC-32.
 * It is durable once `writer.settle()` returns.
 */
export function writeRegion(
  ckpt: Checkpoint,
  writer: PackWriter,
  path: string,
  offset: number,
  bytes: number,
  items: Placed[],
  progress: Progress,
  chunk: number,
  kept: KeptReader,
): Region {
  const out = writer.file(path, offset, false);
  const w = new RegionWriter(out, progress, kept);
  try {
    writeTensors(ckpt, items, w, chunk);
    w.padTo(bytes);
  } catch (e) {
    out.discard();
    throw e;
  }
  out.end();
  return { offset, bytes, crc32: w.crc };
}
