/**
 * Splits the expert banks of a container across several directories (one per disk), so that
 * expert reads spread over devices: expert e of every MoE layer goes to directory e % n, at
 * offset floor(e / n) × stride of a file with the bank's own name. Run the model with
 * `RunOptions.shards` (or `--shards`) naming the same directories in the same order.
 *
 * `deno task split-banks <x.sluice> <dirA,dirB,...> [--progress auto|tty|lines|off]`
 *
 * @module
 */
import {
  closeSync,
  fsyncSync,
  lstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  readSync,
  realpathSync,
  renameSync,
  statSync,
  unlinkSync,
  writeSync,
} from "node:fs";
import { join, resolve } from "node:path";
import { HELP_FLAG, helpShown, parseCommandArgs } from "./cli/args.ts";
import { type Container, type ExpertBank } from "../io/container.ts";
import { openContainer } from "../engine/container.ts";
import { Progress, type ProgressMode } from "./progress.ts";
import { isContainerDir } from "./pack/output_guard.ts";

/** Options of {@link splitBanks}. */
export interface SplitBanksOptions {
  /** Progress display (default "auto"). */
  progress?: ProgressMode;
  /** Sink for one-line notices (default: stderr). */
  log?: (line: string) => void;
  /** Replace shard files an earlier split left in the folders (nothing else is ever replaced). */
  force?: boolean;
}

/** What {@link splitBanks} wrote. */
export interface SplitBanksResult {
  /** MoE layers split. */
  layers: number;
  /** Records written (and verified) over all shards. */
  records: number;
  /** Bytes written over all shards. */
  bytes: number;
  /** Every shard file written, shard by shard within each layer. */
  files: string[];
}

/** Records of a bank that shard `shard` of `n` holds: experts shard, shard + n, ... */
export function shardRecordCount(count: number, shard: number, n: number): number {
  return shard < count ? Math.ceil((count - shard) / n) : 0;
}

/** Reads exactly `len` bytes at `pos` of `fd` into `buf`, or throws naming `path`. */
function readFully(fd: number, buf: Uint8Array, len: number, pos: number, path: string): void {
  for (let done = 0; done < len;) {
    const n = readSync(fd, buf, done, len - done, pos + done);
    if (n === 0) throw new Error(`${path}: unexpected end of file at byte ${pos + done}`);
    done += n;
  }
}

function writeFully(fd: number, buf: Uint8Array, pos: number): void {
  for (let done = 0; done < buf.length;) {
    done += writeSync(fd, buf, done, buf.length - done, pos + done);
  }
}

/**
 * The shard directories as given, created if missing. Rejects duplicates, the container, and a
 * folder holding anything but this split's own shard files (regular files, replaced only with
 * `force`): a split must never destroy another container or anyone's files.
 */
function prepareDirs(c: Container, dirs: string[], own: Set<string>, force: boolean): string[] {
  if (dirs.length === 0) throw new Error("split-banks: no shard directories given");
  const containerDir = realpathSync(c.dir);
  const seen = new Set<string>();
  for (const d of dirs) {
    const kind = (() => {
      try {
        return Deno.statSync(d);
      } catch {
        return null;
      }
    })();
    if (kind && !kind.isDirectory) throw new Error(`split-banks: ${d} is not a folder`);
    if (kind && realpathSync(d) !== containerDir) {
      if (isContainerDir(d)) {
        throw new Error(
          `split-banks: shard directory ${d} is a sluice container; give an empty or new folder`,
        );
      }
      for (const name of readdirSync(d)) {
        const mine = own.has(name.replace(/\.tmp-\d+$/, ""));
        if (!mine) {
          throw new Error(
            `split-banks: shard directory ${d} holds ${name}, which is not a shard file of ` +
              `this split; give an empty or new folder`,
          );
        }
        if (!lstatSync(join(d, name)).isFile()) {
          throw new Error(
            `split-banks: ${join(d, name)} is not a regular file; remove it yourself`,
          );
        }
        if (!force && own.has(name)) {
          throw new Error(
            `split-banks: ${join(d, name)} exists (an earlier split?); pass --force to replace ` +
              `the shard files`,
          );
        }
      }
    }
    mkdirSync(d, { recursive: true });
    const real = realpathSync(d);
    if (real === containerDir) {
      throw new Error(`split-banks: shard directory ${d} is the container itself`);
    }
    if (seen.has(real)) throw new Error(`split-banks: shard directory ${d} is given twice`);
    seen.add(real);
  }
  return dirs.map((d) => resolve(d));
}

