/**
 * `bench pack [--size 1G] [--json]`: pack throughput against the disk's own sequential write, in
 * one run. A synthetic bf16 Qwen3-MoE checkpoint of `--size` is made in a temporary directory on
 * the cache disk ($SLUICE_CACHE or /tmp/sluice-bench), packed once (MB/s of container written),
 * then `dd oflag=direct bs=4M conv=fdatasync` copies the checkpoint's largest shard (just written,
 * so read from the page cache; real data, since a virtual disk may shortcut zeros) to the same
 * disk. Everything it made is removed at the end. Target (issue 16): pack ÷ disk write ≥ 0.8.
 *
 * @module
 */
import { mkdirSync, rmSync, statSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { packCheckpoint } from "../../pack.ts";
import { parseSize, synthCheckpoint } from "../../synth.ts";

/** Issue 16: pack throughput ÷ the disk's sequential write. */
export const PACK_TARGET = 0.8;

/** What {@link benchPack} measured. */
export interface PackBenchResult {
  checkpoint_bytes: number;
  container_bytes: number;
  pack_seconds: number;
  /** Container MB (1e6 bytes) written per second of the pack. */
  pack_mb_s: number;
  /** dd's sequential O_DIRECT write of the checkpoint's largest shard, MB/s; null on failure. */
  disk_write_mb_s: number | null;
  ratio: number | null;
  target: number;
  load_average: number;
}

/** dd's MB/s copying `src` to `path` with O_DIRECT and a final fdatasync; null on failure. */
function ddWriteMbS(src: string, path: string): number | null {
  const bytes = statSync(src).size;
  const t0 = performance.now();
  try {
    const out = new Deno.Command("dd", {
      args: [`if=${src}`, `of=${path}`, "bs=4M", "oflag=direct", "conv=fdatasync"],
      stdout: "null",
      stderr: "null",
    }).outputSync();
    if (!out.success) return null;
  } catch {
    return null;
  }
  return bytes / ((performance.now() - t0) / 1000) / 1e6;
}

/** Makes and packs a synthetic checkpoint, dd-copies its largest shard, removes it all. */
export async function benchPack(
  size: number,
  log: (line: string) => void,
): Promise<PackBenchResult> {
  const cache = Deno.env.get("SLUICE_CACHE") ?? "/tmp/sluice-bench";
  mkdirSync(cache, { recursive: true });
  const dir = Deno.makeTempDirSync({ dir: cache, prefix: "bench-pack-" });
  try {
    const hf = join(dir, "hf");
    log(`bench pack: making a ${(size / 2 ** 30).toFixed(2)} GiB synthetic checkpoint`);
    const synth = await synthCheckpoint({ arch: "qwen3_moe", out: hf, size, dtype: "bf16", log });
    const packed = await packCheckpoint(hf, join(dir, "out.sluice"), { log, progress: "off" });
    const packMbS = packed.containerBytes / packed.seconds / 1e6;
    log(`bench pack: ${packMbS.toFixed(1)} MB/s packing; dd copying the largest shard`);
    const shards = [...Deno.readDirSync(hf)].filter((e) => e.name.endsWith(".safetensors"))
      .map((e) => join(hf, e.name)).sort((a, b) => statSync(b).size - statSync(a).size);
    const dd = ddWriteMbS(shards[0], join(dir, "dd.bin"));
    return {
      checkpoint_bytes: synth.totalBytes,
      container_bytes: packed.containerBytes,
      pack_seconds: packed.seconds,
      pack_mb_s: packMbS,
      disk_write_mb_s: dd,
      ratio: dd ? packMbS / dd : null,
      target: PACK_TARGET,
      load_average: Deno.loadavg()[0],
    };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** CLI entry (tools/dev/bench/mod.ts). */
export async function main(args: string[]): Promise<void> {
  const { values } = parseArgs({
    args,
    options: { size: { type: "string", default: "1G" }, json: { type: "boolean", default: false } },
  });
  const r = await benchPack(parseSize(values.size!), (l) => console.error(l));
  if (values.json) {
    console.log(JSON.stringify(r, null, 1));
    return;
  }
  const verdict = r.ratio === null ? "n/a" : r.ratio >= r.target ? "PASS" : "MISS";
  console.log(
    `pack ${r.pack_mb_s.toFixed(1)} MB/s (${(r.container_bytes / 1e9).toFixed(2)} GB in ` +
      `${r.pack_seconds.toFixed(1)} s); dd oflag=direct ${
        r.disk_write_mb_s?.toFixed(1) ?? "n/a"
      } ` +
      `MB/s; ratio ${r.ratio?.toFixed(2) ?? "n/a"} (target >= ${r.target}: ${verdict}); load ` +
      `average ${r.load_average.toFixed(2)}`,
  );
}
