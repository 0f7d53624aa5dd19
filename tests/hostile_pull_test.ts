/**
 * `pull` against a hostile or broken Hub (issue 27), served by the test on 127.0.0.1 only: shard
 * names that climb out of the output folder or are absolute, a file list or shard that stalls, a
 * redirect loop, and declared sizes beyond the free disk. Each is refused with one clear line, and
 * nothing is written outside the pull's own folders.
 */
import assert from "node:assert/strict";
import { existsSync, mkdirSync, readdirSync } from "node:fs";
import { join } from "node:path";
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