/**
 * Writes one layer's shard files: reads the bank in groups of n consecutive records (one
 * sequential read each) and appends record g·n + i to shard i at g × stride. Each shard is
 * written to a temporary name, synced and renamed into place.
 */
function splitLayer(
  src: string,
  bank: ExpertBank,
  dirs: string[],
  progress: Progress,
): string[] {
  const n = dirs.length;
  const { stride, count } = bank;
  const finals = dirs.map((d) => join(d, bank.file));
  const temps = finals.map((f) => `${f}.tmp-${Deno.pid}`);
  const fds: number[] = [];
  const srcFd = openSync(src, "r");
  /** Runs a write step on shard `i`, naming its file (not the temporary name) on failure. */
  const onShard = (i: number, f: () => void) => {
    try {
      f();
    } catch (e) {
      const m = (e as Error).message.replace(temps[i], finals[i]);
      throw new Error(`${finals[i]}: cannot write the shard file (${m})`);
    }
  };
  try {
    temps.forEach((t, i) => onShard(i, () => fds.push(openSync(t, "wx"))));
    const group = new Uint8Array(n * stride);
    for (let g = 0; g * n < count; g++) {
      const inGroup = Math.min(n, count - g * n);
      readFully(srcFd, group, inGroup * stride, g * n * stride, src);
      for (let i = 0; i < inGroup; i++) {
        const part = group.subarray(i * stride, (i + 1) * stride);
        onShard(i, () => writeFully(fds[i], part, g * stride));
      }
      progress.add(inGroup * stride);
    }
    fds.forEach((fd, i) => onShard(i, () => fsyncSync(fd)));
  } catch (e) {
    for (const t of temps) {
      try {
        unlinkSync(t);
      } catch {
        // Never created, or already gone.
      }
    }
    throw e;
  } finally {
    for (const fd of fds) closeSync(fd);
    closeSync(srcFd);
  }
  temps.forEach((t, i) => renameSync(t, finals[i]));
  return finals;
}

/**
 * Checks that every shard holds exactly its records, byte for byte equal to the source bank of
 * the container: shard i of n has ceil((count − i) / n) records and record e at
 * floor(e / n) × stride. Throws naming the file, layer and expert of the first difference.
 */
export function verifyShards(
  containerPath: string,
  dirs: string[],
  progress?: Progress,
): number {
  const c = openContainer(containerPath);
  const n = dirs.length;
  let records = 0;
  for (const bank of c.manifest.experts) {
    if (!bank) continue;
    const src = c.expertBankPath(bank.layer);
    const { stride, count } = bank;
    const paths = dirs.map((d) => join(d, bank.file));
    paths.forEach((p, i) => {
      const want = shardRecordCount(count, i, n) * stride;
      let size: number;
      try {
        size = statSync(p).size;
      } catch {
        throw new Error(`${p}: shard ${i} of layer ${bank.layer} is missing`);
      }
      if (size !== want) {
        throw new Error(
          `${p}: shard ${i} of layer ${bank.layer} has ${size} bytes, expected ${want}`,
        );
      }
    });
    const srcFd = openSync(src, "r");
    const fds = paths.map((p) => openSync(p, "r"));
    try {
      const a = new Uint8Array(stride), b = new Uint8Array(stride);
      for (let e = 0; e < count; e++) {
        const shard = e % n, at = Math.floor(e / n) * stride;
        readFully(srcFd, a, stride, e * stride, src);
        readFully(fds[shard], b, stride, at, paths[shard]);
        if (!bytesEqual(a, b)) {
          throw new Error(
            `${paths[shard]}: layer ${bank.layer} expert ${e} at offset ${at} differs from ` +
              `${src} offset ${e * stride}`,
          );
        }
        records++;
        progress?.add(stride);
      }
    } finally {
      for (const fd of fds) closeSync(fd);
      closeSync(srcFd);
    }
  }
  return records;
}

