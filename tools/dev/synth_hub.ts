/**
 * `deno run -A tools/dev/synth_hub.ts --arch A --overrides JSON [--size 2G] [--max-shard 768M]
 * [--port 8765] --work DIR`: serves a synthetic checkpoint (tools/synth.ts) on loopback as a
 * Hugging Face Hub repo `synth/<arch>`, so that `HF_ENDPOINT=http://127.0.0.1:PORT mod.ts pull
 * synth/<arch> out.sluice` packs a model whose checkpoint would not fit on the disk beside its
 * container. Headers and side files are made in memory; a shard is generated into `--work` when
 * its data is first asked for, replacing the one generated before, so the disk holds the container,
 * the shards `pull --keep-shards` keeps and one generated shard. The bytes are those `synth` writes
 * with the same arguments (seed 0, uniform routing, bf16).
 *
 * @module
 */
import {
  closeSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  readSync,
  rmSync,
} from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { Progress } from "../progress.ts";
import { parseSize } from "../synth.ts";
import { routerPlans } from "../synth/routing.ts";
import { byName, headerBytes, planShards, shardNames, writeShards } from "../synth/safetensors.ts";
import { synthShape } from "../synth/shape.ts";
import { synthTensors } from "../synth/tensors.ts";
import { sumBytes, type SynthArch, type SynthOverrides } from "../synth/types.ts";
import { shardIndex, writeSideFiles } from "../synth/write.ts";

/** The commit every file is served at. */
const COMMIT = "5e7e5e7e5e7e5e7e5e7e5e7e5e7e5e7e5e7e5e7e";

/** Options of {@link serveSynthHub}. */
export interface SynthHubOptions {
  arch: SynthArch;
  overrides: SynthOverrides;
  /** Target bytes of tensor data (the overrides may fix every size). */
  size: number;
  maxShardBytes: number;
  /** Folder for the side files and the shard being served (emptied first). */
  work: string;
  /** Default: any free port. */
  port?: number;
  log?: (line: string) => void;
}

/** A running hub. */
export interface SynthHub {
  /** Base URL for `HF_ENDPOINT`. */
  endpoint: string;
  /** The repo to pull. */
  repo: string;
  /** Bytes of tensor data of the model. */
  dataBytes: number;
  shards: number;
  close(): Promise<void>;
}

/** Starts serving the checkpoint `opts` describe (see the module text). */
export function serveSynthHub(opts: SynthHubOptions): SynthHub {
  const log = opts.log ?? ((s: string) => console.error(s));
  const shape = synthShape(opts.arch, opts.size, opts.overrides, "bf16");
  const plans = routerPlans(opts.arch, shape.dims, "uniform", undefined, 0);
  const shards = planShards(synthTensors(opts.arch, shape.dims, "bf16"), opts.maxShardBytes)
    .map(byName);
  const names = shardNames(shards.length);
  const headers = shards.map(headerBytes);
  const sizes = shards.map((s, i) => headers[i].length + sumBytes(s));
  rmSync(opts.work, { recursive: true, force: true });
  const side = join(opts.work, "side"), gen = join(opts.work, "shard");
  mkdirSync(side, { recursive: true });
  writeSideFiles(side, shape);
  const small = new Map<string, Uint8Array>();
  for (const f of readdirSync(side)) small.set(f, new Uint8Array(readFileSync(join(side, f))));
  if (shards.length > 1) {
    const map = Object.fromEntries(shards.flatMap((s, i) => s.map((t) => [t.name, names[i]])));
    const json = JSON.stringify(shardIndex(shape, map), null, 2) + "\n";
    small.set("model.safetensors.index.json", new TextEncoder().encode(json));
  }
  let current = -1;
  const generate = (i: number): string => {
    const path = join(gen, "model.safetensors");
    if (current === i) return path;
    rmSync(gen, { recursive: true, force: true });
    mkdirSync(gen);
    const t0 = performance.now();
    writeShards(gen, [shards[i]], 0, plans, new Progress({ label: "", total: 1, mode: "off" }));
    log(`synth hub: generated ${names[i]} in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
    current = i;
    return path;
  };
  const repo = `synth/${opts.arch}`;
  const server = Deno.serve(
    { hostname: "127.0.0.1", port: opts.port ?? 0, onListen() {} },
    (req) => {
      const url = new URL(req.url);
      if (url.pathname === `/api/models/${repo}/revision/main`) {
        const siblings = [
          ...[...small].map(([f, b]) => ({ rfilename: f, size: b.length })),
          ...names.map((f, i) => ({ rfilename: f, size: sizes[i] })),
        ];
        return Response.json({ id: repo, sha: COMMIT, siblings });
      }
      const prefix = `/${repo}/resolve/${COMMIT}/`;
      if (!url.pathname.startsWith(prefix)) return new Response("not found", { status: 404 });
      const file = decodeURIComponent(url.pathname.slice(prefix.length));
      const shard = names.indexOf(file);
      const size = shard >= 0 ? sizes[shard] : small.get(file)?.length;
      if (size === undefined) return new Response("not found", { status: 404 });
      const m = /^bytes=(\d+)-(\d*)$/.exec(req.headers.get("range") ?? "");
      const start = m ? Number(m[1]) : 0;
      const end = m && m[2] ? Math.min(size, Number(m[2]) + 1) : size;
      if (start >= end) return new Response("bad range", { status: 416 });
      const init = {
        status: m ? 206 : 200,
        headers: {
          "content-length": String(end - start),
          ...(m ? { "content-range": `bytes ${start}-${end - 1}/${size}` } : {}),
        },
      };
      if (shard < 0) return new Response(small.get(file)!.slice(start, end), init);
      // Header reads (planning) need no data: only a read past the header generates the shard.
      if (end <= headers[shard].length) {
        return new Response(headers[shard].slice(start, end), init);
      }
      const fd = openSync(generate(shard), "r");
      let pos = start;
      const body = new ReadableStream<Uint8Array>({
        pull(c) {
          if (pos >= end) {
            closeSync(fd);
            c.close();
            return;
          }
          const buf = new Uint8Array(Math.min(8 << 20, end - pos));
          const n = readSync(fd, buf, 0, buf.length, pos);
          pos += n;
          c.enqueue(buf.subarray(0, n));
        },
        cancel() {
          closeSync(fd);
        },
      });
      return new Response(body, init);
    },
  );
  log(
    `synth hub: ${repo}, ${shape.dims.layers} layers, ${shards.length} shards, ` +
      `${(shape.dataBytes / 1e9).toFixed(2)} GB of tensor data, at ` +
      `http://127.0.0.1:${server.addr.port}`,
  );
  return {
    endpoint: `http://127.0.0.1:${server.addr.port}`,
    repo,
    dataBytes: shape.dataBytes,
    shards: shards.length,
    close: async () => {
      await server.shutdown();
      rmSync(opts.work, { recursive: true, force: true });
    },
  };
}

if (import.meta.main) {
  const { values: v } = parseArgs({
    args: Deno.args,
    options: {
      arch: { type: "string" },
      overrides: { type: "string", default: "{}" },
      size: { type: "string", default: "2G" },
      "max-shard": { type: "string", default: "768M" },
      port: { type: "string", default: "8765" },
      work: { type: "string" },
    },
  });
  if (!v.arch || !v.work) {
    console.error("synth hub: --arch and --work are required");
    Deno.exit(1);
  }
  serveSynthHub({
    arch: v.arch as SynthArch,
    overrides: JSON.parse(v.overrides!),
    size: parseSize(v.size!),
    maxShardBytes: parseSize(v["max-shard"]!),
    work: v.work,
    port: Number(v.port),
  });
}
