/**
 * Widening of any stored weight (plain or compact, docs/FORMAT.md) to float32 from its container
 * bytes: for round-trip tests, the quality report and reference forwards built from a container.
 * Compact formats follow their definitions in engine/quant/*.ts.
 *
 * @module
 */
import { bf16ToNumber } from "./int4.ts";
import { E2M1_VALUES, e8m0ToNumber } from "./mxfp4.ts";
import { decodeDtypeToF32, dequantFp8Blocks } from "../../io/checkpoint_weights.ts";
import type { TensorEntry } from "../../io/container.ts";
import { Q4_BLOCK, VQ3R_DIM, VQ3R_STAGES } from "../../io/format.ts";

const PLAIN_NAMES: Record<string, string> = { f32: "F32", bf16: "BF16", f16: "F16" };

function f32View(b: Uint8Array): Float32Array {
  const copy = b.slice();
  return new Float32Array(copy.buffer, 0, copy.length / 4);
}

/**
 * The float32 values [rows × cols] of a stored tensor from its bytes `data`, its scale bytes and,
 * for vq3r, its codebooks (f32 [3][8][256], the codebooks.bin layout). Throws naming `what` when
 * a needed part is missing.
 */
export function decodeStored(
  entry: TensorEntry,
  data: Uint8Array,
  scale?: Uint8Array,
  codebooks?: Float32Array,
  what = "tensor",
): Float32Array {
  const plain = PLAIN_NAMES[entry.dtype];
  if (plain) return decodeDtypeToF32(plain, data, what);
  if (!scale) throw new Error(`${what}: ${entry.dtype} weights need their scale bytes`);
  const [rows, cols] = entry.shape;
  const out = new Float32Array(rows * cols);
  switch (entry.dtype) {
    case "f8_e4m3":
      return dequantFp8Blocks(data, rows, cols, f32View(scale));
    case "int8row": {
      const s = f32View(scale);
      const q = new Int8Array(data.buffer, data.byteOffset, data.length);
      for (let i = 0; i < rows * cols; i++) out[i] = q[i] * s[Math.floor(i / cols)];
      return out;
    }
    case "mxfp4":
    case "int4g32": {
      const ng = cols / Q4_BLOCK;
      const s16 = entry.dtype === "int4g32"
        ? new Uint16Array(scale.slice().buffer, 0, rows * ng)
        : null;
      for (let r = 0; r < rows; r++) {
        for (let c = 0; c < cols; c++) {
          const i = r * cols + c;
          const nib = (data[i >> 1] >> (4 * (i & 1))) & 15;
          const g = r * ng + Math.floor(c / Q4_BLOCK);
          out[i] = s16
            ? (nib - 8) * bf16ToNumber(s16[g])
            : E2M1_VALUES[nib] * e8m0ToNumber(scale[g]);
        }
      }
      return out;
    }
    case "vq3r": {
      if (!codebooks) throw new Error(`${what}: vq3r weights need their codebooks`);
      const s = f32View(scale);
      const nch = Math.ceil(cols / VQ3R_DIM);
      for (let r = 0; r < rows; r++) {
        for (let c = 0; c < cols; c++) {
          const k = c >> 3, d = c & 7;
          let v = 0;
          for (let st = 0; st < VQ3R_STAGES; st++) {
            const e = data[(r * VQ3R_STAGES + st) * nch + k];
            v += codebooks[(st * VQ3R_DIM + d) * 256 + e];
          }
          out[r * cols + c] = s[r] * v;
        }
      }
      return out;
    }
    default:
      throw new Error(`${what}: cannot decode ${entry.dtype}`);
  }
}
