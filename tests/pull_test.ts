/**
 * `pull` against a mock Hugging Face Hub served on 127.0.0.1 by the test (file list with LFS
 * sha256, Range requests, ETags, a bearer token), serving the two-shard tiny-deepseek-v3-fp8
 * fixture with injected failures: a 429 with Retry-After, a 500 then success, a connection
 * dropped mid-shard, a wrong checksum. The pulled container must be byte-identical to `pack` of
 * the same files, shard bytes on disk must stay within the printed bound, and an interrupted pull
 * must resume to the same container. Also: clear 401/404 errors, `pack` of a Hub cache folder, and
 * the synth hub (tools/dev/synth_hub.ts) serving what `synth` writes.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import {
  cpSync,
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { join, relative } from "node:path";
import { packCheckpoint } from "../tools/pack.ts";
import { pullModel, type PullOptions } from "../tools/pull/pull.ts";
import { serveSynthHub } from "../tools/dev/synth_hub.ts";
import { synthCheckpoint } from "../tools/synth.ts";
import { actionsBefore, prefetchAfter, simulate } from "../tools/pull/shards.ts";
import { fixtureDir, tempDir } from "./fixtures.ts";
import { writeInt4Checkpoint } from "./int4_checkpoint.ts";

const FIXTURE = "tiny-deepseek-v3-fp8";
const present = existsSync(join(fixtureDir(FIXTURE), "config.json"));
const REPO = "acme/tiny-dsv3";
const COMMIT = "0123456789abcdef0123456789abcdef01234567";
const TOKEN = "hf_secret_token_never_printed";
const SHARD1 = "model-00001-of-00002.safetensors";
const SHARD2 = "model-00002-of-00002.safetensors";
const INDEX = "model.safetensors.index.json";

/** Failures to inject, per file, consumed in order. */
interface Faults {
  /** HTTP statuses to answer before serving the file (e.g. [500] or [429]). */
  status?: Record<string, number[]>;
  /** Byte counts after which to drop the connection, one per request (Infinity: never). */
  drop?: Record<string, number[]>;
  /** Bytes after which the first download of the file stalls for good (to be killed). */
  stall?: Record<string, number>;
  /** How many times to serve the file with one byte flipped. */
  corrupt?: Record<string, number>;
}

interface MockHub {
  endpoint: string;
  /** Every request as "METHOD path range". */
  requests: string[];
  close(): Promise<void>;
}

function sha256(bytes: Uint8Array): string {
  return createHash("sha256").update(bytes).digest("hex");
}

function mockHub(dir: string, faults: Faults = {}, token: string | null = TOKEN): MockHub {
  const files = new Map<string, Uint8Array>();
  for (const name of readdirSync(dir)) {
    files.set(name, new Uint8Array(readFileSync(join(dir, name))));
  }
  const requests: string[] = [];
  const take = <T>(m: Record<string, T[]> | undefined, f: string) => m?.[f]?.shift();
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, (req) => {
    const url = new URL(req.url);
    const range = req.headers.get("range");
    requests.push(`${req.method} ${url.pathname} ${range ?? ""}`);
    if (token !== null && req.headers.get("authorization") !== `Bearer ${token}`) {
      return new Response("unauthorized", { status: 401 });
    }
    if (url.pathname === `/api/models/${REPO}/revision/main`) {
      const siblings = [...files].map(([rfilename, b]) => ({
        rfilename,
        size: b.length,
        ...(rfilename.endsWith(".safetensors")
          ? { lfs: { sha256: sha256(b), size: b.length } }
          : {}),
      }));
      return Response.json({ id: REPO, sha: COMMIT, siblings });
    }
    const prefix = `/${REPO}/resolve/${COMMIT}/`;
    if (!url.pathname.startsWith(prefix)) return new Response("not found", { status: 404 });
    const name = decodeURIComponent(url.pathname.slice(prefix.length));
    const data = files.get(name);
    if (!data) return new Response("not found", { status: 404 });
    // Faults hit whole-file downloads (no Range end), not the header reads.
    const download = !range || range.endsWith("-");
    const status = download ? take(faults.status, name) : undefined;
    if (status !== undefined) {
      return new Response("busy", {
        status,
        headers: status === 429 ? { "retry-after": "1" } : {},
      });
    }
    let body = data;
    if (download && (faults.corrupt?.[name] ?? 0) > 0) {
      faults.corrupt![name]--;
      body = new Uint8Array(data);
      body[body.length >> 1] ^= 0xff;
    }
    const m = range ? /^bytes=(\d+)-(\d*)$/.exec(range) : null;
    const start = m ? Number(m[1]) : 0;
    const end = m && m[2] ? Number(m[2]) + 1 : data.length;
    if (start >= data.length) return new Response(null, { status: 416 });
    const part = body.subarray(start, end);
    const headers: Record<string, string> = {
      "content-length": String(part.length),
      "accept-ranges": "bytes",
      etag: `"${sha256(data)}"`,
    };
    if (m) headers["content-range"] = `bytes ${start}-${end - 1}/${data.length}`;
    const dropAt = (download ? take(faults.drop, name) : undefined) ?? Infinity;
    const stallAt = download ? faults.stall?.[name] : undefined;
    if (stallAt !== undefined) delete faults.stall![name];
    const stream = new ReadableStream<Uint8Array>({
      start(c) {
        if (stallAt !== undefined) {
          // Never closed: the client is killed while waiting; the server cancels the stream.
          c.enqueue(part.slice(0, stallAt));
        } else if (dropAt < part.length) {
          c.enqueue(part.slice(0, dropAt));
          // The body ends before its Content-Length: the client sees a dropped connection.
          c.close();
        } else {
          c.enqueue(part.slice());
          c.close();
        }
      },
    });
    return new Response(stream, { status: m ? 206 : 200, headers });
  });
  return {
    endpoint: `http://127.0.0.1:${server.addr.port}`,
    requests,
    close: () => server.shutdown(),
  };
}