function bytesEqual(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  // Compare 4 bytes at a time where alignment allows; records are 4 KiB multiples.
  if (a.length % 4 === 0 && a.byteOffset % 4 === 0 && b.byteOffset % 4 === 0) {
    const x = new Uint32Array(a.buffer, a.byteOffset, a.length / 4);
    const y = new Uint32Array(b.buffer, b.byteOffset, b.length / 4);
    for (let i = 0; i < x.length; i++) if (x[i] !== y[i]) return false;
    return true;
  }
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/**
 * Splits every expert bank of the container at `containerPath` across `dirs` (created if
 * missing), then byte-verifies every record of every shard against the source bank.
 */
export function splitBanks(
  containerPath: string,
  dirs: string[],
  opts: SplitBanksOptions = {},
): SplitBanksResult {
  const c = openContainer(containerPath);
  const banks = c.manifest.experts.filter((b): b is ExpertBank => b !== null);
  const own = new Set(banks.map((b) => b.file));
  const shardDirs = prepareDirs(c, dirs, own, opts.force ?? false);
  const log = opts.log ?? ((line: string) => console.error(line));
  if (banks.length === 0) throw new Error(`${containerPath}: the model has no expert banks`);
  const total = banks.reduce((s, b) => s + b.count * b.stride, 0);
  log(
    `split-banks: ${banks.length} banks, ${(total / 2 ** 30).toFixed(2)} GiB into ` +
      `${shardDirs.length} shards`,
  );
  const files: string[] = [];
  const write = new Progress({ label: "split", total, mode: opts.progress });
  for (const bank of banks) {
    files.push(...splitLayer(c.expertBankPath(bank.layer), bank, shardDirs, write));
  }
  write.finish();
  const check = new Progress({ label: "verify", total, mode: opts.progress });
  const records = verifyShards(containerPath, shardDirs, check);
  check.finish();
  log(`split-banks: ${records} records verified; run with --shards ${shardDirs.join(",")}`);
  return { layers: banks.length, records, bytes: total, files };
}

/** Runs the split-banks command with command-line `args`; returns the exit code. */
export function splitBanksCommand(args: string[]): Promise<number> {
  const usage = "usage: deno run -A mod.ts split-banks <x.sluice> <dirA,dirB,...> " +
    "[--progress auto|tty|lines|off] [--force]\n\n" +
    "Each folder must be new, empty or hold only this split's shard files (replaced with --force).";
  const a = parseCommandArgs("split-banks", args, {
    progress: { type: "string" },
    force: { type: "boolean" },
    ...HELP_FLAG,
  }, { positionals: true });
  if (helpShown(a, usage)) return Promise.resolve(0);
  if (a.positionals.length !== 2) {
    console.error(usage);
    return Promise.resolve(2);
  }
  const progress = a.oneOf("progress", ["auto", "tty", "lines", "off"] as const) ?? "auto";
  const dirs = a.positionals[1].split(",").filter((d) => d !== "");
  splitBanks(a.positionals[0], dirs, {
    progress: progress as ProgressMode,
    force: a.bool("force"),
  });
  return Promise.resolve(0);
}

if (import.meta.main) {
  try {
    Deno.exit(await splitBanksCommand(Deno.args));
  } catch (e) {
    console.error(`split-banks: ${(e as Error).message}`);
    Deno.exit(1);
  }
}
