/**
 * The weak messages of issue 27 made clear: a model path that is missing, a file, an empty folder
 * or a checkpoint each says so; a budget of 1 byte is not printed as "0 B"; a context that fills
 * says so on stderr and as `stop_reason` in --json; a pull that cannot write names the file.
 */
import assert from "node:assert/strict";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { openContainer } from "../engine/container.ts";
import { demoModelPath } from "../tools/demo_model.ts";
import { Hub } from "../tools/pull/hub.ts";
import { runSluice, tempDir } from "./fixtures.ts";

Deno.test("a model path that is missing, a file, empty or a checkpoint: four messages", () => {
  const root = join(tempDir(), "paths");
  mkdirSync(join(root, "empty"), { recursive: true });
  mkdirSync(join(root, "ckpt"));
  writeFileSync(join(root, "ckpt", "config.json"), "{}");
  writeFileSync(join(root, "file.sluice"), "x");
  mkdirSync(join(root, "other"));
  writeFileSync(join(root, "other", "notes.txt"), "x");
  const cases: [string, RegExp][] = [
    ["missing.sluice", /missing\.sluice: no such file or folder/],
    ["file.sluice", /file\.sluice: a file, not a sluice container/],
    ["empty", /empty: an empty folder, not a sluice container/],
    ["ckpt", /ckpt: a checkpoint folder, not a sluice container .*pack it first/],
    ["other", /other: not a sluice container \(no manifest\.json\)/],
  ];
  for (const [name, why] of cases) assert.throws(() => openContainer(join(root, name)), why);
});

Deno.test("a 1-byte budget is printed as 1 B; a full context is announced and in --json", async () => {
  const model = await demoModelPath(true);
  const tiny = await runSluice(["generate", "--model", model, "--budget", "1", "--prompt", "hi"]);
  assert.equal(tiny.code, 1);
  assert.match(tiny.stderr, /budget 1 B is below the floor of/);
  const full = await runSluice([
    ...["generate", "--model", model, "--ctx", "16", "--prompt", "hello there"],
    ...["-n", "100", "--ignore-eos", "--json"],
  ]);
  assert.equal(full.code, 0, full.stderr);
  const out = JSON.parse(full.stdout);
  assert.equal(out.stop_reason, "context");
  assert.equal(out.prompt_ids.length + out.generated_ids.length, 16);
  assert.match(full.stderr, /the context is full: 16 tokens/);
  const asked = await runSluice([
    "generate",
    "--model",
    model,
    "--prompt",
    "hi",
    "-n",
    "3",
    "--ignore-eos",
    "--json",
  ]);
  assert.equal(JSON.parse(asked.stdout).stop_reason, "max_tokens");
});

Deno.test("a download that cannot be written names the file and is not retried as a network fault", async () => {
  const data = new Uint8Array(100_000).fill(7);
  const ac = new AbortController();
  let gets = 0;
  const server = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen() {}, signal: ac.signal },
    () => {
      gets++;
      return new Response(data);
    },
  );
  try {
    const hub = new Hub({
      endpoint: `http://127.0.0.1:${server.addr.port}`,
      token: "",
      backoffMs: 5,
      log: () => {},
    });
    const rev = { repo: "a/b", revision: "main", commit: "c", files: new Map() };
    const file = { path: "model.safetensors", size: data.length, sha256: null };
    await assert.rejects(
      () => hub.download(rev, file, "/dev/full", () => {}),
      /model\.safetensors: cannot write \/dev\/full \(.*No space left on device/,
    );
    assert.equal(gets, 1, "a full disk is not retried");
  } finally {
    ac.abort();
    await server.finished;
  }
});
