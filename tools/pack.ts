/**
 * `deno task pack <hf-dir> <out>.sluice [--convert f32|bf16] [--experts FORMAT] [--trunk int8]
 * [--force]`: packs a Hugging Face checkpoint into a sluice container (docs/FORMAT.md). Streams
 * tensor by tensor with bounded buffers (an expert matrix at a time when quantising), trains the
 * VQ3R codebooks of each MoE layer when asked, writes into `<out>.tmp/` and renames it into place
 * at the end, and resumes an interrupted pack layer by layer from the journal kept in the
 * temporary directory.
 *
 * @module
 */

import { replaceDir } from "./replace_dir.ts";
import {
  chmodSync,
  closeSync,
  copyFileSync,
  existsSync,
  fdatasyncSync,
  fstatSync,
  ftruncateSync,
  mkdirSync,
  openSync,
  readFileSync,
  readSync,
  renameSync,
  rmSync,
  statSync,
  writeFileSync,
  writeSync,
} from "node:fs";
import { basename, join } from "node:path";
import { parseArgs } from "node:util";
import { loadModelConfig } from "../engine/config.ts";
import {
  EXPERT_MATRICES,
  type ExpertMatrix,
  type GlobalTensor,
  type LayerTensor,
  type ModelConfig,
} from "../engine/model_config.ts";
import { hfExpertName, hfGlobalName, hfLayerName, layerTensorsOf } from "../engine/tensor_names.ts";
import { trainVq3r, vq3rKernelCodebooks } from "../engine/quant/vq3r.ts";
import { fp8ScaleInfo, readF32 } from "../io/checkpoint_weights.ts";
import {
  type CodebookRef,
  CODEBOOKS_FILE,
  CONTAINER_FORMAT,
  CONTAINER_VERSION,
  type ExpertBank,
  expertBankFile,
  type LayerRun,
  type Manifest,
  type PackSettings,
  type Region,
  type TensorEntry,
  TRUNK_FILE,
} from "../io/container.ts";
import { crc32 } from "../io/crc32.ts";
import {
  alignUp,
  BLOCK_ALIGN,
  encodeRecordHeader,
  EXPERT_FORMAT_IDS,
  type ExpertFormat,
  isCompactDtype,
  Q4_BLOCK,
  RECORD_HEADER_BYTES,
  type RecordMatrix,
  scaleSpecOf,
  storedBytes,
  type StoredDtype,
  TENSOR_ALIGN,
  VQ3R_CODEBOOK_BYTES,
  VQ3R_DIM,
} from "../io/format.ts";
import { type Checkpoint, openCheckpoint, type TensorInfo } from "../io/safetensors.ts";
import { encodeMatrix, KEPT_DTYPE, scaleBytesF32, streamTensor } from "./pack_encode.ts";
import {
  findMatrix,
  INT4_PACKED,
  readMatrixF32,
  readPackedInt4,
  type SourceMatrix,
} from "./pack_source.ts";
import { formatBytes, Progress, type ProgressMode } from "./progress.ts";

/** `--experts` choices and the container format each one stores. */
export const EXPERT_OPTIONS = {
  mxfp4: "mxfp4",
  int4: "int4g32",
  vq3r: "vq3r",
  int8: "int8row",
  fp8: "f8_e4m3",
  bf16: "bf16",
  f32: "f32",
} as const satisfies Record<string, ExpertFormat>;

/** An `--experts` choice. */
export type ExpertsOption = keyof typeof EXPERT_OPTIONS;

/** VQ3R codebook training settings of a pack. */
export interface Vq3rPackOptions {
  /** k-means seed (default 1). */
  seed?: number;
  /** 8-weight vectors sampled per (layer, matrix kind) (default 32768). */
  sampleSize?: number;
  /** Lloyd iterations per stage (default 12). */
  iterations?: number;
  /** Experts of a layer whose matrices are sampled, evenly spaced (default 16). */
  trainExperts?: number;
}

/** Options of {@link packCheckpoint}. */
export interface PackOptions {
  /** Dequantise / convert every weight matrix to this dtype (norms and routers are f32 anyway). */
  convert?: "f32" | "bf16";
  /** Store the routed experts in this format, quantised from the checkpoint's values. */
  experts?: ExpertsOption;
  /** "int8": per-row int8 for the layers' 2-D matmul weights (not embeddings, norms, routers). */
  trunk?: "int8";
  /** VQ3R training settings (with `experts: "vq3r"`). */
  vq3r?: Vq3rPackOptions;
  /** Replace an existing output. */
  force?: boolean;
  /** Progress display (default "auto"). */
  progress?: ProgressMode;
  /** Largest streaming buffer for one tensor (default 64 MiB). */
  chunkBytes?: number;
  /** Test hook: fail on purpose right after layer k is written and journaled. */
  stopAfterLayer?: number;
  /** Informational lines (default: stderr). */
  log?: (line: string) => void;
}

/** What {@link packCheckpoint} did. */
export interface PackResult {
  out: string;
  manifest: Manifest;
  /** Layers written by this run. */
  layersPacked: number[];
  /** Layers kept from an interrupted earlier run. */
  layersResumed: number[];
  /** Bytes of trunk.bin plus all expert banks. */
  containerBytes: number;
  seconds: number;
}

