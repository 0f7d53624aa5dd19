/**
 * GGUF v3 constants shared by the reader and the writer: the metadata value types, the ggml
 * tensor types this project reads or writes, and their block sizes.
 *
 * @module
 */

/** "GGUF" read as a little-endian uint32. */
export const GGUF_MAGIC = 0x46554747;
/** The GGUF version written and accepted. */
export const GGUF_VERSION = 3;
/** Alignment of tensor data when `general.alignment` is absent. */
export const GGUF_DEFAULT_ALIGNMENT = 32;

/** Metadata value type codes of the GGUF spec. */
export const GGUF_VALUE_TYPE = {
  u8: 0,
  i8: 1,
  u16: 2,
  i16: 3,
  u32: 4,
  i32: 5,
  f32: 6,
  bool: 7,
  string: 8,
  array: 9,
  u64: 10,
  i64: 11,
  f64: 12,
} as const;

/** Name of a metadata value type. */
export type GgufValueTypeName = keyof typeof GGUF_VALUE_TYPE;

/** Value types whose JS value is a number. */
export type GgufNumberType = "u8" | "i8" | "u16" | "i16" | "u32" | "i32" | "f32" | "f64";

/** Value types that may be array elements (the spec allows nested arrays; we do not). */
export type GgufElementType = Exclude<GgufValueTypeName, "array">;

/** One typed metadata value. 64-bit integers are bigint so no precision is lost. */
export type GgufValue =
  | { type: GgufNumberType; value: number }
  | { type: "u64" | "i64"; value: bigint }
  | { type: "bool"; value: boolean }
  | { type: "string"; value: string }
  | { type: "array"; elem: GgufNumberType; value: ArrayLike<number> }
  | { type: "array"; elem: "u64" | "i64"; value: ArrayLike<bigint> }
  | { type: "array"; elem: "bool"; value: ArrayLike<boolean> }
  | { type: "array"; elem: "string"; value: ArrayLike<string> };

/** ggml tensor types (the subset with a fixed block layout this project knows). */
export const GGML_TYPE = {
  F32: 0,
  F16: 1,
  Q4_0: 2,
  Q4_1: 3,
  Q5_0: 6,
  Q5_1: 7,
  Q8_0: 8,
  Q2_K: 10,
  Q3_K: 11,
  Q4_K: 12,
  Q5_K: 13,
  Q6_K: 14,
  I32: 26,
  BF16: 30,
  MXFP4: 39,
} as const;

/** Name of a ggml tensor type. */
export type GgmlTypeName = keyof typeof GGML_TYPE;

/** Elements per block and bytes per block of each known ggml type. */
export const GGML_BLOCK: Record<GgmlTypeName, { elems: number; bytes: number }> = {
  F32: { elems: 1, bytes: 4 },
  F16: { elems: 1, bytes: 2 },
  Q4_0: { elems: 32, bytes: 18 },
  Q4_1: { elems: 32, bytes: 20 },
  Q5_0: { elems: 32, bytes: 22 },
  Q5_1: { elems: 32, bytes: 24 },
  Q8_0: { elems: 32, bytes: 34 },
  Q2_K: { elems: 256, bytes: 84 },
  Q3_K: { elems: 256, bytes: 110 },
  Q4_K: { elems: 256, bytes: 144 },
  Q5_K: { elems: 256, bytes: 176 },
  Q6_K: { elems: 256, bytes: 210 },
  I32: { elems: 1, bytes: 4 },
  BF16: { elems: 1, bytes: 2 },
  // ggml's block_mxfp4: the E8M0 byte, then 16 bytes of E2M1 pairs.
  MXFP4: { elems: 32, bytes: 17 },
};

/** The name of a ggml type code, or undefined when it is not in {@link GGML_TYPE}. */
export function ggmlTypeName(code: number): GgmlTypeName | undefined {
  for (const [name, c] of Object.entries(GGML_TYPE)) if (c === code) return name as GgmlTypeName;
  return undefined;
}

/**
 * Bytes of a tensor of `type` with GGUF dims `dims` (dims[0] varies fastest). Throws when
 * dims[0] is not a whole number of blocks, naming `what`.
 */
export function ggmlTensorBytes(type: GgmlTypeName, dims: readonly number[], what: string): number {
  const { elems, bytes } = GGML_BLOCK[type];
  const row = dims[0] ?? 1;
  if (row % elems !== 0) {
    throw new Error(`${what}: first dim ${row} is not a multiple of the ${type} block of ${elems}`);
  }
  const rows = dims.slice(1).reduce((a, b) => a * b, 1);
  return (row / elems) * bytes * rows;
}

/** Rounds `n` up to a multiple of `a`. */
export function alignTo(n: number, a: number): number {
  return Math.ceil(n / a) * a;
}
