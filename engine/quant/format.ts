/**
 * What one weight format is, in the way ggml's type_traits rows describe a type: its id, how pack
 * encodes float32 weights into it, how its bytes decode back to float32 (for references, the
 * quality report and GGUF export), which kernel multiplies with it and what input that kernel
 * reads. One file per format in engine/quant/ exports its entry; engine/quant/mod.ts lists them.
 * The byte layout (bytes of a matrix, its scale tensor, the record header's format id) is the
 * container format's, in io/format.ts's `FORMAT_LAYOUTS`.
 *
 * @module
 */
import { type ExpertFormat, Q4_BLOCK } from "../../io/format.ts";

/**
 * What form a format's kernel reads its input vector in: f32 as is, the Q8 copy of
 * quantize_act_q8 (mxfp4, int4g32), or the lookup table of vq3r_lut / vq4p_lut (vq3r, vq4p).
 */
export type InputForm = "f32" | "q8" | "lut";

/** A matrix encoded in a stored format: its bytes and, for scaled formats, its scale bytes. */
export interface EncodedMatrix {
  data: Uint8Array;
  scale: Uint8Array | null;
}

/**
 * The float32 values [rows × cols] of stored bytes `data` with their `scale` bytes and, for
 * vq3r, the codebooks (f32 [3][8][256], the codebooks.bin layout). Throws naming `what` when a
 * needed part is missing.
 */
export type Decode = (
  data: Uint8Array,
  scale: Uint8Array | undefined,
  rows: number,
  cols: number,
  what: string,
  codebooks?: Float32Array,
) => Float32Array;

/** One weight format. */
export interface WeightFormat {
  /** The dtype a container stores it as (a tensor entry's `dtype`). */
  readonly id: ExpertFormat;
  /** Its name as a `pack --experts` choice (and in quant-report), when it is one. */
  readonly option?: string;
  /** Whether it approximates float32 weights (quant-report measures the lossy ones). */
  readonly lossy: boolean;
  /** The form its kernel reads the input vector in. */
  readonly input: InputForm;
  /** The single-vector kernel, and whether it takes the scale pointer after the weights. */
  readonly gemv: { kernel: string; scaled: boolean };
  /**
   * The batched kernel that reads each weight once for a whole batch, when there is one: (W, X, Y,
   * rows, cols, nb), with the scale pointer after W when `gemv.scaled`.
   */
  readonly gemm?: string;
  /**
   * "lut" formats: the kernel that builds the table from the codebooks and an input vector
   * (codebooks, x, table, cols), and the table's bytes for `cols` (padded) columns.
   */
  readonly table?: { readonly kernel: string; bytes(cols: number): number };
  /**
   * A single-vector kernel that multiplies f32 activations exactly, for weights that are the model
   * as shipped (a TensorRef with `exact`: gpt-oss's and K3's MXFP4, Kimi-K2's INT4), when the
   * format has one. io/format.ts's `EXACT_INPUT_FORMATS` lists the formats that have one.
   */
  readonly exactGemv?: { kernel: string; scaled: boolean };
  /**
   * The batched path of those `exact` weights: `kernel` (W, S, X, Y, D, rows, cols, nb, r0, r1)
   * decodes them exactly as the plain format `as` into scratch D ([rows, cols] of `as`), a tile of
   * rows at a time, and multiplies the batch with that format's gemm; every column equals
   * `exactGemv` bit for bit, so batching still never changes output. Batches smaller than
   * `minBatch` run `exactGemv` per vector instead (the decode costs more than it saves there).
   */
  readonly exactGemm?: { kernel: string; as: string; minBatch: number };
  /**
   * Encodes float32 `w` [rows, cols] (pack). vq3r needs the trained `codebooks` ([3][256][8],
   * engine/quant/vq3r.ts). Throws naming `what` for a matrix the format cannot hold.
   */
  encode(
    w: Float32Array,
    rows: number,
    cols: number,
    what: string,
    codebooks?: Float32Array,
  ): EncodedMatrix;
  /** Decodes stored bytes to float32 (references, quant-report, GGUF export). */
  decode: Decode;
}

/** What every scaled compact format's entry has besides its encoder and decoder. */
export function compactFormat(
  id: ExpertFormat,
  option: string,
  input: InputForm,
  kernel: string,
): Pick<WeightFormat, "id" | "option" | "lossy" | "input" | "gemv"> {
  return { id, option, lossy: true, input, gemv: { kernel, scaled: true } };
}

/** A quantiser's result as stored bytes: its `data` array, and its `scales` as the scale bytes. */
export function stored<K extends string>(
  m: Record<K, ArrayBufferView> & { scales: ArrayBufferView },
  data: K,
): EncodedMatrix {
  return { data: bytesOf(m[data]), scale: bytesOf(m.scales) };
}

/** A byte view of a typed array. */
export function bytesOf(a: ArrayBufferView): Uint8Array {
  return new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
}

/** A float32 copy of scale bytes (the stored bytes may be unaligned). */
export function f32View(b: Uint8Array): Float32Array {
  const copy = b.slice();
  return new Float32Array(copy.buffer, 0, copy.length / 4);
}

/** The scale bytes of a scaled format, or an error naming `what`. */
export function needScale(scale: Uint8Array | undefined, id: string, what: string): Uint8Array {
  if (!scale) throw new Error(`${what}: ${id} weights need their scale bytes`);
  return scale;
}

/**
 * The float32 values of a 4-bit format with one scale per 32-column group (mxfp4, int4g32):
 * element i is nibble i of `data` (low nibble first), valued by `value(nibble, group)`.
 */
export function decodeNibbles(
  data: Uint8Array,
  rows: number,
  cols: number,
  value: (nibble: number, group: number) => number,
): Float32Array {
  const ng = cols / Q4_BLOCK;
  const out = new Float32Array(rows * cols);
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < cols; c++) {
      const i = r * cols + c;
      const nib = (data[i >> 1] >> (4 * (i & 1))) & 15;
      out[i] = value(nib, r * ng + Math.floor(c / Q4_BLOCK));
    }
  }
  return out;
}
