/**
 * Weight matrices as a checkpoint ships them: a plain tensor (F32, BF16, F16, F8_E4M3 with its
 * block scales), or an INT4 matrix in compressed-tensors' "pack-quantized" form as
 * Kimi-K2-Thinking ships its experts (`<name>_packed` I32 [rows, cols/8], `<name>_scale` BF16
 * [rows, cols/32], `<name>_shape` I32 [2] = [rows, cols]; group 32, symmetric, no zero point;
 * engine/quant/int4.ts has the bit layout), or an MXFP4 matrix as Kimi K3 ships its experts
 * (`<name>_packed` U8 [rows, cols/2], two E2M1 codes a byte, the even element low, and
 * `<name>_scale` U8 [rows, cols/32] E8M0: the container's mxfp4 bytes exactly, see
 * engine/quant/mxfp4.ts), or one expert's slice of gpt-oss's fused MXFP4 tensors
 * (`…experts.gate_up_proj_blocks` U8 [E, 2I, H/32, 16] + `_scales` U8 [E, 2I, H/32], gate and up
 * rows interleaved; `down_proj_blocks` [E, H, I/32, 16] + `_scales`), whose row bytes are also
 * already sluice's mxfp4 layout. Both MXFP4 forms are copied, never re-quantised. Or one expert's
 * rows of the stacked plain tensors Qwen3.5 and Gemma 4 ship (`…experts.gate_up_proj` [E, 2I, H],
 * gate rows then up rows; `down_proj` [E, H, I]; no `.weight` suffix).
 *
 * @module
 */
import type { ExpertMatrix, ModelConfig } from "../io/model_config.ts";
import { dequantizeInt4g32 } from "./quant/int4.ts";
import { dequantizeMxfp4 } from "./quant/mxfp4.ts";
import { modelTypeOf } from "./models/mod.ts";
import { hfExpertName, hfFusedExpertSlice } from "./tensor_names.ts";
import {
  companionScaleName,
  decodeDtypeToF32,
  readExpertRows,
  readF32,
} from "../io/checkpoint_weights.ts";
import type { Checkpoint, TensorInfo } from "../io/safetensors.ts";

/** Dtype label of an INT4 pack-quantized source matrix. */
export const INT4_PACKED = "INT4_PACKED";
/** Dtype label of an MXFP4 packed source matrix. */
export const MXFP4_PACKED = "MXFP4_PACKED";

/** Dtype label of one expert's matrix inside gpt-oss's fused MXFP4 tensors. */
export const MXFP4_FUSED = "MXFP4_FUSED";

/** Where one expert matrix lies inside a fused MXFP4 tensor pair. */
export interface FusedSlice {
  blocks: TensorInfo;
  scales: TensorInfo;
  /** The bias tensor [E, rows of the fused tensor] (BF16 or F32). */
  bias: TensorInfo;
  expert: number;
  /** Fused row of the matrix's row r: first + r × step (gate 0, 2, …; up 1, 3, …; down r). */
  first: number;
  step: number;
}

/** One 2-D weight matrix of a checkpoint. */
export interface SourceMatrix {
  /** The plain tensor name (`….weight`), also for packed matrices. */
  name: string;
  /** What the matrix is, for errors: `layer 1 expert 3 gate`. */
  what: string;
  file: string;
  rows: number;
  cols: number;
  /** The checkpoint dtype of a plain tensor, or {@link INT4_PACKED} / {@link MXFP4_PACKED} / {@link MXFP4_FUSED}. */
  dtype: string;
  plain?: TensorInfo;
  packed?: { packed: TensorInfo; scale: TensorInfo };
  fused?: FusedSlice;
  /** One expert's rows first.. of a plain tensor stacking all experts (Qwen3.5, Gemma 4). */
  stacked?: { tensor: TensorInfo; expert: number; first: number };
}

/**
 * Whether `src` stored as `dtype` keeps the bytes the checkpoint ships: Kimi's packed INT4 as
 * int4g32, K3's packed and gpt-oss's fused MXFP4 as mxfp4 (pack copies those, never re-quantises).
 */
export function keepsShippedBytes(src: SourceMatrix, dtype: string): boolean {
  if (dtype === "int4g32") return src.dtype === INT4_PACKED;
  return dtype === "mxfp4" && (src.dtype === MXFP4_PACKED || src.dtype === MXFP4_FUSED);
}

