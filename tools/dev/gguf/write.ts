/**
 * Writer of GGUF v3 files: header, typed metadata (scalars, strings, arrays), tensor infos, and
 * the tensor data, streamed tensor by tensor from a producer so that a model larger than RAM can
 * be written. Output goes to a temporary path that is renamed into place at the end.
 *
 * @module
 */

import {
  alignTo,
  GGML_TYPE,
  ggmlTensorBytes,
  type GgmlTypeName,
  GGUF_DEFAULT_ALIGNMENT,
  GGUF_MAGIC,
  GGUF_VALUE_TYPE,
  GGUF_VERSION,
  type GgufElementType,
  type GgufValue,
} from "./format.ts";

/** One tensor to write. `dims` are in GGUF order: dims[0] varies fastest. */
export interface GgufTensorSpec {
  name: string;
  dims: number[];
  type: GgmlTypeName;
}

/** Yields the bytes of one tensor, in order, in chunks of any size. */
export type TensorProducer = (spec: GgufTensorSpec, index: number) => Iterable<Uint8Array>;

/** Options of {@link writeGguf}. */
export interface WriteGgufOptions {
  /** Data alignment; written as `general.alignment` when not the default 32. */
  alignment?: number;
  /** Called after each chunk is written with its byte count. */
  onBytes?: (n: number) => void;
}

/** Growable little-endian byte buffer for the header. */
class ByteSink {
  #buf = new Uint8Array(1 << 16);
  #view = new DataView(this.#buf.buffer);
  length = 0;
  readonly #enc = new TextEncoder();

