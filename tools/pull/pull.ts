/**
 * `pull`: a Hugging Face Hub checkpoint into a container without the whole checkpoint on disk.
 * The config, tokenizer and index files come first; every shard starts as a placeholder that holds
 * only its safetensors header (fetched with two Range requests) in a sparse file of the shard's
 * size, which is all the packer needs to plan the layout and fingerprint the source (INT4
 * matrices' tiny `weight_shape` tensors, which planning reads, are filled in from their
 * `weight_packed` headers and checked once the shard arrives). The packer
 * (tools/pack/) then runs on that folder and, before each step, the pull downloads the shards
 * the step reads and turns shards no later step reads back into placeholders, keeping at most
 * `keepShards` complete shards on disk. Staging lives in `<out>.pull/` with `pull.json`
 * recording the commit and the verified shards; the pack's own journal lives in `<out>.tmp/`, so
 * a rerun after any interruption resumes both.
 *
 * @module
 */

import {
  closeSync,
  existsSync,
  ftruncateSync,
  mkdirSync,
  openSync,
  readdirSync,
  readSync,
  renameSync,
  rmSync,
  statfsSync,
  statSync,
  writeSync,
} from "node:fs";
import { basename, dirname, join, resolve } from "node:path";
import { loadModelConfig } from "../../engine/config.ts";
import { MAX_TOKENIZER_FILE_BYTES } from "../../engine/tokenizer_bounds.ts";
import { readJsonObject, readJsonObjectIfExists, writeJson } from "../../io/json_file.ts";
import { openCheckpoint, readSafetensorsHeader, type TensorInfo } from "../../io/safetensors.ts";
import { packCheckpoint } from "../pack/pack_checkpoint.ts";
import { packOptionKey, type PackOptions, type PackResult } from "../pack/options.ts";
import { computeLayout } from "../pack/layout.ts";
import { CONFIG_FILES, TOKENIZER_FILES } from "../pack/side_files.ts";
import { formatBytes, Progress } from "../progress.ts";
import { Hub, type HubFile, type HubOptions, sha256File } from "./hub.ts";
import { Downloader } from "./downloader.ts";
import { actionsBefore, prefetchAfter, simulate, type Step, stepShards } from "./shards.ts";

/** Options of {@link pullModel}: the pack's, plus the shard bound and the Hub client's. */
export interface PullOptions
  extends Pick<PackOptions, "convert" | "experts" | "trunk" | "vq3r" | "force" | "progress"> {
  /** Most complete shards on disk at once (default 2). */
  keepShards?: number;
  hub?: HubOptions;
  /** Informational lines (default: stderr). */
  log?: (line: string) => void;
  /** Test hook: take the output's filesystem to have this many bytes free. */
  freeBytes?: number;
  /** Test hook: fail on purpose right after layer k is packed. */
  stopAfterLayer?: number;
}

/** What {@link pullModel} did. */
export interface PullResult {
  repo: string;
  commit: string;
  out: string;
  /** Bytes received over the network by this run. */
  downloadedBytes: number;
  containerBytes: number;
  /** The bound on shard bytes on disk at once, printed before the download. */
  boundBytes: number;
  /** Most shard bytes (complete and in progress) on disk at once, as measured. */
  peakShardBytes: number;
  /** Shards found complete and verified from an earlier run. */
  reusedShards: string[];
  seconds: number;
  pack: PackResult;
}

const INDEX = "model.safetensors.index.json";
const SINGLE = "model.safetensors";
const STATE = "pull.json";

interface PullState {
  repo: string;
  commit: string;
  /** Shards downloaded and verified, present in full. */
  complete: string[];
}

/** Parses `org/name[@revision]`. */
export function parseRepoSpec(spec: string): { repo: string; revision: string } {
  const m = /^([A-Za-z0-9][\w.-]*\/[\w.-]+)(?:@(.+))?$/.exec(spec);
  if (!m) throw new Error(`"${spec}" is not a Hub repo: expected org/name or org/name@revision`);
  return { repo: m[1], revision: m[2] ?? "main" };
}

