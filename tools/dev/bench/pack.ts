/**
 * `bench pack [--size 1G] [--repeat 3] [--json]`: pack throughput against the disk's own
 * sequential write, in one run. A synthetic bf16 Qwen3-MoE checkpoint of `--size` is made in a
 * temporary directory on the cache disk ($SLUICE_CACHE or /tmp/sluice-bench) and packed `--repeat`
 * times (MB/s of container written). `dd oflag=direct bs=4M conv=fdatasync` copies the
 * checkpoint's largest shard (just written, so read from the page cache; real data, since a
 * virtual disk may shortcut zeros) to the same disk before the first pack and after each one, and
 * each pack is set against the mean of the two dd runs around it: on a shared disk whose speed
 * moved 4× within seconds, one dd before or after was a different disk. The run with the median
 * ratio is reported. Everything it made is removed at the end. Target (issue 16): pack ÷ disk
 * write ≥ 0.8.
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

/** One pack and the dd runs around it. */
export interface PackRun {
  pack_seconds: number;
  /** Container MB (1e6 bytes) written per second of the pack. */
  pack_mb_s: number;
  /**
   * The mean of dd's sequential O_DIRECT writes of the checkpoint's largest shard just before
   * and just after the pack, MB/s; null when dd failed.
   */
  disk_write_mb_s: number | null;
  ratio: number | null;
  load_average: number;
}

/** What {@link benchPack} measured: the run of median ratio, and every run. */
export interface PackBenchResult extends PackRun {
  checkpoint_bytes: number;
  container_bytes: number;
  target: number;
  /** Every pack in order. */
  runs: PackRun[];
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

/**
 * Makes a synthetic checkpoint, packs it `repeat` times between dd copies of its largest shard,
 * removes it all.
 */
export async function benchPack(
  size: number,
  log: (line: string) => void,
  repeat = 3,
): Promise<PackBenchResult> {
  const cache = Deno.env.get("SLUICE_CACHE") ?? "/tmp/sluice-bench";
  mkdirSync(cache, { recursive: true });
  const dir = Deno.makeTempDirSync({ dir: cache, prefix: "bench-pack-" });
  try {
    const hf = join(dir, "hf");
    log(`bench pack: making a ${(size / 2 ** 30).toFixed(2)} GiB synthetic checkpoint`);
    const synth = await synthCheckpoint({ arch: "qwen3_moe", out: hf, size, dtype: "bf16", log });
    const shards = [...Deno.readDirSync(hf)].filter((e) => e.name.endsWith(".safetensors"))
      .map((e) => join(hf, e.name)).sort((a, b) => statSync(b).size - statSync(a).size);
    const dd = () => {
      const mbS = ddWriteMbS(shards[0], join(dir, "dd.bin"));
      rmSync(join(dir, "dd.bin"), { force: true });
      return mbS;
    };
    let before = dd();
    const runs: PackRun[] = [];
    let containerBytes = 0;
    for (let i = 0; i < repeat; i++) {
      const packed = await packCheckpoint(hf, join(dir, "out.sluice"), {
        log,
        progress: "off",
        force: true,
      });
      containerBytes = packed.containerBytes;
      const packMbS = packed.containerBytes / packed.seconds / 1e6;
      const after = dd();
      const disk = before !== null && after !== null ? (before + after) / 2 : null;
      log(
        `bench pack: run ${i + 1}/${repeat}: ${packMbS.toFixed(1)} MB/s packing, dd ` +
          `${before?.toFixed(1) ?? "n/a"} before and ${after?.toFixed(1) ?? "n/a"} MB/s after`,
      );
      runs.push({
        pack_seconds: packed.seconds,
        pack_mb_s: packMbS,
        disk_write_mb_s: disk,
        ratio: disk ? packMbS / disk : null,
        load_average: Deno.loadavg()[0],
      });
      before = after;
    }
    const byRatio = [...runs].sort((a, b) => (a.ratio ?? 0) - (b.ratio ?? 0));
    return {
      ...byRatio[Math.floor((byRatio.length - 1) / 2)],
      checkpoint_bytes: synth.totalBytes,
      container_bytes: containerBytes,
      target: PACK_TARGET,
      runs,
    };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** CLI entry (tools/dev/bench/mod.ts). */
export async function main(args: string[]): Promise<void> {
  const { values } = parseArgs({
    args,
    options: {
      size: { type: "string", default: "1G" },
      repeat: { type: "string", default: "3" },
      json: { type: "boolean", default: false },
    },
  });
  const repeat = Number(values.repeat);
  if (!Number.isInteger(repeat) || repeat < 1) {
    throw new Error(`--repeat ${values.repeat}: expected a whole number of at least 1`);
  }
  const r = await benchPack(parseSize(values.size!), (l) => console.error(l), repeat);
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
      `MB/s; ratio ${r.ratio?.toFixed(2) ?? "n/a"} (target >= ${r.target}: ${verdict}), the ` +
      `median of ${r.runs.length} (${
        r.runs.map((x) => x.ratio?.toFixed(2) ?? "n/a").join(", ")
      }); ` +
      `load average ${r.load_average.toFixed(2)}`,
  );
}