/** Every file below `dir`, relative path → bytes. */
function tree(dir: string): Map<string, Uint8Array> {
  const out = new Map<string, Uint8Array>();
  const walk = (d: string) => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      if (e.isDirectory()) walk(p);
      else out.set(relative(dir, p), readFileSync(p));
    }
  };
  walk(dir);
  return out;
}

function assertSameContainer(got: string, want: string): void {
  const a = tree(got), b = tree(want);
  assert.deepEqual([...a.keys()].sort(), [...b.keys()].sort());
  for (const [k, v] of b) {
    const g = a.get(k)!;
    assert.ok(g.length === v.length && g.every((x, i) => x === v[i]), `${k} differs`);
  }
}

const quiet = { progress: "off" as const };
let reference: Promise<string> | undefined;
function packedReference(): Promise<string> {
  reference ??= packCheckpoint(fixtureDir(FIXTURE), join(tempDir(), "ref.sluice"), {
    ...quiet,
    log: () => {},
  }).then((r) => r.out);
  return reference;
}

async function pull(hub: MockHub, out: string, opts: PullOptions = {}, lines: string[] = []) {
  return await pullModel(REPO, out, {
    ...quiet,
    log: (l) => lines.push(l),
    ...opts,
    hub: {
      endpoint: hub.endpoint,
      token: TOKEN,
      backoffMs: 5,
      log: (l) => lines.push(l),
      ...opts.hub,
    },
  });
}

Deno.test({
  name: "pull through 429, 500, a dropped connection and a bad checksum equals pack",
  ignore: !present,
  fn: async () => {
    const hub = mockHub(fixtureDir(FIXTURE), {
      status: { "config.json": [429], [INDEX]: [500], [SHARD2]: [503] },
      drop: { [SHARD2]: [100_000] },
      corrupt: { [SHARD1]: 1 },
    });
    const lines: string[] = [];
    try {
      const out = join(tempDir(), "pulled.sluice");
      const t0 = performance.now();
      const r = await pull(hub, out, { keepShards: 2 }, lines);
      assertSameContainer(out, await packedReference());
      assert.ok(performance.now() - t0 >= 1000, "Retry-After: 1 was honoured");
      const log = lines.join("\n");
      assert.match(log, /config\.json: HTTP 429, retrying in 1\.0 s/);
      assert.match(log, /model\.safetensors\.index\.json: HTTP 500, retrying/);
      assert.match(log, /connection lost/);
      assert.match(log, /sha256 [0-9a-f]{64}, expected [0-9a-f]{64}; fetching it again/);
      assert.ok(!log.includes(TOKEN), "the token is never printed");
      // After the drop, the shard resumed with a Range request, not from the start.
      assert.ok(hub.requests.some((q) => q.includes(SHARD2) && /bytes=100000-$/.test(q)));
      const sizes = [SHARD1, SHARD2].map((f) => statSync(join(fixtureDir(FIXTURE), f)).size);
      assert.ok(r.peakShardBytes <= r.boundBytes, `${r.peakShardBytes} > ${r.boundBytes}`);
      assert.ok(r.boundBytes <= sizes[0] + sizes[1]);
      assert.ok(!existsSync(`${out}.pull`) && !existsSync(`${out}.tmp`), "staging is removed");
    } finally {
      await hub.close();
    }
  },
});