/** Bytes a directory's files take on disk (allocated blocks, so sparse files count as such). */
function allocatedBytes(dir: string): number {
  if (!existsSync(dir)) return 0;
  let n = 0;
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    n += e.isDirectory() ? allocatedBytes(p) : (Deno.statSync(p).blocks ?? 0) * 512;
  }
  return n;
}

/** Pulls `spec` from the Hub and packs it into `out`. */
export async function pullModel(
  spec: string,
  out: string,
  opts: PullOptions = {},
): Promise<PullResult> {
  const t0 = performance.now();
  const log = opts.log ?? ((s: string) => console.error(s));
  const keep = opts.keepShards ?? 2;
  if (!Number.isInteger(keep) || keep < 1) throw new Error(`--keep-shards must be ≥ 1`);
  const { repo, revision } = parseRepoSpec(spec);
  packOptionKey(opts); // bad --experts / --trunk / --convert fail before any download
  if (existsSync(out) && !opts.force) {
    throw new Error(`${out} already exists; pass --force to replace it`);
  }
  const hub = new Hub({ log, ...opts.hub });
  const rev = await hub.revision(repo, revision);
  const stage = `${resolve(out)}.pull`;
  const statePath = join(stage, STATE);
  let state = existsSync(statePath) ? readJsonObject(statePath) as unknown as PullState : null;
  if (state && (state.repo !== repo || state.commit !== rev.commit)) {
    log(`pull: ${stage} holds ${state.repo}@${state.commit}; starting over for ${rev.commit}`);
    rmSync(stage, { recursive: true, force: true });
    state = null;
  }
  mkdirSync(stage, { recursive: true });
  const complete = new Set(state?.complete ?? []);
  const saveState = () =>
    writeJson(statePath, { repo, commit: rev.commit, complete: [...complete] });
  saveState();
  let downloaded = 0;
  let peak = 0;
  /** Bytes the complete shards and the partial downloads take on disk (what the bound bounds). */
  const shardBytes = () => {
    let n = 0;
    for (const e of readdirSync(stage)) {
      if (complete.has(e) || e.endsWith(".safetensors.incomplete")) {
        n += statSync(join(stage, e)).size;
      }
    }
    return n;
  };
  const fileOf = (path: string): HubFile => {
    const f = rev.files.get(path);
    if (!f) throw new Error(`${repo}@${revision}: the repo has no ${path}`);
    return f;
  };
  const downloader = new Downloader(opts.hub ?? {}, log);
  /**
   * Downloads shard `f` in the worker, so it proceeds while the main thread packs; with a
   * progress bar when the caller waits for it, else one line when it is done. Checks and renames
   * it into place, and records it as complete.
   */
  const fetchShard = (f: HubFile, foreground: boolean): Promise<void> => {
    const part = join(stage, `${f.path}.incomplete`);
    const label = `download ${f.path} (${shardNames.indexOf(f.path) + 1}/${shardNames.length})`;
    const progress = foreground
      ? new Progress({ label, total: f.size, mode: opts.progress ?? "auto" })
      : null;
    if (existsSync(part)) progress?.add(statSync(part).size);
    const t1 = performance.now();
    return downloader.download(rev, f, part, (n) => {
      if (n > 0) progress?.add(n);
    }).then((fetched) => {
      downloaded += fetched;
      progress?.finish();
      checkShapes(part, f.path, shapes.get(f.path));
      renameSync(part, join(stage, f.path));
      complete.add(f.path);
      saveState();
      peak = Math.max(peak, shardBytes());
      if (!progress) {
        const secs = (performance.now() - t1) / 1000;
        log(
          `pull: ${label} done in the background: ${formatBytes(f.size)}, ` +
            `${(fetched / secs / 1e6).toFixed(1)} MB/s`,
        );
      }
    });
  };

  // Small files: config, tokenizer, chat template, index.
  if (!rev.files.has("config.json")) {
    throw new Error(`${repo}@${revision}: no config.json, so this is not a transformers model`);
  }
  const outDir = dirname(resolve(out));
  const freeBytes = () => {
    if (opts.freeBytes !== undefined) return opts.freeBytes;
    const fs = statfsSync(outDir);
    return Number(fs.bavail) * Number(fs.bsize);
  };
  for (const name of [...CONFIG_FILES, ...TOKENIZER_FILES, INDEX]) {
    const f = rev.files.get(name);
    if (f && !(Number.isSafeInteger(f.size) && f.size >= 0 && f.size <= MAX_TOKENIZER_FILE_BYTES)) {
      throw new Error(
        `${repo}@${revision}: ${name} declares ${f.size} bytes; at most ` +
          `${formatBytes(MAX_TOKENIZER_FILE_BYTES)} is accepted`,
      );
    }
    if (!f || (existsSync(join(stage, name)) && statSync(join(stage, name)).size === f.size)) {
      continue;
    }
    const part = join(stage, `${name}.incomplete`);
    downloaded += await hub.download(rev, f, part, () => {});
    renameSync(part, join(stage, name));
  }
  const shardNames = rev.files.has(INDEX)
    ? [...new Set(Object.values(readShardIndex(join(stage, INDEX))))].sort()
    : rev.files.has(SINGLE)
    ? [SINGLE]
    : [];
  // Remote names become paths below the stage: each is checked before any file is touched.
  for (const name of shardNames) checkShardName(name, `${repo}@${revision}: ${INDEX}`);
  if (shardNames.length === 0) {
    throw new Error(`${repo}@${revision}: neither ${INDEX} nor ${SINGLE} is in the repo`);
  }
  const shards = new Map(shardNames.map((n) => [n, fileOf(n)]));
  const sizes = new Map(shardNames.map((n) => [n, shards.get(n)!.size]));
  // Declared sizes are checked before any shard file is made: a shard must fit on the disk whole.
  const free0 = freeBytes();
  for (const [name, size] of sizes) {
    if (!Number.isSafeInteger(size) || size < 8) {
      throw new Error(`${repo}@${revision}: ${name}: the file list declares ${size} bytes`);
    }
    if (size > free0) {
      throw new Error(
        `${repo}@${revision}: ${name} declares ${formatBytes(size)}, more than the ` +
          `${formatBytes(free0)} free in ${outDir}; no shard was downloaded`,
      );
    }
  }

  // Complete shards from an earlier run are kept only when size and sha256 still match.
  const reused: string[] = [];
  for (const name of [...complete]) {
    const f = shards.get(name);
    const p = join(stage, name);
    const ok = f && existsSync(p) && statSync(p).size === f.size &&
      (f.sha256 === null || sha256File(p) === f.sha256);
    if (ok) reused.push(name);
    else complete.delete(name);
  }
  saveState();
  const headers = new Map<string, Uint8Array>();
  let shapes = new Map<string, ShapeFill[]>();
  // A shard becomes a placeholder: its header (read from the complete file when `local`, else
  // fetched) in a sparse file of its full size.
  const placeholder = async (name: string, local = false) => {
    let header = headers.get(name);
    if (!header && local) header = readHeader(join(stage, name));
    if (!header) {
      const len = new DataView((await hub.range(rev, name, 0, 8)).buffer).getBigUint64(0, true);
      if (len > BigInt(sizes.get(name)! - 8)) {
        throw new Error(`${repo}: ${name}: header length ${len} exceeds the file`);
      }
      header = new Uint8Array(8 + Number(len));
      header.set(await hub.range(rev, name, 0, 8 + Number(len)));
      headers.set(name, header);
    }
    const tmp = join(stage, `${name}.placeholder`);
    const fd = openSync(tmp, "w");
    try {
      writeSync(fd, header);
      ftruncateSync(fd, sizes.get(name)!);
    } finally {
      closeSync(fd);
    }
    renameSync(tmp, join(stage, name));
  };
  for (const name of shardNames) {
    if (complete.has(name)) continue;
    await placeholder(name);
  }
  // Planning reads INT4 matrices' `weight_shape` tensors; a placeholder gets the only value its
  // `weight_packed` header allows, and the real shard is checked against it once downloaded.
  shapes = int4Shapes(stage, shardNames);
  for (const name of shardNames) {
    if (!complete.has(name)) writeShapes(join(stage, name), shapes.get(name));
  }

  // Plan the container from the headers alone, and the shards each pack step reads.
  const cfg = loadModelConfig(stage);
  const ckpt = openCheckpoint(stage);
  let containerBytes: number, need: Set<string>[], steps: Step[];
  try {
    const layout = computeLayout(cfg, ckpt, opts);
    containerBytes = layout.trunkBytes + layout.codebooksBytes +
      layout.banks.reduce((n, b) => n + (b ? b.stride * b.experts.length : 0), 0);
    ({ steps, need } = stepShards(ckpt, layout));
  } finally {
    ckpt.close();
  }
  const schedule = simulate(need, new Set(complete), keep, sizes);
  peak = shardBytes();
  const biggest = Math.max(...sizes.values());
  const total = [...sizes.values()].reduce((a, b) => a + b, 0);
  log(
    `pull: ${repo}@${revision} (${rev.commit.slice(0, 12)}): ${shardNames.length} shard(s), ` +
      `${formatBytes(total)}; container ${formatBytes(containerBytes)}; peak extra disk ` +
      `${formatBytes(schedule.peakBytes)} (${schedule.peakShards} shard(s) at once, ` +
      `--keep-shards ${keep}, largest shard ${formatBytes(biggest)})` +
      (schedule.refetched.length ? `; ${schedule.refetched.length} shard(s) fetched twice` : ""),
  );
  if (schedule.peakShards > keep) {
    log(`pull: one pack step reads ${schedule.peakShards} shards, more than --keep-shards ${keep}`);
  }
  const free = freeBytes();
  const present = allocatedBytes(`${resolve(out)}.tmp`) + shardBytes();
  const needed = containerBytes + schedule.peakBytes - present;
  if (needed > free) {
    throw new Error(
      `${outDir} has ${formatBytes(free)} free; the pull needs ${formatBytes(needed)} more ` +
        `(container ${formatBytes(containerBytes)} + peak shards ${
          formatBytes(schedule.peakBytes)
        }); lower --keep-shards or free space`,
    );
  }

  const live = new Set(complete);
  const inflight = new Map<string, Promise<void>>();
  const settle = async (name: string) => {
    const p = inflight.get(name);
    inflight.delete(name);
    await p;
  };
  const beforeStep = async (step: Step) => {
    const i = steps.indexOf(step);
    peak = Math.max(peak, shardBytes());
    const { evict, fetch } = actionsBefore(i, need, live, keep);
    for (const name of evict) {
      await settle(name);
      // Forget the shard before replacing it: a crash in between must not leave it "complete".
      complete.delete(name);
      saveState();
      await placeholder(name, true);
    }
    for (const name of need[i]) await settle(name);
    for (const name of fetch) await fetchShard(shards.get(name)!, true);
    const ahead = prefetchAfter(i, need, live, keep);
    if (ahead !== null) {
      const p = fetchShard(shards.get(ahead)!, false);
      p.catch(() => {}); // awaited (and its error thrown) when a step needs the shard
      inflight.set(ahead, p);
    }
    peak = Math.max(peak, shardBytes());
  };
  let pack: PackResult;
  try {
    pack = await packCheckpoint(stage, out, {
      convert: opts.convert,
      experts: opts.experts,
      trunk: opts.trunk,
      vq3r: opts.vq3r,
      force: opts.force,
      progress: opts.progress,
      log,
      beforeStep,
      stopAfterLayer: opts.stopAfterLayer,
    });
  } finally {
    // A failed pack leaves background downloads half done: they resume on the next run.
    downloader.close();
  }
  rmSync(stage, { recursive: true, force: true });
  const seconds = (performance.now() - t0) / 1000;
  log(
    `pull: done in ${seconds.toFixed(1)} s: downloaded ${formatBytes(downloaded)}` +
      (reused.length ? ` (${reused.length} shard(s) reused)` : "") +
      `, wrote ${formatBytes(pack.containerBytes)}, peak shards on disk ${formatBytes(peak)} ` +
      `(bound ${formatBytes(schedule.peakBytes)})`,
  );
  return {
    repo,
    commit: rev.commit,
    out,
    downloadedBytes: downloaded,
    containerBytes: pack.containerBytes,
    boundBytes: schedule.peakBytes,
    peakShardBytes: peak,
    reusedShards: reused,
    seconds,
    pack,
  };
}

