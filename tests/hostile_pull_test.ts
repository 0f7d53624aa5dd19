/**
 * `pull` against a hostile or broken Hub (issue 27), served by the test on 127.0.0.1 only: shard
 * names that climb out of the output folder or are absolute, a file list or shard that stalls, a
 * redirect loop, and declared sizes beyond the free disk. Each is refused with one clear line, and
 * nothing is written outside the pull's own folders.
 */
import assert from "node:assert/strict";
import { existsSync, mkdirSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { Hub } from "../tools/pull/hub.ts";
import { pullModel, type PullOptions } from "../tools/pull/pull.ts";
import { tempDir } from "./fixtures.ts";

const REPO = "evil/model";
const COMMIT = "fedcba9876543210fedcba9876543210fedcba98";

/** A safetensors file holding one f32 tensor of 2 values. */
function tinySafetensors(): Uint8Array {
  const header = new TextEncoder().encode(
    JSON.stringify({ "x.weight": { dtype: "F32", shape: [2], data_offsets: [0, 8] } }),
  );
  const out = new Uint8Array(8 + header.length + 8);
  new DataView(out.buffer).setBigUint64(0, BigInt(header.length), true);
  out.set(header, 8);
  return out;
}

interface FakeHub {
  endpoint: string;
  requests: string[];
  close(): Promise<void>;
}

/**
 * A Hub with the given files (name → bytes; `sizes` overrides the size the file list declares);
 * `hook` may answer a request itself (stall, redirect) by returning a Response or a promise.
 */
function fakeHub(
  files: Record<string, Uint8Array>,
  sizes: Record<string, number> = {},
  hook?: (path: string, req: Request) => Response | Promise<Response> | undefined,
): FakeHub {
  const requests: string[] = [];
  const ac = new AbortController();
  const server = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen() {}, signal: ac.signal },
    (req) => {
      const path = decodeURIComponent(new URL(req.url).pathname);
      requests.push(path);
      const hooked = hook?.(path, req);
      if (hooked) return hooked;
      if (path === `/api/models/${REPO}/revision/main`) {
        const siblings = Object.entries(files).map(([rfilename, b]) => ({
          rfilename,
          size: sizes[rfilename] ?? b.length,
        }));
        return Response.json({ sha: COMMIT, siblings });
      }
      const prefix = `/${REPO}/resolve/${COMMIT}/`;
      const name = path.startsWith(prefix) ? path.slice(prefix.length) : null;
      // A lenient server: any name it cannot find is answered with the first shard's bytes.
      const data = name === null
        ? undefined
        : files[name] ?? Object.values(files).find((_, i) => Object.keys(files)[i].endsWith("s"));
      if (!data) return new Response("not found", { status: 404 });
      const m = /^bytes=(\d+)-(\d*)$/.exec(req.headers.get("range") ?? "");
      const start = m ? Number(m[1]) : 0;
      const end = m && m[2] ? Number(m[2]) + 1 : data.length;
      return new Response(data.slice(start, end), { status: m ? 206 : 200 });
    },
  );
  return {
    endpoint: `http://127.0.0.1:${server.addr.port}`,
    requests,
    close: async () => {
      ac.abort();
      await server.finished;
    },
  };
}

const CONFIG = new TextEncoder().encode(JSON.stringify({ model_type: "llama" }));

function pullFrom(hub: FakeHub, out: string, opts: PullOptions = {}) {
  return pullModel(REPO, out, {
    progress: "off",
    log: () => {},
    ...opts,
    hub: { endpoint: hub.endpoint, token: "", backoffMs: 5, log: () => {}, ...opts.hub },
  });
}

/** A fresh folder `root/a/b/` to pull into, so a climb of two levels would land in `root/`. */
function nest(name: string): { root: string; out: string } {
  const root = join(tempDir(), name);
  mkdirSync(join(root, "a", "b"), { recursive: true });
  return { root, out: join(root, "a", "b", "out.sluice") };
}

for (
  const [what, shard] of [
    ["a name climbing out with ..", "../../escape.safetensors"],
    ["an absolute name", "/tmp/sluice-pull-escape-test.safetensors"],
    ["a name with a folder", "sub/inner.safetensors"],
  ]
) {
  Deno.test(`pull refuses ${what} in the shard index before touching any file`, async () => {
    const index = new TextEncoder().encode(JSON.stringify({ weight_map: { "x.weight": shard } }));
    const hub = fakeHub({
      "config.json": CONFIG,
      "model.safetensors.index.json": index,
      [shard]: tinySafetensors(),
    });
    const { root, out } = nest(`climb-${what.length}`);
    try {
      await assert.rejects(
        () => pullFrom(hub, out),
        (e: Error) => {
          assert.match(e.message, /model\.safetensors\.index\.json: invalid shard name/);
          assert.ok(e.message.includes(JSON.stringify(shard)), e.message);
          return true;
        },
      );
      assert.deepEqual(readdirSync(root), ["a"], "nothing written beside the output's folders");
      assert.deepEqual(readdirSync(join(root, "a")), ["b"]);
      assert.ok(!existsSync("/tmp/sluice-pull-escape-test.safetensors"));
      const stage = `${out}.pull`;
      const staged = existsSync(stage) ? readdirSync(stage).sort() : [];
      assert.deepEqual(staged, ["config.json", "model.safetensors.index.json", "pull.json"]);
      assert.ok(
        !hub.requests.some((p) => p.includes("escape") || p.includes("inner")),
        "the hostile shard was never fetched",
      );
    } finally {
      await hub.close();
    }
  });
}

