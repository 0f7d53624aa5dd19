/**
 * The layout of a container, computed before any byte is written: the stored dtype of every
 * tensor, its offset in trunk.bin (globals, then one 4 KiB-aligned run per layer), the record
 * layout of each MoE layer's expert bank, and where each VQ3R / VQ4P codebook set goes in
 * codebooks.bin.
 *
 * @module
 */

import {
  EXPERT_MATRICES,
  type ExpertMatrix,
  type GlobalTensor,
  globalTensorsOf,
  layerKindOf,
  type LayerTensor,
  type ModelConfig,
  mtpLayerIds,
} from "../../io/model_config.ts";
import { specMismatch, type TensorSpec } from "../../io/manifest.ts";
import { modelTypeOf } from "../../engine/models/mod.ts";
import { hfGlobalName, hfLayerName, layerTensorsOf } from "../../engine/tensor_names.ts";
import {
  expertMatrixShape,
  globalTensorSpec,
  layerTensorSpec,
} from "../../engine/tensor_shapes.ts";
import { fp8ScaleInfo } from "../../io/checkpoint_weights.ts";
import type { TensorEntry } from "../../io/manifest_schema.ts";
import {
  alignUp,
  BLOCK_ALIGN,
  CODEBOOK_BYTES,
  type ExpertFormat,
  isCodebookDtype,
  Q4_BLOCK,
  RECORD_HEADER_BYTES,
  scaleSpecOf,
  storedBytes,
  type StoredDtype,
  TENSOR_ALIGN,
  VQ3R_DIM,
} from "../../io/format.ts";
import type { Checkpoint, TensorInfo } from "../../io/safetensors.ts";
import { KEPT_DTYPE } from "./encode.ts";
import { EXPERT_OPTIONS, type PackOptions } from "./options.ts";
import {
  findExpertMatrix,
  INT4_PACKED,
  keepsShippedBytes,
  MXFP4_FUSED,
  MXFP4_PACKED,
  type SourceMatrix,
} from "../../engine/checkpoint_matrix.ts";

/** A tensor to write: where it comes from and its entry (offsets relative to its region). */
export interface Placed {
  src: TensorInfo;
  entry: TensorEntry;
}

/** The full container layout, computed before any byte is written. */
export interface PackLayout {
  globals: { items: Map<GlobalTensor, Placed>; region: { offset: number; bytes: number } };
  layers: { items: Map<LayerTensor, Placed>; offset: number; bytes: number }[];
  banks: (BankLayout | null)[];
  trunkBytes: number;
  /** Size of codebooks.bin (0 when nothing is vq3r or vq4p). */
  codebooksBytes: number;
}

/** One MoE layer's bank: sources, layout, and where its codebooks go. */
export interface BankLayout {
  experts: Map<ExpertMatrix, SourceMatrix>[];
  matrices: Record<ExpertMatrix, TensorEntry>;
  stride: number;
  format: ExpertFormat;
  /**
   * Whether every matrix in the bank's format keeps the checkpoint's shipped bytes (gpt-oss's
   * fused and K3's packed MXFP4, Kimi-K2's INT4; plain fallbacks aside): then they are the model
   * itself and multiply f32 activations exactly.
   */
  shipped: boolean;
  /** gpt-oss: each matrix's f32 bias vector, after the matrices in every record. */
  biases?: Record<ExpertMatrix, TensorEntry>;
  fallback: Partial<Record<ExpertMatrix, string>>;
  /** Offset in codebooks.bin of each vq3r / vq4p matrix kind's codebooks. */
  codebookOffsets: Partial<Record<ExpertMatrix, number>>;
}

/** Layer tensors `--trunk int8` leaves alone: MLA's wkv_b is widened to f32 at load time. */
const TRUNK_INT8_EXCLUDED: ReadonlySet<LayerTensor> = new Set(["router", "wkv_b"]);