/** An INT4 matrix's `weight_shape` tensor and the value its `weight_packed` tensor implies. */
interface ShapeFill {
  name: string;
  /** Byte offset in the shard. */
  offset: number;
  bytes: Uint8Array;
}

/** The `weight_shape` values each shard's INT4 matrices must hold, from the headers alone. */
function int4Shapes(stage: string, shards: string[]): Map<string, ShapeFill[]> {
  const all = new Map<string, TensorInfo>();
  for (const s of shards) for (const t of readSafetensorsHeader(join(stage, s))) all.set(t.name, t);
  const out = new Map<string, ShapeFill[]>();
  for (const t of all.values()) {
    if (!t.name.endsWith("_shape") || String(t.shape) !== "2") continue;
    const packed = all.get(`${t.name.slice(0, -"_shape".length)}_packed`);
    if (!packed || packed.shape.length !== 2 || (t.dtype !== "I32" && t.dtype !== "I64")) continue;
    const dims = [packed.shape[0], packed.shape[1] * 8];
    const bytes = t.dtype === "I32"
      ? new Uint8Array(new Int32Array(dims).buffer)
      : new Uint8Array(new BigInt64Array(dims.map(BigInt)).buffer);
    const shard = basename(t.file);
    out.set(shard, [...(out.get(shard) ?? []), { name: t.name, offset: t.offset, bytes }]);
  }
  return out;
}

