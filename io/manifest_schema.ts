/**
 * The shape of a `.sluice` container's `manifest.json`: the format constants, the file names it
 * refers to, and the types of every section (trunk regions and tensor entries, expert banks,
 * codebook references, pack settings). docs/FORMAT.md is the normative text; io/manifest.ts
 * validates an untrusted manifest against these types.
 *
 * @module
 */

import type { ExpertMatrix, GlobalTensor, ModelConfig } from "./model_config.ts";
import type { ExpertFormat, StoredDtype } from "./format.ts";

/** Container format name in the manifest. */
export const CONTAINER_FORMAT = "sluice";
/** Container format version this reader and the packer implement. */
export const CONTAINER_VERSION = 1;
/** The trunk file's name. */
export const TRUNK_FILE = "trunk.bin";
/** The VQ3R codebook file's name. */
export const CODEBOOKS_FILE = "codebooks.bin";

/** Name of the expert bank file of a layer. */
export function expertBankFile(layer: number): string {
  return `experts-L${layer}.bin`;
}

/**
 * One stored tensor. Block- or row-scaled formats (f8_e4m3, mxfp4, int4g32, int8row, vq3r,
 * vq4p) carry their scale in `scale`; vq3r and vq4p also their zero-padded column count in
 * `paddedCols`.
 */
export interface TensorEntry {
  dtype: StoredDtype;
  shape: number[];
  offset: number;
  bytes: number;
  scale?: TensorEntry;
  /** vq3r and vq4p only: cols rounded up to a multiple of 8; the kernel runs on this many columns. */
  paddedCols?: number;
}

/** Where one codebook set (vq3r f32 [3][8][256], vq4p f32 [4][8][64]) lies in codebooks.bin. */
export interface CodebookRef {
  offset: number;
  bytes: number;
  crc32: number;
}

/** A byte range of a file with the CRC-32 of its bytes (padding included). */
export interface Region {
  offset: number;
  bytes: number;
  crc32: number;
}

/** One layer's trunk tensors: a 4 KiB-aligned run of trunk.bin. */
export interface LayerRun extends Region {
  /** Canonical layer tensor name → entry; offsets relative to the run start. */
  tensors: Record<string, TensorEntry>;
}

/** The routed experts of one MoE layer: `file` holds record e at e × stride. */
export interface ExpertBank {
  layer: number;
  file: string;
  count: number;
  /** Bytes per record, a multiple of 4096. */
  stride: number;
  /** Format of the expert matrices (the record header's format id). */
  format: ExpertFormat;
  /** Offsets relative to the record start; the same in every record of the bank. */
  matrices: Record<ExpertMatrix, TensorEntry>;
  /**
   * Matrices kept in a plain dtype although `format` is compact, with the reason (mxfp4 and
   * int4g32 need cols a multiple of 32).
   */
  fallback?: Partial<Record<ExpertMatrix, string>>;
  /**
   * "f32": the bank's matrices in its format (mxfp4, int4g32) multiply f32 activations exactly,
   * because pack copied them as the checkpoint shipped them (gpt-oss's and Kimi K3's MXFP4,
   * Kimi-K2's INT4); absent: the Q8 copy (weights quantised at pack time anyway). Containers
   * written before it existed say `mxfp4Activations: "f32"` on mxfp4 banks, read as this.
   */
  activations?: "f32";
  /** gpt-oss: each matrix's f32 bias vector [rows], after the matrices, inside the payload. */
  biases?: Record<ExpertMatrix, TensorEntry>;
  /** vq3r, vq4p: each such matrix's codebooks in codebooks.bin. */
  codebooks?: Partial<Record<ExpertMatrix, CodebookRef>>;
}

/** How the weights were quantised at pack time (informational). */
export interface PackSettings {
  convert: "f32" | "bf16" | null;
  /** The `--experts` format asked for, or null when experts kept their checkpoint dtype. */
  experts: ExpertFormat | null;
  /** "int8row" when the trunk matmul weights were quantised, else null. */
  trunk: "int8row" | null;
}

/** The parsed `manifest.json`. */
export interface Manifest {
  format: typeof CONTAINER_FORMAT;
  version: typeof CONTAINER_VERSION;
  config: ModelConfig;
  source: { config: unknown; generation_config?: unknown; fingerprint: string };
  trunk: {
    file: typeof TRUNK_FILE;
    bytes: number;
    globals: { region: Region; tensors: Partial<Record<GlobalTensor, TensorEntry>> };
    layers: LayerRun[];
  };
  /** Index = layer; null for dense layers. */
  experts: (ExpertBank | null)[];
  /**
   * The multi-token-prediction layers numLayers.. (present exactly when `config.mtp` is): their
   * trunk runs (in trunk.bin, after the main layers') and expert banks, index j = layer
   * numLayers + j. The main pass never runs them; `--spec mtp` drafts with them.
   */
  mtp?: { layers: LayerRun[]; experts: (ExpertBank | null)[] };
  /** Present exactly when some expert matrix is vq3r or vq4p. */
  codebooks?: { file: typeof CODEBOOKS_FILE; bytes: number };
  /** Absent in containers packed before quantisation existed. */
  pack?: PackSettings;
  tokenizer: { files: string[] };
}
