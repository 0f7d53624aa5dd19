/**
 * Hostile-but-fair pack runs (issue 15): outputs that would destroy the source or a foreign
 * directory, concurrent packs, tampered resume state, broken tokenizers, a full disk.
 */
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { verifyContainer } from "../io/container.ts";
import { openContainer } from "../engine/container.ts";
import { packCheckpoint, type PackOptions } from "../tools/pack.ts";
import { lockPackOutput } from "../tools/pack/output_guard.ts";
import { fixtureDir, HAVE_FIXTURES } from "./fixtures.ts";

const QUIET: PackOptions = { progress: "off", log: () => {} };
const ignore = !HAVE_FIXTURES;

async function rejectsWith(p: Promise<unknown>, ...parts: string[]): Promise<void> {
  await assert.rejects(p, (e: Error) => {
    for (const s of parts) assert.ok(e.message.includes(s), `"${e.message}" lacks "${s}"`);
    return true;
  });
}

/** A private copy of a fixture checkpoint in `dir`. */
function copyFixture(name: string, dir: string): string {
  Deno.mkdirSync(dir, { recursive: true });
  for (const f of Deno.readDirSync(fixtureDir(name))) {
    if (f.isFile) Deno.copyFileSync(`${fixtureDir(name)}/${f.name}`, `${dir}/${f.name}`);
  }
  return dir;
}

function listing(dir: string): string[] {
  return [...Deno.readDirSync(dir)].map((e) => e.name).sort();
}

function withTemp(fn: (dir: string) => Promise<void>): () => Promise<void> {
  return async () => {
    const dir = Deno.makeTempDirSync({ prefix: "sluice-hostile-" });
    try {
      await fn(dir);
    } finally {
      Deno.removeSync(dir, { recursive: true });
    }
  };
}

Deno.test({
  name: "--force never replaces the source, its ancestors or a non-container directory",
  ignore,
  fn: withTemp(async (tmp) => {
    const src = copyFixture("stories260k", `${tmp}/ckpt/model`);
    const before = listing(src);
    const force = { ...QUIET, force: true };
    await rejectsWith(packCheckpoint(src, src, force), "source checkpoint");
    await rejectsWith(packCheckpoint(src, `${tmp}/ckpt`, force), "source checkpoint");
    await rejectsWith(packCheckpoint(src, tmp, force), "source checkpoint");
    await rejectsWith(packCheckpoint(src, `${src}/../../ckpt/.`, force), "source checkpoint");
    // Its temporary directory may not be the source either.
    const src2 = copyFixture("stories260k", `${tmp}/m.tmp`);
    await rejectsWith(packCheckpoint(src2, `${tmp}/m`, force), "temporary directory is the source");
    assert.ok(existsSync(`${src2}/model.safetensors`));
    assert.deepEqual(listing(src), before);
    // A directory (or file) that is not a container is left alone, and so is a foreign .tmp.
    Deno.mkdirSync(`${tmp}/photos`);
    Deno.writeTextFileSync(`${tmp}/photos/cat.jpg`, "meow");
    await rejectsWith(packCheckpoint(src, `${tmp}/photos`, force), "not a sluice container");
    assert.equal(Deno.readTextFileSync(`${tmp}/photos/cat.jpg`), "meow");
    Deno.writeTextFileSync(`${tmp}/notes.txt`, "keep");
    await rejectsWith(packCheckpoint(src, `${tmp}/notes.txt`, force), "not a sluice container");
    Deno.mkdirSync(`${tmp}/x.sluice.tmp`);
    Deno.writeTextFileSync(`${tmp}/x.sluice.tmp/thesis.tex`, "keep");
    await rejectsWith(packCheckpoint(src, `${tmp}/x.sluice`, QUIET), "temporary directory");
    assert.equal(Deno.readTextFileSync(`${tmp}/x.sluice.tmp/thesis.tex`), "keep");
    // A container is replaced, and nothing else is left beside it.
    const out = `${tmp}/c.sluice`;
    await packCheckpoint(src, out, QUIET);
    await packCheckpoint(fixtureDir("tiny-deepseek-v3"), out, force);
    assert.equal(openContainer(out).config.family, "deepseek_v3");
    assert.deepEqual(
      listing(tmp).filter((n) => n.startsWith("c.sluice")),
      ["c.sluice"],
    );
    assert.deepEqual(listing(src), before);
  }),
});

Deno.test({
  name: "a second pack of the same output fails on the lock; concurrent CLI packs stay whole",
  ignore,
  fn: withTemp(async (tmp) => {
    const out = `${tmp}/l.sluice`;
    const held = lockPackOutput(out);
    try {
      await rejectsWith(
        packCheckpoint(fixtureDir("stories260k-moe"), out, QUIET),
        "another pack is writing",
        `${out}.lock`,
      );
    } finally {
      held.release();
    }
    assert.ok(!existsSync(`${out}.lock`) && !existsSync(out));
    // Two processes race for one output: each succeeds or fails clearly, the result verifies.
    const pack = () =>
      new Deno.Command(Deno.execPath(), {
        args: [
          "run",
          "-A",
          new URL("../tools/pack.ts", import.meta.url).pathname,
          fixtureDir("stories260k-moe"),
          out,
          "--force",
        ],
        stdout: "null",
        stderr: "piped",
      }).output();
    const runs = await Promise.all([pack(), pack(), pack()]);
    assert.ok(runs.some((r) => r.code === 0), "one pack wins");
    for (const r of runs.filter((r) => r.code !== 0)) {
      assert.match(new TextDecoder().decode(r.stderr), /another pack is writing|already exists/);
    }
    verifyContainer(openContainer(out));
    assert.deepEqual(listing(tmp), ["l.sluice"]);
    assert.ok(!listing(out).some((n) => n.endsWith(".part")));
  }),
});

