/**
 * Parses `manifest.json` as untrusted input: checks the type and bounds of every field, that every
 * tensor, region, record matrix and codebook set lies inside its file with the alignment the
 * format requires, and that nothing overlaps. The result is a {@link Manifest} the readers can
 * trust.
 *
 * @module
 */

import { statSync } from "node:fs";
import { join } from "node:path";
import {
  EXPERT_MATRICES,
  type ExpertMatrix,
  type GlobalTensor,
  globalTensorsOf,
  layerKindOf,
  type ModelConfig,
} from "./model_config.ts";
import {
  BLOCK_ALIGN,
  CODEBOOK_BYTES,
  EXACT_INPUT_FORMATS,
  isCodebookDtype,
  isCompactDtype,
  isExpertFormat,
  isStoredDtype,
  RECORD_HEADER_BYTES,
  scaleSpecOf,
  storedBytes,
  TENSOR_ALIGN,
  VQ3R_DIM,
} from "./format.ts";
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
} from "./manifest_schema.ts";

type Obj = Record<string, unknown>;

/** Largest dimension a stored config or tensor shape may have. */
export const MAX_DIM = 2 ** 31;

function obj(v: unknown, where: string): Obj {
  if (v === null || typeof v !== "object" || Array.isArray(v)) {
    throw new Error(`${where}: expected an object`);
  }
  return v as Obj;
}

/** A value for a message: its JSON, or "nothing" when the field is missing. */
function shown(v: unknown): string {
  return v === undefined ? "nothing (the field is missing)" : JSON.stringify(v);
}

function int(v: unknown, where: string, min: number, max: number): number {
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < min || v > max) {
    throw new Error(`${where}: expected an integer in [${min}, ${max}], got ${shown(v)}`);
  }
  return v;
}

function num(v: unknown, where: string): number {
  if (typeof v !== "number" || !Number.isFinite(v)) {
    throw new Error(`${where}: expected a finite number, got ${shown(v)}`);
  }
  return v;
}

function oneOf<T extends string>(v: unknown, allowed: readonly T[], where: string): T {
  if (!allowed.includes(v as T)) {
    throw new Error(`${where}: expected one of ${allowed.join(", ")}, got ${shown(v)}`);
  }
  return v as T;
}

function bool(v: unknown, where: string): boolean {
  if (typeof v !== "boolean") throw new Error(`${where}: expected a boolean`);
  return v;
}

/**
 * The checks of manifest fields, each error naming the field and what was expected; the model
 * families' own config checks (engine/models/) use them too.
 */
/** Checks the types of a stored `RopeConfig` (the model's, or a layer geometry's own). */
function ropeField(v: unknown, where: string): void {
  const rope = obj(v, where);
  num(rope.theta, `${where}.theta`);
  oneOf(rope.layout, ["half", "interleaved"], `${where}.layout`);
  int(rope.dim, `${where}.dim`, 0, MAX_DIM);
  const scaling = obj(rope.scaling, `${where}.scaling`);
  oneOf(
    scaling.type,
    ["none", "linear", "llama3", "yarn", "proportional"],
    `${where}.scaling.type`,
  );
  for (const [k, x] of Object.entries(scaling)) {
    if (k === "truncate") bool(x, `${where}.scaling.truncate`);
    else if (k !== "type") num(x, `${where}.scaling.${k}`);
  }
}

/** The typed field checks, for the families' own sections (engine/models/). */
export const manifestField = { obj, int, num, oneOf, bool, rope: ropeField };

/**
 * What the container format needs from the engine's model families: io/ knows the format, the
 * family registry (engine/models/mod.ts) knows which families exist, their config sections and
 * the tensors of their layers.
 */