Deno.test({
  name: "pull: a step reading more shards than --keep-shards raises the bound and says so",
  ignore: !present,
  fn: async () => {
    const hub = mockHub(fixtureDir(FIXTURE));
    try {
      const out = join(tempDir(), "bounded.sluice");
      // The globals read both shards (embedding in one, LM head in the other): the bound rises
      // to 2 and says so; layers 0-1 read shard 1 only, so it goes before layer 2 starts.
      const lines: string[] = [];
      const r = await pull(hub, out, { keepShards: 1 }, lines);
      assert.match(lines.join("\n"), /reads 2 shards, more than --keep-shards 1/);
      assert.ok(r.peakShardBytes <= r.boundBytes);
      assertSameContainer(out, await packedReference());
      const fetches = hub.requests.filter((q) => q.includes(`/${SHARD1} `) && q.endsWith(" "));
      assert.equal(fetches.length, 1, "each shard is downloaded once");
    } finally {
      await hub.close();
    }
  },
});

Deno.test({
  name: "pull: interrupted mid-shard and after a layer, the rerun resumes to the same container",
  ignore: !present,
  fn: async () => {
    const out = join(tempDir(), "resumed.sluice");
    // First run: shard 2 keeps dropping, so the pull gives up with a partial download on disk.
    const broken = mockHub(fixtureDir(FIXTURE), { drop: { [SHARD2]: [150_000, 0, 0] } });
    try {
      await assert.rejects(
        () => pull(broken, out, { hub: { attempts: 3 } }),
        /model-00002-of-00002\.safetensors: still \d+ bytes short after 3 attempts/,
      );
    } finally {
      await broken.close();
    }
    assert.ok(existsSync(join(`${out}.pull`, `${SHARD2}.incomplete`)));
    // Second run: stopped on purpose after layer 1 is packed.
    const hub = mockHub(fixtureDir(FIXTURE));
    try {
      await assert.rejects(() => pull(hub, out, { stopAfterLayer: 1 }), /stopped on request/);
      assert.ok(hub.requests.some((q) => q.includes(SHARD2) && /bytes=150000-$/.test(q)));
      // Third run: both shards are verified and reused, layers 0-1 come from the pack journal.
      hub.requests.length = 0;
      const r = await pull(hub, out);
      assert.deepEqual(r.reusedShards.sort(), [SHARD1, SHARD2]);
      assert.deepEqual(r.pack.layersResumed, [0, 1]);
      assert.ok(!hub.requests.some((q) => q.includes(".safetensors ")), "no shard refetched");
      assertSameContainer(out, await packedReference());
    } finally {
      await hub.close();
    }
  },
});

Deno.test({
  name: "pull: 401 and 404 are one clear line naming the repo and file",
  ignore: !present,
  fn: async () => {
    const hub = mockHub(fixtureDir(FIXTURE));
    try {
      const out = join(tempDir(), "denied.sluice");
      await assert.rejects(
        () => pull(hub, out, { hub: { token: "" } }),
        (e: Error) => {
          assert.match(e.message, /acme\/tiny-dsv3@main: file list: HTTP 401, .*set HF_TOKEN/);
          return true;
        },
      );
      await assert.rejects(
        () =>
          pullModel("acme/missing", out, {
            ...quiet,
            hub: { endpoint: hub.endpoint, token: TOKEN },
          }),
        /acme\/missing@main: file list: HTTP 404, not found \(check the repo name and revision\)/,
      );
      assert.ok(!existsSync(out) && !existsSync(`${out}.tmp`));
    } finally {
      await hub.close();
    }
  },
});