function writeShapes(path: string, fills: ShapeFill[] | undefined): void {
  if (!fills?.length) return;
  const fd = openSync(path, "r+");
  try {
    for (const f of fills) writeSync(fd, f.bytes, 0, f.bytes.length, f.offset);
  } finally {
    closeSync(fd);
  }
}

/** Throws unless a downloaded shard's `weight_shape` tensors hold what planning assumed. */
function checkShapes(path: string, shard: string, fills: ShapeFill[] | undefined): void {
  if (!fills?.length) return;
  const fd = openSync(path, "r");
  try {
    for (const f of fills) {
      const got = new Uint8Array(f.bytes.length);
      readSync(fd, got, 0, got.length, f.offset);
      if (!got.every((b, i) => b === f.bytes[i])) {
        throw new Error(
          `${shard}: tensor ${f.name} does not match the shape of its weight_packed tensor ` +
            `(expected rows and 8 × packed columns)`,
        );
      }
    }
  } finally {
    closeSync(fd);
  }
}

/** The length prefix and JSON header of a safetensors file. */
function readHeader(path: string): Uint8Array {
  const fd = openSync(path, "r");
  try {
    const len = new Uint8Array(8);
    readSync(fd, len, 0, 8, 0);
    const n = 8 + Number(new DataView(len.buffer).getBigUint64(0, true));
    const header = new Uint8Array(n);
    if (readSync(fd, header, 0, n, 0) !== n) throw new Error(`${path}: truncated header`);
    return header;
  } finally {
    closeSync(fd);
  }
}

/**
 * Throws unless `name` (a shard named by the remote index) is a plain file name of a safetensors
 * shard: no folder part, not absolute, no `..`, no control characters. A hostile repository could
 * otherwise make the pull write outside its folder.
 */
export function checkShardName(name: unknown, where: string): void {
  const ok = typeof name === "string" && name.length > 0 && name.length <= 255 &&
    name.endsWith(".safetensors") && !name.startsWith(".") && !/[/\\]/.test(name) &&
    [...name].every((c) => c.charCodeAt(0) >= 0x20);
  if (!ok) {
    throw new Error(
      `${where}: invalid shard name ${JSON.stringify(name)}: expected a plain file name ending ` +
        `in .safetensors (no folder, no "..", not absolute); refusing to write it`,
    );
  }
}

/** The `weight_map` of a shard index: tensor name → shard file. */
function readShardIndex(path: string): Record<string, string> {
  const map = readJsonObjectIfExists(path).weight_map;
  if (!map || typeof map !== "object") throw new Error(`${path}: no weight_map`);
  return map as Record<string, string>;
}
