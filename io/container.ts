/**
 * Reader of a `.sluice` container directory: opens it (its manifest parsed and validated as
 * untrusted input by io/manifest.ts) and offers positional reads of trunk tensors, expert records
 * and VQ3R codebooks, with CRC checks. docs/FORMAT.md describes the layout; io/manifest_schema.ts
 * has the manifest's types, re-exported here.
 *
 * @module
 */

import { closeSync, existsSync, openSync, readSync, statSync } from "node:fs";
import { join } from "node:path";
import {
  EXPERT_MATRICES,
  type ExpertMatrix,
  type GlobalTensor,
  type ModelConfig,
} from "./model_config.ts";
import { crc32 } from "./crc32.ts";
import { type RecordHeader, verifyRecord } from "./format.ts";
import { type FamilyRules, parseManifest } from "./manifest.ts";
import {
  CODEBOOKS_FILE,
  type ExpertBank,
  type Manifest,
  type Region,
  type TensorEntry,
  TRUNK_FILE,
} from "./manifest_schema.ts";

// The manifest parser and types live in their own modules; re-exported for existing importers.
export { type FamilyRules, parseManifest, validateModelConfig } from "./manifest.ts";
export * from "./manifest_schema.ts";

/** Largest manifest accepted. */
export const MAX_MANIFEST_BYTES = 64 * 1024 * 1024;

/** An opened container. */
export interface Container {
  dir: string;
  manifest: Manifest;
  config: ModelConfig;
  trunkPath: string;
  /** Path of a MoE layer's expert bank. */
  expertBankPath(layer: number): string;
}

/** Why `path`, which holds no manifest.json, is not a container: missing, a file, empty, or else. */
function notAContainer(path: string): string {
  let info: Deno.FileInfo;
  try {
    info = Deno.statSync(path);
  } catch {
    return `${path}: no such file or folder (a sluice container is a folder made by 'mod.ts pack')`;
  }
  if (!info.isDirectory) {
    return `${path}: a file, not a sluice container (a container is a folder made by 'mod.ts pack')`;
  }
  const names = [...Deno.readDirSync(path)].map((e) => e.name);
  if (names.length === 0) return `${path}: an empty folder, not a sluice container`;
  if (names.includes("config.json")) {
    return `${path}: a checkpoint folder, not a sluice container (no manifest.json); ` +
      `pack it first with 'mod.ts pack ${path} out.sluice'`;
  }
  return `${path}: not a sluice container (no manifest.json)`;
}

/**
 * Opens a container directory and validates its manifest against its files and the model family
 * `rules` (engine/container.ts binds the engine's family registry).
 */
export function readContainer(path: string, rules: FamilyRules): Container {
  const mPath = join(path, "manifest.json");
  if (!existsSync(mPath)) throw new Error(notAContainer(path));
  const size = statSync(mPath).size;
  if (size > MAX_MANIFEST_BYTES) {
    throw new Error(`${mPath}: ${size} bytes exceeds the ${MAX_MANIFEST_BYTES}-byte limit`);
  }
  let raw: unknown;
  try {
    raw = JSON.parse(Deno.readTextFileSync(mPath));
  } catch (e) {
    throw new Error(`${mPath}: not valid JSON (${(e as Error).message})`);
  }
  const manifest = parseManifest(raw, path, rules);
  return {
    dir: path,
    manifest,
    config: manifest.config,
    trunkPath: join(path, TRUNK_FILE),
    expertBankPath(layer: number): string {
      const bank = allBanks(manifest)[layer];
      if (!bank) throw new Error(`${path}: layer ${layer} has no expert bank`);
      return join(path, bank.file);
    },
  };
}

/** Reads `bytes` bytes at `offset` of `path`. */
export function readFileRange(path: string, offset: number, bytes: number): Uint8Array {
  const out = new Uint8Array(bytes);
  const fd = openSync(path, "r");
  try {
    let done = 0;
    while (done < bytes) {
      const n = readSync(fd, out, done, Math.min(bytes - done, 1 << 30), offset + done);
      if (n === 0) throw new Error(`${path}: unexpected end of file at byte ${offset + done}`);
      done += n;
    }
  } finally {
    closeSync(fd);
  }
  return out;
}