export interface FamilyRules {
  /** Checks `config.family` and that family's own sections of a stored config. */
  validateFamily(config: Record<string, unknown>, where: string): void;
  /** The canonical tensors layer `layer` of `config` holds, in run order. */
  layerTensors(config: ModelConfig, layer: number): readonly string[];
  /** Throws, naming `where` and the field, when a config value is out of bounds. */
  checkBounds(config: ModelConfig, where: string): void;
  /** The shape and role `config` gives a global tensor, a layer tensor, an expert matrix. */
  globalSpec(config: ModelConfig, g: GlobalTensor): TensorSpec;
  layerSpec(config: ModelConfig, t: string, layer: number): TensorSpec;
  expertShape(config: ModelConfig, m: ExpertMatrix): [number, number];
}

/**
 * How a tensor is stored: vectors (norms, biases) and routers always as f32, weights as 2-D
 * matrices in any stored dtype.
 */
export type TensorRole = "vector" | "router" | "weight";

/** The shape ([rows, cols] for matrices) and role a model's config gives one tensor. */
export interface TensorSpec {
  shape: number[];
  role: TensorRole;
  /** Any shape holding at least `shape`'s element count is fine (KDA's A_log: one rate a head). */
  atLeast?: boolean;
}

/** Why `shape` does not fit `spec` (as "[…]" or "at least N values"), or null when it does. */
export function specMismatch(shape: readonly number[], spec: TensorSpec): string | null {
  if (!spec.atLeast) return String(shape) === String(spec.shape) ? null : `[${spec.shape}]`;
  const n = (s: readonly number[]) => s.reduce((a, b) => a * b, 1);
  return n(shape) >= n(spec.shape) ? null : `at least ${n(spec.shape)} values`;
}

/** Checks an entry against the shape and role the config gives its tensor. */
function checkSpec(e: TensorEntry, spec: TensorSpec, where: string): void {
  const want = specMismatch(e.shape, spec);
  if (want) throw new Error(`${where}: shape [${e.shape}], but the config gives ${want}`);
  if (spec.role !== "weight" && e.dtype !== "f32") {
    throw new Error(`${where}: dtype ${e.dtype}, expected f32 for a ${spec.role}`);
  }
}

/**
 * A stored config in the current shape. Containers packed before the layer skeleton was made of
 * parts kept Kimi K3's features in one `k3` section (latentDim, situBeta, situLinearBeta,
 * attnResBlockSize); they are read as the features they are: the latent MoE width, the SiTU gate,
 * Attention Residuals.
 */
function upgradeStoredConfig(c: Record<string, unknown>, where: string): Record<string, unknown> {
  if (c.k3 === undefined) return c;
  const { k3: raw, ...rest } = c;
  const k = obj(raw, `${where}.k3`);
  int(k.latentDim, `${where}.k3.latentDim`, 1, MAX_DIM);
  int(k.attnResBlockSize, `${where}.k3.attnResBlockSize`, 1, MAX_DIM);
  num(k.situBeta, `${where}.k3.situBeta`);
  num(k.situLinearBeta, `${where}.k3.situLinearBeta`);
  return {
    ...rest,
    moe: rest.moe === null ? null : { ...obj(rest.moe, `${where}.moe`), latentDim: k.latentDim },
    residual: { kind: "attn_res", blockSize: k.attnResBlockSize },
    glu: { kind: "situ", beta: k.situBeta, linearBeta: k.situLinearBeta },
  };
}

/**
 * Validates the normalised config stored in a manifest (types and bounds of every field), the
 * family's sections by `rules`.
 */
