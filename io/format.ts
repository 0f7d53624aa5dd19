/**
 * Byte layout of the sluice container's expert records and the constants both the packer and
 * the readers use (alignments, dtypes, format ids). docs/FORMAT.md is the normative text; this
 * module is its executable form.
 *
 * A record is: a 128-byte header, then the payload (gate, its scale, up, its scale, down, its
 * scale; each 64-byte aligned), then zero padding up to the layer's stride (a multiple of 4 KiB).
 *
 * @module
 */

import { EXPERT_MATRICES, type ExpertMatrix } from "./model_config.ts";
import { crc32 } from "./crc32.ts";

/** "SLXR" read as a little-endian u32: first bytes of every expert record. */
export const RECORD_MAGIC = 0x52584c53;
/** Version of the record header layout. */
export const RECORD_VERSION = 1;
/** Size of the record header; the payload starts right after it. */
export const RECORD_HEADER_BYTES = 128;
/** Alignment of every tensor inside a record or a trunk run. */
export const TENSOR_ALIGN = 64;
/** Alignment (and padding unit) of record strides, trunk runs and the globals region. */
export const BLOCK_ALIGN = 4096;
/** Block side of FP8 scales. */
export const FP8_SCALE_BLOCK = 128;

/** Columns per block of MXFP4 and per group of INT4. */
export const Q4_BLOCK = 32;
/** Weights per VQ3R vector, and VQ3R stages. */
export const VQ3R_DIM = 8;
export const VQ3R_STAGES = 3;
/** Bytes of one VQ3R codebook set in codebooks.bin: f32 [3][8][256] (kernel layout). */
export const VQ3R_CODEBOOK_BYTES = VQ3R_STAGES * VQ3R_DIM * 256 * 4;
/** VQ4P: stages, and rows interleaved per index group (one byte lane each). */
export const VQ4P_STAGES = 4;
export const VQ4P_ROW_GROUP = 16;

/** Formats whose matrices are coded against codebooks in codebooks.bin (residual VQ). */
export type CodebookDtype = "vq3r" | "vq4p";

/** Bytes of one codebook set in codebooks.bin: vq3r f32 [3][8][256], vq4p f32 [4][8][64]. */
export const CODEBOOK_BYTES: Record<CodebookDtype, number> = {
  vq3r: VQ3R_CODEBOOK_BYTES,
  vq4p: VQ4P_STAGES * VQ3R_DIM * 64 * 4,
};

/** Whether `d` is coded against codebooks (and carries `paddedCols`). */
export function isCodebookDtype(d: string): d is CodebookDtype {
  return d === "vq3r" || d === "vq4p";
}

/** The scale tensor (dtype and shape) a scaled weight carries. */
export interface ScaleSpec {
  dtype: "f32" | "bf16" | "e8m0";
  shape: number[];
}

/** The byte layout of one stored dtype (docs/FORMAT.md). */
interface Layout {
  /** Plain dtypes: bytes per element (any shape). */
  elementBytes?: number;
  /** Compact formats: bytes of a 2-D [rows, cols] matrix, NaN for a shape it cannot hold. */
  matrixBytes?: (rows: number, cols: number) => number;
  /** Scaled formats: the scale tensor a [rows, cols] weight must carry. */
  scale?: (rows: number, cols: number) => ScaleSpec;
  /** Weight formats: the format id of expert record headers. */
  recordId?: number;
}

/** The layout of a 4-bit format with one `scaleDtype` scale per 32 columns (mxfp4, int4g32). */
function q4Layout<R extends number>(recordId: R, scaleDtype: "e8m0" | "bf16") {
  return {
    recordId,
    matrixBytes: (rows: number, cols: number) => cols % Q4_BLOCK ? NaN : (rows * cols) / 2,
    scale: (rows: number, cols: number): ScaleSpec => ({
      dtype: scaleDtype,
      shape: [rows, cols / Q4_BLOCK],
    }),
  };
}

/**
 * Every dtype a container stores, one row each: the byte layout the readers, the packer and the
 * manifest check share. A weight format's encoder, decoder and kernel are its entry in
 * engine/quant/mod.ts.
 */