/** Files copied from the checkpoint when present; the first six are listed as tokenizer files. */
const TOKENIZER_FILES = [
  "tokenizer.json",
  "tokenizer.model",
  "tiktoken.model",
  "tokenizer_config.json",
  "special_tokens_map.json",
  "chat_template.jinja",
];
const CONFIG_FILES = ["config.json", "generation_config.json"];
const JOURNAL = "journal.json";

/** A tensor to write: where it comes from and its entry (offsets relative to its region). */
interface Placed {
  src: TensorInfo;
  entry: TensorEntry;
}

/** The journal of a partial pack: what source, what options, which layers are done. */
interface Journal {
  fingerprint: string;
  convert: string | null;
  /** Every option that changes the bytes written, as JSON. */
  options: string;
  globals: Region | null;
  layers: Record<string, Region>;
  /** CRC-32 of each VQ3R codebook set written, per layer and matrix kind. */
  codebooks: Record<string, Partial<Record<ExpertMatrix, number>>>;
}

/** Layer tensors `--trunk int8` leaves alone: MLA's wkv_b is widened to f32 at load time. */
const TRUNK_INT8_EXCLUDED: ReadonlySet<LayerTensor> = new Set(["router", "wkv_b"]);

function storedDtype(
  src: TensorInfo,
  role: "vector" | "router" | "weight",
  convert: PackOptions["convert"],
): StoredDtype {
  const kept = KEPT_DTYPE[src.dtype];
  if (!kept) {
    throw new Error(
      `${src.file}: tensor ${src.name} has dtype ${src.dtype}, which sluice cannot store`,
    );
  }
  if (role !== "weight") return "f32";
  return convert ?? kept;
}

/** The entry of a tensor of `shape` stored as `dtype`, with its scale entry when it has one. */
function entryOf(dtype: StoredDtype, shape: number[], what: string): TensorEntry {
  const bytes = storedBytes(dtype, shape);
  if (Number.isNaN(bytes)) throw new Error(`${what}: ${dtype} cannot hold shape [${shape}]`);
  const e: TensorEntry = { dtype, shape: [...shape], offset: 0, bytes };
  const spec = scaleSpecOf(dtype, shape);
  if (spec) {
    e.scale = {
      dtype: spec.dtype,
      shape: spec.shape,
      offset: 0,
      bytes: storedBytes(spec.dtype, spec.shape),
    };
  }
  if (dtype === "vq3r") e.paddedCols = Math.ceil(shape[1] / VQ3R_DIM) * VQ3R_DIM;
  return e;
}

/** Makes the entry of `src` stored as `dtype`; an FP8 tensor kept as FP8 must have its scales. */
function entryFor(ckpt: Checkpoint, src: TensorInfo, dtype: StoredDtype): TensorEntry {
  if (dtype === "f8_e4m3" && src.dtype === "F8_E4M3") fp8ScaleInfo(ckpt, src);
  return entryOf(dtype, src.shape, `${src.file}: tensor ${src.name}`);
}

/** Assigns 64-byte aligned offsets from `start`, each scale right after its tensor; returns the end. */
function place(items: Placed[], start: number): number {
  let at = start;
  for (const { entry } of items) {
    entry.offset = alignUp(at, TENSOR_ALIGN);
    at = entry.offset + entry.bytes;
    if (entry.scale) {
      entry.scale.offset = alignUp(at, TENSOR_ALIGN);
      at = entry.scale.offset + entry.scale.bytes;
    }
  }
  return at;
}

function lookup(ckpt: Checkpoint, name: string, what: string): TensorInfo {
  const t = ckpt.tensors.get(name);
  if (!t) throw new Error(`${ckpt.dir}: ${what} needs tensor ${name}, which the checkpoint lacks`);
  return t;
}

function checkShape(t: TensorInfo, want: number[]): void {
  if (String(t.shape) !== String(want)) {
    throw new Error(`${t.file}: tensor ${t.name} has shape [${t.shape}], expected [${want}]`);
  }
}

/** The full container layout, computed before any byte is written. */
interface Plan {
  globals: { items: Map<GlobalTensor, Placed>; region: { offset: number; bytes: number } };
  layers: { items: Map<LayerTensor, Placed>; offset: number; bytes: number }[];
  banks: (BankPlan | null)[];
  trunkBytes: number;
  /** Size of codebooks.bin (0 when nothing is vq3r). */
  codebooksBytes: number;
}

/** One MoE layer's bank: sources, layout, and where its VQ3R codebooks go. */
interface BankPlan {
  experts: Map<ExpertMatrix, SourceMatrix>[];
  matrices: Record<ExpertMatrix, TensorEntry>;
  stride: number;
  format: ExpertFormat;
  fallback: Partial<Record<ExpertMatrix, string>>;
  /** Offset in codebooks.bin of each vq3r matrix kind's codebooks. */
  codebookOffsets: Partial<Record<ExpertMatrix, number>>;
}

