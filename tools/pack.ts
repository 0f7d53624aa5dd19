/**
 * `deno task pack <hf-dir> <out>.sluice [--convert f32|bf16] [--force]`: packs a Hugging Face
 * checkpoint into a sluice container (docs/FORMAT.md). Streams tensor by tensor with bounded
 * buffers, writes into `<out>.tmp/` and renames it into place at the end, and resumes an
 * interrupted pack layer by layer from the journal kept in the temporary directory.
 *
 * @module
 */

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
import { fp8ScaleInfo } from "../io/checkpoint_weights.ts";
import {
  CONTAINER_FORMAT,
  CONTAINER_VERSION,
  type ExpertBank,
  expertBankFile,
  type LayerRun,
  type Manifest,
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
  RECORD_HEADER_BYTES,
  type RecordMatrix,
  STORED_DTYPE_BYTES,
  type StoredDtype,
  TENSOR_ALIGN,
} from "../io/format.ts";
import { type Checkpoint, openCheckpoint, type TensorInfo } from "../io/safetensors.ts";
import { KEPT_DTYPE, scaleBytesF32, streamTensor } from "./pack_encode.ts";
import { formatBytes, Progress, type ProgressMode } from "./progress.ts";

/** Options of {@link packCheckpoint}. */
export interface PackOptions {
  /** Dequantise / convert every weight matrix to this dtype (norms and routers are f32 anyway). */
  convert?: "f32" | "bf16";
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
  globals: Region | null;
  layers: Record<string, Region>;
}

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

/** Makes the entry of `src` stored as `dtype`, with its FP8 scale entry when it keeps FP8. */
function entryFor(ckpt: Checkpoint, src: TensorInfo, dtype: StoredDtype): TensorEntry {
  const elems = src.shape.reduce((a, b) => a * b, 1);
  const e: TensorEntry = {
    dtype,
    shape: [...src.shape],
    offset: 0,
    bytes: elems * STORED_DTYPE_BYTES[dtype],
  };
  if (dtype === "f8_e4m3") {
    const s = fp8ScaleInfo(ckpt, src);
    e.scale = { dtype: "f32", shape: [...s.shape], offset: 0, bytes: s.shape[0] * s.shape[1] * 4 };
  }
  return e;
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
  banks: ({
    experts: Map<ExpertMatrix, TensorInfo>[];
    matrices: Record<ExpertMatrix, TensorEntry>;
    stride: number;
    format: StoredDtype;
  } | null)[];
  trunkBytes: number;
}

function planLayout(cfg: ModelConfig, ckpt: Checkpoint, convert: PackOptions["convert"]): Plan {
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
      items.set(t, { src, entry: entryFor(ckpt, src, storedDtype(src, role, convert)) });
    }
    const bytes = alignUp(Math.max(place([...items.values()], 0), 1), BLOCK_ALIGN);
    layers.push({ items, offset: cursor, bytes });
    cursor += bytes;
    banks.push(cfg.layerKinds[l] === "moe" ? planBank(cfg, ckpt, l, convert) : null);
  }
  return {
    globals: {
      items: gItems,
      region: { offset: 0, bytes: alignUp(Math.max(gEnd, 1), BLOCK_ALIGN) },
    },
    layers,
    banks,
    trunkBytes: cursor,
  };
}