/** Reads one trunk tensor: a global (`layer` = "globals") or a layer tensor, without its scale. */
export function readTrunkTensor(
  c: Container,
  layer: number | "globals",
  name: string,
): { entry: TensorEntry; data: Uint8Array; scale?: Uint8Array } {
  const t = c.manifest.trunk;
  const base = layer === "globals" ? 0 : t.layers[layer]?.offset;
  const entry = layer === "globals"
    ? t.globals.tensors[name as GlobalTensor]
    : t.layers[layer]?.tensors[name];
  if (base === undefined || !entry) throw new Error(`${c.dir}: no trunk tensor ${layer}/${name}`);
  const data = readFileRange(c.trunkPath, base + entry.offset, entry.bytes);
  const scale = entry.scale
    ? readFileRange(c.trunkPath, base + entry.scale.offset, entry.scale.bytes)
    : undefined;
  return { entry, data, scale };
}

/** Reads and verifies one expert record (header and payload CRC); returns it with its header. */
export function readExpertRecord(
  c: Container,
  layer: number,
  expert: number,
): { record: Uint8Array; header: RecordHeader } {
  const bank = allBanks(c.manifest)[layer];
  if (!bank) throw new Error(`${c.dir}: layer ${layer} has no expert bank`);
  if (!Number.isInteger(expert) || expert < 0 || expert >= bank.count) {
    throw new Error(`${c.dir}: layer ${layer} has no expert ${expert}`);
  }
  const path = c.expertBankPath(layer);
  const offset = expert * bank.stride;
  const record = readFileRange(path, offset, bank.stride);
  const header = verifyRecord(record, { file: path, layer, expert, offset }, bank.stride);
  for (const m of EXPERT_MATRICES) {
    const h = header.matrices[m], e = bank.matrices[m];
    if (h.offset !== e.offset || h.bytes !== e.bytes || h.scaleOffset !== (e.scale?.offset ?? 0)) {
      throw new Error(
        `${path}: layer ${layer} expert ${expert}: ${m} placement differs from the manifest`,
      );
    }
  }
  return { record, header };
}

/** Verifies every CRC of a container: the globals region, each layer run and each record. */
export function verifyContainer(c: Container): void {
  const t = c.manifest.trunk;
  const check = (r: Region, what: string) => {
    const got = crc32(readFileRange(c.trunkPath, r.offset, r.bytes));
    if (got !== r.crc32) {
      throw new Error(`${c.trunkPath}: ${what} CRC mismatch at offset ${r.offset}`);
    }
  };
  check(t.globals.region, "globals region");
  [...t.layers, ...c.manifest.mtp?.layers ?? []].forEach((r, l) => check(r, `layer ${l} run`));
  allBanks(c.manifest).forEach((bank, l) => {
    if (!bank) return;
    for (let e = 0; e < bank.count; e++) readExpertRecord(c, l, e);
    for (const m of EXPERT_MATRICES) if (bank.codebooks?.[m]) readCodebooks(c, l, m);
  });
}

/**
 * Reads and CRC-checks the codebooks of one vq3r or vq4p matrix kind of a MoE layer: f32
 * [3][8][256] or [4][8][64], the kernels' dimension-major layout.
 */
export function readCodebooks(c: Container, layer: number, m: ExpertMatrix): Float32Array {
  const ref = allBanks(c.manifest)[layer]?.codebooks?.[m];
  if (!ref) throw new Error(`${c.dir}: layer ${layer} ${m} has no codebooks`);
  const path = join(c.dir, CODEBOOKS_FILE);
  const bytes = readFileRange(path, ref.offset, ref.bytes);
  if (crc32(bytes) !== ref.crc32) {
    throw new Error(`${path}: layer ${layer} ${m} codebooks CRC mismatch at offset ${ref.offset}`);
  }
  return new Float32Array(bytes.buffer, 0, ref.bytes / 4);
}

/**
 * Every expert bank of a manifest by layer: the main layers', then the MTP layers' (numLayers..,
 * manifest `mtp`); null for dense layers.
 */
export function allBanks(m: Manifest): (ExpertBank | null)[] {
  return [...m.experts, ...m.mtp?.experts ?? []];
}
