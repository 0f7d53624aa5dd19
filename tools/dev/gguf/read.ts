/**
 * Reader of GGUF v3 files (llama.cpp's model format): header, typed metadata, tensor infos and
 * positional reads of tensor data. The file is untrusted input: counts, lengths and tensor ranges
 * are checked against the file size. Also decodes F32 / F16 / BF16 / Q8_0 tensor bytes to float32
 * with plain scalar code, so it can serve as the oracle for the encoders.
 *
 * @module
 */

import { closeSync, fstatSync, openSync, readSync } from "node:fs";
import { f16ToF32 } from "../../../io/checkpoint_weights.ts";
import {
  alignTo,
  GGML_BLOCK,
  ggmlTensorBytes,
  type GgmlTypeName,
  ggmlTypeName,
  GGUF_DEFAULT_ALIGNMENT,
  GGUF_MAGIC,
  GGUF_VALUE_TYPE,
  GGUF_VERSION,
  type GgufElementType,
  type GgufValue,
  type GgufValueTypeName,
} from "./format.ts";

/** One tensor of a GGUF file. `dims` are in GGUF order: dims[0] varies fastest. */
export interface GgufTensorInfo {
  name: string;
  dims: number[];
  type: GgmlTypeName;
  /** Absolute byte offset of the data in the file. */
  offset: number;
  bytes: number;
}

/** An opened GGUF file. */
export interface GgufFile {
  path: string;
  version: number;
  /** Metadata in file order. */
  metadata: Map<string, GgufValue>;
  /** Tensor infos in file order. */
  tensors: GgufTensorInfo[];
  alignment: number;
  /** Absolute offset of the tensor data section. */
  dataOffset: number;
  /** Reads one tensor's raw bytes. */
  readTensor(name: string): Uint8Array;
  close(): void;
}

/** Refuses absurd counts before allocating for them. */
const MAX_COUNT = 2 ** 32;
const CHUNK = 1 << 20;

const TYPE_BY_CODE = new Map<number, GgufValueTypeName>(
  Object.entries(GGUF_VALUE_TYPE).map(([k, v]) => [v, k as GgufValueTypeName]),
);

/** Sequential reads over a file through a sliding buffer. */
class Cursor {
  pos = 0;
  #buf = new Uint8Array(0);
  #bufStart = 0;
  readonly #fd: number;
  readonly #size: number;
  readonly #path: string;
  readonly #dec = new TextDecoder("utf-8", { fatal: true });

  constructor(fd: number, size: number, path: string) {
    this.#fd = fd;
    this.#size = size;
    this.#path = path;
  }

