/**
 * The packer's in-place reads of kept tensors (tools/pack/kept_reader.ts): on the shim's reader
 * threads (or node:fs with SLUICE_IO=fallback) into the staging memory, in pieces, and on the
 * pack's thread for other bytes, both land
 * exactly the file's bytes for any range and alignment, name the same first NaN element, name the
 * tensor when the file is cut short, and see a file replaced after closeFiles.
 */
import assert from "node:assert/strict";
import { renameSync, truncateSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { openCheckpoint } from "../io/safetensors.ts";
import { shimUnavailable } from "../io/shim.ts";
import { FiniteScan } from "../tools/pack/finite.ts";
import { KeptReader, PIECE_BYTES } from "../tools/pack/kept_reader.ts";
import {
  createArenaMemory,
  instantiateKernels,
  KERNEL_RESERVED_BYTES,
  loadKernelModule,
} from "../wasm/mod.ts";

const memory = createArenaMemory(16 << 20);
const scan = new FiniteScan(memory, await instantiateKernels(await loadKernelModule(), memory));

/** bf16 values: 3.4 pieces' worth, finite, varied (xorshift bits with the exponent kept low). */
const VALUES = Math.floor(3.4 * PIECE_BYTES / 2);

/** A one-tensor safetensors file of `data` (bf16) at `path`, written by temp name + rename. */
function writeCheckpoint(path: string, data: Uint16Array): void {
  const header = new TextEncoder().encode(JSON.stringify({
    "w.weight": { dtype: "BF16", shape: [data.length], data_offsets: [0, data.byteLength] },
  }));
  const out = new Uint8Array(8 + header.length + data.byteLength);
  new DataView(out.buffer).setBigUint64(0, BigInt(header.length), true);
  out.set(header, 8);
  out.set(new Uint8Array(data.buffer), 8 + header.length);
  writeFileSync(path + ".part", out);
  renameSync(path + ".part", path);
}

function values(seed: number): Uint16Array {
  const v = new Uint16Array(VALUES);
  let x = seed;
  for (let i = 0; i < v.length; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    v[i] = x & 0xbfff; // exponent bit 14 clear: never all ones
  }
  return v;
}

/** The element a read names as NaN or infinite, or -1. */
function nanAt(read: () => void): number {
  try {
    read();
    return -1;
  } catch (e) {
    const m = /w\.weight: element (\d+) is NaN or infinite/.exec((e as Error).message);
    assert.ok(m, (e as Error).message);
    return Number(m[1]);
  }
}

for (const fallback of [false, true]) {
  const how = fallback ? "through node:fs (SLUICE_IO=fallback)" : "on the shim's reader threads";
  Deno.test(`kept reads ${how} and on the pack's thread land the same bytes`, () => {
    checkReads(fallback);
  });
}

function checkReads(fallback: boolean): void {
  const dir = Deno.makeTempDirSync({ prefix: "sluice-kept-" });
  const path = join(dir, "model.safetensors");
  const data = values(7);
  writeCheckpoint(path, data);
  const ckpt = openCheckpoint(dir);
  const kept = new KeptReader(ckpt, memory, scan, fallback);
  try {
    const shimWhy = shimUnavailable(memory);
    assert.equal(
      kept.kind,
      fallback || shimWhy ? "fallback" : "shim-buffered",
      shimWhy ?? "",
    );
    const src = ckpt.tensors.get("w.weight")!;
    const bytes = new Uint8Array(data.buffer);
    for (
      const [at, len, where] of [
        [0, src.bytes, 0],
        [2, PIECE_BYTES, 6],
        [2 * 12345, 2 * PIECE_BYTES + 98, 4096],
        [src.bytes - 10, 10, 2],
      ]
    ) {
      const inSlots = new Uint8Array(memory.buffer, KERNEL_RESERVED_BYTES + where, len);
      inSlots.fill(0xee);
      kept.read(src, at, inSlots);
      assert.ok(inSlots.every((b, i) => b === bytes[at + i]), `range ${at}+${len} in the slots`);
      const plain = new Uint8Array(len);
      kept.read(src, at, plain);
      assert.deepEqual(plain, bytes.subarray(at, at + len));
    }
    assert.throws(() => kept.read(src, src.bytes - 2, new Uint8Array(4)), /outside its/);

    // A NaN in the third piece and a later one: the first is named, counted from the tensor's start.
    const bad = data.slice();
    const first = PIECE_BYTES + 4321;
    bad[first] = 0x7fc1;
    bad[first + 100] = 0xff80;
    writeCheckpoint(path, bad);
    kept.closeFiles();
    ckpt.close();
    const at = 2 * 1000;
    const len = src.bytes - at;
    const inSlots = new Uint8Array(memory.buffer, KERNEL_RESERVED_BYTES, len);
    assert.equal(nanAt(() => kept.read(src, at, inSlots)), first);
    assert.equal(nanAt(() => kept.read(src, at, new Uint8Array(len))), first);

    // A file cut short after it was opened: both reads name the tensor.
    truncateSync(path, src.offset + PIECE_BYTES);
    for (const dst of [inSlots, new Uint8Array(len)]) {
      assert.throws(() => kept.read(src, at, dst), /tensor w\.weight: /);
    }
  } finally {
    kept.close();
    ckpt.close();
    Deno.removeSync(dir, { recursive: true });
  }
}