export const FORMAT_LAYOUTS = {
  f32: { elementBytes: 4, recordId: 1 },
  bf16: { elementBytes: 2, recordId: 2 },
  f16: { elementBytes: 2, recordId: 3 },
  f8_e4m3: {
    elementBytes: 1,
    recordId: 4,
    scale: (rows: number, cols: number): ScaleSpec => ({
      dtype: "f32",
      shape: [Math.ceil(rows / FP8_SCALE_BLOCK), Math.ceil(cols / FP8_SCALE_BLOCK)],
    }),
  },
  // Only as the scale dtype of mxfp4.
  e8m0: { elementBytes: 1 },
  mxfp4: q4Layout(5, "e8m0"),
  int4g32: q4Layout(6, "bf16"),
  int8row: {
    recordId: 7,
    matrixBytes: (rows: number, cols: number) => rows * cols,
    scale: (rows: number): ScaleSpec => ({ dtype: "f32", shape: [rows] }),
  },
  vq3r: {
    recordId: 8,
    matrixBytes: (rows: number, cols: number) => rows * VQ3R_STAGES * Math.ceil(cols / VQ3R_DIM),
    scale: (rows: number): ScaleSpec => ({ dtype: "f32", shape: [rows] }),
  },
  vq4p: {
    recordId: 9,
    matrixBytes: (rows: number, cols: number) =>
      alignUp(rows, VQ4P_ROW_GROUP) * 3 * Math.ceil(cols / VQ3R_DIM),
    scale: (rows: number): ScaleSpec => ({ dtype: "f32", shape: [rows] }),
  },
} as const satisfies Record<string, Layout>;

type Layouts = typeof FORMAT_LAYOUTS;

/** A dtype a container stores. */
export type StoredDtype = keyof Layouts;

/** A plain dtype: every element takes `elementBytes` bytes. */
export type PlainDtype = {
  [K in StoredDtype]: Layouts[K] extends { elementBytes: number } ? K : never;
}[StoredDtype];

/**
 * A compact weight format (docs/FORMAT.md "Compact formats"): its byte count is not elements ×
 * a size, and it carries a scale tensor of a fixed dtype and shape.
 */
export type CompactDtype = {
  [K in StoredDtype]: Layouts[K] extends { matrixBytes: unknown } ? K : never;
}[StoredDtype];

/** Formats of weight matrices, routed experts included (the record header's format id). */
export type ExpertFormat = {
  [K in StoredDtype]: Layouts[K] extends { recordId: number } ? K : never;
}[StoredDtype];

const LAYOUT: Record<string, Layout> = FORMAT_LAYOUTS;

/** Expert format id written in record headers, per expert weight format. */
export const EXPERT_FORMAT_IDS = Object.fromEntries(
  Object.entries(LAYOUT).flatMap(([k, l]) => l.recordId === undefined ? [] : [[k, l.recordId]]),
) as Record<ExpertFormat, number>;

/** Bytes per element of a plain dtype. */
export function elementBytes(dtype: PlainDtype): number {
  return LAYOUT[dtype].elementBytes!;
}

/** Whether `s` names a dtype a container stores. */
export function isStoredDtype(s: unknown): s is StoredDtype {
  return typeof s === "string" && Object.hasOwn(LAYOUT, s);
}

/** Whether `s` names an expert format. */
export function isExpertFormat(s: unknown): s is ExpertFormat {
  return isStoredDtype(s) && LAYOUT[s].recordId !== undefined;
}

/** Whether `d` is a compact format. */
/**
 * The expert formats a bank may mark `activations: "f32"` (its matrices are the checkpoint's
 * shipped bytes): those whose weight-format entry (engine/quant/) has an exact f32-input kernel.
 */
export const EXACT_INPUT_FORMATS: readonly ExpertFormat[] = ["mxfp4", "int4g32"];

/** Whether `d` is a compact (quantised) dtype. */
export function isCompactDtype(d: string): d is CompactDtype {
  return isStoredDtype(d) && LAYOUT[d].matrixBytes !== undefined;
}

/**
 * Bytes of a tensor of `shape` stored as `dtype`. Compact formats are 2-D [rows, cols]:
 * mxfp4 and int4g32 take rows × cols / 2 (cols a multiple of 32), int8row rows × cols, vq3r
 * rows × 3 × ceil(cols / 8) index bytes, vq4p the same with rows rounded up to 16. Returns NaN for
 * a shape the format cannot hold.
 */