export function validateModelConfig(v: unknown, where: string, rules: FamilyRules): ModelConfig {
  const c = upgradeStoredConfig(obj(v, where), where);
  const w = (k: string) => `${where}.${k}`;
  if (typeof c.modelType !== "string") throw new Error(`${w("modelType")}: expected a string`);
  for (const k of ["vocabSize", "hiddenSize", "numHeads", "numKvHeads", "headDim"]) {
    int(c[k], w(k), 1, MAX_DIM);
  }
  const numLayers = int(c.numLayers, w("numLayers"), 1, 100000);
  int(c.intermediateSize, w("intermediateSize"), 0, MAX_DIM);
  int(c.maxPositions, w("maxPositions"), 1, MAX_DIM);
  num(c.rmsNormEps, w("rmsNormEps"));
  num(c.attnScale, w("attnScale"));
  for (const k of ["tieWordEmbeddings", "qkNorm", "attentionBias"]) bool(c[k], w(k));
  // Features any family may set (absent: off).
  for (const k of ["normUnitOffset", "attnOutputGate", "qkNormWhole"]) {
    if (c[k] !== undefined) bool(c[k], w(k));
  }
  ropeField(c.rope, w("rope"));
  if (!Array.isArray(c.layerKinds) || c.layerKinds.length !== numLayers) {
    throw new Error(`${w("layerKinds")}: expected ${numLayers} entries`);
  }
  c.layerKinds.forEach((k, i) => oneOf(k, ["dense", "moe"], `${w("layerKinds")}[${i}]`));
  if (c.moe !== null) {
    const m = obj(c.moe, w("moe"));
    const n = int(m.numExperts, w("moe.numExperts"), 1, 1 << 20);
    int(m.topK, w("moe.topK"), 1, n);
    int(m.expertIntermediate, w("moe.expertIntermediate"), 1, MAX_DIM);
    oneOf(m.scoring, ["softmax", "sigmoid", "topk_softmax", "sqrtsoftplus"], w("moe.scoring"));
    if (m.swigluLimit !== undefined) num(m.swigluLimit, w("moe.swigluLimit"));
    if (m.hashLayers !== undefined) int(m.hashLayers, w("moe.hashLayers"), 0, numLayers);
    for (
      const k of [
        "routerLogitBias",
        "expertBias",
        "sharedExpertGate",
        "scaledRouterInput",
        "expertScale",
        "denseBeside",
      ]
    ) {
      if (m[k] !== undefined) bool(m[k], w(`moe.${k}`));
    }
    if (m.clampedSwiglu !== undefined) {
      const g = obj(m.clampedSwiglu, w("moe.clampedSwiglu"));
      num(g.limit, w("moe.clampedSwiglu.limit"));
      num(g.alpha, w("moe.clampedSwiglu.alpha"));
    }
    bool(m.normTopK, w("moe.normTopK"));
    bool(m.selectionBias, w("moe.selectionBias"));
    num(m.routedScaling, w("moe.routedScaling"));
    int(m.nGroup, w("moe.nGroup"), 1, n);
    int(m.topkGroup, w("moe.topkGroup"), 1, n);
    int(m.sharedIntermediate, w("moe.sharedIntermediate"), 0, MAX_DIM);
    if (m.latentDim !== undefined) int(m.latentDim, w("moe.latentDim"), 1, MAX_DIM);
  } else if (c.layerKinds.includes("moe")) {
    throw new Error(`${w("moe")}: MoE layers need a moe section`);
  }
  if (c.residual !== undefined) {
    const r = obj(c.residual, w("residual"));
    oneOf(r.kind, ["attn_res", "hyper", "sandwich"], w("residual.kind"));
    if (r.kind === "attn_res") int(r.blockSize, w("residual.blockSize"), 1, numLayers);
    else if (r.kind === "sandwich") num(r.embedScale, w("residual.embedScale"));
    else {
      int(r.streams, w("residual.streams"), 1, 64);
      int(r.sinkhornIters, w("residual.sinkhornIters"), 1, 1000);
      num(r.eps, w("residual.eps"));
      if (r.collapse !== undefined) oneOf(r.collapse, ["mean"], w("residual.collapse"));
    }
  }
  if (c.glu !== undefined) {
    const g = obj(c.glu, w("glu"));
    oneOf(g.kind, ["situ", "gelu_tanh"], w("glu.kind"));
    if (g.kind === "situ") {
      num(g.beta, w("glu.beta"));
      num(g.linearBeta, w("glu.linearBeta"));
    }
  }
  if (c.logitSoftcap !== undefined) num(c.logitSoftcap, w("logitSoftcap"));
  if (c.mtp !== undefined) int(obj(c.mtp, w("mtp")).layers, w("mtp.layers"), 1, 64);
  rules.validateFamily(c, where);
  if (c.bosId !== null) int(c.bosId, w("bosId"), 0, MAX_DIM);
  if (!Array.isArray(c.eosIds)) throw new Error(`${w("eosIds")}: expected a list`);
  c.eosIds.forEach((x, i) => int(x, `${w("eosIds")}[${i}]`, 0, MAX_DIM));
  return c as unknown as ModelConfig;
}

