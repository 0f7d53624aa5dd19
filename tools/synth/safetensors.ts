/**
 * Writing the synthetic tensors as safetensors files: grouping them into shards, the header of a
 * shard and the values of each tensor, streamed in fixed-size chunks.
 *
 * @module
 */

import { closeSync, openSync, writeSync } from "node:fs";
import { join } from "node:path";
import type { Progress } from "../progress.ts";
import type { RouterPlan } from "./routing.ts";
import { sumBytes, type SynthTensor, tensorBytes } from "./types.ts";
import { fillFrom, streamSeed, type ValueTable, valueTable } from "./values.ts";

/** Values generated and written at a time: memory use is one such chunk, whatever the model. */
const CHUNK_ELEMS = 1 << 22;

/** Groups tensors (in model order) into shards of at most `max` bytes each. */
export function planShards(tensors: SynthTensor[], max: number): SynthTensor[][] {
  const shards: SynthTensor[][] = [[]];
  let bytes = 0;
  for (const t of tensors) {
    const n = tensorBytes(t);
    if (bytes > 0 && bytes + n > max) {
      shards.push([]);
      bytes = 0;
    }
    shards[shards.length - 1].push(t);
    bytes += n;
  }
  return shards;
}

/** The safetensors header of `tensors` (sorted by name), padded with spaces to 8 bytes. */
function headerBytes(tensors: SynthTensor[]): Uint8Array {
  const h: Record<string, unknown> = { __metadata__: { format: "pt" } };
  let off = 0;
  for (const t of tensors) {
    const n = tensorBytes(t);
    h[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [off, off + n] };
    off += n;
  }
  let json = JSON.stringify(h);
  json += " ".repeat((8 - ((json.length + 8) % 8)) % 8);
  const body = new TextEncoder().encode(json);
  const out = new Uint8Array(8 + body.length);
  new DataView(out.buffer).setBigUint64(0, BigInt(body.length), true);
  out.set(body, 8);
  return out;
}

function writeAll(fd: number, bytes: Uint8Array): void {
  let done = 0;
  while (done < bytes.length) done += writeSync(fd, bytes, done, bytes.length - done);
}

/** Streams one tensor's values into `fd` in chunks. */
function writeTensor(
  fd: number,
  t: SynthTensor,
  seed: number,
  plans: Map<number, RouterPlan>,
  buf: { u16: Uint16Array; f32: Float32Array },
  progress: Progress,
): void {
  const elems = t.shape.reduce((a, b) => a * b, 1);
  if (t.dtype === "U8") return writeBytes(fd, t, elems, seed, progress);
  const view = (n: number): ValueTable =>
    t.dtype === "BF16"
      ? buf.u16.subarray(0, n)
      : t.dtype === "F8_E4M3"
      ? new Uint8Array(buf.u16.buffer, 0, n)
      : buf.f32.subarray(0, n);
  const emit = (arr: ValueTable) => {
    writeAll(fd, new Uint8Array(arr.buffer, arr.byteOffset, arr.byteLength));
    progress.add(arr.byteLength);
  };
  let x = streamSeed(seed, t.name);
  if (t.init.kind === "zeros") {
    for (let i = 0; i < elems; i += CHUNK_ELEMS) {
      emit(view(Math.min(CHUNK_ELEMS, elems - i)).fill(0));
    }
  } else if (t.init.kind === "router") {
    const plan = plans.get(t.layer);
    if (!plan) throw new Error(`${t.name}: no router plan for layer ${t.layer}`);
    const [rows, cols] = t.shape;
    for (let r = 0; r < rows; r++) {
      const table = valueTable(0, plan.scales[r] / Math.sqrt(cols), t.dtype);
      x = fillFrom(view(cols), table, x);
      emit(view(cols));
    }
  } else if (t.init.kind === "normal") {
    const table = valueTable(t.init.mean, t.init.std, t.dtype);
    for (let i = 0; i < elems; i += CHUNK_ELEMS) {
      const v = view(Math.min(CHUNK_ELEMS, elems - i));
      x = fillFrom(v, table, x);
      emit(v);
    }
  } else throw new Error(`${t.name}: ${t.init.kind} values need a U8 tensor`);
}

/** Streams a U8 tensor: seeded random bytes in lo..hi, or one value throughout. */
function writeBytes(
  fd: number,
  t: SynthTensor,
  elems: number,
  seed: number,
  progress: Progress,
): void {
  const buf = new Uint8Array(Math.min(elems, 4 * CHUNK_ELEMS));
  const words = new Uint32Array(buf.buffer, 0, buf.length >> 2);
  let x = streamSeed(seed, t.name);
  const init = t.init;
  for (let i = 0; i < elems; i += buf.length) {
    const n = Math.min(buf.length, elems - i);
    if (init.kind === "fill") buf.fill(init.value);
    else if (init.kind === "bytes") {
      for (let w = 0; w < words.length; w++) {
        x ^= x << 13;
        x ^= x >>> 17;
        x ^= x << 5;
        words[w] = Math.imul(x, 0x9e3779b1);
      }
      for (let j = words.length * 4; j < buf.length; j++) buf[j] = (x >>> (8 * (j & 3))) & 255;
      // A narrower range (gpt-oss's E8M0 scales) folds the uniform bytes into lo..hi.
      const span = init.hi - init.lo + 1;
      if (span < 256) { for (let j = 0; j < n; j++) buf[j] = init.lo + buf[j] % span; }
    } else throw new Error(`${t.name}: U8 tensors are random bytes or a fill value`);
    writeAll(fd, buf.subarray(0, n));
    progress.add(n);
  }
}

/** What {@link writeShards} wrote. */
export interface WrittenShards {
  /** Bytes of all files (headers included). */
  totalBytes: number;
  /** Tensor name → file name, in the order written. */
  weightMap: Record<string, string>;
}

/**
 * Writes each shard into `dir` as `model.safetensors` (one shard) or
 * `model-0000i-of-0000n.safetensors`, tensors sorted by name within a file.
 */
export function writeShards(
  dir: string,
  shards: SynthTensor[][],
  seed: number,
  plans: Map<number, RouterPlan>,
  progress: Progress,
): WrittenShards {
  const buf = { u16: new Uint16Array(CHUNK_ELEMS), f32: new Float32Array(CHUNK_ELEMS) };
  const names = shards.length === 1
    ? ["model.safetensors"]
    : shards.map((_, i) =>
      `model-${String(i + 1).padStart(5, "0")}-of-${
        String(shards.length).padStart(5, "0")
      }.safetensors`
    );
  const weightMap: Record<string, string> = {};
  let totalBytes = 0;
  shards.forEach((shard, i) => {
    const sorted = [...shard].sort((a, b) => a.name < b.name ? -1 : a.name > b.name ? 1 : 0);
    const header = headerBytes(sorted);
    const fd = openSync(join(dir, names[i]), "w");
    try {
      writeAll(fd, header);
      for (const t of sorted) {
        writeTensor(fd, t, seed, plans, buf, progress);
        weightMap[t.name] = names[i];
      }
    } finally {
      closeSync(fd);
    }
    totalBytes += header.length + sumBytes(shard);
  });
  return { totalBytes, weightMap };
}
