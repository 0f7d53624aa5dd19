/**
 * Reader for Hugging Face safetensors checkpoints: one `model.safetensors`, a sharded checkpoint
 * with `model.safetensors.index.json`, or a directory of several `*.safetensors` without an index.
 * Headers are untrusted input and are validated fully; tensor data is read with positional reads
 * from lazily opened files, so a checkpoint far larger than RAM can be walked tensor by tensor.
 *
 * @module
 */

import {
  closeSync,
  existsSync,
  fstatSync,
  openSync,
  readdirSync,
  readFileSync,
  readSync,
} from "node:fs";
import { join } from "node:path";

/** Bytes per element of every safetensors dtype this reader accepts. */
export const DTYPE_BYTES = {
  F64: 8,
  F32: 4,
  F16: 2,
  BF16: 2,
  F8_E4M3: 1,
  F8_E5M2: 1,
  // Power-of-two scales (DeepSeek-V4's per-32 FP4 and 128×128 FP8 block scales).
  F8_E8M0: 1,
  I64: 8,
  U64: 8,
  I32: 4,
  U32: 4,
  I16: 2,
  U16: 2,
  I8: 1,
  U8: 1,
  BOOL: 1,
} as const;

/** A safetensors dtype name. */
export type SafetensorsDtype = keyof typeof DTYPE_BYTES;

/** Where one tensor lives. */
export interface TensorInfo {
  name: string;
  dtype: SafetensorsDtype;
  shape: number[];
  /** Path of the file holding the tensor. */
  file: string;
  /** Absolute byte offset of the tensor's first byte in `file`. */
  offset: number;
  bytes: number;
}

/** An opened checkpoint: the tensor index plus positional reads. */
export interface Checkpoint {
  dir: string;
  tensors: Map<string, TensorInfo>;
  /** Reads a tensor's raw little-endian bytes into a new array. */
  read(name: string): Uint8Array;
  /** Reads a tensor's raw bytes into `dst`, whose length must equal the tensor's byte count. */
  readInto(name: string, dst: Uint8Array): void;
  /** Reads `dst.length` bytes of a tensor starting `start` bytes into it (for streaming). */
  readRangeInto(name: string, start: number, dst: Uint8Array): void;
  /** Closes every file opened so far. */
  close(): void;
}

/** Largest JSON header accepted (the real DeepSeek-V3 shards have headers of a few hundred KiB). */
export const MAX_HEADER_BYTES = 100 * 1024 * 1024;

/** Largest single read request; node's readSync rejects lengths of 2 GiB and more. */
const READ_CHUNK = 1 << 30;

/** Name of the single-file checkpoint. */
const SINGLE_FILE = "model.safetensors";
/** Name of the shard index. */
const INDEX_FILE = "model.safetensors.index.json";

function isDtype(s: unknown): s is SafetensorsDtype {
  return typeof s === "string" && Object.hasOwn(DTYPE_BYTES, s);
}

function isNonNegInt(v: unknown): v is number {
  return typeof v === "number" && Number.isSafeInteger(v) && v >= 0;
}

/** Reads exactly `dst.length` bytes at `position`, failing with a message naming `what`. */
function preadFully(fd: number, dst: Uint8Array, position: number, what: string): void {
  let done = 0;
  while (done < dst.length) {
    const want = Math.min(dst.length - done, READ_CHUNK);
    const n = readSync(fd, dst, done, want, position + done);
    if (n === 0) {
      throw new Error(`${what}: unexpected end of file at byte ${position + done}`);
    }
    done += n;
  }
}

/**
 * Parses and validates the header of one safetensors file; returns its tensors with absolute
 * offsets. Throws naming the file (and the tensor) on any inconsistency.
 */