export function storedBytes(dtype: StoredDtype, shape: readonly number[]): number {
  const l = LAYOUT[dtype];
  if (!l.matrixBytes) return shape.reduce((a, b) => a * b, 1) * l.elementBytes!;
  return shape.length === 2 ? l.matrixBytes(shape[0], shape[1]) : NaN;
}

/**
 * The scale tensor (dtype and shape) a weight of `dtype` and `shape` must carry, or null:
 * f8_e4m3 f32 [ceil(R/128), ceil(C/128)]; mxfp4 e8m0 [R, C/32]; int4g32 bf16 [R, C/32];
 * int8row, vq3r and vq4p f32 [R].
 */
export function scaleSpecOf(dtype: StoredDtype, shape: readonly number[]): ScaleSpec | null {
  return LAYOUT[dtype].scale?.(shape[0], shape[1]) ?? null;
}

/** Rounds `n` up to a multiple of `a`. */
export function alignUp(n: number, a: number): number {
  return Math.ceil(n / a) * a;
}

/** Where one matrix (and its scale) lies inside a record; offsets from the record start. */
export interface RecordMatrix {
  offset: number;
  bytes: number;
  /** 0 when the matrix has no scale. */
  scaleOffset: number;
  scaleBytes: number;
}

/** The decoded header of one expert record. */
export interface RecordHeader {
  layer: number;
  expert: number;
  formatId: number;
  /** Offset of the payload from the record start (= RECORD_HEADER_BYTES). */
  payloadOffset: number;
  /** Bytes from the payload start to the end of the last matrix or scale. */
  payloadBytes: number;
  /** CRC-32 of the payload bytes. */
  payloadCrc: number;
  matrices: Record<ExpertMatrix, RecordMatrix>;
}

/** Byte offsets of the header fields (all little-endian). */
const F = {
  magic: 0, // u32
  version: 4, // u16
  headerBytes: 6, // u16
  layer: 8, // u32
  expert: 12, // u32
  formatId: 16, // u32
  payloadCrc: 20, // u32
  payloadOffset: 24, // u32
  payloadBytes: 28, // u32
  matrices: 32, // 3 × (offset, bytes, scaleOffset, scaleBytes), u32 each: 48 bytes
  headerCrc: 80, // u32: CRC-32 of bytes 0..79
} as const;

/** Encodes a record header into its 128 bytes (the rest is zero). */
export function encodeRecordHeader(h: RecordHeader): Uint8Array {
  const out = new Uint8Array(RECORD_HEADER_BYTES);
  const v = new DataView(out.buffer);
  v.setUint32(F.magic, RECORD_MAGIC, true);
  v.setUint16(F.version, RECORD_VERSION, true);
  v.setUint16(F.headerBytes, RECORD_HEADER_BYTES, true);
  v.setUint32(F.layer, h.layer, true);
  v.setUint32(F.expert, h.expert, true);
  v.setUint32(F.formatId, h.formatId, true);
  v.setUint32(F.payloadCrc, h.payloadCrc, true);
  v.setUint32(F.payloadOffset, h.payloadOffset, true);
  v.setUint32(F.payloadBytes, h.payloadBytes, true);
  EXPERT_MATRICES.forEach((m, i) => {
    const base = F.matrices + 16 * i;
    const r = h.matrices[m];
    v.setUint32(base, r.offset, true);
    v.setUint32(base + 4, r.bytes, true);
    v.setUint32(base + 8, r.scaleOffset, true);
    v.setUint32(base + 12, r.scaleBytes, true);
  });
  v.setUint32(F.headerCrc, crc32(out.subarray(0, F.headerCrc)), true);
  return out;
}

/** Where a record lies, for error messages. */
export interface RecordPlace {
  file: string;
  layer: number;
  expert: number;
  /** Byte offset of the record in the file. */
  offset: number;
}

function placeText(p: RecordPlace): string {
  return `${p.file}: layer ${p.layer} expert ${p.expert} record at offset ${p.offset}`;
}

/**
 * Decodes and validates a record header: magic, version, header CRC, the expected layer and
 * expert, and that every matrix and scale is 64-byte aligned, inside the payload, and inside
 * `stride`, without overlaps.
 */