Deno.test({
  name: "pack accepts a Hub cache folder (snapshots/<rev>/ symlinks into blobs/)",
  ignore: !present,
  fn: async () => {
    const cache = join(tempDir(), "hub", "models--acme--tiny-dsv3");
    mkdirSync(join(cache, "blobs"), { recursive: true });
    mkdirSync(join(cache, "snapshots", COMMIT), { recursive: true });
    mkdirSync(join(cache, "refs"));
    writeFileSync(join(cache, "refs", "main"), COMMIT);
    for (const name of readdirSync(fixtureDir(FIXTURE))) {
      const bytes = readFileSync(join(fixtureDir(FIXTURE), name));
      const blob = sha256(bytes);
      cpSync(join(fixtureDir(FIXTURE), name), join(cache, "blobs", blob));
      symlinkSync(`../../blobs/${blob}`, join(cache, "snapshots", COMMIT, name));
    }
    const out = join(tempDir(), "from-cache.sluice");
    await packCheckpoint(cache, out, { ...quiet, log: () => {} });
    assertSameContainer(out, await packedReference());
  },
});

Deno.test("shard schedule: drops what no later step reads, keeps the bound, refetches the furthest", () => {
  const need = [["a", "d"], ["a"], ["b"], ["c"], ["d"], ["a"]].map((x) => new Set(x));
  const sizes = new Map(["a", "b", "c", "d"].map((f) => [f, 10]));
  const live = new Set<string>();
  const acts = need.map((_, i) => actionsBefore(i, need, live, 2));
  // Before step 2 the bound forces one out: "a" (read again at step 5) rather than "d" (step 4).
  assert.deepEqual(acts.map((a) => a.fetch), [["a", "d"], [], ["b"], ["c"], [], ["a"]]);
  assert.deepEqual(acts.map((a) => a.evict), [[], [], ["a"], ["b"], ["c"], ["d"]]);
  const s = simulate(need, new Set(), 2, sizes);
  assert.equal(s.peakShards, 2);
  assert.equal(s.peakBytes, 20);
  assert.deepEqual(s.refetched, ["a"]);
  assert.equal(s.fetchBytes, 50);
  // After step 4 (reads "d") there is room for one more: the next shard read later, "a".
  const room = new Set(["d"]);
  assert.equal(prefetchAfter(4, need, room, 2), "a");
  assert.deepEqual([...room], ["d", "a"]);
  assert.equal(prefetchAfter(4, need, room, 2), null, "no room left");
  // With room for everything nothing is fetched twice.
  assert.deepEqual(simulate(need, new Set(), 4, sizes).refetched, []);
});