function planLayout(cfg: ModelConfig, ckpt: Checkpoint, opts: PackOptions): Plan {
  const convert = opts.convert;
  const gItems = new Map<GlobalTensor, Placed>();
  for (const g of ["embed", "final_norm", "lm_head"] as GlobalTensor[]) {
    const name = hfGlobalName(cfg, g);
    if (name === null) continue;
    const src = lookup(ckpt, name, g);
    checkShape(src, g === "final_norm" ? [cfg.hiddenSize] : [cfg.vocabSize, cfg.hiddenSize]);
    gItems.set(g, {
      src,
      entry: entryFor(
        ckpt,
        src,
        storedDtype(src, g === "final_norm" ? "vector" : "weight", convert),
      ),
    });
  }
  const gEnd = place([...gItems.values()], 0);
  let cursor = alignUp(gEnd, BLOCK_ALIGN);
  const layers: Plan["layers"] = [];
  const banks: Plan["banks"] = [];
  for (let l = 0; l < cfg.numLayers; l++) {
    const items = new Map<LayerTensor, Placed>();
    for (const t of layerTensorsOf(cfg, l)) {
      const src = lookup(ckpt, hfLayerName(cfg, l, t)!, `layer ${l} ${t}`);
      const role = t === "router" ? "router" : src.shape.length === 1 ? "vector" : "weight";
      if (role === "weight" && src.shape.length !== 2) {
        throw new Error(`${src.file}: tensor ${src.name} has shape [${src.shape}], expected 2-D`);
      }
      let dtype = storedDtype(src, role, convert);
      if (opts.trunk === "int8" && role === "weight" && !TRUNK_INT8_EXCLUDED.has(t)) {
        dtype = "int8row";
      }
      items.set(t, { src, entry: entryFor(ckpt, src, dtype) });
    }
    const bytes = alignUp(Math.max(place([...items.values()], 0), 1), BLOCK_ALIGN);
    layers.push({ items, offset: cursor, bytes });
    cursor += bytes;
    banks.push(cfg.layerKinds[l] === "moe" ? planBank(cfg, ckpt, l, opts) : null);
  }
  let codebooksBytes = 0;
  for (const b of banks) {
    for (const m of EXPERT_MATRICES) {
      if (b?.matrices[m].dtype !== "vq3r") continue;
      b.codebookOffsets[m] = codebooksBytes;
      codebooksBytes += VQ3R_CODEBOOK_BYTES;
    }
  }
  return {
    globals: {
      items: gItems,
      region: { offset: 0, bytes: alignUp(Math.max(gEnd, 1), BLOCK_ALIGN) },
    },
    layers,
    banks,
    trunkBytes: cursor,
    codebooksBytes,
  };
}

/**
 * The dtype an expert matrix is stored in, and why it falls back to a plain dtype when the
 * requested format cannot hold it (mxfp4 and int4g32 need cols a multiple of 32).
 */
function expertDtype(
  src: SourceMatrix,
  opts: PackOptions,
): { dtype: StoredDtype; fallback?: string } {
  const plainOf = (): StoredDtype => {
    if (opts.convert) return opts.convert;
    if (src.dtype === INT4_PACKED) return "int4g32";
    const kept = KEPT_DTYPE[src.dtype];
    if (!kept) {
      throw new Error(
        `${src.file}: tensor ${src.name} has dtype ${src.dtype}, which sluice cannot store`,
      );
    }
    return kept;
  };
  if (!opts.experts) return { dtype: plainOf() };
  const want = EXPERT_OPTIONS[opts.experts];
  if ((want === "mxfp4" || want === "int4g32") && src.cols % Q4_BLOCK !== 0) {
    // A packed INT4 source always has cols % 32 = 0, so the fallback is a plain float dtype.
    return {
      dtype: plainOf(),
      fallback: `cols ${src.cols} is not a multiple of ${Q4_BLOCK}`,
    };
  }
  return { dtype: want };
}

