/**
 * Hostile-but-fair command lines (issue 15): --trace onto links, devices and folders, thread
 * counts and prefill chunks out of range, bad sampling values — each refused (or lowered with a
 * notice) before the model loads, with nothing left behind.
 */
import assert from "node:assert/strict";
import { HAVE_FIXTURES, packedFixture } from "./fixtures.ts";

const MOD = new URL("../mod.ts", import.meta.url).pathname;
const ignore = !HAVE_FIXTURES;
/** Printed once the model has loaded: its absence shows a refusal came first. */
const LOADED = /sluice: budget/;

async function sluice(...args: string[]): Promise<{ code: number; stderr: string }> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", MOD, ...args],
    stdin: "null",
    stdout: "null",
    env: { NO_COLOR: "1" },
  }).output();
  return { code: out.code, stderr: new TextDecoder().decode(out.stderr) };
}

function listing(dir: string): string[] {
  return [...Deno.readDirSync(dir)].map((e) => e.name).sort();
}

Deno.test({
  name: "--trace refuses links, devices and folders up front and leaves nothing behind",
  ignore,
  fn: async () => {
    const model = await packedFixture("stories260k-moe");
    const dir = Deno.makeTempDirSync({ prefix: "sluice-trace-" });
    try {
      Deno.writeTextFileSync(`${dir}/precious.txt`, "keep");
      Deno.symlinkSync(`${dir}/precious.txt`, `${dir}/link.jsonl`);
      Deno.mkdirSync(`${dir}/folder`);
      const run = (trace: string) =>
        sluice("generate", "--model", model, "--prompt", "Once", "-n", "2", "--trace", trace);
      for (
        const [trace, kind] of [
          [`${dir}/link.jsonl`, "symbolic link"],
          [`${dir}/folder`, "directory"],
          ["/dev/full", "device"],
          ["/dev/null", "device"],
          [`${dir}/nowhere/t.jsonl`, "does not exist"],
        ]
      ) {
        const r = await run(trace);
        assert.equal(r.code, 1, r.stderr);
        assert.ok(r.stderr.includes(kind), `${trace}: ${r.stderr}`);
        assert.doesNotMatch(r.stderr, LOADED);
        assert.equal(r.stderr.trim().split("\n").length, 1, r.stderr);
      }
      // A meta.json beside the trace that is a link is refused too.
      Deno.mkdirSync(`${dir}/m`);
      Deno.symlinkSync(`${dir}/precious.txt`, `${dir}/m/meta.json`);
      const meta = await run(`${dir}/m/t.jsonl`);
      assert.equal(meta.code, 1);
      assert.match(meta.stderr, /meta\.json is a symbolic link/);
      assert.equal(Deno.readTextFileSync(`${dir}/precious.txt`), "keep");
      assert.ok(Deno.lstatSync(`${dir}/link.jsonl`).isSymlink);
      assert.deepEqual(listing(dir), ["folder", "link.jsonl", "m", "precious.txt"]);
      assert.deepEqual(listing(`${dir}/folder`), []);
      assert.deepEqual(listing(`${dir}/m`), ["meta.json"]);
      // A regular path works and leaves exactly the trace and its meta.json.
      const ok = await run(`${dir}/folder/t.jsonl`);
      assert.equal(ok.code, 0, ok.stderr);
      assert.deepEqual(listing(`${dir}/folder`), ["meta.json", "t.jsonl"]);
    } finally {
      Deno.removeSync(dir, { recursive: true });
    }
  },
});

Deno.test({
  name: "out-of-range --prefill-chunk, --ctx and sampling flags fail before the model loads",
  ignore,
  fn: async () => {
    const model = await packedFixture("stories260k");
    for (
      const [flag, value, says] of [
        ["--prefill-chunk", "0", "--prefill-chunk must be a whole number in 1..512"],
        ["--prefill-chunk", "100000", "--prefill-chunk must be a whole number in 1..512"],
        ["--ctx", "0", "--ctx must be"],
        ["--threads", "0", "--threads must be"],
        ["--temperature", "-1", "temperature"],
        ["--top-p", "2", "topP"],
        ["--min-p", "1", "minP"],
        ["--repeat-penalty", "0", "repetitionPenalty"],
      ]
    ) {
      const r = await sluice("generate", "--model", model, "--prompt", "Once", flag, value);
      assert.equal(r.code, 1, `${flag} ${value}: ${r.stderr}`);
      assert.ok(r.stderr.includes(says), `${flag} ${value}: ${r.stderr}`);
      assert.doesNotMatch(r.stderr, LOADED, `${flag} ${value} was checked after loading`);
      assert.doesNotMatch(r.stderr, /undefined/);
    }
  },
});

Deno.test({
  name: "--threads above the core count is lowered to it with a notice",
  ignore,
  fn: async () => {
    const model = await packedFixture("stories260k");
    const cores = navigator.hardwareConcurrency || 1;
    const r = await sluice(
      "generate",
      "--model",
      model,
      "--prompt",
      "Once",
      "-n",
      "2",
      "--threads",
      "1000",
    );
    assert.equal(r.code, 0, r.stderr);
    assert.ok(r.stderr.includes(`--threads 1000 is more than the ${cores} cores; using ${cores}`));
  },
});

Deno.test({
  name: "--trace on a full disk is a clear error and leaves no partial trace",
  ignore,
  fn: async () => {
    const model = await packedFixture("stories260k-moe");
    const dir = Deno.makeTempDirSync({ prefix: "sluice-trace-full-" });
    try {
      const mount = new Deno.Command("mount", {
        args: ["-t", "tmpfs", "-o", "size=4096", "tmpfs", dir],
        stderr: "piped",
      }).outputSync();
      if (mount.code !== 0) {
        console.warn(
          `skipped: cannot mount a small tmpfs (${new TextDecoder().decode(mount.stderr).trim()})`,
        );
        return;
      }
      try {
        const r = await sluice(
          "generate",
          "--model",
          model,
          "--prompt",
          "Once",
          "-n",
          "60",
          "--ignore-eos",
          "--trace",
          `${dir}/t.jsonl`,
        );
        assert.equal(r.code, 1, r.stderr);
        assert.match(
          r.stderr,
          /--trace .*t\.jsonl: cannot write the trace \(No space left on device/,
        );
        assert.deepEqual(listing(dir), []);
      } finally {
        new Deno.Command("umount", { args: [dir] }).outputSync();
      }
    } finally {
      Deno.removeSync(dir, { recursive: true });
    }
  },
});