function readShapeTensor(ckpt: Checkpoint, t: TensorInfo): number[] {
  if (t.dtype !== "I32" && t.dtype !== "I64") {
    throw new Error(`${t.file}: tensor ${t.name} has dtype ${t.dtype}, expected I32`);
  }
  const raw = ckpt.read(t.name).slice();
  return t.dtype === "I32"
    ? [...new Int32Array(raw.buffer)]
    : [...new BigInt64Array(raw.buffer)].map(Number);
}

/**
 * Finds the matrix `name` (a `….weight` name): the plain tensor when the checkpoint has it, else
 * its INT4 `weight_packed` / `weight_scale` / `weight_shape` triple or its MXFP4 (U8)
 * `weight_packed` / `weight_scale` pair, checked for dtypes and shapes. Throws naming `what` when
 * none exists.
 */
export function findMatrix(ckpt: Checkpoint, name: string, what: string): SourceMatrix {
  const plain = ckpt.tensors.get(name);
  if (plain) {
    if (plain.shape.length !== 2) {
      throw new Error(
        `${plain.file}: tensor ${plain.name} has shape [${plain.shape}], expected 2-D`,
      );
    }
    const own = companionScaleName(name);
    // DeepSeek-V4's FP4 experts: e2m1 pairs in I8 with E8M0 scales per 32 inputs in `.scale`.
    if (plain.dtype === "I8" && own !== null) {
      return mxfp4Source(name, what, plain, ckpt.tensors.get(own), `${plain.file}: tensor ${name}`);
    }
    const [rows, cols] = plain.shape;
    return { name, what, file: plain.file, rows, cols, dtype: plain.dtype, plain };
  }
  const packed = ckpt.tensors.get(`${name}_packed`);
  if (!packed) {
    throw new Error(`${ckpt.dir}: ${what} needs tensor ${name}, which the checkpoint lacks`);
  }
  const at = `${packed.file}: tensor ${packed.name}`;
  const scale = ckpt.tensors.get(`${name}_scale`);
  if (packed.dtype === "U8") return mxfp4Source(name, what, packed, scale, at);
  const shapeT = ckpt.tensors.get(`${name}_shape`);
  if (!scale || !shapeT) {
    throw new Error(`${at}: an INT4 packed weight needs ${name}_scale and ${name}_shape`);
  }
  const shape = readShapeTensor(ckpt, shapeT);
  if (shape.length !== 2 || shape[1] % 32 !== 0) {
    throw new Error(
      `${at}: weight_shape [${shape}] is not [rows, cols] with cols a multiple of 32`,
    );
  }
  const [rows, cols] = shape;
  if (packed.dtype !== "I32" || String(packed.shape) !== String([rows, cols / 8])) {
    throw new Error(
      `${at}: expected I32 [${rows}, ${cols / 8}], got ${packed.dtype} [${packed.shape}]`,
    );
  }
  if (scale.dtype !== "BF16" || String(scale.shape) !== String([rows, cols / 32])) {
    throw new Error(
      `${scale.file}: tensor ${scale.name}: expected BF16 [${rows}, ${cols / 32}] (group 32), ` +
        `got ${scale.dtype} [${scale.shape}]`,
    );
  }
  return {
    name,
    what,
    file: packed.file,
    rows,
    cols,
    dtype: INT4_PACKED,
    packed: { packed, scale },
  };
}

/** An MXFP4 `weight_packed` U8 [rows, cols/2] with its `weight_scale` U8 [rows, cols/32]. */
function mxfp4Source(
  name: string,
  what: string,
  packed: TensorInfo,
  scale: TensorInfo | undefined,
  at: string,
): SourceMatrix {
  if (!scale) throw new Error(`${at}: an MXFP4 packed weight needs its scale tensor`);
  if (packed.shape.length !== 2 || (packed.shape[1] * 2) % 32 !== 0) {
    throw new Error(
      `${at}: expected U8 [rows, cols/2] with cols a multiple of 32, got [${packed.shape}]`,
    );
  }
  const [rows, cols] = [packed.shape[0], packed.shape[1] * 2];
  const e8m0 = scale.dtype === "U8" || scale.dtype === "F8_E8M0";
  if (!e8m0 || String(scale.shape) !== String([rows, cols / 32])) {
    throw new Error(
      `${scale.file}: tensor ${scale.name}: expected U8 or F8_E8M0 [${rows}, ${cols / 32}] ` +
        `(E8M0, group 32), got ${scale.dtype} [${scale.shape}]`,
    );
  }
  return {
    name,
    what,
    file: packed.file,
    rows,
    cols,
    dtype: MXFP4_PACKED,
    packed: { packed, scale },
  };
}