  #room(n: number): DataView {
    if (this.length + n > this.#buf.length) {
      const next = new Uint8Array(Math.max(this.#buf.length * 2, this.length + n));
      next.set(this.#buf.subarray(0, this.length));
      this.#buf = next;
      this.#view = new DataView(next.buffer);
    }
    return this.#view;
  }

  u8(v: number): void {
    this.#room(1).setUint8(this.length, v);
    this.length += 1;
  }
  i8(v: number): void {
    this.#room(1).setInt8(this.length, v);
    this.length += 1;
  }
  u16(v: number): void {
    this.#room(2).setUint16(this.length, v, true);
    this.length += 2;
  }
  i16(v: number): void {
    this.#room(2).setInt16(this.length, v, true);
    this.length += 2;
  }
  u32(v: number): void {
    this.#room(4).setUint32(this.length, v, true);
    this.length += 4;
  }
  i32(v: number): void {
    this.#room(4).setInt32(this.length, v, true);
    this.length += 4;
  }
  f32(v: number): void {
    this.#room(4).setFloat32(this.length, v, true);
    this.length += 4;
  }
  f64(v: number): void {
    this.#room(8).setFloat64(this.length, v, true);
    this.length += 8;
  }
  u64(v: number | bigint): void {
    this.#room(8).setBigUint64(this.length, BigInt(v), true);
    this.length += 8;
  }
  i64(v: bigint): void {
    this.#room(8).setBigInt64(this.length, v, true);
    this.length += 8;
  }
  string(s: string): void {
    const b = this.#enc.encode(s);
    this.u64(b.length);
    this.#room(b.length);
    this.#buf.set(b, this.length);
    this.length += b.length;
  }
  pad(to: number): void {
    const n = alignTo(this.length, to) - this.length;
    this.#room(n);
    this.#buf.fill(0, this.length, this.length + n);
    this.length += n;
  }
  bytes(): Uint8Array {
    return this.#buf.subarray(0, this.length);
  }
}

function checkNumber(type: GgufElementType, v: unknown, key: string): number {
  const ranges: Partial<Record<GgufElementType, [number, number]>> = {
    u8: [0, 0xff],
    i8: [-0x80, 0x7f],
    u16: [0, 0xffff],
    i16: [-0x8000, 0x7fff],
    u32: [0, 0xffffffff],
    i32: [-0x80000000, 0x7fffffff],
  };
  if (typeof v !== "number") throw new Error(`metadata ${key}: ${type} value must be a number`);
  const r = ranges[type];
  if (r && (!Number.isInteger(v) || v < r[0] || v > r[1])) {
    throw new Error(`metadata ${key}: ${v} does not fit ${type}`);
  }
  return v;
}

function writeScalar(s: ByteSink, type: GgufElementType, v: unknown, key: string): void {
  switch (type) {
    case "string":
      if (typeof v !== "string") throw new Error(`metadata ${key}: expected a string`);
      return s.string(v);
    case "bool":
      if (typeof v !== "boolean") throw new Error(`metadata ${key}: expected a boolean`);
      return s.u8(v ? 1 : 0);
    case "u64":
    case "i64":
      if (typeof v !== "bigint") throw new Error(`metadata ${key}: ${type} value must be a bigint`);
      return type === "u64" ? s.u64(v) : s.i64(v);
    case "f32":
      return s.f32(checkNumber(type, v, key));
    case "f64":
      return s.f64(checkNumber(type, v, key));
    default:
      s[type](checkNumber(type, v, key));
  }
}

function writeValue(s: ByteSink, key: string, v: GgufValue): void {
  s.string(key);
  s.u32(GGUF_VALUE_TYPE[v.type]);
  if (v.type !== "array") return writeScalar(s, v.type, v.value, key);
  s.u32(GGUF_VALUE_TYPE[v.elem]);
  s.u64(v.value.length);
  for (let i = 0; i < v.value.length; i++) writeScalar(s, v.elem, v.value[i], `${key}[${i}]`);
}

/** Encodes the header (up to and including the padding before the data) and the data size. */
export function encodeGgufHeader(
  metadata: ReadonlyMap<string, GgufValue>,
  tensors: readonly GgufTensorSpec[],
  alignment = GGUF_DEFAULT_ALIGNMENT,
): { header: Uint8Array; offsets: number[]; sizes: number[]; dataBytes: number } {
  if (!Number.isInteger(alignment) || alignment <= 0 || alignment % 8) {
    throw new Error(`GGUF alignment must be a positive multiple of 8, got ${alignment}`);
  }
  const meta = new Map(metadata);
  if (alignment !== GGUF_DEFAULT_ALIGNMENT) {
    meta.set("general.alignment", { type: "u32", value: alignment });
  } else if (meta.has("general.alignment")) {
    const a = meta.get("general.alignment")!;
    if (a.type !== "u32" || a.value !== alignment) {
      throw new Error(`metadata general.alignment disagrees with the alignment ${alignment}`);
    }
  }
  const s = new ByteSink();
  s.u32(GGUF_MAGIC);
  s.u32(GGUF_VERSION);
  s.u64(tensors.length);
  s.u64(meta.size);
  for (const [k, v] of meta) writeValue(s, k, v);
  const offsets: number[] = [];
  const sizes: number[] = [];
  const names = new Set<string>();
  let at = 0;
  for (const t of tensors) {
    if (names.has(t.name)) throw new Error(`GGUF tensor ${t.name} is listed twice`);
    names.add(t.name);
    if (
      t.dims.length < 1 || t.dims.length > 4 || t.dims.some((d) => !Number.isInteger(d) || d < 1)
    ) {
      throw new Error(`GGUF tensor ${t.name}: dims [${t.dims}] must be 1..4 positive integers`);
    }
    const bytes = ggmlTensorBytes(t.type, t.dims, `GGUF tensor ${t.name}`);
    s.string(t.name);
    s.u32(t.dims.length);
    for (const d of t.dims) s.u64(d);
    s.u32(GGML_TYPE[t.type]);
    s.u64(at);
    offsets.push(at);
    sizes.push(bytes);
    at = alignTo(at + bytes, alignment);
  }
  s.pad(alignment);
  return { header: s.bytes(), offsets, sizes, dataBytes: at };
}

function writeAll(file: Deno.FsFile, bytes: Uint8Array): void {
  let done = 0;
  while (done < bytes.length) done += file.writeSync(bytes.subarray(done));
}

/**
 * Writes a GGUF file at `path`: metadata in the map's order, tensors in `tensors` order, each
 * tensor's bytes pulled from `produce` and checked against the size its type and dims imply.
 * Returns the file size.
 */
export function writeGguf(
  path: string,
  metadata: ReadonlyMap<string, GgufValue>,
  tensors: readonly GgufTensorSpec[],
  produce: TensorProducer,
  opts: WriteGgufOptions = {},
): number {
  const alignment = opts.alignment ?? GGUF_DEFAULT_ALIGNMENT;
  const { header, sizes, dataBytes } = encodeGgufHeader(metadata, tensors, alignment);
  const tmp = `${path}.tmp-${Deno.pid}`;
  const file = Deno.openSync(tmp, { write: true, create: true, truncate: true });
  try {
    writeAll(file, header);
    const zeros = new Uint8Array(alignment);
    tensors.forEach((spec, i) => {
      let n = 0;
      for (const chunk of produce(spec, i)) {
        n += chunk.length;
        if (n > sizes[i]) break;
        writeAll(file, chunk);
        opts.onBytes?.(chunk.length);
      }
      if (n !== sizes[i]) {
        throw new Error(
          `GGUF tensor ${spec.name}: producer gave ${n > sizes[i] ? "more than " : ""}${n} ` +
            `bytes, expected ${sizes[i]} for ${spec.type} [${spec.dims}]`,
        );
      }
      writeAll(file, zeros.subarray(0, alignTo(n, alignment) - n));
    });
    file.close();
  } catch (e) {
    file.close();
    Deno.removeSync(tmp);
    throw e;
  }
  Deno.renameSync(tmp, path);
  return header.length + dataBytes;
}