/** A two-file repo: config and one shard (the shard's bytes need not be a real model). */
function oneShard(): Record<string, Uint8Array> {
  return { "config.json": CONFIG, "model.safetensors": tinySafetensors() };
}

/** A promise that settles only when `signal` aborts: a server that never answers. */
function never(signal: AbortSignal): Promise<Response> {
  return new Promise((resolve) =>
    signal.addEventListener("abort", () => resolve(new Response(null, { status: 503 })))
  );
}

const FAST = { connectTimeoutMs: 200, idleTimeoutMs: 200, attempts: 2 };

Deno.test("pull: a file list that never answers fails after the connect timeout and retries", async () => {
  const hub = fakeHub(
    oneShard(),
    {},
    (path, req) => path.startsWith("/api/") ? never(req.signal) : undefined,
  );
  const { out } = nest("stall-list");
  try {
    const t0 = performance.now();
    await assert.rejects(
      () => pullFrom(hub, out, { hub: FAST }),
      /evil\/model@main: file list: no answer within 0\.2 s, giving up after 2 attempts/,
    );
    assert.ok(performance.now() - t0 < 10_000);
    assert.equal(hub.requests.filter((p) => p.startsWith("/api/")).length, 2);
  } finally {
    await hub.close();
  }
});

Deno.test("pull: a shard whose bytes stop coming fails after the idle timeout and retries", async () => {
  const files = oneShard();
  const shard = files["model.safetensors"];
  const hub = fakeHub(files, {}, (path, req) => {
    // Header reads (Range with an end) are served; the whole-file download stalls mid-way.
    const range = req.headers.get("range") ?? "";
    if (!path.endsWith("/model.safetensors") || /-\d+$/.test(range)) return undefined;
    const stream = new ReadableStream<Uint8Array>({
      start(c) {
        c.enqueue(shard.slice(0, 10));
        req.signal.addEventListener("abort", () => c.close());
      },
    });
    return new Response(stream, { status: 200 });
  });
  const dest = join(tempDir(), "stalled.incomplete");
  const client = new Hub({
    endpoint: hub.endpoint,
    token: "",
    backoffMs: 5,
    log: () => {},
    ...FAST,
  });
  try {
    const rev = await client.revision(REPO, "main");
    const t0 = performance.now();
    await assert.rejects(
      () => client.download(rev, rev.files.get("model.safetensors")!, dest, () => {}),
      /model\.safetensors: still \d+ bytes short after 2 attempts \(last: no data for 0\.2 s\)/,
    );
    assert.ok(performance.now() - t0 < 10_000);
    // The second attempt resumed from the 10 bytes the first one got.
    assert.equal(Deno.statSync(dest).size, 10);
  } finally {
    await hub.close();
  }
});

Deno.test("pull: a redirect loop fails at once, without retries", async () => {
  const hub = fakeHub(
    oneShard(),
    {},
    (path) =>
      path.startsWith("/api/")
        ? new Response(null, { status: 302, headers: { location: "/api/loop" } })
        : undefined,
  );
  const { out } = nest("redirect");
  try {
    await assert.rejects(
      () => pullFrom(hub, out, { hub: { attempts: 8, backoffMs: 1000 } }),
      /file list: redirect loop or too many redirects/,
    );
    assert.ok(hub.requests.length <= 25, `${hub.requests.length} requests`);
  } finally {
    await hub.close();
  }
});

Deno.test("pull: a declared size beyond the free disk is refused before any shard is written", async () => {
  const files = oneShard();
  const hub = fakeHub(files, { "model.safetensors": 2 ** 50 });
  const { out } = nest("huge");
  try {
    await assert.rejects(
      () => pullFrom(hub, out, { freeBytes: 10 << 30 }),
      /model\.safetensors declares 1\.0 PiB|model\.safetensors declares 1024\.0 TiB/,
    );
    const stage = `${out}.pull`;
    assert.ok(!existsSync(join(stage, "model.safetensors")), "no placeholder was made");
    assert.ok(!hub.requests.some((p) => p.endsWith("/model.safetensors")), "nothing fetched");
    const big = fakeHub({ ...files, "tokenizer.json": CONFIG }, { "tokenizer.json": 2 ** 40 });
    try {
      await assert.rejects(
        () => pullFrom(big, nest("huge-tok").out),
        /tokenizer\.json declares 1099511627776 bytes; at most 64\.0 MiB is accepted/,
      );
    } finally {
      await big.close();
    }
  } finally {
    await hub.close();
  }
});