/**
 * The raw bytes of a packed matrix and of its scales, as the checkpoint ships them: the
 * int4g32 (INT4) or mxfp4 (MXFP4) container form.
 */
export function readPacked(
  ckpt: Checkpoint,
  src: SourceMatrix,
): { data: Uint8Array; scale: Uint8Array } {
  if (!src.packed) throw new Error(`${src.file}: ${src.name} is not a packed matrix`);
  const scale = ckpt.read(src.packed.scale.name);
  if (src.dtype === MXFP4_PACKED) checkE8m0(scale, src, src.packed.scale);
  return { data: ckpt.read(src.packed.packed.name), scale };
}

/**
 * The end of every refusal of NaN or infinite checkpoint weights: callers recognise it (also
 * across worker boundaries, where error classes are lost) to say that a rerun cannot help.
 */
export const NAN_WEIGHTS_REFUSED = "sluice refuses weights that would make every output NaN";

/**
 * Refuses MXFP4 scale bytes (E8M0, one per 32 columns of a row) holding 0xFF, which the OCP MX
 * spec defines as NaN: that block, and through it every output, would be NaN. `t` is the
 * checkpoint tensor the bytes come from.
 */
function checkE8m0(scale: Uint8Array, src: SourceMatrix, t: TensorInfo): void {
  const i = scale.indexOf(0xff);
  if (i < 0) return;
  const perRow = src.cols / 32, row = Math.floor(i / perRow), block = i % perRow;
  throw new Error(
    `${t.file}: tensor ${t.name} (${src.what}): row ${row} block ${block} (columns ` +
      `${block * 32}–${block * 32 + 31}) has E8M0 scale 0xFF, which the OCP MX spec defines as ` +
      `NaN; ${NAN_WEIGHTS_REFUSED}`,
  );
}

/**
 * Matrix `m` of expert `e` of MoE layer `l`, wherever the checkpoint keeps it: one expert's
 * slice of fused MXFP4 tensors (gpt-oss) or its own tensor or packed pair.
 */
export function findExpertMatrix(
  ckpt: Checkpoint,
  cfg: ModelConfig,
  l: number,
  e: number,
  m: ExpertMatrix,
): SourceMatrix {
  const slice = hfFusedExpertSlice(cfg, l, m);
  if (!slice) return findMatrix(ckpt, hfExpertName(cfg, l, e, m), `layer ${l} expert ${e} ${m}`);
  return modelTypeOf(cfg).naming.stacked
    ? findStacked(ckpt, cfg, l, e, m, slice.base, slice.first)
    : findFusedMxfp4(ckpt, cfg, l, e, m);
}

/**
 * Matrix `m` of expert `e` of MoE layer `l` in the stacked plain tensors (Qwen3.5, Gemma 4)
 * (`experts.gate_up_proj` [E, 2I, H], `experts.down_proj` [E, H, I]), whose rows from `first`
 * on are the matrix; shape checked against the config.
 */
function findStacked(
  ckpt: Checkpoint,
  cfg: ModelConfig,
  l: number,
  e: number,
  m: ExpertMatrix,
  base: string,
  first: number,
): SourceMatrix {
  const E = cfg.moe!.numExperts, I = cfg.moe!.expertIntermediate, H = cfg.hiddenSize;
  const t = fusedTensor(
    ckpt,
    base,
    ["F32", "BF16", "F16"],
    m === "down" ? [E, H, I] : [E, 2 * I, H],
  );
  const [rows, cols] = m === "down" ? [H, I] : [I, H];
  return {
    name: `${base}[${e}].${m}`,
    what: `layer ${l} expert ${e} ${m}`,
    file: t.file,
    rows,
    cols,
    dtype: t.dtype,
    stacked: { tensor: t, expert: e, first },
  };
}

function fusedTensor(ckpt: Checkpoint, name: string, dtypes: string[], shape: number[]) {
  const t = ckpt.tensors.get(name);
  if (!t) throw new Error(`${ckpt.dir}: fused experts need tensor ${name}, which is missing`);
  if (!dtypes.includes(t.dtype) || String(t.shape) !== String(shape)) {
    throw new Error(
      `${t.file}: tensor ${name} is ${t.dtype} [${t.shape}], expected ${
        dtypes.join(" or ")
      } [${shape}]`,
    );
  }
  return t;
}

