/**
 * The arena and the worker pool: aligned allocation within the budget, and row-split dispatches
 * whose results do not depend on the thread count.
 */
import assert from "node:assert/strict";
import { Arena, PAGE } from "../engine/arena.ts";
import { attentionRowHeads } from "../engine/ops.ts";
import { Pool } from "../engine/pool.ts";
import { chunkRows } from "../engine/pool_protocol.ts";
import { openReader } from "../io/reader.ts";
import { loadKernelModule } from "../wasm/mod.ts";
import { gemvRef } from "./scalar_kernels.ts";

Deno.test("arena hands out aligned, disjoint regions and refuses to overflow", () => {
  const arena = new Arena(4 << 20);
  const a = arena.alloc("a", 10);
  const b = arena.alloc("b", 5000);
  const c = arena.alloc("c", 100, 64);
  assert.equal(a % PAGE, 0);
  assert.equal(b % PAGE, 0);
  assert.ok(b >= a + PAGE && c >= b + 2 * PAGE && c % 64 === 0);
  assert.throws(() => arena.alloc("too big", 8 << 20), /cannot allocate too big/);
});

Deno.test("claimed chunks are whole 4-row blocks, about 8 per thread", () => {
  for (const rows of [1, 3, 4, 5, 17, 4097, 14336]) {
    for (const threads of [1, 2, 3, 5]) {
      const c = chunkRows(rows, threads);
      assert.equal(c % 4, 0);
      assert.ok(Math.ceil(rows / c) <= threads * 8, `rows ${rows}, ${threads} threads: chunk ${c}`);
    }
  }
});

Deno.test("attention claims hold whole kv heads where every thread can get one", () => {
  // Qwen3-30B-A3B's 32 / 4 heads on 2 threads: rows of 2 heads, claims of 4 rows = one kv head.
  assert.equal(attentionRowHeads(32, 4, 2), 2);
  for (const [nHeads, nKv] of [[32, 4], [8, 2], [16, 2], [64, 8], [14, 2], [12, 4], [16, 1]]) {
    for (const threads of [1, 2, 3, 4]) {
      const u = attentionRowHeads(nHeads, nKv, threads), group = nHeads / nKv;
      const rows = nHeads / u, chunk = chunkRows(rows, threads);
      assert.ok(Number.isInteger(rows), `${nHeads}/${nKv}, ${threads} threads: rows of ${u}`);
      if (u === 1) continue;
      assert.equal((chunk * u) % group, 0, `${nHeads}/${nKv}, ${threads} threads: a kv head cut`);
      assert.ok(Math.ceil(rows / chunk) >= threads, `${nHeads}/${nKv}: a thread left idle`);
    }
  }
  // One kv head: its heads stay split one by one, or one thread would take the whole job.
  assert.equal(attentionRowHeads(16, 1, 2), 1);
});

Deno.test("gemv through pools of 1, 2 and 3 threads gives identical rows", async () => {
  const module = await loadKernelModule();
  const rows = 517, cols = 300;
  const W = Float32Array.from({ length: rows * cols }, (_, i) => Math.sin(i * 0.37));
  const x = Float32Array.from({ length: cols }, (_, i) => Math.cos(i * 0.11));
  const results: Float32Array[] = [];
  for (const threads of [1, 2, 3]) {
    const arena = new Arena(8 << 20);
    const pool = await Pool.create(arena, module, threads);
    try {
      const w = arena.alloc("W", W.byteLength), xo = arena.alloc("x", x.byteLength);
      const y = arena.alloc("y", rows * 4);
      arena.f32(w, W.length).set(W);
      arena.f32(xo, cols).set(x);
      // Work above the serial threshold, so the workers really take part.
      pool.run1("gemv_f32", [BigInt(w), BigInt(xo), BigInt(y), rows, cols], rows, 1 << 20);
      if (threads > 1) assert.ok(pool.counts.parallel > 0);
      results.push(arena.f32(y, rows).slice());
    } finally {
      pool.close();
    }
  }
  assert.deepEqual(results[1], results[0]);
  assert.deepEqual(results[2], results[0]);
  const ref = gemvRef({ type: "f32", data: W }, x, rows, cols);
  for (let r = 0; r < rows; r++) assert.ok(Math.abs(results[0][r] - ref[r]) < 1e-4);
});

Deno.test("a closed pool refuses work; unknown kernels are named", async () => {
  const arena = new Arena(4 << 20);
  const pool = await Pool.create(arena, await loadKernelModule(), 2);
  assert.throws(() => pool.run1("no_such_kernel", [], 4), /no kernel named no_such_kernel/);
  pool.close();
  pool.close();
  assert.throws(() => pool.run1("gemv_f32", [0n, 0n, 0n, 0, 0], 0), /used after close/);
});

Deno.test("kernels and O_DIRECT reads work above 4 GiB of arena (wasm64)", async () => {
  // Memory64 pages are committed lazily: the untouched 4 GiB pad costs no RAM.
  const arena = new Arena(4.25 * 2 ** 30);
  const pool = await Pool.create(arena, await loadKernelModule(), 2);
  const reader = openReader(arena.memory, { quiet: true });
  const dir = Deno.makeTempDirSync({ prefix: "sluice-high-" });
  try {
    arena.alloc("pad", 4 * 2 ** 30);
    const rows = 64, cols = 1024;
    const W = Float32Array.from({ length: rows * cols }, (_, i) => Math.sin(i));
    const x = Float32Array.from({ length: cols }, (_, i) => Math.cos(i));
    const path = `${dir}/w.bin`;
    Deno.writeFileSync(path, new Uint8Array(W.buffer));
    const w = arena.alloc("W", W.byteLength), xo = arena.alloc("x", cols * 4);
    const y = arena.alloc("y", rows * 4);
    assert.ok(w > 2 ** 32);
    const file = reader.open(path);
    reader.read(file, w, W.byteLength, 0);
    reader.closeFile(file);
    assert.deepEqual(arena.f32(w, W.length), W);
    arena.f32(xo, cols).set(x);
    pool.run1("gemv_f32", [BigInt(w), BigInt(xo), BigInt(y), rows, cols], rows, 1 << 20);
    const ref = gemvRef({ type: "f32", data: W }, x, rows, cols);
    for (let r = 0; r < rows; r++) assert.ok(Math.abs(arena.f32(y, rows)[r] - ref[r]) < 1e-3);
  } finally {
    reader.close();
    pool.close();
    Deno.removeSync(dir, { recursive: true });
  }
});
