/**
 * tools/split_banks.ts: shard files hold exactly the records e ≡ i (mod n) at floor(e/n) × stride,
 * checked here by reading the source bank independently; a model run over the shards gives
 * bit-identical logits to the unsharded container; the verifier catches a flipped byte.
 */
import assert from "node:assert/strict";
import {
  closeSync,
  cpSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  readSync,
  statSync,
  symlinkSync,
  writeFileSync,
  writeSync,
} from "node:fs";
import { join } from "node:path";
import { openContainer } from "../engine/container.ts";
import { Model } from "../engine/model.ts";
import { argmax } from "../engine/sampler.ts";
import { splitBanks, verifyShards } from "../tools/split_banks.ts";
import { packedFixture, tempDir } from "./fixtures.ts";

const FIXTURE = "stories260k-moe64";
const SHARDS = 3;
const POSITIONS = 20;

function readAt(path: string, offset: number, bytes: number): Uint8Array {
  const out = new Uint8Array(bytes);
  const fd = openSync(path, "r");
  try {
    let done = 0;
    while (done < bytes) {
      const n = readSync(fd, out, done, bytes - done, offset + done);
      assert.ok(n > 0, `${path}: short read at ${offset + done}`);
      done += n;
    }
  } finally {
    closeSync(fd);
  }
  return out;
}

async function splitFixture(tag: string): Promise<{ path: string; dirs: string[] }> {
  const path = await packedFixture(FIXTURE);
  const dirs = Array.from({ length: SHARDS }, (_, i) => join(tempDir(), `${tag}-shard${i}`));
  splitBanks(path, dirs, { progress: "off", log: () => {} });
  return { path, dirs };
}

/** Logits at each position of a greedy run from a fixed prompt. */
async function logitsRun(path: string, shards?: string[]): Promise<Float32Array[]> {
  // Few expert slots, so records are read from the banks again and again.
  const model = await Model.open(path, { quiet: true, ctx: 64, shards, expertSlots: 16 });
  try {
    const tokens = [1, 403, 407];
    const out: Float32Array[] = [];
    for (let pos = 0; pos < POSITIONS; pos++) {
      const logits = model.forward([tokens[pos]], pos);
      out.push(logits);
      if (pos + 1 >= tokens.length) tokens.push(argmax(logits));
    }
    return out;
  } finally {
    model.close();
  }
}

Deno.test("split-banks puts expert e of every layer in shard e % n at floor(e / n) × stride", async () => {
  const { path, dirs } = await splitFixture("layout");
  const c = openContainer(path);
  let checked = 0;
  for (const bank of c.manifest.experts) {
    if (!bank) continue;
    const src = c.expertBankPath(bank.layer);
    for (let i = 0; i < SHARDS; i++) {
      const file = join(dirs[i], bank.file);
      const mine: number[] = Array.from({ length: bank.count }, (_, e: number) => e).filter((e) =>
        e % SHARDS === i
      );
      assert.equal(statSync(file).size, mine.length * bank.stride, `${file}: size`);
      mine.forEach((e, slot) => {
        const want = readAt(src, e * bank.stride, bank.stride);
        const got = readAt(file, slot * bank.stride, bank.stride);
        assert.deepEqual(got, want, `${file}: layer ${bank.layer} expert ${e}`);
        checked++;
      });
    }
  }
  const total = c.manifest.experts.reduce((s, b) => s + (b?.count ?? 0), 0);
  assert.equal(checked, total);
});

Deno.test("a model over the shards gives bit-identical logits to the unsharded container", async () => {
  const { path, dirs } = await splitFixture("logits");
  const whole = await logitsRun(path);
  const sharded = await logitsRun(path, dirs);
  assert.equal(sharded.length, POSITIONS);
  sharded.forEach((l, pos) => assert.deepEqual(l, whole[pos], `logits differ at position ${pos}`));
});

Deno.test("the shard verifier catches a flipped byte and names the expert", async () => {
  const { path, dirs } = await splitFixture("corrupt");
  const c = openContainer(path);
  const bank = c.manifest.experts.find((b) => b !== null)!;
  // Expert 7 of the first bank: shard 7 % 3 = 1, slot 2; flip a payload byte.
  const file = join(dirs[1], bank.file);
  const at = 2 * bank.stride + 200;
  const byte = readAt(file, at, 1);
  const fd = openSync(file, "r+");
  writeSync(fd, new Uint8Array([byte[0] ^ 0x40]), 0, 1, at);
  closeSync(fd);
  assert.throws(
    () => verifyShards(path, dirs),
    new RegExp(`layer ${bank.layer} expert 7 at offset ${2 * bank.stride}`),
  );
});

Deno.test("split-banks rejects the container itself and repeated directories", async () => {
  const path = await packedFixture(FIXTURE);
  const opts = { progress: "off" as const, log: () => {} };
  assert.throws(() => splitBanks(path, [path]), /is the container itself/);
  const d = join(tempDir(), "twice");
  assert.throws(() => splitBanks(path, [d, d], opts), /is given twice/);
});

Deno.test("split-banks never replaces another container, foreign files or links; --force only its own", async () => {
  const path = await packedFixture(FIXTURE);
  const opts = { progress: "off" as const, log: () => {} };
  const snapshot = (dir: string) =>
    new Map(readdirSync(dir).map((n) => [n, readFileSync(join(dir, n)).join()]));
  // Another container (same family, so the same bank file names) given as a shard folder.
  const other = join(tempDir(), "other.sluice");
  cpSync(path, other, { recursive: true });
  const before = snapshot(other);
  const fresh = join(tempDir(), "guard-fresh");
  assert.throws(
    () => splitBanks(path, [fresh, other], opts),
    /shard directory .*other\.sluice is a sluice container; give an empty or new folder/,
  );
  assert.deepEqual(snapshot(other), before, "the other container is untouched");
  // A folder with someone's file in it.
  const mixed = join(tempDir(), "guard-mixed");
  mkdirSync(mixed);
  writeFileSync(join(mixed, "notes.txt"), "mine");
  assert.throws(() => splitBanks(path, [mixed], opts), /holds notes\.txt, which is not a shard/);
  // A rerun into its own output needs --force; a link where a shard file goes is never replaced.
  const dirs = [join(tempDir(), "guard-a"), join(tempDir(), "guard-b")];
  splitBanks(path, dirs, opts);
  assert.throws(() => splitBanks(path, dirs, opts), /exists \(an earlier split\?\); pass --force/);
  splitBanks(path, dirs, { ...opts, force: true });
  assert.ok(verifyShards(path, dirs) > 0);
  const bank = openContainer(path).manifest.experts.find((b) => b)!;
  const target = join(tempDir(), "guard-target.bin");
  writeFileSync(target, "precious");
  Deno.removeSync(join(dirs[0], bank.file));
  symlinkSync(target, join(dirs[0], bank.file));
  assert.throws(
    () => splitBanks(path, dirs, { ...opts, force: true }),
    /is not a regular file; remove it yourself/,
  );
  assert.equal(readFileSync(target, "utf8"), "precious");
});