/**
 * Validates one tensor entry: dtype, shape, byte count, 64-byte alignment, inside `[0, limit)`;
 * a scaled format must carry the scale tensor `scaleSpecOf` names, and vq3r its `paddedCols`.
 */
function tensorEntry(v: unknown, where: string, limit: number): TensorEntry {
  const e = obj(v, where);
  if (!isStoredDtype(e.dtype)) throw new Error(`${where}.dtype: unknown dtype ${shown(e.dtype)}`);
  if (!Array.isArray(e.shape) || e.shape.length < 1 || e.shape.length > 4) {
    throw new Error(`${where}.shape: expected 1 to 4 dimensions`);
  }
  const shape = e.shape.map((d, i) => int(d, `${where}.shape[${i}]`, 0, MAX_DIM));
  const offset = int(e.offset, `${where}.offset`, 0, Number.MAX_SAFE_INTEGER);
  const bytes = int(e.bytes, `${where}.bytes`, 0, Number.MAX_SAFE_INTEGER);
  const need = storedBytes(e.dtype, shape);
  if (Number.isNaN(need)) {
    throw new Error(`${where}: ${e.dtype} cannot hold a tensor of shape [${shape}]`);
  }
  if (bytes !== need) {
    throw new Error(`${where}: ${e.dtype} [${shape}] needs ${need} bytes, entry says ${bytes}`);
  }
  if (offset % TENSOR_ALIGN || offset + bytes > limit) {
    throw new Error(`${where}: [${offset}, ${offset + bytes}) not 64-aligned inside [0, ${limit})`);
  }
  const out: TensorEntry = { dtype: e.dtype, shape, offset, bytes };
  const spec = scaleSpecOf(e.dtype, shape);
  if (spec) {
    if (shape.length !== 2) throw new Error(`${where}: an ${e.dtype} tensor must be 2-D`);
    const scale = tensorEntry(e.scale, `${where}.scale`, limit);
    if (
      scale.dtype !== spec.dtype || scale.scale || String(scale.shape) !== String(spec.shape)
    ) {
      throw new Error(`${where}.scale: expected an ${spec.dtype} tensor of shape [${spec.shape}]`);
    }
    out.scale = scale;
  } else if (e.scale !== undefined) {
    throw new Error(`${where}.scale: ${e.dtype} tensors have no scale`);
  }
  if (isCodebookDtype(e.dtype)) {
    const want = Math.ceil(shape[1] / VQ3R_DIM) * VQ3R_DIM;
    if (e.paddedCols !== want) {
      throw new Error(`${where}.paddedCols: expected ${want} for ${shape[1]} columns`);
    }
    out.paddedCols = want;
  } else if (e.paddedCols !== undefined) {
    throw new Error(`${where}.paddedCols: only vq3r and vq4p tensors have paddedCols`);
  }
  return out;
}

/** Every byte range of a set of entries (scales included), checked for overlaps. */
function checkNoOverlap(entries: [string, TensorEntry][], where: string): void {
  const spans: [number, number, string][] = [];
  for (const [name, e] of entries) {
    spans.push([e.offset, e.bytes, name]);
    if (e.scale) spans.push([e.scale.offset, e.scale.bytes, `${name}.scale`]);
  }
  spans.sort((a, b) => a[0] - b[0]);
  for (let i = 1; i < spans.length; i++) {
    if (spans[i][0] < spans[i - 1][0] + spans[i - 1][1]) {
      throw new Error(`${where}: tensor ${spans[i][2]} overlaps ${spans[i - 1][2]}`);
    }
  }
}

