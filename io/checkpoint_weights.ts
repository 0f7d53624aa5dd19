/**
 * Decoding of checkpoint tensors to float32: F32, F16, BF16, and FP8 E4M3 ("fn") with the
 * 128×128 block scales (`<weight>_scale_inv`) of DeepSeek-V3 / Kimi-K2 checkpoints.
 * Byte arrays are little-endian; typed-array views assume a little-endian host (x86, ARM).
 *
 * @module
 */

import type { Checkpoint, TensorInfo } from "./safetensors.ts";

/** Side of the square blocks that share one FP8 scale. */
export const FP8_BLOCK = 128;

/** Suffix appended to an FP8 weight's name to name its block-scale tensor. */
export const SCALE_INV_SUFFIX = "_scale_inv";

/** The value of each of the 256 OCP FP8 E4M3 "fn" codes (bias 7, no infinities, 0x7F/0xFF NaN). */
export const FP8_E4M3_TABLE: Float32Array = (() => {
  const t = new Float32Array(256);
  for (let c = 0; c < 256; c++) {
    const sign = c & 0x80 ? -1 : 1;
    const exp = (c >> 3) & 0xf;
    const man = c & 7;
    if (exp === 15 && man === 7) t[c] = NaN;
    else if (exp === 0) t[c] = sign * (man / 8) * 2 ** -6;
    else t[c] = sign * (1 + man / 8) * 2 ** (exp - 7);
  }
  return t;
})();

/** Converts one IEEE binary16 bit pattern to its value. */
export function f16ToF32(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >> 10) & 0x1f;
  const man = h & 0x3ff;
  if (exp === 0) return sign * man * 2 ** -24;
  if (exp === 31) return man ? NaN : sign * Infinity;
  return sign * (1 + man / 1024) * 2 ** (exp - 15);
}

/** Copies `bytes` into a fresh, aligned buffer (views need 2/4-byte alignment). */
function aligned(bytes: Uint8Array): ArrayBuffer {
  const copy = new Uint8Array(bytes.length);
  copy.set(bytes);
  return copy.buffer;
}

/**
 * Decodes raw tensor bytes of a floating-point dtype to float32 (FP8 without its scales).
 * Throws for integer dtypes, naming `what`.
 */
export function decodeDtypeToF32(dtype: string, bytes: Uint8Array, what = "tensor"): Float32Array {
  switch (dtype) {
    case "F32":
      if (bytes.length % 4) throw new Error(`${what}: F32 byte count ${bytes.length} not / 4`);
      return new Float32Array(aligned(bytes));
    case "F16":
    case "BF16": {
      if (bytes.length % 2) throw new Error(`${what}: ${dtype} byte count ${bytes.length} odd`);
      const u16 = new Uint16Array(aligned(bytes));
      const out = new Float32Array(u16.length);
      if (dtype === "BF16") {
        const bits = new Uint32Array(out.buffer);
        for (let i = 0; i < u16.length; i++) bits[i] = u16[i] << 16;
      } else {
        for (let i = 0; i < u16.length; i++) out[i] = f16ToF32(u16[i]);
      }
      return out;
    }
    case "F8_E4M3": {
      const out = new Float32Array(bytes.length);
      for (let i = 0; i < bytes.length; i++) out[i] = FP8_E4M3_TABLE[bytes[i]];
      return out;
    }
    case "F8_E8M0": {
      // Power-of-two scales: 2^(x − 127); 0xFF is NaN in the OCP MX spec and is refused.
      const out = new Float32Array(bytes.length);
      for (let i = 0; i < bytes.length; i++) {
        if (bytes[i] === 0xff) throw new Error(`${what}: element ${i} is the E8M0 NaN code 0xFF`);
        out[i] = 2 ** (bytes[i] - 127);
      }
      return out;
    }
    case "I64": {
      // Index tables (DeepSeek-V4's tid2eid): small non-negative integers, exact in float32.
      if (bytes.length % 8) throw new Error(`${what}: I64 byte count ${bytes.length} not / 8`);
      const ints = new BigInt64Array(aligned(bytes));
      return Float32Array.from(ints, (v, i) => {
        if (v < 0n || v >= 1n << 24n) {
          throw new Error(`${what}: element ${i} is ${v}; expected an index in 0..2^24`);
        }
        return Number(v);
      });
    }
    default:
      throw new Error(`${what}: dtype ${dtype} cannot be decoded to float32`);
  }
}

/** Shape [ceil(rows/128), ceil(cols/128)] the block-scale tensor of a [rows, cols] weight has. */
export function fp8ScaleShape(rows: number, cols: number): [number, number] {
  return [Math.ceil(rows / FP8_BLOCK), Math.ceil(cols / FP8_BLOCK)];
}