function storedDtype(
  src: TensorInfo,
  role: "vector" | "router" | "weight",
  convert: PackOptions["convert"],
): StoredDtype {
  // An index table (DeepSeek-V4's tid2eid, I64) is stored as exact f32 like any vector.
  if (role !== "weight" && src.dtype === "I64") return "f32";
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
  if (isCodebookDtype(dtype)) e.paddedCols = Math.ceil(shape[1] / VQ3R_DIM) * VQ3R_DIM;
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

function checkShape(t: TensorInfo, spec: TensorSpec, what: string): void {
  const want = specMismatch(t.shape, spec);
  if (want) {
    throw new Error(
      `${t.file}: tensor ${t.name} (${what}) has shape [${t.shape}], but config.json gives ${want}`,
    );
  }
}

/** Plans the whole container for `cfg` packed from `ckpt` with `opts`; throws on bad tensors. */
export function computeLayout(cfg: ModelConfig, ckpt: Checkpoint, opts: PackOptions): PackLayout {
  const convert = opts.convert;
  const gItems = new Map<GlobalTensor, Placed>();
  for (const g of globalTensorsOf(cfg)) {
    const src = lookup(ckpt, hfGlobalName(cfg, g)!, g);
    const spec = globalTensorSpec(cfg, g);
    checkShape(src, spec, g);
    gItems.set(g, { src, entry: entryFor(ckpt, src, storedDtype(src, spec.role, convert)) });
  }
  const gEnd = place([...gItems.values()], 0);
  let cursor = alignUp(gEnd, BLOCK_ALIGN);
  const layers: PackLayout["layers"] = [];
  const banks: PackLayout["banks"] = [];
  // The MTP layers (if kept) follow the main ones, each with its run and bank.
  for (let l = 0; l < cfg.numLayers + (cfg.mtp?.layers ?? 0); l++) {
    const items = new Map<LayerTensor, Placed>();
    for (const t of layerTensorsOf(cfg, l)) {
      const src = lookup(ckpt, hfLayerName(cfg, l, t)!, `layer ${l} ${t}`);
      const spec = layerTensorSpec(cfg, t, l);
      checkShape(src, spec, `layer ${l} ${t}`);
      const role = spec.role;
      let dtype = storedDtype(src, role, convert);
      if (opts.trunk === "int8" && role === "weight" && !TRUNK_INT8_EXCLUDED.has(t)) {
        dtype = "int8row";
      }
      items.set(t, { src, entry: entryFor(ckpt, src, dtype) });
    }
    const bytes = alignUp(Math.max(place([...items.values()], 0), 1), BLOCK_ALIGN);
    layers.push({ items, offset: cursor, bytes });
    cursor += bytes;
    banks.push(layerKindOf(cfg, l) === "moe" ? layoutBank(cfg, ckpt, l, opts) : null);
  }
  let codebooksBytes = 0;
  for (const b of banks) {
    for (const m of EXPERT_MATRICES) {
      if (!b) continue;
      const bytes = codebookSetBytes(b, m);
      if (!bytes) continue;
      b.codebookOffsets[m] = codebooksBytes;
      codebooksBytes += bytes;
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
    if (src.dtype === MXFP4_FUSED) return "mxfp4";
    if (src.dtype === MXFP4_PACKED) return "mxfp4";
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

/** Plans the expert bank of MoE layer `l`: source matrices, record layout, format, fallbacks. */
function layoutBank(cfg: ModelConfig, ckpt: Checkpoint, l: number, opts: PackOptions): BankLayout {
  const moe = cfg.moe!;
  const experts: Map<ExpertMatrix, SourceMatrix>[] = [];
  for (let e = 0; e < moe.numExperts; e++) {
    const mats = new Map<ExpertMatrix, SourceMatrix>();
    for (const m of EXPERT_MATRICES) {
      const src = findExpertMatrix(ckpt, cfg, l, e, m);
      const want = expertMatrixShape(cfg, m);
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
  const biasItems = moe.expertBias
    ? EXPERT_MATRICES.map((m) => ({ entry: entryOf("f32", [experts[0].get(m)!.rows], m) }))
    : [];
  const end = place([...placed, ...biasItems] as Placed[], RECORD_HEADER_BYTES);
  const byMatrix = (items: { entry: TensorEntry }[]) =>
    Object.fromEntries(EXPERT_MATRICES.map((m, i) => [m, items[i].entry])) as Record<
      ExpertMatrix,
      TensorEntry
    >;
  const format = (kept[0] ?? EXPERT_OPTIONS[opts.experts!]) as ExpertFormat;
  const inFormat = EXPERT_MATRICES.filter((_, i) => placed[i].entry.dtype === format);
  const bank: BankLayout = {
    experts,
    matrices: byMatrix(placed),
    stride: alignUp(end, BLOCK_ALIGN),
    format,
    fallback,
    codebookOffsets: {},
    shipped: inFormat.length > 0 &&
      inFormat.every((m) => keepsShippedBytes(experts[0].get(m)!, format)),
  };
  if (biasItems.length) bank.biases = byMatrix(biasItems);
  return bank;
}

/** Says once per matrix kind which expert matrices keep a plain dtype, and why. */
export function reportFallbacks(layout: PackLayout, log: (line: string) => void): void {
  const said = new Set<string>();
  for (const b of layout.banks) {
    for (const [m, why] of Object.entries(b?.fallback ?? {})) {
      const line = `pack: expert ${m} matrices stay ${b!.matrices[m as ExpertMatrix].dtype}, ` +
        `not ${b!.format}: ${why}`;
      if (!said.has(line)) log(line);
      said.add(line);
    }
  }
}

/** Bytes of the codebook set of `bank`'s matrix kind `m` (0 when it has none). */
export function codebookSetBytes(bank: BankLayout, m: ExpertMatrix): number {
  const d = bank.matrices[m].dtype;
  return isCodebookDtype(d) ? CODEBOOK_BYTES[d] : 0;
}

/**
 * `cfg` with the multi-token-prediction layers it declares when pack keeps them (the model_type
 * names them, the checkpoint holds every tensor of them, and `opts.mtp` is not false), else
 * without them, said in one line.
 */
export function mtpKept(
  cfg: ModelConfig,
  ckpt: Checkpoint,
  opts: PackOptions,
  log: (line: string) => void,
): ModelConfig {
  if (!cfg.mtp) return cfg;
  const { mtp, ...without } = cfg;
  const what = `${mtp.layers} multi-token-prediction layer(s)`;
  if (opts.mtp === false) {
    log(`pack: leaving out the ${what} (--no-mtp); --spec mtp will be refused`);
    return without;
  }
  for (const l of mtpLayerIds(cfg)) {
    const names = layerTensorsOf(cfg, l).map((t) => hfLayerName(cfg, l, t)!);
    const missing = names.find((n) => !ckpt.tensors.has(n));
    if (missing) {
      log(`pack: not keeping the ${what}: the checkpoint lacks ${missing}`);
      return without;
    }
  }
  return cfg;
}

/**
 * Says which checkpoint layers lie at index ≥ num_hidden_layers and are not kept (multi-token-
 * prediction layers packed with --no-mtp or without a naming) and which tensors lie under a
 * prefix the model_type skips (Qwen3.5's vision tower, and its MTP block when not kept, Gemma
 * 4's vision tower): they are not part of the container.
 */
export function reportSkippedLayers(
  cfg: ModelConfig,
  ckpt: Checkpoint,
  log: (line: string) => void,
): void {
  const counts = new Map<number, number>();
  const layers = `${modelTypeOf(cfg).prefix ?? "model."}layers.`;
  const kept = cfg.numLayers + (cfg.mtp?.layers ?? 0);
  for (const name of ckpt.tensors.keys()) {
    const m = name.startsWith(layers) ? /^(\d+)\./.exec(name.slice(layers.length)) : null;
    const l = m ? Number(m[1]) : -1;
    if (l >= kept) counts.set(l, (counts.get(l) ?? 0) + 1);
  }
  for (const [l, n] of [...counts].sort((a, b) => a[0] - b[0])) {
    log(
      `pack: skipping layer ${l} (${n} tensors): index >= num_hidden_layers ${cfg.numLayers}, ` +
        `a multi-token-prediction layer, not kept`,
    );
  }
  const mtpPrefix = cfg.mtp ? modelTypeOf(cfg).mtp?.skippedPrefix : undefined;
  for (const [prefix, what] of Object.entries(modelTypeOf(cfg).skipped ?? {})) {
    if (prefix === mtpPrefix) continue;
    const n = [...ckpt.tensors.keys()].filter((name) => name.startsWith(prefix)).length;
    if (n) log(`pack: skipping ${n} tensors under ${prefix}* (${what})`);
  }
}
