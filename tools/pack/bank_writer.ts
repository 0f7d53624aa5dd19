/**
 * Writes the expert bank file of one MoE layer: one fixed-stride record per expert, a header
 * (placement and payload CRC of each matrix) followed by the matrices in the dtype the layout chose —
 * streamed, re-encoded or, for Kimi's packed INT4 and K3's MXFP4, copied as shipped.
 *
 * @module
 */

import { EXPERT_MATRICES, type ExpertMatrix } from "../../io/model_config.ts";
import type { TensorEntry } from "../../io/manifest_schema.ts";
import { crc32 } from "../../io/crc32.ts";
import {
  encodeRecordHeader,
  EXPERT_FORMAT_IDS,
  isCompactDtype,
  RECORD_HEADER_BYTES,
  type RecordMatrix,
} from "../../io/format.ts";
import type { Checkpoint } from "../../io/safetensors.ts";
import type { Progress } from "../progress.ts";
import { encodeMatrix, KEPT_DTYPE, scaleBytesF32, streamTensor } from "./encode.ts";
import { checkFinite } from "./finite.ts";
import type { BankLayout } from "./layout.ts";
import type { PackWriter } from "./block_writer.ts";
import type { KeptReader } from "./kept_reader.ts";
import {
  keepsShippedBytes,
  readFusedBias,
  readFusedMxfp4,
  readMatrixF32,
  readPacked,
  type SourceMatrix,
} from "../../engine/checkpoint_matrix.ts";

/** Writes one expert matrix (and its scale) into `record` at its entry's offsets. */
function writeExpertMatrix(
  ckpt: Checkpoint,
  src: SourceMatrix,
  entry: TensorEntry,
  record: Uint8Array,
  chunk: number,
  codebooks: Float32Array | undefined,
  kept: KeptReader,
): void {
  const asShipped = keepsShippedBytes(src, entry.dtype);
  if (src.packed && asShipped) {
    // Kimi's packed INT4 words with bf16 scales are the int4g32 bytes, K3's MXFP4 codes with
    // E8M0 scales the mxfp4 bytes: copied, never re-quantised.
    const { data, scale } = readPacked(ckpt, src);
    checkFinite(scale, src.packed.scale.dtype, `${src.file}: tensor ${src.packed.scale.name}`);
    record.set(data, entry.offset);
    record.set(scale, entry.scale!.offset);
    return;
  }
  if (src.fused && asShipped) {
    // gpt-oss's MXFP4 rows are sluice's mxfp4 rows: copied byte for byte, never re-quantised.
    const { data, scale } = readFusedMxfp4(ckpt, src);
    record.set(data, entry.offset);
    record.set(scale, entry.scale!.offset);
    return;
  }
  if (src.plain && KEPT_DTYPE[src.plain.dtype] === entry.dtype) {
    // Read straight into the record: no staging copy.
    const dst = record.subarray(entry.offset, entry.offset + src.plain.bytes);
    kept.read(src.plain, 0, dst);
    if (entry.scale) record.set(scaleBytesF32(ckpt, src.plain), entry.scale.offset);
    return;
  }
  const streamable = entry.dtype === "f8_e4m3"
    ? src.dtype === "F8_E4M3"
    : !isCompactDtype(entry.dtype);
  if (src.plain && streamable) {
    let at = entry.offset;
    streamTensor(ckpt, src.plain, entry.dtype, chunk, (b) => {
      record.set(b, at);
      at += b.length;
    });
    if (entry.scale) record.set(scaleBytesF32(ckpt, src.plain), entry.scale.offset);
    return;
  }
  const what = `${src.file}: tensor ${src.name}`;
  const enc = encodeMatrix(
    readMatrixF32(ckpt, src),
    src.rows,
    src.cols,
    entry.dtype,
    what,
    codebooks,
  );
  record.set(enc.data, entry.offset);
  if (enc.scale) record.set(enc.scale, entry.scale!.offset);
}

/**
 * Zeroes what of `record` (a reused staging slot) no matrix will overwrite: only the gaps when
 * every matrix is read in place at its full size (the common bf16 case, sparing a second pass
 * over the record), else all of it.
 */
function zeroUncovered(
  record: Uint8Array,
  bank: BankLayout,
  mats: Map<ExpertMatrix, SourceMatrix>,
): void {
  const spans: [number, number][] = [];
  for (const m of EXPERT_MATRICES) {
    const entry = bank.matrices[m];
    const plain = mats.get(m)!.plain;
    if (
      !plain || KEPT_DTYPE[plain.dtype] !== entry.dtype || entry.scale ||
      plain.bytes !== entry.bytes
    ) {
      record.fill(0);
      return;
    }
    spans.push([entry.offset, entry.offset + entry.bytes]);
  }
  spans.sort((a, b) => a[0] - b[0]);
  let at = 0;
  for (const [start, end] of spans) {
    record.fill(0, at, Math.max(at, start));
    at = Math.max(at, end);
  }
  record.fill(0, at);
}

/**
 * Writes all records of one expert bank into `path` (a temporary name the caller renames) through
 * `writer`, whose slots hold at least one record. It is durable once `writer.settle()` returns.
 */
export function writeBank(
  ckpt: Checkpoint,
  writer: PackWriter,
  l: number,
  bank: BankLayout,
  path: string,
  progress: Progress,
  chunk: number,
  codebooks: Partial<Record<ExpertMatrix, Float32Array>>,
  kept: KeptReader,
): void {
  // Records are built in place in the staging buffer: several per write when they are small.
  const out = writer.file(path, 0, true);
  try {
    bank.experts.forEach((mats, e) => {
      const record = out.reserve(bank.stride);
      zeroUncovered(record, bank, mats);
      let payloadEnd = RECORD_HEADER_BYTES;
      const headerMats = {} as Record<ExpertMatrix, RecordMatrix>;
      for (const m of EXPERT_MATRICES) {
        const entry = bank.matrices[m];
        writeExpertMatrix(ckpt, mats.get(m)!, entry, record, chunk, codebooks[m], kept);
        payloadEnd = Math.max(
          payloadEnd,
          entry.scale ? entry.scale.offset + entry.scale.bytes : entry.offset + entry.bytes,
        );
        headerMats[m] = {
          offset: entry.offset,
          bytes: entry.bytes,
          scaleOffset: entry.scale?.offset ?? 0,
          scaleBytes: entry.scale?.bytes ?? 0,
        };
        const bias = bank.biases?.[m];
        if (bias) {
          const f = readFusedBias(ckpt, mats.get(m)!);
          record.set(new Uint8Array(f.buffer, f.byteOffset, f.byteLength), bias.offset);
          payloadEnd = Math.max(payloadEnd, bias.offset + bias.bytes);
        }
      }
      record.set(
        encodeRecordHeader({
          layer: l,
          expert: e,
          formatId: EXPERT_FORMAT_IDS[bank.format],
          payloadOffset: RECORD_HEADER_BYTES,
          payloadBytes: payloadEnd - RECORD_HEADER_BYTES,
          payloadCrc: crc32(record.subarray(RECORD_HEADER_BYTES, payloadEnd)),
          matrices: headerMats,
        }),
      );
      progress.add(record.length);
    });
  } catch (e) {
    out.discard();
    throw e;
  }
  out.end();
}