function region(v: unknown, where: string, fileBytes: number): Region {
  const r = obj(v, where);
  const offset = int(r.offset, `${where}.offset`, 0, fileBytes);
  const bytes = int(r.bytes, `${where}.bytes`, 0, fileBytes);
  if (offset % BLOCK_ALIGN || bytes % BLOCK_ALIGN || offset + bytes > fileBytes) {
    throw new Error(
      `${where}: [${offset}, ${
        offset + bytes
      }) must be 4096-aligned inside the ${fileBytes}-byte file`,
    );
  }
  return { offset, bytes, crc32: int(r.crc32, `${where}.crc32`, 0, 0xffffffff) };
}

function plainFileName(v: unknown, where: string): string {
  if (typeof v !== "string" || v === "" || /[\\/]/.test(v) || v.startsWith(".")) {
    throw new Error(`${where}: ${JSON.stringify(v)} is not a plain file name`);
  }
  return v;
}

function fileSize(path: string, where: string): number {
  try {
    return statSync(path).size;
  } catch {
    throw new Error(`${where}: file ${path} is missing`);
  }
}

/**
 * Parses and validates a manifest object against the files of the container `dir`, the config's
 * family parts and each layer's tensor set by `rules`.
 */
export function parseManifest(raw: unknown, dir: string, rules: FamilyRules): Manifest {
  const where = join(dir, "manifest.json");
  const m = obj(raw, where);
  if (m.format !== CONTAINER_FORMAT) throw new Error(`${where}: format is not "sluice"`);
  if (m.version !== CONTAINER_VERSION) {
    throw new Error(
      `${where}: version ${shown(m.version)}, this reader knows ${CONTAINER_VERSION}`,
    );
  }
  const config = validateModelConfig(m.config, `${where} config`, rules);
  rules.checkBounds(config, `${where} config`);
  const source = obj(m.source, `${where} source`);
  if (typeof source.fingerprint !== "string") {
    throw new Error(`${where} source.fingerprint: expected a string`);
  }

  const trunk = obj(m.trunk, `${where} trunk`);
  if (trunk.file !== TRUNK_FILE) throw new Error(`${where} trunk.file: expected ${TRUNK_FILE}`);
  const trunkBytes = fileSize(join(dir, TRUNK_FILE), `${where} trunk`);
  if (trunk.bytes !== trunkBytes) {
    throw new Error(
      `${where} trunk.bytes: ${shown(trunk.bytes)} but ${TRUNK_FILE} has ${trunkBytes}`,
    );
  }
  const g = obj(trunk.globals, `${where} trunk.globals`);
  const gRegion = region(g.region, `${where} trunk.globals.region`, trunkBytes);
  const gTensors = obj(g.tensors, `${where} trunk.globals.tensors`);
  const globals: Partial<Record<GlobalTensor, TensorEntry>> = {};
  const wantGlobals: GlobalTensor[] = globalTensorsOf(config);
  if (Object.keys(gTensors).sort().join() !== [...wantGlobals].sort().join()) {
    throw new Error(`${where} trunk.globals.tensors: expected exactly ${wantGlobals.join(", ")}`);
  }
  for (const k of wantGlobals) {
    const e = tensorEntry(gTensors[k], `${where} trunk.globals.tensors.${k}`, trunkBytes);
    checkSpec(e, rules.globalSpec(config, k), `${where} trunk.globals.tensors.${k}`);
    for (const span of [e, e.scale].filter((x) => x) as TensorEntry[]) {
      if (
        span.offset < gRegion.offset || span.offset + span.bytes > gRegion.offset + gRegion.bytes
      ) {
        throw new Error(`${where} trunk.globals.tensors.${k}: outside the globals region`);
      }
    }
    globals[k] = e;
  }
  checkNoOverlap(Object.entries(globals) as [string, TensorEntry][], `${where} trunk.globals`);

  if (!Array.isArray(trunk.layers) || trunk.layers.length !== config.numLayers) {
    throw new Error(`${where} trunk.layers: expected ${config.numLayers} runs`);
  }
  const regions: [number, number, string][] = [[gRegion.offset, gRegion.bytes, "globals"]];
  const layerRun = (v: unknown, l: number, at: string): LayerRun => {
    const r = region(v, at, trunkBytes);
    const t = obj(obj(v, at).tensors, `${at}.tensors`);
    const want = rules.layerTensors(config, l);
    if (Object.keys(t).sort().join() !== [...want].sort().join()) {
      throw new Error(`${at}.tensors: expected exactly ${want.join(", ")}`);
    }
    const tensors: Record<string, TensorEntry> = {};
    for (const k of want) {
      const e = tensorEntry(t[k], `${at}.tensors.${k}`, r.bytes);
      checkSpec(e, rules.layerSpec(config, k, l), `${at}.tensors.${k}`);
      tensors[k] = e;
    }
    checkNoOverlap(Object.entries(tensors), at);
    regions.push([r.offset, r.bytes, `layer ${l}`]);
    return { ...r, tensors };
  };
  const layers = trunk.layers.map((v, l) => layerRun(v, l, `${where} trunk.layers[${l}]`));
  // The MTP layers numLayers.. (docs/FORMAT.md), exactly when the config has them.
  const n = config.numLayers;
  const mtp = m.mtp === undefined ? undefined : obj(m.mtp, `${where} mtp`);
  if ((mtp === undefined) !== (config.mtp === undefined)) {
    throw new Error(`${where} mtp: present exactly when config.mtp is`);
  }
  const mtpCount = config.mtp?.layers ?? 0;
  if (mtp && (!Array.isArray(mtp.layers) || mtp.layers.length !== mtpCount)) {
    throw new Error(`${where} mtp.layers: expected ${mtpCount} runs`);
  }
  const mtpLayers = mtp
    ? (mtp.layers as unknown[]).map((v, j) => layerRun(v, n + j, `${where} mtp.layers[${j}]`))
    : [];
  regions.sort((a, b) => a[0] - b[0]);
  for (let i = 1; i < regions.length; i++) {
    if (regions[i][0] < regions[i - 1][0] + regions[i - 1][1]) {
      throw new Error(`${where} trunk: ${regions[i][2]} overlaps ${regions[i - 1][2]}`);
    }
  }

  let codebooks: Manifest["codebooks"];
  if (m.codebooks !== undefined) {
    const cb = obj(m.codebooks, `${where} codebooks`);
    if (cb.file !== CODEBOOKS_FILE) {
      throw new Error(`${where} codebooks.file: expected ${CODEBOOKS_FILE}`);
    }
    const size = fileSize(join(dir, CODEBOOKS_FILE), `${where} codebooks`);
    if (cb.bytes !== size) {
      throw new Error(
        `${where} codebooks.bytes: ${shown(cb.bytes)} but ${CODEBOOKS_FILE} has ${size}`,
      );
    }
    codebooks = { file: CODEBOOKS_FILE, bytes: size };
  }
  const codebookSpans: [number, number, string][] = [];

  if (!Array.isArray(m.experts) || m.experts.length !== config.numLayers) {
    throw new Error(`${where} experts: expected ${config.numLayers} entries`);
  }
  const bankOf = (v: unknown, l: number, at: string): ExpertBank | null => {
    if (layerKindOf(config, l) === "dense") {
      if (v !== null) throw new Error(`${at}: layer ${l} is dense, expected null`);
      return null;
    }
    const moe = config.moe!;
    const b = obj(v, at);
    int(b.layer, `${at}.layer`, l, l);
    if (b.file !== expertBankFile(l)) throw new Error(`${at}.file: expected ${expertBankFile(l)}`);
    const count = int(b.count, `${at}.count`, moe.numExperts, moe.numExperts);
    const stride = int(b.stride, `${at}.stride`, BLOCK_ALIGN, 2 ** 32 - 1);
    if (stride % BLOCK_ALIGN) throw new Error(`${at}.stride: ${stride} is not a multiple of 4096`);
    const format = isExpertFormat(b.format) ? b.format : null;
    if (!format) throw new Error(`${at}.format: unknown format ${shown(b.format)}`);
    const fallback = b.fallback === undefined ? undefined : obj(b.fallback, `${at}.fallback`);
    const cbs = b.codebooks === undefined ? undefined : obj(b.codebooks, `${at}.codebooks`);
    const size = fileSize(join(dir, b.file), at);
    if (size !== count * stride) {
      throw new Error(`${at}: ${b.file} has ${size} bytes, expected ${count} × ${stride}`);
    }
    const mats = obj(b.matrices, `${at}.matrices`);
    const matrices = {} as Record<ExpertMatrix, TensorEntry>;
    const fellBack: Partial<Record<ExpertMatrix, string>> = {};
    const refs: Partial<Record<ExpertMatrix, CodebookRef>> = {};
    for (const k of EXPERT_MATRICES) {
      const e = tensorEntry(mats[k], `${at}.matrices.${k}`, stride);
      const want = rules.expertShape(config, k);
      const reason = fallback?.[k];
      // A fallback matrix keeps a plain dtype; every other matrix has the bank's format.
      const dtypeOk = reason === undefined
        ? e.dtype === format
        : typeof reason === "string" && isCompactDtype(format) && !isCompactDtype(e.dtype);
      if (!dtypeOk || String(e.shape) !== String(want) || e.offset < RECORD_HEADER_BYTES) {
        throw new Error(
          `${at}.matrices.${k}: expected ${reason === undefined ? format : "a plain dtype"} ` +
            `[${want}] after the header`,
        );
      }
      if (reason !== undefined) fellBack[k] = reason as string;
      if (isCodebookDtype(e.dtype)) {
        const setBytes = CODEBOOK_BYTES[e.dtype];
        const r = obj(cbs?.[k], `${at}.codebooks.${k}`);
        const ref: CodebookRef = {
          offset: int(r.offset, `${at}.codebooks.${k}.offset`, 0, codebooks?.bytes ?? 0),
          bytes: int(r.bytes, `${at}.codebooks.${k}.bytes`, 0, codebooks?.bytes ?? 0),
          crc32: int(r.crc32, `${at}.codebooks.${k}.crc32`, 0, 0xffffffff),
        };
        if (
          !codebooks || ref.offset % BLOCK_ALIGN || ref.bytes !== setBytes ||
          ref.offset + ref.bytes > codebooks.bytes
        ) {
          throw new Error(
            `${at}.codebooks.${k}: expected ${setBytes} bytes at a 4096-aligned ` +
              `offset inside ${CODEBOOKS_FILE}`,
          );
        }
        codebookSpans.push([ref.offset, ref.bytes, `layer ${l} ${k} codebooks`]);
        refs[k] = ref;
      } else if (cbs?.[k] !== undefined) {
        throw new Error(`${at}.codebooks.${k}: only vq3r and vq4p matrices have codebooks`);
      }
      matrices[k] = e;
    }
    for (const k of Object.keys(fallback ?? {})) {
      if (!EXPERT_MATRICES.includes(k as ExpertMatrix)) {
        throw new Error(`${at}.fallback: ${k} is not an expert matrix`);
      }
    }
    let biases: Record<ExpertMatrix, TensorEntry> | undefined;
    if (moe.expertBias) {
      const bs = obj(b.biases, `${at}.biases`);
      biases = {} as Record<ExpertMatrix, TensorEntry>;
      for (const k of EXPERT_MATRICES) {
        const e = tensorEntry(bs[k], `${at}.biases.${k}`, stride);
        const rows = rules.expertShape(config, k)[0];
        if (e.dtype !== "f32" || String(e.shape) !== String([rows])) {
          throw new Error(`${at}.biases.${k}: expected f32 [${rows}]`);
        }
        biases[k] = e;
      }
    } else if (b.biases !== undefined) {
      throw new Error(`${at}.biases: this model's experts have no biases`);
    }
    checkNoOverlap(
      [
        ...Object.entries(matrices),
        ...Object.entries(biases ?? {}).map(([k, e]) => [`${k} bias`, e] as [string, TensorEntry]),
      ],
      at,
    );
    const bank: ExpertBank = { layer: l, file: b.file, count, stride, format, matrices };
    if (biases) bank.biases = biases;
    if (b.activations !== undefined) {
      if (b.activations !== "f32" || !EXACT_INPUT_FORMATS.includes(format)) {
        throw new Error(
          `${at}.activations: only "f32", on an ${EXACT_INPUT_FORMATS.join(" or ")} bank`,
        );
      }
      bank.activations = "f32";
    }
    // The field's name before int4g32 had an exact kernel; same meaning.
    if (b.mxfp4Activations !== undefined) {
      if (b.mxfp4Activations !== "f32" || format !== "mxfp4") {
        throw new Error(`${at}.mxfp4Activations: only "f32", on an mxfp4 bank`);
      }
      bank.activations = "f32";
    }
    if (Object.keys(fellBack).length) bank.fallback = fellBack;
    if (Object.keys(refs).length) bank.codebooks = refs;
    return bank;
  };
  const experts = m.experts.map((v, l) => bankOf(v, l, `${where} experts[${l}]`));
  if (mtp && (!Array.isArray(mtp.experts) || mtp.experts.length !== mtpCount)) {
    throw new Error(`${where} mtp.experts: expected ${mtpCount} entries`);
  }
  const mtpExperts = mtp
    ? (mtp.experts as unknown[]).map((v, j) => bankOf(v, n + j, `${where} mtp.experts[${j}]`))
    : [];
  codebookSpans.sort((a, b) => a[0] - b[0]);
  for (let i = 1; i < codebookSpans.length; i++) {
    if (codebookSpans[i][0] < codebookSpans[i - 1][0] + codebookSpans[i - 1][1]) {
      throw new Error(`${where}: ${codebookSpans[i][2]} overlaps ${codebookSpans[i - 1][2]}`);
    }
  }
  const pack = m.pack === undefined ? undefined : packSettings(m.pack, `${where} pack`);

  const tok = obj(m.tokenizer, `${where} tokenizer`);
  if (!Array.isArray(tok.files)) throw new Error(`${where} tokenizer.files: expected a list`);
  const files = tok.files.map((f, i) => {
    const name = plainFileName(f, `${where} tokenizer.files[${i}]`);
    fileSize(join(dir, name), `${where} tokenizer.files[${i}]`);
    return name;
  });
  return {
    format: CONTAINER_FORMAT,
    version: CONTAINER_VERSION,
    config,
    source: {
      config: source.config,
      generation_config: source.generation_config,
      fingerprint: source.fingerprint,
    },
    trunk: {
      file: TRUNK_FILE,
      bytes: trunkBytes,
      globals: { region: gRegion, tensors: globals },
      layers,
    },
    experts,
    ...(mtp ? { mtp: { layers: mtpLayers, experts: mtpExperts } } : {}),
    ...(codebooks ? { codebooks } : {}),
    ...(pack ? { pack } : {}),
    tokenizer: { files },
  };
}

function packSettings(v: unknown, where: string): PackSettings {
  const p = obj(v, where);
  const nullOr = <T extends string>(x: unknown, allowed: readonly T[], at: string): T | null =>
    x === null ? null : oneOf(x, allowed, at);
  const experts = p.experts === null ? null : isExpertFormat(p.experts) ? p.experts : undefined;
  if (experts === undefined) {
    throw new Error(`${where}.experts: unknown format ${shown(p.experts)}`);
  }
  return {
    convert: nullOr(p.convert, ["f32", "bf16"], `${where}.convert`),
    experts,
    trunk: nullOr(p.trunk, ["int8row"], `${where}.trunk`),
  };
}