function planBank(cfg: ModelConfig, ckpt: Checkpoint, l: number, opts: PackOptions): BankPlan {
  const moe = cfg.moe!;
  const experts: Map<ExpertMatrix, SourceMatrix>[] = [];
  for (let e = 0; e < moe.numExperts; e++) {
    const mats = new Map<ExpertMatrix, SourceMatrix>();
    for (const m of EXPERT_MATRICES) {
      const src = findMatrix(ckpt, hfExpertName(cfg, l, e, m), `layer ${l} expert ${e} ${m}`);
      const want = m === "down"
        ? [cfg.hiddenSize, moe.expertIntermediate]
        : [moe.expertIntermediate, cfg.hiddenSize];
      if (String([src.rows, src.cols]) !== String(want)) {
        throw new Error(
          `${src.file}: tensor ${src.name} has shape [${src.rows}, ${src.cols}], expected [${want}]`,
        );
      }
      const first = experts[0]?.get(m);
      if (first && first.dtype !== src.dtype) {
        throw new Error(
          `${src.file}: tensor ${src.name} is ${src.dtype}, expert 0's ${m} is ${first.dtype}`,
        );
      }
      if (src.plain && KEPT_DTYPE[src.dtype] === "f8_e4m3") fp8ScaleInfo(ckpt, src.plain);
      mats.set(m, src);
    }
    experts.push(mats);
  }
  const fallback: Partial<Record<ExpertMatrix, string>> = {};
  const placed = EXPERT_MATRICES.map((m) => {
    const src = experts[0].get(m)!;
    const { dtype, fallback: why } = expertDtype(src, opts);
    if (why) fallback[m] = why;
    return { entry: entryOf(dtype, [src.rows, src.cols], `${src.file}: tensor ${src.name}`) };
  });
  if (!opts.experts && placed.some((p) => p.entry.dtype === "int4g32")) {
    // A checkpoint with INT4 experts may ship some expert matrices in a float dtype.
    placed.forEach((p, i) => {
      const src = experts[0].get(EXPERT_MATRICES[i])!;
      if (p.entry.dtype !== "int4g32") {
        fallback[EXPERT_MATRICES[i]] = `the checkpoint ships it as ${src.dtype}`;
      }
    });
  }
  const kept = placed.filter((_, i) => !fallback[EXPERT_MATRICES[i]]).map((p) => p.entry.dtype);
  const formats = new Set(kept);
  if (formats.size > 1) {
    throw new Error(`${ckpt.dir}: layer ${l}: experts mix dtypes ${[...formats].join(", ")}`);
  }
  const end = place(placed as Placed[], RECORD_HEADER_BYTES);
  const matrices = Object.fromEntries(
    EXPERT_MATRICES.map((m, i) => [m, placed[i].entry]),
  ) as Record<ExpertMatrix, TensorEntry>;
  return {
    experts,
    matrices,
    stride: alignUp(end, BLOCK_ALIGN),
    format: (kept[0] ?? EXPERT_OPTIONS[opts.experts!]) as ExpertFormat,
    fallback,
    codebookOffsets: {},
  };
}

/** SHA-256 over the configs and every safetensors header: changes when the source changes. */
async function fingerprint(src: string, ckpt: Checkpoint): Promise<string> {
  const parts: Uint8Array[] = [new TextEncoder().encode(`sluice-pack-v${CONTAINER_VERSION}\0`)];
  for (const f of CONFIG_FILES) {
    const p = join(src, f);
    parts.push(existsSync(p) ? readFileSync(p) : new Uint8Array(0), new Uint8Array(1));
  }
  const files = [...new Set([...ckpt.tensors.values()].map((t) => t.file))].sort();
  for (const f of files) {
    const fd = openSync(f, "r");
    try {
      const size = fstatSync(fd).size;
      const readAt = (n: number, pos: number): Uint8Array => {
        const buf = new Uint8Array(n);
        for (let got = 0; got < n;) {
          const k = readSync(fd, buf, got, n - got, pos + got);
          if (k === 0) throw new Error(`${f}: unexpected end of file in the header`);
          got += k;
        }
        return buf;
      };
      // The 8-byte length and the JSON header; openCheckpoint has already bounded the length.
      const len = new DataView(readAt(8, 0).buffer).getBigUint64(0, true);
      const header = readAt(8 + Number(len), 0);
      parts.push(new TextEncoder().encode(`${basename(f)}\0${size}\0`), header);
    } finally {
      closeSync(fd);
    }
  }
  const all = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    all.set(p, at);
    at += p.length;
  }
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", all));
  return "sha256:" + [...digest].map((b) => b.toString(16).padStart(2, "0")).join("");
}

/** Writes sequentially from `start` in a file, keeping the CRC of everything written. */
class RegionWriter {
  crc = 0;
  #rel = 0;
  constructor(readonly fd: number, readonly start: number, readonly progress: Progress) {}