Deno.test({
  name: "mod.ts pull: HF_ENDPOINT and HF_TOKEN from the environment, progress and summary lines",
  ignore: !present,
  fn: async () => {
    const hub = mockHub(fixtureDir(FIXTURE));
    try {
      const out = join(tempDir(), "cli.sluice");
      const r = await new Deno.Command(Deno.execPath(), {
        args: ["run", "-A", new URL("../mod.ts", import.meta.url).pathname, "pull", REPO, out],
        env: { HF_ENDPOINT: hub.endpoint, HF_TOKEN: TOKEN, NO_COLOR: "1" },
        stdin: "null",
      }).output();
      const err = new TextDecoder().decode(r.stderr);
      assert.equal(r.code, 0, err);
      assert.match(err, /peak extra disk [\d.]+ KiB \(2 shard\(s\) at once, --keep-shards 2/);
      assert.match(err, /download model-00001-of-00002\.safetensors \(1\/2\) .*MB\/s ETA/);
      assert.match(err, /pack cli\.sluice .*MB\/s ETA/);
      assert.match(err, /pull: done in [\d.]+ s: downloaded .*, wrote .*, peak shards on disk/);
      assert.ok(!err.includes(TOKEN));
      assertSameContainer(out, await packedReference());
    } finally {
      await hub.close();
    }
  },
});

Deno.test({
  name:
    "mod.ts pull killed with SIGKILL mid-shard resumes with a Range request to the same container",
  ignore: !present,
  fn: async () => {
    const hub = mockHub(fixtureDir(FIXTURE), { stall: { [SHARD2]: 200_000 } });
    try {
      const out = join(tempDir(), "killed.sluice");
      const child = new Deno.Command(Deno.execPath(), {
        args: ["run", "-A", new URL("../mod.ts", import.meta.url).pathname, "pull", REPO, out],
        env: { HF_ENDPOINT: hub.endpoint, HF_TOKEN: TOKEN, NO_COLOR: "1" },
        stdin: "null",
        stdout: "null",
        stderr: "null",
      }).spawn();
      const part = join(`${out}.pull`, `${SHARD2}.incomplete`);
      for (let i = 0; i < 600 && !(existsSync(part) && statSync(part).size >= 200_000); i++) {
        await new Promise((r) => setTimeout(r, 50));
      }
      child.kill("SIGKILL");
      const status = await child.status;
      assert.equal(status.signal, "SIGKILL");
      assert.equal(statSync(part).size, 200_000, "the partial shard survives the kill");
      hub.requests.length = 0;
      const r = await pull(hub, out);
      assert.ok(hub.requests.some((q) => q.includes(SHARD2) && /bytes=200000-$/.test(q)));
      assert.ok(
        r.downloadedBytes < statSync(join(fixtureDir(FIXTURE), SHARD2)).size +
            statSync(join(fixtureDir(FIXTURE), SHARD1)).size,
      );
      assertSameContainer(out, await packedReference());
    } finally {
      await hub.close();
    }
  },
});

Deno.test({
  name: "pull of an INT4 (pack-quantized) checkpoint plans from placeholders and equals pack",
  ignore: !existsSync(join(fixtureDir("stories260k-moe"), "config.json")),
  fn: async () => {
    const src = join(tempDir(), "int4-src");
    writeInt4Checkpoint(src, fixtureDir("stories260k-moe"));
    const want = join(tempDir(), "int4-ref.sluice");
    await packCheckpoint(src, want, { ...quiet, log: () => {} });
    const hub = mockHub(src);
    try {
      const out = join(tempDir(), "int4-pulled.sluice");
      await pull(hub, out);
      assertSameContainer(out, want);
    } finally {
      await hub.close();
    }
  },
});

Deno.test({
  name: "pull: refused up front when the container and the peak shards do not fit the free space",
  ignore: !present,
  fn: async () => {
    const hub = mockHub(fixtureDir(FIXTURE));
    try {
      const out = join(tempDir(), "nospace.sluice");
      await assert.rejects(
        () => pull(hub, out, { freeBytes: 500_000 }),
        /has 488\.3 KiB free; the pull needs [\d.]+ [KM]iB more \(container [\d.]+ [KM]iB \+ peak shards/,
      );
      assert.ok(
        !hub.requests.some((q) => q.includes(".safetensors ") && q.endsWith(" ")),
        "no shard was downloaded",
      );
      assert.ok(!existsSync(out) && !existsSync(`${out}.tmp`));
    } finally {
      await hub.close();
    }
  },
});

Deno.test("pull from the synth hub (tools/dev/synth_hub.ts) equals pack of synth's checkpoint", async () => {
  const overrides = {
    hidden: 128,
    layers: 4,
    experts: 8,
    topK: 2,
    vocab: 300,
    heads: 2,
    headDim: 32,
    maxPositions: 256,
  };
  const dir = tempDir(), maxShardBytes = 96 * 1024;
  const hub = serveSynthHub({
    arch: "deepseek_v4",
    overrides,
    size: 1e6,
    maxShardBytes,
    work: join(dir, "synth-hub"),
    log: () => {},
  });
  try {
    assert.ok(hub.shards > 2, `${hub.shards} shards`);
    const pulled = join(dir, "synth-hub-pulled.sluice");
    const r = await pullModel(hub.repo, pulled, {
      ...quiet,
      keepShards: 2,
      log: () => {},
      hub: { endpoint: hub.endpoint, backoffMs: 5, log: () => {} },
    });
    const ckpt = await synthCheckpoint({
      arch: "deepseek_v4",
      out: join(dir, "synth-hub-ckpt"),
      size: 1e6,
      overrides,
      maxShardBytes,
      progress: "off",
      log: () => {},
    });
    const packed = await packCheckpoint(ckpt.dir, join(dir, "synth-hub-packed.sluice"), {
      ...quiet,
      log: () => {},
    });
    assertSameContainer(pulled, packed.out);
    assert.ok(r.peakShardBytes <= r.boundBytes, `${r.peakShardBytes} > ${r.boundBytes}`);
  } finally {
    await hub.close();
  }
});