/**
 * Matrix `m` of expert `e` of MoE layer `l` in gpt-oss's fused MXFP4 tensors, with their shapes
 * and dtypes checked against the config.
 */
export function findFusedMxfp4(
  ckpt: Checkpoint,
  cfg: ModelConfig,
  l: number,
  e: number,
  m: ExpertMatrix,
): SourceMatrix {
  const slice = hfFusedExpertSlice(cfg, l, m);
  if (!slice) throw new Error(`${cfg.modelType}: layer ${l} has no fused experts`);
  const E = cfg.moe!.numExperts, I = cfg.moe!.expertIntermediate, H = cfg.hiddenSize;
  const base = slice.base;
  const [fusedRows, cols] = m === "down" ? [H, I] : [2 * I, H];
  if (cols % 32) {
    throw new Error(`${ckpt.dir}: ${base}: MXFP4 needs a multiple of 32 columns, has ${cols}`);
  }
  const blocks = fusedTensor(ckpt, `${base}_blocks`, ["U8"], [E, fusedRows, cols / 32, 16]);
  const scales = fusedTensor(ckpt, `${base}_scales`, ["U8"], [E, fusedRows, cols / 32]);
  const bias = fusedTensor(ckpt, `${base}_bias`, ["BF16", "F32", "F16"], [E, fusedRows]);
  return {
    name: `${base}[${e}].${m}`,
    what: `layer ${l} expert ${e} ${m}`,
    file: blocks.file,
    rows: m === "down" ? H : I,
    cols,
    dtype: MXFP4_FUSED,
    fused: { blocks, scales, bias, expert: e, first: slice.first, step: slice.step },
  };
}

function fusedRows(ckpt: Checkpoint, t: TensorInfo, src: SourceMatrix): Uint8Array {
  const f = src.fused!;
  return readExpertRows(ckpt, t.name, f.expert, f.first, f.step, src.rows);
}

/** One fused MXFP4 expert matrix as sluice mxfp4 bytes: its rows' blocks and E8M0 scales as shipped. */
export function readFusedMxfp4(
  ckpt: Checkpoint,
  src: SourceMatrix,
): { data: Uint8Array; scale: Uint8Array } {
  const f = src.fused;
  if (!f) throw new Error(`${src.file}: ${src.name} is not a fused MXFP4 matrix`);
  const scale = fusedRows(ckpt, f.scales, src);
  checkE8m0(scale, src, f.scales);
  return { data: fusedRows(ckpt, f.blocks, src), scale };
}

/** The bias vector of one fused expert matrix, as float32 (bf16 widens exactly). */
export function readFusedBias(ckpt: Checkpoint, src: SourceMatrix): Float32Array {
  const f = src.fused;
  if (!f) throw new Error(`${src.file}: ${src.name} is not a fused MXFP4 matrix`);
  return decodeDtypeToF32(
    f.bias.dtype,
    fusedRows(ckpt, f.bias, src),
    `${f.bias.file}: tensor ${f.bias.name}`,
  );
}

/** The matrix as float32 [rows × cols] (FP8 with its block scales, INT4 as q · scale). */
export function readMatrixF32(ckpt: Checkpoint, src: SourceMatrix): Float32Array {
  if (src.plain) return readF32(ckpt, src.name);
  const st = src.stacked;
  if (st) {
    const bytes = readExpertRows(ckpt, st.tensor.name, st.expert, st.first, 1, src.rows);
    return decodeDtypeToF32(st.tensor.dtype, bytes, `${st.tensor.file}: tensor ${src.name}`);
  }
  if (src.fused) {
    const { data, scale } = readFusedMxfp4(ckpt, src);
    return dequantizeMxfp4({ rows: src.rows, cols: src.cols, blocks: data, scales: scale });
  }
  const { data, scale } = readPacked(ckpt, src);
  if (src.dtype === MXFP4_PACKED) {
    return dequantizeMxfp4({ rows: src.rows, cols: src.cols, blocks: data, scales: scale });
  }
  return dequantizeInt4g32({
    rows: src.rows,
    cols: src.cols,
    packed: new Int32Array(data.slice().buffer),
    scales: new Uint16Array(scale.slice().buffer),
  });
}