/**
 * Dequantises FP8 E4M3 codes of `rows` rows of a matrix with `cols` columns with its block
 * scales: w[i, j] = fp8(code[i, j]) · scale[i / 128, j / 128], rounded once to float32.
 * `rowStart` is the matrix row of the first code row, for dequantising a slice.
 */
export function dequantFp8Blocks(
  codes: Uint8Array,
  rows: number,
  cols: number,
  scale: Float32Array,
  rowStart = 0,
): Float32Array {
  const sCols = Math.ceil(cols / FP8_BLOCK);
  const out = new Float32Array(rows * cols);
  for (let i = 0; i < rows; i++) {
    const sRow = Math.floor((rowStart + i) / FP8_BLOCK) * sCols;
    const base = i * cols;
    for (let j = 0; j < cols; j++) {
      out[base + j] = FP8_E4M3_TABLE[codes[base + j]] * scale[sRow + Math.floor(j / FP8_BLOCK)];
    }
  }
  return out;
}

/**
 * Finds and checks the block-scale tensor of an FP8 weight: it must exist, be 2-D float, and
 * have shape [ceil(rows/128), ceil(cols/128)].
 */
export function fp8ScaleInfo(ckpt: Checkpoint, weight: TensorInfo): TensorInfo {
  const hfName = weight.name + SCALE_INV_SUFFIX;
  const own = companionScaleName(weight.name);
  const scaleName = ckpt.tensors.has(hfName) || own === null ? hfName : own;
  const s = ckpt.tensors.get(scaleName);
  const where = `${weight.file}: tensor ${weight.name}`;
  if (!s) {
    throw new Error(
      `${where}: FP8 weight has no block-scale tensor ${hfName}${own ? ` or ${own}` : ""}`,
    );
  }
  if (weight.shape.length !== 2) {
    throw new Error(`${where}: FP8 weight must be 2-D, has shape [${weight.shape}]`);
  }
  const [er, ec] = fp8ScaleShape(weight.shape[0], weight.shape[1]);
  if (s.shape.length !== 2 || s.shape[0] !== er || s.shape[1] !== ec) {
    throw new Error(
      `${s.file}: tensor ${scaleName} has shape [${s.shape}], expected [${er}, ${ec}] for ` +
        `${weight.name} [${weight.shape}]`,
    );
  }
  if (!["F32", "BF16", "F16", "F8_E8M0"].includes(s.dtype)) {
    throw new Error(`${s.file}: tensor ${scaleName} has dtype ${s.dtype}, expected a float dtype`);
  }
  return s;
}

/**
 * DeepSeek's own name of the scales of weight `name` (`….weight` → `….scale`: the FP8 block
 * scales and the FP4 group scales of its original checkpoints), or null for another name.
 */
export function companionScaleName(name: string): string | null {
  return name.endsWith(".weight") ? `${name.slice(0, -".weight".length)}.scale` : null;
}

/**
 * Reads a tensor as float32. FP8 E4M3 weights get their `<name>_scale_inv` block scales applied.
 */
export function readF32(ckpt: Checkpoint, name: string): Float32Array {
  const t = ckpt.tensors.get(name);
  if (!t) throw new Error(`${ckpt.dir}: checkpoint has no tensor ${name}`);
  const what = `${t.file}: tensor ${name}`;
  if (t.dtype !== "F8_E4M3") return decodeDtypeToF32(t.dtype, ckpt.read(name), what);
  const s = fp8ScaleInfo(ckpt, t);
  const scale = decodeDtypeToF32(s.dtype, ckpt.read(s.name), `${s.file}: tensor ${s.name}`);
  return dequantFp8Blocks(ckpt.read(name), t.shape[0], t.shape[1], scale);
}

/**
 * Rows first, first + step, … (`rows` of them) of expert `expert` in a tensor that fuses all
 * experts along its first dimension ([E, R, …], gpt-oss), as their bytes in order.
 */
export function readExpertRows(
  ckpt: Checkpoint,
  name: string,
  expert: number,
  first: number,
  step: number,
  rows: number,
): Uint8Array {
  const t = ckpt.tensors.get(name);
  if (!t) throw new Error(`${ckpt.dir}: checkpoint has no tensor ${name}`);
  const [E, R] = t.shape;
  if (t.shape.length < 2 || expert < 0 || expert >= E || first + (rows - 1) * step >= R) {
    throw new Error(
      `${t.file}: tensor ${name} [${t.shape}] has no expert ${expert} rows ${first}+${step}·${rows}`,
    );
  }
  const rowBytes = t.bytes / (E * R);
  const all = new Uint8Array(R * rowBytes);
  ckpt.readRangeInto(name, expert * R * rowBytes, all);
  if (step === 1 && first === 0 && rows === R) return all;
  const out = new Uint8Array(rows * rowBytes);
  for (let r = 0; r < rows; r++) {
    const at = (first + r * step) * rowBytes;
    out.set(all.subarray(at, at + rowBytes), r * rowBytes);
  }
  return out;
}
