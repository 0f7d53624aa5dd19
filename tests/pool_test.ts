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
import { Ops } from "../engine/ops.ts";
import type { TensorRef } from "../engine/tensor.ts";
import { quantizeMxfp4 } from "../engine/quant/mxfp4.ts";
import { f32ToBf16Bytes } from "../engine/quant/plain.ts";
import { q8Bytes } from "../wasm/quant_kernels.ts";

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

/** A pool of `threads` on a fresh arena, with a bump allocator that copies arrays in. */
async function poolWith(threads: number, bytes = 16 << 20) {
  const arena = new Arena(bytes);
  const pool = await Pool.create(arena, await loadKernelModule(), threads);
  const put = (a: Float32Array | Uint8Array) => {
    const off = arena.alloc("t", a.byteLength, 64);
    new Uint8Array(arena.memory.buffer, off, a.byteLength).set(
      new Uint8Array(a.buffer, a.byteOffset, a.byteLength),
    );
    return off;
  };
  return { arena, pool, ops: new Ops(arena, pool), put };
}

Deno.test("jobs marked after read the outputs of the jobs before them, whatever the threads", async () => {
  // y1 = A·x, y2 = B·y1, y3 = C·y2 in one dispatch: a stale y1 or y2 changes y3.
  const n = 384;
  const mats = [0.37, 0.23, 0.41].map((f) =>
    Float32Array.from({ length: n * n }, (_, i) => Math.sin(i * f) / 16)
  );
  const x = Float32Array.from({ length: n }, (_, i) => Math.cos(i * 0.11));
  let want: Float32Array | null = null;
  for (const threads of [1, 2, 3, 4]) {
    const { arena, pool, put } = await poolWith(threads);
    try {
      const [a, b, c] = mats.map(put), xo = put(x);
      const ys = [1, 2, 3].map(() => arena.alloc("y", n * 4));
      const job = (w: number, from: number, to: number, after: boolean) => ({
        kernel: "gemv_f32",
        args: [BigInt(w), BigInt(from), BigInt(to), n, n],
        rows: n,
        after,
      });
      for (let rep = 0; rep < 40; rep++) {
        for (const y of ys) arena.f32(y, n).fill(0);
        pool.run([
          job(a, xo, ys[0], false),
          job(b, ys[0], ys[1], true),
          job(c, ys[1], ys[2], true),
        ], 1 << 20);
        const got = arena.f32(ys[2], n).slice();
        want ??= got;
        assert.deepEqual(got, want, `${threads} threads, repeat ${rep}`);
      }
      if (threads > 1) assert.ok(pool.counts.parallel > 0);
    } finally {
      pool.close();
    }
  }
});

Deno.test("gated MLPs in one dispatch give the bits of matmul, SiLU, (Q8,) matmul", async () => {
  const inter = 96, d = 256;
  const rand = (len: number, f: number) =>
    Float32Array.from({ length: len }, (_, i) => Math.sin(i * f + f) * 0.5);
  for (const threads of [1, 2, 3]) {
    const { arena, ops, pool, put } = await poolWith(threads);
    try {
      // MLPs in MXFP4 as shipped (the exact kernel, f32 input) and as packed (Q8 input), bf16
      // and f32, all in one call.
      const weights = (kind: string, rows: number, cols: number, f: number): TensorRef => {
        const w = rand(rows * cols, f);
        const dtype = kind.startsWith("mxfp4") ? "mxfp4" : kind;
        if (dtype === "mxfp4") {
          const m = quantizeMxfp4(w, rows, cols);
          const exact = kind === "mxfp4 exact";
          return { dtype, rows, cols, ptr: put(m.blocks), scale: put(m.scales), exact };
        }
        const data = dtype === "bf16" ? f32ToBf16Bytes(w) : w;
        return { dtype, rows, cols, ptr: put(data) };
      };
      const k = pool.exports;
      const mlps = ["mxfp4 exact", "mxfp4", "bf16", "f32"].map((kind, i) => {
        const x = put(rand(d, 0.05 + i));
        const q8 = kind === "mxfp4";
        const xq = q8 ? arena.alloc("xq", q8Bytes(d), 64) : undefined;
        if (xq !== undefined) k.quantize_act_q8(BigInt(x), BigInt(xq), d);
        return {
          gate: weights(kind, inter, d, 0.3 + i),
          up: weights(kind, inter, d, 0.7 + i),
          down: weights(kind, d, inter, 1.1 + i),
          x,
          g: arena.alloc("g", inter * 4),
          u: arena.alloc("u", inter * 4),
          y: arena.alloc("y", d * 4),
          xq,
          gq: q8 ? arena.alloc("gq", q8Bytes(inter), 64) : undefined,
        };
      });
      const want = mlps.map((m) => {
        const xq = m.xq === undefined ? undefined : [m.xq];
        ops.matmul({ w: m.gate, x: m.x, y: m.g, nb: 1, prep: xq }, {
          w: m.up,
          x: m.x,
          y: m.u,
          nb: 1,
          prep: xq,
        });
        ops.siluMul(m.g, m.u, inter);
        if (m.gq !== undefined) k.quantize_act_q8(BigInt(m.g), BigInt(m.gq), inter);
        const gq = m.gq === undefined ? undefined : [m.gq];
        ops.matmul({ w: m.down, x: m.g, y: m.y, nb: 1, prep: gq });
        return new Uint32Array(arena.memory.buffer, m.y, d).slice();
      });
      for (let rep = 0; rep < 20; rep++) {
        for (const m of mlps) {
          arena.f32(m.g, inter).fill(0);
          if (m.gq !== undefined) new Uint8Array(arena.memory.buffer, m.gq, q8Bytes(inter)).fill(0);
        }
        ops.gatedMlps(mlps);
        mlps.forEach((m, i) =>
          assert.deepEqual(new Uint32Array(arena.memory.buffer, m.y, d), want[i], `${threads}`)
        );
      }
      if (threads > 1) assert.ok(pool.counts.parallel > 0);
    } finally {
      pool.close();
    }
  }
});