export function decodeRecordHeader(
  bytes: Uint8Array,
  place: RecordPlace,
  stride: number,
): RecordHeader {
  const where = placeText(place);
  if (bytes.length < RECORD_HEADER_BYTES) {
    throw new Error(`${where}: header needs ${RECORD_HEADER_BYTES} bytes, got ${bytes.length}`);
  }
  const v = new DataView(bytes.buffer, bytes.byteOffset, RECORD_HEADER_BYTES);
  const magic = v.getUint32(F.magic, true);
  if (magic !== RECORD_MAGIC) {
    throw new Error(`${where}: bad magic 0x${magic.toString(16)} (expected "SLXR")`);
  }
  const version = v.getUint16(F.version, true);
  if (version !== RECORD_VERSION) {
    throw new Error(`${where}: record version ${version}, this reader knows ${RECORD_VERSION}`);
  }
  const headerCrc = crc32(bytes.subarray(0, F.headerCrc));
  if (v.getUint32(F.headerCrc, true) !== headerCrc) {
    throw new Error(`${where}: header CRC mismatch`);
  }
  if (v.getUint16(F.headerBytes, true) !== RECORD_HEADER_BYTES) {
    throw new Error(`${where}: header size ${v.getUint16(F.headerBytes, true)} is not 128`);
  }
  const h: RecordHeader = {
    layer: v.getUint32(F.layer, true),
    expert: v.getUint32(F.expert, true),
    formatId: v.getUint32(F.formatId, true),
    payloadCrc: v.getUint32(F.payloadCrc, true),
    payloadOffset: v.getUint32(F.payloadOffset, true),
    payloadBytes: v.getUint32(F.payloadBytes, true),
    matrices: {} as Record<ExpertMatrix, RecordMatrix>,
  };
  if (h.layer !== place.layer || h.expert !== place.expert) {
    throw new Error(`${where}: header says layer ${h.layer} expert ${h.expert}`);
  }
  if (!Object.values(EXPERT_FORMAT_IDS).includes(h.formatId)) {
    throw new Error(`${where}: unknown expert format id ${h.formatId}`);
  }
  const payloadEnd = h.payloadOffset + h.payloadBytes;
  if (h.payloadOffset !== RECORD_HEADER_BYTES || payloadEnd > stride) {
    throw new Error(
      `${where}: payload [${h.payloadOffset}, ${payloadEnd}) must start at 128 and end within ` +
        `the stride ${stride}`,
    );
  }
  const spans: [number, number, string][] = [];
  EXPERT_MATRICES.forEach((m, i) => {
    const base = F.matrices + 16 * i;
    const r: RecordMatrix = {
      offset: v.getUint32(base, true),
      bytes: v.getUint32(base + 4, true),
      scaleOffset: v.getUint32(base + 8, true),
      scaleBytes: v.getUint32(base + 12, true),
    };
    h.matrices[m] = r;
    spans.push([r.offset, r.bytes, m]);
    if (r.scaleOffset || r.scaleBytes) spans.push([r.scaleOffset, r.scaleBytes, `${m} scale`]);
  });
  for (const [off, len, what] of spans) {
    if (off % TENSOR_ALIGN || off < h.payloadOffset || off + len > payloadEnd) {
      throw new Error(
        `${where}: ${what} at [${off}, ${off + len}) is not 64-byte aligned inside the payload ` +
          `[${h.payloadOffset}, ${payloadEnd})`,
      );
    }
  }
  spans.sort((a, b) => a[0] - b[0]);
  for (let i = 1; i < spans.length; i++) {
    if (spans[i][0] < spans[i - 1][0] + spans[i - 1][1]) {
      throw new Error(`${where}: ${spans[i][2]} overlaps ${spans[i - 1][2]}`);
    }
  }
  return h;
}

/**
 * Checks a whole record (header + payload): decodes the header and verifies the payload CRC.
 * `record` must hold at least the header and the payload.
 */
export function verifyRecord(record: Uint8Array, place: RecordPlace, stride: number): RecordHeader {
  const h = decodeRecordHeader(record, place, stride);
  const end = h.payloadOffset + h.payloadBytes;
  if (record.length < end) {
    throw new Error(
      `${placeText(place)}: record of ${record.length} bytes ends before the payload`,
    );
  }
  const crc = crc32(record.subarray(h.payloadOffset, end));
  if (crc !== h.payloadCrc) {
    throw new Error(
      `${placeText(place)}: payload CRC 0x${crc.toString(16)} != header 0x${
        h.payloadCrc.toString(16)
      }`,
    );
  }
  return h;
}