  bytes(n: number, what: string): Uint8Array {
    if (this.pos + n > this.#size) {
      throw new Error(`${this.#path}: ${what} at byte ${this.pos} runs past the end of the file`);
    }
    const end = this.#bufStart + this.#buf.length;
    if (this.pos < this.#bufStart || this.pos + n > end) {
      const len = Math.min(Math.max(n, CHUNK), this.#size - this.pos);
      const buf = new Uint8Array(len);
      let done = 0;
      while (done < len) {
        const got = readSync(this.#fd, buf, done, len - done, this.pos + done);
        if (got === 0) throw new Error(`${this.#path}: unexpected end of file`);
        done += got;
      }
      this.#buf = buf;
      this.#bufStart = this.pos;
    }
    const off = this.pos - this.#bufStart;
    this.pos += n;
    return this.#buf.subarray(off, off + n);
  }

  view(n: number, what: string): DataView {
    const b = this.bytes(n, what);
    return new DataView(b.buffer, b.byteOffset, n);
  }

  u32(what: string): number {
    return this.view(4, what).getUint32(0, true);
  }

  u64(what: string): number {
    const v = this.view(8, what).getBigUint64(0, true);
    if (v > BigInt(Number.MAX_SAFE_INTEGER)) {
      throw new Error(`${this.#path}: ${what} ${v} is too large`);
    }
    return Number(v);
  }

  count(what: string): number {
    const n = this.u64(what);
    if (n > MAX_COUNT) throw new Error(`${this.#path}: ${what} ${n} is implausibly large`);
    return n;
  }

  string(what: string): string {
    const n = this.u64(`${what} length`);
    try {
      return this.#dec.decode(this.bytes(n, what));
    } catch (e) {
      throw new Error(`${this.#path}: ${what} is not valid UTF-8 (${(e as Error).message})`);
    }
  }
}

function readScalar(
  c: Cursor,
  type: GgufElementType,
  what: string,
): number | bigint | boolean | string {
  switch (type) {
    case "u8":
      return c.view(1, what).getUint8(0);
    case "i8":
      return c.view(1, what).getInt8(0);
    case "u16":
      return c.view(2, what).getUint16(0, true);
    case "i16":
      return c.view(2, what).getInt16(0, true);
    case "u32":
      return c.view(4, what).getUint32(0, true);
    case "i32":
      return c.view(4, what).getInt32(0, true);
    case "f32":
      return c.view(4, what).getFloat32(0, true);
    case "f64":
      return c.view(8, what).getFloat64(0, true);
    case "u64":
      return c.view(8, what).getBigUint64(0, true);
    case "i64":
      return c.view(8, what).getBigInt64(0, true);
    case "bool": {
      const b = c.view(1, what).getUint8(0);
      if (b > 1) throw new Error(`${what}: bool byte ${b} is neither 0 nor 1`);
      return b === 1;
    }
    case "string":
      return c.string(what);
  }
}

function valueType(c: Cursor, path: string, what: string): GgufValueTypeName {
  const code = c.u32(`${what} type`);
  const t = TYPE_BY_CODE.get(code);
  if (!t) throw new Error(`${path}: ${what} has unknown value type ${code}`);
  return t;
}

function readValue(c: Cursor, path: string, key: string): GgufValue {
  const what = `metadata ${key}`;
  const type = valueType(c, path, what);
  if (type !== "array") {
    return { type, value: readScalar(c, type, what) } as GgufValue;
  }
  const elem = valueType(c, path, `${what} element`);
  if (elem === "array") throw new Error(`${path}: ${what}: nested arrays are not supported`);
  const n = c.count(`${what} array length`);
  const value = new Array(n);
  for (let i = 0; i < n; i++) value[i] = readScalar(c, elem, `${what}[${i}]`);
  return { type, elem, value } as GgufValue;
}

/** Opens a GGUF file, parses its header and checks every tensor lies inside the file. */
export function readGguf(path: string): GgufFile {
  const fd = openSync(path, "r");
  try {
    const size = fstatSync(fd).size;
    const c = new Cursor(fd, size, path);
    const magic = c.u32("magic");
    if (magic !== GGUF_MAGIC) {
      throw new Error(`${path}: not a GGUF file (magic 0x${magic.toString(16)})`);
    }
    const version = c.u32("version");
    if (version !== GGUF_VERSION) {
      throw new Error(`${path}: GGUF version ${version}, only ${GGUF_VERSION} is supported`);
    }
    const nTensors = c.count("tensor count");
    const nKv = c.count("metadata count");
    const metadata = new Map<string, GgufValue>();
    for (let i = 0; i < nKv; i++) {
      const key = c.string(`metadata key ${i}`);
      if (metadata.has(key)) throw new Error(`${path}: metadata key ${key} appears twice`);
      metadata.set(key, readValue(c, path, key));
    }
    const alignMeta = metadata.get("general.alignment");
    let alignment = GGUF_DEFAULT_ALIGNMENT;
    if (alignMeta) {
      if (alignMeta.type !== "u32" || alignMeta.value === 0 || alignMeta.value % 8 !== 0) {
        throw new Error(`${path}: general.alignment must be a u32 multiple of 8`);
      }
      alignment = alignMeta.value;
    }
    const raw: { name: string; dims: number[]; type: GgmlTypeName; rel: number }[] = [];
    const names = new Set<string>();
    for (let i = 0; i < nTensors; i++) {
      const name = c.string(`tensor ${i} name`);
      if (names.has(name)) throw new Error(`${path}: tensor ${name} appears twice`);
      names.add(name);
      const nDims = c.u32(`tensor ${name} dim count`);
      if (nDims < 1 || nDims > 4) throw new Error(`${path}: tensor ${name} has ${nDims} dims`);
      const dims: number[] = [];
      for (let d = 0; d < nDims; d++) dims.push(c.count(`tensor ${name} dim ${d}`));
      const code = c.u32(`tensor ${name} type`);
      const type = ggmlTypeName(code);
      if (!type) throw new Error(`${path}: tensor ${name} has unsupported ggml type ${code}`);
      const rel = c.u64(`tensor ${name} offset`);
      if (rel % alignment !== 0) {
        throw new Error(`${path}: tensor ${name} offset ${rel} is not ${alignment}-aligned`);
      }
      raw.push({ name, dims, type, rel });
    }
    const dataOffset = alignTo(c.pos, alignment);
    const tensors = raw.map((t) => {
      const bytes = ggmlTensorBytes(t.type, t.dims, `${path}: tensor ${t.name}`);
      const offset = dataOffset + t.rel;
      if (offset + bytes > size) {
        throw new Error(
          `${path}: tensor ${t.name} data [${offset}, ${offset + bytes}) is past ` +
            `the end of the ${size}-byte file`,
        );
      }
      return { name: t.name, dims: t.dims, type: t.type, offset, bytes };
    });
    const byName = new Map(tensors.map((t) => [t.name, t]));
    let open = true;
    return {
      path,
      version,
      metadata,
      tensors,
      alignment,
      dataOffset,
      readTensor(name: string): Uint8Array {
        const t = byName.get(name);
        if (!t) throw new Error(`${path}: no tensor ${name}`);
        if (!open) throw new Error(`${path}: file is closed`);
        const out = new Uint8Array(t.bytes);
        let done = 0;
        while (done < t.bytes) {
          const got = readSync(fd, out, done, Math.min(t.bytes - done, 1 << 30), t.offset + done);
          if (got === 0) throw new Error(`${path}: tensor ${name}: unexpected end of file`);
          done += got;
        }
        return out;
      },
      close(): void {
        if (open) closeSync(fd);
        open = false;
      },
    };
  } catch (e) {
    closeSync(fd);
    throw e;
  }
}

/** Converts one bfloat16 bit pattern to its value. */
export function bf16ToF32(h: number): number {
  const v = new DataView(new ArrayBuffer(4));
  v.setUint32(0, (h & 0xffff) << 16);
  return v.getFloat32(0);
}

/** Decodes the bytes of a tensor of `type` to float32 (F32, F16, BF16 and Q8_0 only). */
export function decodeGgmlToF32(type: GgmlTypeName, bytes: Uint8Array, what: string): Float32Array {
  const v = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const { elems, bytes: blockBytes } = GGML_BLOCK[type];
  if (bytes.length % blockBytes) {
    throw new Error(`${what}: ${bytes.length} bytes is not a whole number of ${type} blocks`);
  }
  const out = new Float32Array((bytes.length / blockBytes) * elems);
  switch (type) {
    case "F32":
      for (let i = 0; i < out.length; i++) out[i] = v.getFloat32(4 * i, true);
      return out;
    case "F16":
      for (let i = 0; i < out.length; i++) out[i] = f16ToF32(v.getUint16(2 * i, true));
      return out;
    case "BF16":
      for (let i = 0; i < out.length; i++) out[i] = bf16ToF32(v.getUint16(2 * i, true));
      return out;
    case "Q8_0":
      for (let b = 0; b < out.length / 32; b++) {
        const d = f16ToF32(v.getUint16(b * 34, true));
        for (let j = 0; j < 32; j++) out[b * 32 + j] = d * v.getInt8(b * 34 + 2 + j);
      }
      return out;
    default:
      throw new Error(`${what}: decoding ${type} is not implemented`);
  }
}

/** A metadata value of `file`, checked to exist. */
export function ggufMeta(file: GgufFile, key: string): GgufValue {
  const v = file.metadata.get(key);
  if (!v) throw new Error(`${file.path}: no metadata key ${key}`);
  return v;
}