export function readSafetensorsHeader(path: string): TensorInfo[] {
  const fd = openSync(path, "r");
  try {
    const fileSize = fstatSync(fd).size;
    if (fileSize < 8) {
      throw new Error(`${path}: file of ${fileSize} bytes is too short for a safetensors header`);
    }
    const lenBuf = new Uint8Array(8);
    preadFully(fd, lenBuf, 0, path);
    const headerLen = new DataView(lenBuf.buffer).getBigUint64(0, true);
    if (headerLen > BigInt(MAX_HEADER_BYTES) || headerLen > BigInt(fileSize - 8)) {
      throw new Error(
        `${path}: header length ${headerLen} exceeds the file size (${fileSize}) or the ` +
          `${MAX_HEADER_BYTES}-byte limit`,
      );
    }
    const hdrBytes = new Uint8Array(Number(headerLen));
    preadFully(fd, hdrBytes, 8, path);
    let header: unknown;
    try {
      header = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(hdrBytes));
    } catch (e) {
      throw new Error(`${path}: header is not valid UTF-8 JSON (${(e as Error).message})`);
    }
    if (header === null || typeof header !== "object" || Array.isArray(header)) {
      throw new Error(`${path}: header is not a JSON object`);
    }
    const dataStart = 8 + Number(headerLen);
    const dataSize = fileSize - dataStart;
    const out: TensorInfo[] = [];
    const spans: { begin: number; end: number; name: string }[] = [];
    for (const [name, raw] of Object.entries(header as Record<string, unknown>)) {
      if (name === "__metadata__") continue;
      const where = `${path}: tensor ${name}`;
      if (raw === null || typeof raw !== "object" || Array.isArray(raw)) {
        throw new Error(`${where}: entry is not an object`);
      }
      const { dtype, shape, data_offsets: offs } = raw as Record<string, unknown>;
      if (!isDtype(dtype)) throw new Error(`${where}: unknown dtype ${shown(dtype)}`);
      if (!Array.isArray(shape) || !shape.every(isNonNegInt)) {
        throw new Error(`${where}: shape ${shown(shape)} is not a list of integers >= 0`);
      }
      if (!Array.isArray(offs) || offs.length !== 2 || !offs.every(isNonNegInt)) {
        throw new Error(`${where}: data_offsets ${shown(offs)} is not [begin, end]`);
      }
      const [begin, end] = offs as number[];
      if (begin > end || end > dataSize) {
        throw new Error(
          `${where}: data_offsets [${begin}, ${end}] lie outside the data area of ${dataSize} bytes`,
        );
      }
      let elems = 1;
      for (const d of shape as number[]) elems *= d;
      const bytes = elems * DTYPE_BYTES[dtype];
      if (!Number.isSafeInteger(bytes) || bytes !== end - begin) {
        throw new Error(
          `${where}: shape [${shape}] of ${dtype} needs ${bytes} bytes but data_offsets span ` +
            `${end - begin}`,
        );
      }
      spans.push({ begin, end, name });
      out.push({ name, dtype, shape: [...shape], file: path, offset: dataStart + begin, bytes });
    }
    spans.sort((a, b) => a.begin - b.begin || a.end - b.end);
    for (let i = 1; i < spans.length; i++) {
      const prev = spans[i - 1], cur = spans[i];
      if (cur.begin < prev.end) {
        throw new Error(
          `${path}: tensor ${cur.name} [${cur.begin}, ${cur.end}) overlaps tensor ${prev.name} ` +
            `[${prev.begin}, ${prev.end})`,
        );
      }
    }
    return out;
  } finally {
    closeSync(fd);
  }
}

/** A header value for a message: its JSON, or "nothing" when the field is missing. */
function shown(v: unknown): string {
  return v === undefined ? "nothing (the field is missing)" : JSON.stringify(v);
}