  write(bytes: Uint8Array): void {
    let done = 0;
    while (done < bytes.length) {
      done += writeSync(this.fd, bytes, done, bytes.length - done, this.start + this.#rel + done);
    }
    this.crc = crc32(bytes, this.crc);
    this.#rel += bytes.length;
    this.progress.add(bytes.length);
  }

  /** Writes zeros up to `rel` bytes from the region start. */
  padTo(rel: number): void {
    while (this.#rel < rel) this.write(new Uint8Array(Math.min(rel - this.#rel, 1 << 20)));
  }
}

function writeTensors(ckpt: Checkpoint, items: Placed[], w: RegionWriter, chunk: number): void {
  for (const { src, entry } of items) {
    w.padTo(entry.offset);
    if (isCompactDtype(entry.dtype)) {
      const [rows, cols] = entry.shape;
      const what = `${src.file}: tensor ${src.name}`;
      const enc = encodeMatrix(readF32(ckpt, src.name), rows, cols, entry.dtype, what);
      w.write(enc.data);
      w.padTo(entry.scale!.offset);
      w.write(enc.scale!);
      continue;
    }
    streamTensor(ckpt, src, entry.dtype, chunk, (b) => w.write(b));
    if (entry.scale) {
      w.padTo(entry.scale.offset);
      w.write(scaleBytesF32(ckpt, src));
    }
  }
}

function writeRegion(
  ckpt: Checkpoint,
  fd: number,
  offset: number,
  bytes: number,
  items: Placed[],
  progress: Progress,
  chunk: number,
): Region {
  const w = new RegionWriter(fd, offset, progress);
  writeTensors(ckpt, items, w, chunk);
  w.padTo(bytes);
  return { offset, bytes, crc32: w.crc };
}

/** Writes one expert matrix (and its scale) into `record` at its entry's offsets. */
function writeExpertMatrix(
  ckpt: Checkpoint,
  src: SourceMatrix,
  entry: TensorEntry,
  record: Uint8Array,
  chunk: number,
  codebooks: Float32Array | undefined,
): void {
  if (src.packed && entry.dtype === "int4g32") {
    // Kimi's packed words and bf16 scales are the int4g32 bytes: copied, never re-quantised.
    const { data, scale } = readPackedInt4(ckpt, src);
    record.set(data, entry.offset);
    record.set(scale, entry.scale!.offset);
    return;
  }
  const streamable = entry.dtype === "f8_e4m3"
    ? src.dtype === "F8_E4M3"
    : !isCompactDtype(entry.dtype);
  if (src.plain && streamable) {
    let at = entry.offset;
    streamTensor(ckpt, src.plain, entry.dtype, chunk, (b) => {
      record.set(b, at);
      at += b.length;
    });
    if (entry.scale) record.set(scaleBytesF32(ckpt, src.plain), entry.scale.offset);
    return;
  }
  const what = `${src.file}: tensor ${src.name}`;
  const enc = encodeMatrix(
    readMatrixF32(ckpt, src),
    src.rows,
    src.cols,
    entry.dtype,
    what,
    codebooks,
  );
  record.set(enc.data, entry.offset);
  if (enc.scale) record.set(enc.scale, entry.scale!.offset);
}

/** Writes all records of one expert bank into `path` (a temporary name the caller renames). */
function writeBank(
  ckpt: Checkpoint,
  l: number,
  bank: BankPlan,
  path: string,
  progress: Progress,
  chunk: number,
  codebooks: Partial<Record<ExpertMatrix, Float32Array>>,
): void {
  const fd = openSync(path, "w");
  try {
    const record = new Uint8Array(bank.stride);
    bank.experts.forEach((mats, e) => {
      record.fill(0);
      let payloadEnd = RECORD_HEADER_BYTES;
      const headerMats = {} as Record<ExpertMatrix, RecordMatrix>;
      for (const m of EXPERT_MATRICES) {
        const entry = bank.matrices[m];
        writeExpertMatrix(ckpt, mats.get(m)!, entry, record, chunk, codebooks[m]);
        payloadEnd = Math.max(
          payloadEnd,
          entry.scale ? entry.scale.offset + entry.scale.bytes : entry.offset + entry.bytes,
        );
        headerMats[m] = {
          offset: entry.offset,
          bytes: entry.bytes,
          scaleOffset: entry.scale?.offset ?? 0,
          scaleBytes: entry.scale?.bytes ?? 0,
        };
      }
      record.set(
        encodeRecordHeader({
          layer: l,
          expert: e,
          formatId: EXPERT_FORMAT_IDS[bank.format],
          payloadOffset: RECORD_HEADER_BYTES,
          payloadBytes: payloadEnd - RECORD_HEADER_BYTES,
          payloadCrc: crc32(record.subarray(RECORD_HEADER_BYTES, payloadEnd)),
          matrices: headerMats,
        }),
      );
      let done = 0;
      while (done < record.length) {
        done += writeSync(fd, record, done, record.length - done, e * bank.stride + done);
      }
      progress.add(record.length);
    });
    fdatasyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

/**
 * Trains the VQ3R codebooks of each vq3r matrix kind of one MoE layer on evenly spaced experts,
 * writes them (kernel layout) into codebooks.bin at their planned offsets, and returns the
 * training layout for encoding plus the CRC of each written set.
 */
function trainBankCodebooks(
  ckpt: Checkpoint,
  l: number,
  bank: BankPlan,
  fd: number,
  opts: Vq3rPackOptions,
  log: (line: string) => void,
  count: { done: number; total: number },
): {
  books: Partial<Record<ExpertMatrix, Float32Array>>;
  crcs: Partial<Record<ExpertMatrix, number>>;
} {
  const books: Partial<Record<ExpertMatrix, Float32Array>> = {};
  const crcs: Partial<Record<ExpertMatrix, number>> = {};
  const E = bank.experts.length;
  const n = Math.max(1, Math.min(E, opts.trainExperts ?? 16));
  for (const m of EXPERT_MATRICES) {
    const offset = bank.codebookOffsets[m];
    if (offset === undefined) continue;
    const t0 = performance.now();
    const mats = Array.from({ length: n }, (_, i) => {
      const src = bank.experts[Math.floor((i * E) / n)].get(m)!;
      return { data: readMatrixF32(ckpt, src), rows: src.rows, cols: src.cols };
    });
    const book = trainVq3r(mats, {
      seed: opts.seed,
      sampleSize: opts.sampleSize,
      iterations: opts.iterations,
    });
    const kernel = vq3rKernelCodebooks(book);
    const bytes = new Uint8Array(kernel.buffer);
    for (let done = 0; done < bytes.length;) {
      done += writeSync(fd, bytes, done, bytes.length - done, offset + done);
    }
    books[m] = book;
    crcs[m] = crc32(bytes);
    count.done++;
    log(
      `pack: VQ3R codebooks ${count.done}/${count.total}: layer ${l} ${m}, ${n} experts sampled, ` +
        `${((performance.now() - t0) / 1000).toFixed(1)} s`,
    );
  }
  return { books, crcs };
}

function writeJson(path: string, value: unknown): void {
  writeFileSync(path + ".part", JSON.stringify(value, null, 1));
  renameSync(path + ".part", path);
}

function readJournal(tmp: string): Journal | null {
  try {
    const j = JSON.parse(readFileSync(join(tmp, JOURNAL), "utf-8"));
    if (typeof j?.fingerprint === "string" && j.layers && typeof j.layers === "object") return j;
  } catch {
    // A missing or torn journal means nothing can be trusted: start over.
  }
  return null;
}

/** Checks a journaled trunk region still holds what was written (size and CRC). */
function regionIntact(fd: number, r: Region, chunk: number): boolean {
  if (fstatSync(fd).size < r.offset + r.bytes) return false;
  const buf = new Uint8Array(Math.min(chunk, r.bytes));
  let crc = 0;
  for (let at = 0; at < r.bytes;) {
    const n = readSync(fd, buf, 0, Math.min(buf.length, r.bytes - at), r.offset + at);
    if (n === 0) return false;
    crc = crc32(buf.subarray(0, n), crc);
    at += n;
  }
  return crc === r.crc32;
}

function readOptionalJson(path: string): unknown {
  return existsSync(path) ? JSON.parse(readFileSync(path, "utf-8")) : undefined;
}

/** Packs the checkpoint in `src` into the container directory `out`. */
export async function packCheckpoint(
  src: string,
  out: string,
  opts: PackOptions = {},
): Promise<PackResult> {
  const t0 = performance.now();
  const log = opts.log ?? ((s: string) => console.error(s));
  const chunk = opts.chunkBytes ?? 64 << 20;
  const convert = opts.convert;
  if (convert !== undefined && convert !== "f32" && convert !== "bf16") {
    throw new Error(`--convert must be f32 or bf16, got ${convert}`);
  }
  if (opts.experts !== undefined && !Object.hasOwn(EXPERT_OPTIONS, opts.experts)) {
    throw new Error(
      `--experts must be one of ${Object.keys(EXPERT_OPTIONS).join(", ")}, got ${opts.experts}`,
    );
  }
  if (opts.trunk !== undefined && opts.trunk !== "int8") {
    throw new Error(`--trunk must be int8, got ${opts.trunk}`);
  }
  const optionKey = JSON.stringify({
    convert: convert ?? null,
    experts: opts.experts ?? null,
    trunk: opts.trunk ?? null,
    vq3r: opts.experts === "vq3r" ? opts.vq3r ?? {} : null,
  });
  if (existsSync(out) && !opts.force) {
    throw new Error(`${out} already exists; pass --force to replace it`);
  }
  const cfg = loadModelConfig(src);
  const ckpt = openCheckpoint(src);
  try {
    const plan = planLayout(cfg, ckpt, opts);
    reportFallbacks(plan, log);
    const fp = await fingerprint(src, ckpt);
    const tmp = out + ".tmp";
    let journal = existsSync(tmp) ? readJournal(tmp) : null;
    if (
      journal &&
      (journal.fingerprint !== fp || journal.convert !== (convert ?? null) ||
        journal.options !== optionKey)
    ) {
      log(`pack: ${tmp} holds a pack of another source or options; starting over`);
      journal = null;
    }
    if (!journal) {
      rmSync(tmp, { recursive: true, force: true });
      mkdirSync(tmp, { recursive: true });
      journal = {
        fingerprint: fp,
        convert: convert ?? null,
        options: optionKey,
        globals: null,
        layers: {},
        codebooks: {},
      };
      writeJson(join(tmp, JOURNAL), journal);
    }
    const trunkPath = join(tmp, TRUNK_FILE);
    if (!existsSync(trunkPath)) writeFileSync(trunkPath, new Uint8Array(0));
    const fd = openSync(trunkPath, "r+");
    const booksPath = join(tmp, CODEBOOKS_FILE);
    if (plan.codebooksBytes > 0 && !existsSync(booksPath)) {
      writeFileSync(booksPath, new Uint8Array(0));
    }
    const booksFd = plan.codebooksBytes > 0 ? openSync(booksPath, "r+") : -1;
    const bookCount = {
      done: 0,
      total: plan.banks.reduce((n, b) => n + Object.keys(b?.codebookOffsets ?? {}).length, 0),
    };
    const resumed: number[] = [];
    const packed: number[] = [];
    try {
      ftruncateSync(fd, plan.trunkBytes);
      if (booksFd >= 0) ftruncateSync(booksFd, plan.codebooksBytes);
      // Keep only journaled work that is still on disk and intact.
      if (journal.globals && !regionIntact(fd, journal.globals, chunk)) journal.globals = null;
      for (const [k, r] of Object.entries(journal.layers)) {
        const l = Number(k);
        const bank = plan.banks[l];
        const bankOk = !bank ||
          (existsSync(join(tmp, expertBankFile(l))) &&
            statSync(join(tmp, expertBankFile(l))).size === bank.stride * bank.experts.length);
        const booksOk = !bank || codebooksIntact(booksFd, bank, journal.codebooks[k]);
        if (!bankOk || !booksOk || !regionIntact(fd, r, chunk)) delete journal.layers[k];
      }
      const bytesOf = (l: number) =>
        plan.layers[l].bytes +
        (plan.banks[l] ? plan.banks[l]!.stride * plan.banks[l]!.experts.length : 0);
      const total = plan.globals.region.bytes + plan.layers.reduce((n, _, l) => n + bytesOf(l), 0);
      const progress = new Progress({
        label: `pack ${basename(out)}`,
        total,
        mode: opts.progress ?? "auto",
      });
      if (journal.globals) progress.add(plan.globals.region.bytes);
      else {
        const { offset, bytes } = plan.globals.region;
        journal.globals = writeRegion(
          ckpt,
          fd,
          offset,
          bytes,
          [...plan.globals.items.values()],
          progress,
          chunk,
        );
        fdatasyncSync(fd);
        writeJson(join(tmp, JOURNAL), journal);
      }
      for (let l = 0; l < cfg.numLayers; l++) {
        if (journal.layers[l]) {
          resumed.push(l);
          progress.add(bytesOf(l));
        } else {
          const lp = plan.layers[l];
          const run = writeRegion(
            ckpt,
            fd,
            lp.offset,
            lp.bytes,
            [...lp.items.values()],
            progress,
            chunk,
          );
          fdatasyncSync(fd);
          const bank = plan.banks[l];
          if (bank) {
            const { books, crcs } = trainBankCodebooks(
              ckpt,
              l,
              bank,
              booksFd,
              opts.vq3r ?? {},
              log,
              bookCount,
            );
            if (booksFd >= 0) fdatasyncSync(booksFd);
            journal.codebooks[l] = crcs;
            const bankPath = join(tmp, expertBankFile(l));
            writeBank(ckpt, l, bank, bankPath + ".part", progress, chunk, books);
            renameSync(bankPath + ".part", bankPath);
          }
          journal.layers[l] = run;
          writeJson(join(tmp, JOURNAL), journal);
          packed.push(l);
        }
        if (opts.stopAfterLayer === l) {
          throw new Error(`pack stopped on request after layer ${l}; ${tmp} can be resumed`);
        }
      }
      progress.finish();
    } finally {
      closeSync(fd);
      if (booksFd >= 0) closeSync(booksFd);
    }

    const settings: PackSettings = {
      convert: convert ?? null,
      experts: opts.experts ? EXPERT_OPTIONS[opts.experts] : null,
      trunk: opts.trunk ? "int8row" : null,
    };
    const manifest = buildManifest(src, cfg, plan, journal, fp, settings);
    const copied: string[] = [];
    for (const f of [...TOKENIZER_FILES, ...CONFIG_FILES]) {
      if (existsSync(join(src, f))) {
        copyFileSync(join(src, f), join(tmp, f));
        chmodSync(join(tmp, f), 0o644);
        if (TOKENIZER_FILES.includes(f)) copied.push(f);
      }
    }
    manifest.tokenizer.files = copied;
    writeJson(join(tmp, "manifest.json"), manifest);
    rmSync(join(tmp, JOURNAL));
    replaceDir(tmp, out);
    const containerBytes = plan.trunkBytes + plan.codebooksBytes +
      plan.banks.reduce((n, b) => n + (b ? b.stride * b.experts.length : 0), 0);
    const seconds = (performance.now() - t0) / 1000;
    if (resumed.length) log(`pack: resumed ${resumed.length} finished layer(s) from ${tmp}`);
    log(`pack: wrote ${out} (${formatBytes(containerBytes)}) in ${seconds.toFixed(1)} s`);
    return { out, manifest, layersPacked: packed, layersResumed: resumed, containerBytes, seconds };
  } finally {
    ckpt.close();
  }
}

/** Says once per matrix kind which expert matrices keep a plain dtype, and why. */
function reportFallbacks(plan: Plan, log: (line: string) => void): void {
  const said = new Set<string>();
  for (const b of plan.banks) {
    for (const [m, why] of Object.entries(b?.fallback ?? {})) {
      const line = `pack: expert ${m} matrices stay ${b!.matrices[m as ExpertMatrix].dtype}, ` +
        `not ${b!.format}: ${why}`;
      if (!said.has(line)) log(line);
      said.add(line);
    }
  }
}

/** Whether a journaled layer's codebooks are still in codebooks.bin with their CRCs. */
function codebooksIntact(
  fd: number,
  bank: BankPlan,
  crcs: Partial<Record<ExpertMatrix, number>> | undefined,
): boolean {
  for (const m of EXPERT_MATRICES) {
    const off = bank.codebookOffsets[m];
    if (off === undefined) continue;
    const want = crcs?.[m];
    if (want === undefined || fd < 0 || fstatSync(fd).size < off + VQ3R_CODEBOOK_BYTES) {
      return false;
    }
    const buf = new Uint8Array(VQ3R_CODEBOOK_BYTES);
    if (readSync(fd, buf, 0, buf.length, off) !== buf.length || crc32(buf) !== want) return false;
  }
  return true;
}

function buildManifest(
  src: string,
  cfg: ModelConfig,
  plan: Plan,
  journal: Journal,
  fp: string,
  settings: PackSettings,
): Manifest {
  const globals: Partial<Record<GlobalTensor, TensorEntry>> = {};
  for (const [g, p] of plan.globals.items) globals[g] = p.entry;
  const layers: LayerRun[] = plan.layers.map((lp, l) => ({
    ...journal.layers[l],
    tensors: Object.fromEntries([...lp.items].map(([t, p]) => [t, p.entry])),
  }));
  const experts: (ExpertBank | null)[] = plan.banks.map((b, l) => {
    if (!b) return null;
    const bank: ExpertBank = {
      layer: l,
      file: expertBankFile(l),
      count: b.experts.length,
      stride: b.stride,
      format: b.format,
      matrices: b.matrices,
    };
    if (Object.keys(b.fallback).length) bank.fallback = b.fallback;
    const refs: Partial<Record<ExpertMatrix, CodebookRef>> = {};
    for (const m of EXPERT_MATRICES) {
      const offset = b.codebookOffsets[m];
      if (offset === undefined) continue;
      refs[m] = { offset, bytes: VQ3R_CODEBOOK_BYTES, crc32: journal.codebooks[l][m]! };
    }
    if (Object.keys(refs).length) bank.codebooks = refs;
    return bank;
  });
  return {
    format: CONTAINER_FORMAT,
    version: CONTAINER_VERSION,
    config: cfg,
    source: {
      config: readOptionalJson(join(src, "config.json")),
      generation_config: readOptionalJson(join(src, "generation_config.json")),
      fingerprint: fp,
    },
    trunk: {
      file: TRUNK_FILE,
      bytes: plan.trunkBytes,
      globals: { region: journal.globals!, tensors: globals },
      layers,
    },
    experts,
    ...(plan.codebooksBytes > 0
      ? { codebooks: { file: CODEBOOKS_FILE, bytes: plan.codebooksBytes } }
      : {}),
    pack: settings,
    tokenizer: { files: [] },
  };
}

const USAGE = `sluice pack — turn a Hugging Face safetensors checkpoint into a .sluice container

Usage: deno task pack <hf-dir> <out>.sluice [options]

Reads single-file or sharded checkpoints (F32, F16, BF16, FP8 E4M3 with 128×128 block scales,
Kimi-style INT4) of model_type llama, mixtral, qwen3_moe, deepseek_v3 / kimi_k2. Writes into
<out>.sluice.tmp and renames at the end; an interrupted pack resumes layer by layer on rerun.

Options:
  --experts FORMAT      store routed experts as mxfp4, int4, vq3r, int8, fp8, bf16 or f32
                        (default: as shipped); matrices a format cannot hold keep their dtype
  --trunk int8          per-row int8 for the layers' attention/dense matrices
  --convert f32|bf16    dequantise / convert every weight matrix
  --vq3r-sample N       vectors sampled to train each VQ3R codebook
  --vq3r-iterations N   k-means iterations per VQ3R stage
  --vq3r-experts N      experts per layer whose rows train the VQ3R codebooks
  --force               replace an existing output
  -h, --help            this text

docs/FORMAT.md describes the container.`;

async function main(args: string[]): Promise<number> {
  let parsed;
  try {
    parsed = parseArgs({
      args,
      allowPositionals: true,
      options: {
        convert: { type: "string" },
        experts: { type: "string" },
        trunk: { type: "string" },
        "vq3r-sample": { type: "string" },
        "vq3r-iterations": { type: "string" },
        "vq3r-experts": { type: "string" },
        force: { type: "boolean" },
        help: { type: "boolean", short: "h" },
      },
    });
  } catch (e) {
    console.error(`pack: ${(e as Error).message}\n${USAGE}`);
    return 1;
  }
  if (parsed.values.help) {
    console.log(USAGE);
    return 0;
  }
  if (parsed.positionals.length !== 2) {
    console.error(`pack: expected a checkpoint directory and an output path\n${USAGE}`);
    return 1;
  }
  const [src, out] = parsed.positionals;
  try {
    const v = parsed.values;
    const count = (s: string | undefined, flag: string): number | undefined => {
      if (s === undefined) return undefined;
      const n = Number(s);
      if (!Number.isInteger(n) || n < 1) throw new Error(`--${flag} must be a positive integer`);
      return n;
    };
    await packCheckpoint(src, out, {
      convert: v.convert as PackOptions["convert"],
      experts: v.experts as PackOptions["experts"],
      trunk: v.trunk as PackOptions["trunk"],
      vq3r: {
        sampleSize: count(v["vq3r-sample"], "vq3r-sample"),
        iterations: count(v["vq3r-iterations"], "vq3r-iterations"),
        trainExperts: count(v["vq3r-experts"], "vq3r-experts"),
      },
      force: v.force,
    });
    return 0;
  } catch (e) {
    const tmp = out + ".tmp";
    const hint = existsSync(join(tmp, JOURNAL))
      ? ` (partial pack kept in ${tmp}; rerun to resume)`
      : "";
    console.error(`pack: ${(e as Error).message}${hint}`);
    return 1;
  }
}

if (import.meta.main) Deno.exit(await main(Deno.args));