Deno.test({
  name: "resume re-checks the CRCs of full-size bank files and the journal's offsets",
  ignore,
  fn: withTemp(async (tmp) => {
    const src = fixtureDir("stories260k-moe");
    const out = `${tmp}/r.sluice`;
    await rejectsWith(packCheckpoint(src, out, { ...QUIET, stopAfterLayer: 2 }), "layer 2");
    // Layer 0's bank keeps its size but one payload byte flips; layer 1's journal entry moves.
    const bank = `${out}.tmp/experts-L0.bin`;
    const bytes = Deno.readFileSync(bank);
    bytes[4096 * 3 + 700] ^= 0x40;
    Deno.writeFileSync(bank, bytes);
    const jPath = `${out}.tmp/journal.json`;
    const j = JSON.parse(Deno.readTextFileSync(jPath));
    j.layers["1"].offset += 4096;
    j.layers["7"] = j.layers["2"];
    Deno.writeTextFileSync(jPath, JSON.stringify(j));
    const res = await packCheckpoint(src, out, QUIET);
    assert.deepEqual(res.layersResumed, [2]);
    assert.deepEqual(res.layersPacked, [0, 1, 3, 4]);
    verifyContainer(openContainer(out));
    // A journal of the wrong shape is a fresh start, not a crash.
    const out2 = `${tmp}/r2.sluice`;
    await rejectsWith(packCheckpoint(src, out2, { ...QUIET, stopAfterLayer: 0 }), "layer 0");
    const j2 = JSON.parse(Deno.readTextFileSync(`${out2}.tmp/journal.json`));
    Deno.writeTextFileSync(
      `${out2}.tmp/journal.json`,
      JSON.stringify({ ...j2, layers: { "0": null }, codebooks: 5 }),
    );
    const res2 = await packCheckpoint(src, out2, QUIET);
    assert.deepEqual(res2.layersResumed, []);
    verifyContainer(openContainer(out2));
  }),
});

Deno.test({
  name: "a broken or missing tokenizer is caught at pack time",
  ignore,
  fn: withTemp(async (tmp) => {
    const src = copyFixture("stories260k", `${tmp}/ckpt`);
    Deno.writeTextFileSync(`${src}/tokenizer.json`, '{"model": {"type": "BPE", "vocab": ');
    await rejectsWith(packCheckpoint(src, `${tmp}/a.sluice`, QUIET), "tokenizer.json");
    assert.deepEqual(listing(tmp), ["ckpt"]);
    for (const f of ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]) {
      Deno.removeSync(`${src}/${f}`);
    }
    const lines: string[] = [];
    await packCheckpoint(src, `${tmp}/b.sluice`, { ...QUIET, log: (s) => lines.push(s) });
    assert.ok(lines.some((l) => /warning: .* no tokenizer/.test(l)), lines.join("\n"));
  }),
});

/** A tmpfs of `bytes` mounted in `dir`, or why it cannot be. */
function mountTmpfs(dir: string, bytes: number): string | null {
  Deno.mkdirSync(dir, { recursive: true });
  const r = new Deno.Command("mount", {
    args: ["-t", "tmpfs", "-o", `size=${bytes}`, "tmpfs", dir],
    stderr: "piped",
  }).outputSync();
  return r.code === 0 ? null : new TextDecoder().decode(r.stderr).trim() || "mount failed";
}

Deno.test({
  name: "a full disk is a clear error and leaves no partial output",
  ignore,
  fn: withTemp(async (tmp) => {
    const src = fixtureDir("stories260k");
    const { containerBytes } = await packCheckpoint(src, `${tmp}/size.sluice`, QUIET);
    const mnt = `${tmp}/small`;
    // Room for the weights and the journal, not for the 15 KB tokenizer.json copied at the end.
    const why = mountTmpfs(mnt, containerBytes + 8192);
    if (why) {
      console.warn(`skipped: cannot mount a small tmpfs (${why})`);
      return;
    }
    try {
      await rejectsWith(
        packCheckpoint(fixtureDir("stories260k-moe"), `${mnt}/m.sluice`, QUIET),
        "needs",
        "free",
      );
      assert.deepEqual(listing(mnt), []);
      await rejectsWith(
        packCheckpoint(src, `${mnt}/s.sluice`, QUIET),
        "no space left",
        "removed the partial output",
      );
      assert.deepEqual(listing(mnt), []);
    } finally {
      new Deno.Command("umount", { args: [mnt] }).outputSync();
    }
  }),
});