/** Reads the shard index and returns the shard file names it names, validated. */
function shardsFromIndex(dir: string, indexPath: string): Map<string, string> {
  let index: unknown;
  try {
    index = JSON.parse(readFileSync(indexPath, "utf-8"));
  } catch (e) {
    throw new Error(`${indexPath}: not valid JSON (${(e as Error).message})`);
  }
  const map = (index as { weight_map?: unknown } | null)?.weight_map;
  if (map === null || typeof map !== "object" || Array.isArray(map)) {
    throw new Error(`${indexPath}: weight_map is missing or not an object`);
  }
  const byTensor = new Map<string, string>();
  for (const [name, file] of Object.entries(map as Record<string, unknown>)) {
    if (typeof file !== "string" || file === "" || /[\\/]/.test(file) || file.startsWith(".")) {
      throw new Error(
        `${indexPath}: tensor ${name} maps to an invalid shard name ${JSON.stringify(file)}`,
      );
    }
    if (!existsSync(join(dir, file))) {
      throw new Error(`${indexPath}: shard ${file} (holding tensor ${name}) does not exist`);
    }
    byTensor.set(name, file);
  }
  return byTensor;
}

/** Opens a checkpoint directory and validates every header; data is read on demand. */
export function openCheckpoint(dir: string): Checkpoint {
  const indexPath = join(dir, INDEX_FILE);
  let files: string[];
  let weightMap: Map<string, string> | null = null;
  if (existsSync(indexPath)) {
    weightMap = shardsFromIndex(dir, indexPath);
    files = [...new Set(weightMap.values())].sort();
  } else if (existsSync(join(dir, SINGLE_FILE))) {
    files = [SINGLE_FILE];
  } else {
    let names: string[];
    try {
      names = readdirSync(dir);
    } catch (e) {
      throw new Error(`${dir}: cannot list checkpoint directory (${(e as Error).message})`);
    }
    files = names.filter((n) => n.endsWith(".safetensors")).sort();
    if (files.length === 0) throw new Error(`${dir}: no *.safetensors file found`);
  }

  const tensors = new Map<string, TensorInfo>();
  for (const file of files) {
    for (const t of readSafetensorsHeader(join(dir, file))) {
      const prior = tensors.get(t.name);
      if (prior) {
        throw new Error(`${t.file}: tensor ${t.name} also appears in ${prior.file}`);
      }
      tensors.set(t.name, t);
    }
  }
  if (weightMap) {
    for (const [name, file] of weightMap) {
      const t = tensors.get(name);
      if (!t) {
        throw new Error(`${join(dir, file)}: tensor ${name} listed in ${INDEX_FILE} is absent`);
      }
      if (t.file !== join(dir, file)) {
        throw new Error(`${t.file}: tensor ${name} is in this shard, but the index says ${file}`);
      }
    }
  }

  const fds = new Map<string, number>();
  const fdOf = (file: string): number => {
    let fd = fds.get(file);
    if (fd === undefined) {
      fd = openSync(file, "r");
      fds.set(file, fd);
    }
    return fd;
  };
  const infoOf = (name: string): TensorInfo => {
    const t = tensors.get(name);
    if (!t) throw new Error(`${dir}: checkpoint has no tensor ${name}`);
    return t;
  };
  const readInto = (name: string, dst: Uint8Array): void => {
    const t = infoOf(name);
    if (dst.length !== t.bytes) {
      throw new Error(`${t.file}: tensor ${name} has ${t.bytes} bytes, destination ${dst.length}`);
    }
    preadFully(fdOf(t.file), dst, t.offset, `${t.file}: tensor ${name}`);
  };
  const readRangeInto = (name: string, start: number, dst: Uint8Array): void => {
    const t = infoOf(name);
    if (!Number.isSafeInteger(start) || start < 0 || start + dst.length > t.bytes) {
      throw new Error(
        `${t.file}: tensor ${name}: range [${start}, ${
          start + dst.length
        }) outside its ${t.bytes} bytes`,
      );
    }
    preadFully(fdOf(t.file), dst, t.offset + start, `${t.file}: tensor ${name}`);
  };
  return {
    dir,
    tensors,
    readInto,
    readRangeInto,
    read(name: string): Uint8Array {
      const dst = new Uint8Array(infoOf(name).bytes);
      readInto(name, dst);
      return dst;
    },
    close(): void {
      for (const fd of fds.values()) closeSync(fd);
      fds.clear();
    },
  };
}