function planBank(cfg: ModelConfig, ckpt: Checkpoint, l: number, convert: PackOptions["convert"]) {
  const moe = cfg.moe!;
  const experts: Map<ExpertMatrix, TensorInfo>[] = [];
  for (let e = 0; e < moe.numExperts; e++) {
    const mats = new Map<ExpertMatrix, TensorInfo>();
    for (const m of EXPERT_MATRICES) {
      const src = lookup(ckpt, hfExpertName(cfg, l, e, m), `layer ${l} expert ${e} ${m}`);
      checkShape(
        src,
        m === "down"
          ? [cfg.hiddenSize, moe.expertIntermediate]
          : [moe.expertIntermediate, cfg.hiddenSize],
      );
      const first = experts[0]?.get(m);
      if (first && first.dtype !== src.dtype) {
        throw new Error(
          `${src.file}: tensor ${src.name} is ${src.dtype}, expert 0's ${m} is ${first.dtype}`,
        );
      }
      mats.set(m, src);
    }
    experts.push(mats);
  }
  const placed = EXPERT_MATRICES.map((m): Placed => {
    const src = experts[0].get(m)!;
    return { src, entry: entryFor(ckpt, src, storedDtype(src, "weight", convert)) };
  });
  const formats = new Set(placed.map((p) => p.entry.dtype));
  if (formats.size !== 1) {
    throw new Error(`${ckpt.dir}: layer ${l}: experts mix dtypes ${[...formats].join(", ")}`);
  }
  const end = place(placed, RECORD_HEADER_BYTES);
  const matrices = Object.fromEntries(
    EXPERT_MATRICES.map((m, i) => [m, placed[i].entry]),
  ) as Record<ExpertMatrix, TensorEntry>;
  return { experts, matrices, stride: alignUp(end, BLOCK_ALIGN), format: placed[0].entry.dtype };
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

/** Writes all records of one expert bank into `path` (a temporary name the caller renames). */
function writeBank(
  ckpt: Checkpoint,
  l: number,
  bank: NonNullable<Plan["banks"][number]>,
  path: string,
  progress: Progress,
  chunk: number,
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
        const src = mats.get(m)!;
        let at = entry.offset;
        streamTensor(ckpt, src, entry.dtype, chunk, (b) => {
          record.set(b, at);
          at += b.length;
        });
        if (entry.scale) record.set(scaleBytesF32(ckpt, src), entry.scale.offset);
        payloadEnd = Math.max(
          payloadEnd,
          entry.scale ? entry.scale.offset + entry.scale.bytes : at,
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
  if (existsSync(out) && !opts.force) {
    throw new Error(`${out} already exists; pass --force to replace it`);
  }
  const cfg = loadModelConfig(src);
  const ckpt = openCheckpoint(src);
  try {
    const plan = planLayout(cfg, ckpt, convert);
    const fp = await fingerprint(src, ckpt);
    const tmp = out + ".tmp";
    let journal = existsSync(tmp) ? readJournal(tmp) : null;
    if (journal && (journal.fingerprint !== fp || journal.convert !== (convert ?? null))) {
      log(`pack: ${tmp} holds a pack of another source or options; starting over`);
      journal = null;
    }
    if (!journal) {
      rmSync(tmp, { recursive: true, force: true });
      mkdirSync(tmp, { recursive: true });
      journal = { fingerprint: fp, convert: convert ?? null, globals: null, layers: {} };
      writeJson(join(tmp, JOURNAL), journal);
    }
    const trunkPath = join(tmp, TRUNK_FILE);
    if (!existsSync(trunkPath)) writeFileSync(trunkPath, new Uint8Array(0));
    const fd = openSync(trunkPath, "r+");
    const resumed: number[] = [];
    const packed: number[] = [];
    try {
      ftruncateSync(fd, plan.trunkBytes);
      // Keep only journaled work that is still on disk and intact.
      if (journal.globals && !regionIntact(fd, journal.globals, chunk)) journal.globals = null;
      for (const [k, r] of Object.entries(journal.layers)) {
        const l = Number(k);
        const bank = plan.banks[l];
        const bankOk = !bank ||
          (existsSync(join(tmp, expertBankFile(l))) &&
            statSync(join(tmp, expertBankFile(l))).size === bank.stride * bank.experts.length);
        if (!bankOk || !regionIntact(fd, r, chunk)) delete journal.layers[k];
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
            const bankPath = join(tmp, expertBankFile(l));
            writeBank(ckpt, l, bank, bankPath + ".part", progress, chunk);
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
    }

    const manifest = buildManifest(src, cfg, plan, journal, fp);
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
    if (existsSync(out)) {
      const old = `${out}.old-${Deno.pid}`;
      renameSync(out, old);
      renameSync(tmp, out);
      rmSync(old, { recursive: true, force: true });
    } else {
      renameSync(tmp, out);
    }
    const containerBytes = plan.trunkBytes +
      plan.banks.reduce((n, b) => n + (b ? b.stride * b.experts.length : 0), 0);
    const seconds = (performance.now() - t0) / 1000;
    if (resumed.length) log(`pack: resumed ${resumed.length} finished layer(s) from ${tmp}`);
    log(`pack: wrote ${out} (${formatBytes(containerBytes)}) in ${seconds.toFixed(1)} s`);
    return { out, manifest, layersPacked: packed, layersResumed: resumed, containerBytes, seconds };
  } finally {
    ckpt.close();
  }
}

function buildManifest(
  src: string,
  cfg: ModelConfig,
  plan: Plan,
  journal: Journal,
  fp: string,
): Manifest {
  const globals: Partial<Record<GlobalTensor, TensorEntry>> = {};
  for (const [g, p] of plan.globals.items) globals[g] = p.entry;
  const layers: LayerRun[] = plan.layers.map((lp, l) => ({
    ...journal.layers[l],
    tensors: Object.fromEntries([...lp.items].map(([t, p]) => [t, p.entry])),
  }));
  const experts: (ExpertBank | null)[] = plan.banks.map((b, l) =>
    b
      ? {
        layer: l,
        file: expertBankFile(l),
        count: b.experts.length,
        stride: b.stride,
        format: b.format,
        matrices: b.matrices,
      }
      : null
  );
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
    tokenizer: { files: [] },
  };
}

const USAGE = "usage: deno task pack <hf-dir> <out>.sluice [--convert f32|bf16] [--force]";

async function main(args: string[]): Promise<number> {
  let parsed;
  try {
    parsed = parseArgs({
      args,
      allowPositionals: true,
      options: {
        convert: { type: "string" },
        force: { type: "boolean" },
        help: { type: "boolean" },
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
    await packCheckpoint(src, out, {
      convert: parsed.values.convert as PackOptions["convert"],
      force: parsed.values.force,
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
