/**
 * The packer's write-behind writer (tools/pack/block_writer.ts): every way of filling its slots
 * (copies, in-place views, whole records, starting mid-file) lands the same bytes at the same
 * offsets as a plain reference write, and a failure in the worker comes back as the error it was.
 */
import assert from "node:assert/strict";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { PackWriter } from "../tools/pack/block_writer.ts";

/** Deterministic pseudo-random bytes (xorshift32). */
function noise(n: number, seed: number): Uint8Array {
  const out = new Uint8Array(n);
  let x = seed >>> 0 || 1;
  for (let i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    out[i] = x & 0xff;
  }
  return out;
}

Deno.test("write-behind slots land every byte where a plain write would", async () => {
  const dir = Deno.makeTempDirSync({ prefix: "sluice-bw-" });
  const pack = await PackWriter.open(64 << 10);
  try {
    // A region written mid-file with odd-sized copies and views spanning slot boundaries.
    const path = join(dir, "region.bin");
    const start = 3 * 4096;
    const total = 5 * (64 << 10) + 7 * 4096;
    const expect = new Uint8Array(start + total);
    writeFileSync(path, expect);
    const data = noise(total, 7);
    expect.set(data, start);
    const w = pack.file(path, start, false);
    let at = 0;
    for (const n of [1, 63, 4096, 70000, 12345]) {
      w.append(data.subarray(at, at + n));
      at += n;
    }
    while (at < total) {
      const view = w.next(Math.min(50000, total - at));
      view.set(data.subarray(at, at + view.length));
      at += view.length;
    }
    w.end();
    pack.settle();
    assert.deepEqual(new Uint8Array(readFileSync(path)), expect);

    // Whole records reserved in place, several per slot, in a new file.
    const bank = join(dir, "bank.bin");
    const stride = 12288;
    const records = noise(11 * stride, 9);
    const b = pack.file(bank, 0, true);
    for (let e = 0; e < 11; e++) {
      b.reserve(stride).set(records.subarray(e * stride, (e + 1) * stride));
    }
    b.end();
    pack.settle();
    assert.deepEqual(new Uint8Array(readFileSync(bank)), records);
  } finally {
    pack.close();
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test("a failed write in the worker is thrown with its code and path", async () => {
  const dir = Deno.makeTempDirSync({ prefix: "sluice-bw-" });
  const pack = await PackWriter.open(64 << 10);
  try {
    const w = pack.file(join(dir, "missing", "x.bin"), 0, true);
    w.append(noise(4096, 3));
    w.end();
    assert.throws(
      () => pack.settle(),
      (e: Error & { code?: string }) => e.code === "ENOENT" && e.message.includes("x.bin"),
    );
  } finally {
    pack.close();
    Deno.removeSync(dir, { recursive: true });
  }
});