Deno.test("a kernel that fails inside a chain of jobs run after each other neither hangs the pool nor breaks it", async () => {
  const { arena, pool, put } = await poolWith(2);
  try {
    const n = 256;
    const w = put(Float32Array.from({ length: n * n }, (_, i) => Math.sin(i)));
    const x = put(new Float32Array(n).fill(1));
    const y = arena.alloc("y", n * 4), z = arena.alloc("z", n * 4);
    const gemv = (from: bigint, to: number, after: boolean) => ({
      kernel: "gemv_f32",
      args: [BigInt(w), from, BigInt(to), n, n],
      rows: n,
      after,
    });
    // The second job reads past the end of memory: the trap must surface, the third never wait.
    const past = BigInt(arena.memory.buffer.byteLength);
    for (let rep = 0; rep < 5; rep++) {
      assert.throws(() =>
        pool.run(
          [gemv(BigInt(x), y, false), gemv(past, z, true), gemv(BigInt(y), z, true)],
          1 << 20,
        )
      );
    }
    pool.run([gemv(BigInt(x), y, false), gemv(BigInt(y), z, true)], 1 << 20);
    const ref = gemvRef({ type: "f32", data: arena.f32(w, n * n).slice() }, arena.f32(y, n), n, n);
    arena.f32(z, n).forEach((v, r) =>
      assert.ok(Math.abs(v - ref[r]) <= 1e-3 * Math.abs(ref[r]) + 1e-3)
    );
  } finally {
    pool.close();
  }
});

Deno.test("a worker that joins a dispatch late never runs the next one's jobs twice", async () => {
  // A one-row dispatch forced onto the workers is done by the main thread before they wake, so
  // they join it late; an in-place job run right after it on the main thread alone must then
  // apply once (a worker that ran part of it again would square silu on those rows).
  const { arena, pool, put } = await poolWith(3);
  try {
    const n = 4096;
    const g = arena.alloc("g", n * 4), u = put(new Float32Array(n).fill(2));
    const w = put(new Float32Array(4).fill(1)), x = put(new Float32Array(4).fill(1));
    const y = arena.alloc("y", 16);
    const silu = { kernel: "silu_mul_range_f32", args: [BigInt(g), BigInt(u), n], rows: n };
    const once = 2 / (1 + Math.exp(-1));
    for (let rep = 0; rep < 300; rep++) {
      arena.f32(g, n).fill(1);
      pool.run(
        [{ kernel: "gemv_f32", args: [BigInt(w), BigInt(x), BigInt(y), 4, 4], rows: 4 }],
        1 << 20,
      );
      pool.run([silu], 1);
      const got = arena.f32(g, n);
      for (let i = 0; i < n; i++) {
        if (Math.abs(got[i] - once) > 1e-6) assert.fail(`repeat ${rep}: element ${i} is ${got[i]}`);
      }
    }
    assert.ok(pool.counts.parallel >= 300 && pool.counts.serial >= 300);
  } finally {
    pool.close();
  }
});
