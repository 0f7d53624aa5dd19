// Compute kernels (wasm/kernels.wasm) against the scalar references of tests/scalar_kernels.ts, plus
// the invariants the engine relies on: row splits and batching never change a result's bits.
import assert from "node:assert/strict";
import {
  createArenaMemory,
  instantiateKernels,
  KERNEL_RESERVED_BYTES,
  type Kernels,
  loadKernelModule,
  type Ptr,
} from "../wasm/mod.ts";
import {
  addRef,
  argmaxRef,
  type AttentionKeys,
  attentionRef,
  type AttentionShape,
  attnResRef,
  axpyRef,
  bf16ToF32,
  csaCompressRef,
  csaIndexScoresRef,
  expRef,
  f16ToF32,
  geluTanhMulRef,
  gemmRef,
  gemvAbsRef,
  gemvRef,
  rmsnormRef,
  rmsnormRowsRef,
  ropeRef,
  scaleRef,
  sigmoidRef,
  siluMulRef,
  situMulRef,
  softcapRef,
  softmaxRef,
  swigluClampedRef,
  swigluLimitRef,
  topkRef,
  type Weights,
} from "./scalar_kernels.ts";
import { hyperHead, hyperPost, hyperWeights } from "../engine/reference/math.ts";

const memory = createArenaMemory(64 * 2 ** 20);
const k: Kernels = await instantiateKernels(await loadKernelModule(), memory);

/** Bump allocator over the test arena; reset() between tests' independent cases. */
let top = KERNEL_RESERVED_BYTES;
function reset(): void {
  top = KERNEL_RESERVED_BYTES;
}
function alloc(bytes: number): Ptr {
  const p = top;
  top += Math.ceil(bytes / 64) * 64;
  assert.ok(top <= memory.buffer.byteLength, "test arena exhausted");
  return BigInt(p);
}
function f32At(p: Ptr, n: number): Float32Array {
  return new Float32Array(memory.buffer, Number(p), n);
}
function putF32(a: Float32Array): Ptr {
  const p = alloc(a.byteLength);
  f32At(p, a.length).set(a);
  return p;
}
function putU16(a: Uint16Array): Ptr {
  const p = alloc(a.byteLength);
  new Uint16Array(memory.buffer, Number(p), a.length).set(a);
  return p;
}
function bitsOf(a: Float32Array): Uint32Array {
  return new Uint32Array(Float32Array.from(a).buffer);
}

/** Deterministic uniform values in [lo, hi). */
function randomF32(n: number, seed: number, lo = -1, hi = 1): Float32Array {
  let s = seed >>> 0;
  return Float32Array.from({ length: n }, () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return lo + (hi - lo) * (s / 2 ** 32);
  });
}
function toBf16(a: Float32Array): Uint16Array {
  return Uint16Array.from(bitsOf(a), (b) => b >>> 16);
}
/** f32 → IEEE half, truncating the mantissa; inputs here are in the normal half range. */
function toF16(a: Float32Array): Uint16Array {
  return Uint16Array.from(bitsOf(a), (b) => {
    const sign = (b >>> 16) & 0x8000;
    const exp = ((b >>> 23) & 0xff) - 127 + 15;
    if (exp <= 0) return sign;
    return sign | (exp << 10) | ((b >>> 13) & 0x3ff);
  });
}

/** |got - want| <= tol * scale[i] for each i, NaN only where expected. */
function assertClose(
  got: Float32Array,
  want: ArrayLike<number>,
  tol: number,
  scale: ArrayLike<number>,
  what: string,
): void {
  assert.equal(got.length, want.length, `${what}: length`);
  for (let i = 0; i < got.length; i++) {
    if (Number.isNaN(want[i])) {
      assert.ok(Number.isNaN(got[i]), `${what}[${i}]: ${got[i]}, expected NaN`);
      continue;
    }
    const err = Math.abs(got[i] - want[i]);
    assert.ok(
      err <= tol * scale[i] || got[i] === want[i],
      `${what}[${i}]: ${got[i]} vs ${want[i]} (error ${err}, allowed ${tol * scale[i]})`,
    );
  }
}
function relScale(want: ArrayLike<number>, floor = 1e-30): number[] {
  return Array.from(want, (v) => Math.max(Math.abs(v), floor));
}

const ROWS = [1, 3, 5, 17];
const COLS = [1, 3, 17, 64, 4097];
type MatType = "f32" | "bf16" | "f16";
const GEMV = { f32: "gemv_f32", bf16: "gemv_bf16", f16: "gemv_f16" } as const;

/** A random matrix in `type`, in the arena, plus its reference description. */
function putMatrix(type: MatType, rows: number, cols: number, seed: number): [Ptr, Weights] {
  const w = randomF32(rows * cols, seed);
  if (type === "f32") return [putF32(w), { type, data: w }];
  const data = type === "bf16" ? toBf16(w) : toF16(w);
  return [putU16(data), { type, data }];
}

function runGemv(type: MatType, W: Ptr, x: Ptr, rows: number, cols: number, splits: number[]) {
  const y = alloc(rows * 4);
  for (let i = 0; i + 1 < splits.length; i++) {
    k[GEMV[type]](W, x, y, rows, cols, splits[i], splits[i + 1]);
  }
  return Float32Array.from(f32At(y, rows));
}

for (const type of ["f32", "bf16", "f16"] as const) {
  Deno.test(`gemv_${type} matches the reference at awkward sizes`, () => {
    for (const rows of ROWS) {
      for (const cols of COLS) {
        reset();
        const [W, ref] = putMatrix(type, rows, cols, rows * 7919 + cols);
        const xs = randomF32(cols, cols);
        const y = runGemv(type, W, putF32(xs), rows, cols, [0, rows]);
        assertClose(
          y,
          gemvRef(ref, xs, rows, cols),
          1e-5,
          gemvAbsRef(ref, xs, rows, cols),
          `gemv_${type} ${rows}x${cols}`,
        );
      }
    }
  });

  Deno.test(`gemv_${type} gives the same bits for every row split`, () => {
    for (const cols of [3, 17, 4097]) {
      reset();
      const rows = 17;
      const [W] = putMatrix(type, rows, cols, cols);
      const x = putF32(randomF32(cols, 5));
      const whole = bitsOf(runGemv(type, W, x, rows, cols, [0, rows]));
      const splits = [[0, 1, 6, 17], [0, 3, 4, 9, 10, 17], Array.from({ length: 18 }, (_, i) => i)];
      for (const s of splits) {
        assert.deepEqual(bitsOf(runGemv(type, W, x, rows, cols, s)), whole, `split ${s}`);
      }
    }
  });
}

Deno.test("gemv_f32 leaves rows outside [r0, r1) alone and clamps r1 to rows", () => {
  reset();
  const [W] = putMatrix("f32", 5, 9, 1);
  const x = putF32(randomF32(9, 2));
  const y = alloc(6 * 4);
  f32At(y, 6).fill(-7);
  k.gemv_f32(W, x, y, 5, 9, 1, 99);
  const out = f32At(y, 6);
  assert.equal(out[0], -7);
  assert.equal(out[5], -7);
  assert.ok(out.slice(1, 5).every((v) => v !== -7));
});

Deno.test("gemv propagates NaN and Inf from x", () => {
  for (const type of ["f32", "bf16", "f16"] as const) {
    reset();
    const rows = 5, cols = 21;
    const w = randomF32(rows * cols, 3, 0.5, 1); // positive weights: Inf stays +Inf
    const W = type === "f32" ? putF32(w) : putU16(type === "bf16" ? toBf16(w) : toF16(w));
    for (const pos of [0, 9, 20]) {
      const xs = randomF32(cols, 4);
      xs[pos] = NaN;
      assert.ok(runGemv(type, W, putF32(xs), rows, cols, [0, rows]).every(Number.isNaN), type);
      xs[pos] = Infinity;
      const y = runGemv(type, W, putF32(xs), rows, cols, [0, rows]);
      assert.ok(y.every((v) => v === Infinity), `${type} +Inf at ${pos}: ${y}`);
    }
  }
});

/** Every 16-bit pattern as a weight, in every column position of a 15-column row. */
function decodeAll(type: "bf16" | "f16"): Float32Array {
  reset();
  const rows = 65536, cols = 15; // 15 = a group of 8, a group of 4 and a tail of 3
  const W = new Uint16Array(rows * cols);
  for (let r = 0; r < rows; r++) W[r * cols + (r % cols)] = r;
  const x = putF32(new Float32Array(cols).fill(1));
  return runGemv(type, putU16(W), x, rows, cols, [0, rows]);
}

Deno.test("gemv_bf16 decodes every bf16 pattern exactly (Inf, NaN, subnormals)", () => {
  const y = decodeAll("bf16");
  for (let h = 0; h < 65536; h++) {
    const want = bf16ToF32(h);
    if (Number.isNaN(want)) assert.ok(Number.isNaN(y[h]), `bf16 0x${h.toString(16)}`);
    else assert.ok(y[h] === want, `bf16 0x${h.toString(16)}: ${y[h]} vs ${want}`);
  }
  assert.equal(y[0x7f80], Infinity);
  assert.equal(y[0xff80], -Infinity);
  assert.equal(y[0x0001], 2 ** -133);
});

Deno.test("gemv_f16 decodes every half pattern exactly (Inf, NaN, subnormals)", () => {
  const y = decodeAll("f16");
  for (let h = 0; h < 65536; h++) {
    const want = f16ToF32(h);
    if (Number.isNaN(want)) assert.ok(Number.isNaN(y[h]), `f16 0x${h.toString(16)}`);
    else assert.ok(y[h] === want, `f16 0x${h.toString(16)}: ${y[h]} vs ${want}`);
  }
  assert.equal(y[0x7c00], Infinity);
  assert.equal(y[0xfc00], -Infinity);
  assert.equal(y[0x0001], 2 ** -24);
  assert.equal(y[0x7bff], 65504);
  assert.equal(y[0x3c00], 1);
});

for (const type of ["f32", "bf16"] as const) {
  Deno.test(`gemm_${type} equals gemv_${type} per column bit for bit, and the reference`, () => {
    const gemm = type === "f32" ? k.gemm_f32 : k.gemm_bf16;
    for (const rows of ROWS) {
      for (const cols of [1, 17, 4097]) {
        // 31 columns of 4097 run as blocks of 12, 12 and 7 (kernels/gemm.c GEMM_BLOCK_FLOATS).
        for (const nb of [1, 3, 4, 5, 6, 8, 31]) {
          reset();
          const [W, ref] = putMatrix(type, rows, cols, rows + cols);
          const xs = randomF32(nb * cols, nb * 31 + cols);
          const X = putF32(xs);
          const Y = alloc(nb * rows * 4);
          gemm(W, X, Y, rows, cols, nb, 0, 1);
          gemm(W, X, Y, rows, cols, nb, 1, rows);
          const got = Float32Array.from(f32At(Y, nb * rows));
          for (let b = 0; b < nb; b++) {
            const col = runGemv(type, W, X + BigInt(b * cols * 4), rows, cols, [0, rows]);
            assert.deepEqual(
              bitsOf(got.subarray(b * rows, (b + 1) * rows)),
              bitsOf(col),
              `gemm_${type} ${rows}x${cols} nb=${nb} column ${b}`,
            );
          }
          const absScale = Array.from(
            { length: nb },
            (_, b) =>
              Array.from(gemvAbsRef(ref, xs.subarray(b * cols, (b + 1) * cols), rows, cols)),
          ).flat();
          assertClose(got, gemmRef(ref, xs, rows, cols, nb), 1e-5, absScale, `gemm_${type}`);
        }
      }
    }
  });
}

Deno.test("rmsnorm_f32 matches the reference, also in place", () => {
  for (const n of COLS) {
    reset();
    const xs = randomF32(n, n, -3, 3), ws = randomF32(n, n + 1);
    const x = putF32(xs), w = putF32(ws), y = alloc(n * 4);
    const want = rmsnormRef(xs, ws, 1e-5);
    k.rmsnorm_f32(x, w, y, n, 1e-5);
    assertClose(f32At(y, n), want, 2e-6, relScale(want, 1e-6), `rmsnorm n=${n}`);
    k.rmsnorm_f32(x, w, x, n, 1e-5);
    assert.deepEqual(bitsOf(f32At(x, n)), bitsOf(f32At(y, n)), `rmsnorm in place n=${n}`);
  }
});

Deno.test("rmsnorm_rows_f32 normalises each row with the shared weight, or with 1 + w", () => {
  reset();
  const n = 17, nrows = 5;
  const xs = randomF32(n * nrows, 8, -2, 2), ws = randomF32(n, 9);
  const x = putF32(xs), w = putF32(ws);
  k.rmsnorm_rows_f32(x, w, x, n, nrows, 1e-6, 0);
  const want = rmsnormRowsRef(xs, ws, n, nrows, 1e-6);
  assertClose(f32At(x, n * nrows), want, 2e-6, relScale(want, 1e-6), "rmsnorm_rows");
  const x1 = putF32(xs);
  k.rmsnorm_rows_f32(x1, w, x1, n, nrows, 1e-6, 1);
  const want1 = rmsnormRowsRef(xs, ws.map((v) => 1 + v), n, nrows, 1e-6);
  assertClose(f32At(x1, n * nrows), want1, 2e-6, relScale(want1, 1e-6), "rmsnorm_rows 1 + w");
});

Deno.test("rmsnorm_f32: NaN in x gives all NaN; Inf gives NaN there and 0 elsewhere", () => {
  reset();
  const n = 19;
  const xs = randomF32(n, 1), ws = randomF32(n, 2);
  xs[11] = NaN;
  const y = alloc(n * 4);
  k.rmsnorm_f32(putF32(xs), putF32(ws), y, n, 1e-5);
  assert.ok(f32At(y, n).every(Number.isNaN));
  xs[11] = Infinity;
  k.rmsnorm_f32(putF32(xs), putF32(ws), y, n, 1e-5);
  assertClose(f32At(y, n), rmsnormRef(xs, ws, 1e-5), 0, new Array(n).fill(0), "rmsnorm Inf");
});

Deno.test("rope_f32 matches the reference bit for bit in both layouts", () => {
  for (const [nheads, stride, rotDim] of [[3, 24, 18], [2, 64, 64], [4, 40, 6], [1, 2, 2]]) {
    for (const interleaved of [false, true]) {
      reset();
      const xs = randomF32(nheads * stride, stride + rotDim, -4, 4);
      const angles = randomF32(rotDim / 2, 77, -3, 3);
      const cos = Float32Array.from(angles, Math.cos), sin = Float32Array.from(angles, Math.sin);
      const x = putF32(xs);
      k.rope_f32(x, nheads, stride, rotDim, putF32(cos), putF32(sin), interleaved ? 1 : 0);
      const want = Float32Array.from(xs);
      ropeRef(want, nheads, stride, rotDim, cos, sin, interleaved);
      assert.deepEqual(
        bitsOf(f32At(x, nheads * stride)),
        bitsOf(want),
        `rope ${nheads}x${stride} rot ${rotDim} interleaved ${interleaved}`,
      );
    }
  }
});

function runSoftmax(xs: Float32Array): Float32Array {
  reset();
  const x = putF32(xs);
  k.softmax_f32(x, xs.length);
  return Float32Array.from(f32At(x, xs.length));
}

Deno.test("softmax_f32 matches the reference and sums to 1", () => {
  for (const n of COLS) {
    const xs = randomF32(n, n, -20, 20);
    const got = runSoftmax(xs);
    const want = softmaxRef(xs);
    // x - max is rounded to f32 before exp: about |x - max| * 2^-24 relative error, ≤ 2.4e-6 here.
    assertClose(got, want, 3e-6, relScale(want, 1e-37), `softmax n=${n}`);
    assert.ok(Math.abs(got.reduce((a, b) => a + b, 0) - 1) < 1e-5);
  }
});

Deno.test("softmax_f32 special values: NaN, +Inf, all -Inf, some -Inf", () => {
  const xs = randomF32(13, 3);
  xs[6] = NaN;
  assert.ok(runSoftmax(xs).every(Number.isNaN), "NaN in → all NaN");
  xs[6] = Infinity;
  assert.ok(runSoftmax(xs).every(Number.isNaN), "+Inf in → all NaN");
  const masked = new Float32Array(13).fill(-Infinity);
  assert.deepEqual(runSoftmax(masked), new Float32Array(13).fill(1 / 13), "all -Inf → uniform");
  xs[6] = -Infinity;
  xs[12] = -Infinity;
  const got = runSoftmax(xs);
  assert.equal(got[6], 0);
  assert.equal(got[12], 0);
  assertClose(got, softmaxRef(xs), 1e-6, relScale(softmaxRef(xs), 1e-37), "softmax -Inf");
});

/** Distance in units in the last place between two finite f32 of the same sign. */
function ulpDistance(a: number, b: number): number {
  const [ba, bb] = bitsOf(Float32Array.of(a, b));
  return Math.abs(ba - bb);
}

Deno.test("exp_f32 is within 2 ulp over the whole range, with overflow, underflow and NaN", () => {
  reset();
  const n = 200003;
  const xs = Float32Array.from({ length: n }, (_, i) => -105 + 195 * i / (n - 1));
  const x = putF32(xs);
  k.exp_f32(x, n);
  const got = f32At(x, n), want = expRef(xs);
  let worst = 0;
  for (let i = 0; i < n; i++) {
    if (want[i] === Infinity || want[i] === 0) {
      assert.equal(got[i], want[i], `exp(${xs[i]})`);
      continue;
    }
    worst = Math.max(worst, ulpDistance(got[i], want[i]));
  }
  assert.ok(worst <= 2, `exp worst error ${worst} ulp`);
  const special = Float32Array.of(
    NaN,
    Infinity,
    -Infinity,
    0,
    -0,
    88.72283,
    88.7229,
    -87.4,
    -103.9,
  );
  const s = putF32(special);
  k.exp_f32(s, special.length);
  const out = f32At(s, special.length);
  assert.ok(Number.isNaN(out[0]));
  assert.deepEqual(Array.from(out.subarray(1, 5)), [Infinity, 0, 1, 1]);
  assert.ok(out[5] > 3.4e38 && out[5] < Infinity, "just below the overflow threshold");
  assert.equal(out[6], Infinity);
  assert.ok(ulpDistance(out[7], Math.exp(special[7])) <= 1, "subnormal result");
  assert.ok(ulpDistance(out[8], Math.exp(special[8])) <= 1, "deep subnormal result");
});

Deno.test("silu_mul_f32 and sigmoid_f32 match the reference; extremes give no NaN", () => {
  for (const n of [1, 3, 17, 4097]) {
    reset();
    const gs = randomF32(n, n, -30, 30), us = randomF32(n, n + 2);
    gs[0] = -200;
    if (n > 1) gs[1] = 200;
    const g = putF32(gs);
    k.silu_mul_f32(g, putF32(us), n);
    const want = siluMulRef(gs, us);
    assertClose(f32At(g, n), want, 3e-6, relScale(want, 1e-37), `silu_mul n=${n}`);
    const x = putF32(gs);
    k.sigmoid_f32(x, n);
    const sig = sigmoidRef(gs);
    assertClose(f32At(x, n), sig, 3e-6, relScale(sig, 1e-37), `sigmoid n=${n}`);
  }
});

Deno.test("add_f32, axpy_f32, scale_f32 match the reference bit for bit; copy_f32 moves", () => {
  for (const n of [1, 3, 17, 4097]) {
    reset();
    const ys = randomF32(n, n), xs = randomF32(n, n + 1);
    const y = putF32(ys), x = putF32(xs);
    k.add_f32(y, x, n);
    assert.deepEqual(bitsOf(f32At(y, n)), bitsOf(addRef(ys, xs)), `add n=${n}`);
    f32At(y, n).set(ys);
    k.axpy_f32(y, x, 0.3, n);
    assert.deepEqual(bitsOf(f32At(y, n)), bitsOf(axpyRef(ys, xs, 0.3)), `axpy n=${n}`);
    f32At(y, n).set(ys);
    k.scale_f32(y, -1.7, n);
    assert.deepEqual(bitsOf(f32At(y, n)), bitsOf(scaleRef(ys, -1.7)), `scale n=${n}`);
    const d = alloc(n * 4);
    k.copy_f32(d, x, n);
    assert.deepEqual(bitsOf(f32At(d, n)), bitsOf(xs), `copy n=${n}`);
  }
  reset();
  const xs = randomF32(10, 1);
  const x = putF32(xs);
  k.copy_f32(x + 4n, x, 9); // overlapping, forward
  assert.deepEqual(Array.from(f32At(x, 10)), [xs[0], ...xs.subarray(0, 9)]);
});

function runArgmax(xs: Float32Array): number {
  reset();
  return k.argmax_f32(putF32(xs), xs.length);
}

Deno.test("argmax_f32: first maximum, NaN ranks highest, empty gives -1", () => {
  for (const n of [1, 3, 17, 4097]) {
    const xs = randomF32(n, n);
    assert.equal(runArgmax(xs), argmaxRef(xs), `n=${n}`);
    xs.fill(0.5);
    assert.equal(runArgmax(xs), 0, `all equal n=${n}`);
  }
  const xs = Float32Array.of(1, 9, 3, 9, 2, 9, 0, 1, 9);
  assert.equal(runArgmax(xs), 1);
  xs[7] = NaN;
  xs[8] = NaN;
  assert.equal(runArgmax(xs), 7);
  assert.equal(argmaxRef(xs), 7);
  assert.equal(runArgmax(Float32Array.of(-0, 0)), 0);
  assert.equal(runArgmax(Float32Array.of(-Infinity, -Infinity)), 0);
  assert.equal(runArgmax(new Float32Array(0)), -1);
});

function runTopk(xs: Float32Array, kk: number): Int32Array {
  reset();
  const idx = alloc(kk * 4);
  k.topk_f32(putF32(xs), xs.length, kk, idx);
  return Int32Array.from(new Int32Array(memory.buffer, Number(idx), kk));
}

Deno.test("topk_f32: descending order, ties to the lower index, NaN first, -1 beyond n", () => {
  for (const n of [1, 3, 17, 4097]) {
    // Values on a coarse grid so ties are common.
    const xs = Float32Array.from(randomF32(n, n), (v) => Math.round(v * 8) / 8);
    for (const kk of [1, 2, 4, 8]) {
      assert.deepEqual(runTopk(xs, kk), topkRef(xs, kk), `n=${n} k=${kk}`);
    }
    assert.equal(runTopk(xs, 1)[0], argmaxRef(xs), "top-1 is argmax");
  }
  const xs = Float32Array.of(2, NaN, 5, 5, -Infinity, NaN, 1);
  assert.deepEqual(Array.from(runTopk(xs, 5)), [1, 5, 2, 3, 0]);
  assert.deepEqual(runTopk(xs, 5), topkRef(xs, 5));
  assert.deepEqual(Array.from(runTopk(Float32Array.of(3, 4), 4)), [1, 0, -1, -1]);
});

/** One attention case: shape, tile, the call's tokens and where their keys are. */
interface AttentionCase {
  s: AttentionShape;
  tile: number;
  pos0: number;
  tokens: number;
  keys: AttentionKeys;
  /** Values are the keys' leading vHeadDim floats (MLA's latent cache). */
  kIsV?: boolean;
  /** Queries drawn from ±qRange (default 2): large ranges peak the scores. */
  qRange?: number;
}

/** Query and output rows are padded so strides differ from the head sizes. */
const Q_PAD = 3, OUT_PAD = 5;

/** Cache slots a case reads: its ring, or every position up to its last token. */
function cacheSlots(c: AttentionCase): number {
  return c.keys.slots || c.pos0 + c.tokens;
}

/**
 * attention_f32 over tokens [t0, t1) of case c (all its queries in qs, rows of nHeads·headDim +
 * Q_PAD), heads split at `splits`; returns (t1 − t0) rows of nHeads·vHeadDim floats. The scratch
 * and the output start as NaN: nothing may be read before it is written.
 */
function runAttention(
  c: AttentionCase,
  qs: Float32Array,
  ks: Float32Array,
  vs: Float32Array,
  t0: number,
  t1: number,
  splits: number[],
  rowHeads = 1,
): Float32Array {
  reset();
  const s = c.s, n = t1 - t0, qStride = s.nHeads * s.headDim + Q_PAD;
  const oStride = s.nHeads * s.vHeadDim + OUT_PAD;
  const q = putF32(qs.subarray(t0 * qStride)), kc = putF32(ks);
  const vc = c.kIsV ? kc : putF32(vs);
  const sinks = c.keys.sinks ? putF32(c.keys.sinks) : 0n;
  // NaN, not what an earlier call left at the same offset: a head no call computed shows.
  const out = putF32(new Float32Array(n * oStride).fill(NaN));
  const scratch = putF32(
    new Float32Array(s.nHeads * (Math.ceil(c.tile / 4) * 4 + 2 * n)).fill(NaN),
  );
  for (let i = 0; i + 1 < splits.length; i++) {
    k.attention_f32(
      q,
      qStride,
      kc,
      vc,
      out,
      oStride,
      n,
      c.pos0 + t0,
      c.keys.window ?? 0,
      c.keys.slots ?? 0,
      s.nHeads,
      s.nKvHeads,
      s.headDim,
      s.vHeadDim,
      s.kStride,
      s.vStride,
      s.scale,
      sinks,
      c.tile,
      scratch,
      rowHeads,
      splits[i],
      splits[i + 1],
    );
  }
  const rows = f32At(out, n * oStride);
  const w = s.nHeads * s.vHeadDim;
  return Float32Array.from({ length: n * w }, (_, i) => rows[Math.floor(i / w) * oStride + i % w]);
}

/** Cases at awkward sizes: tiles of 1, 3, 5 and 64 positions cut mid-call, GQA ratios, rings. */
function attentionCases(): AttentionCase[] {
  const shape = (nHeads: number, nKvHeads: number, headDim: number, vHeadDim = headDim) => ({
    nHeads,
    nKvHeads,
    headDim,
    vHeadDim,
    kStride: nKvHeads * headDim,
    vStride: nKvHeads * vHeadDim,
    scale: 1 / Math.sqrt(headDim),
  });
  return [
    // GQA 2:1 over padded cache rows, a tile of 5 cut by 13 tokens from position 0.
    {
      s: { ...shape(4, 2, 17), kStride: 40, vStride: 36 },
      tile: 5,
      pos0: 0,
      tokens: 13,
      keys: {},
    },
    // 6:1 across the 64-position tile boundary the engine uses.
    { s: shape(6, 1, 64), tile: 64, pos0: 60, tokens: 9, keys: {} },
    // 2:1 over three tiles of 64.
    { s: shape(8, 4, 32), tile: 64, pos0: 130, tokens: 3, keys: {} },
    // A window of 4 in a ring of 4 + 6 − 1 slots that wraps, tiles of 3, 6:3.
    { s: shape(6, 3, 8), tile: 3, pos0: 5, tokens: 6, keys: { window: 4, slots: 9 } },
    // One-position tiles, 1:1, with sinks.
    {
      s: shape(4, 4, 12),
      tile: 1,
      pos0: 2,
      tokens: 5,
      keys: { sinks: Float32Array.of(0.5, -1, 2, 0) },
    },
    // Sinks, a window wider than a tile, a ring, 2:1.
    {
      s: shape(4, 2, 16),
      tile: 4,
      pos0: 9,
      tokens: 7,
      keys: { window: 6, slots: 12, sinks: Float32Array.of(1, -2, 0.25, 3) },
    },
    // MLA-like: one latent head shared by 3, values the keys' leading 19 floats.
    {
      s: { ...shape(3, 1, 24, 19), vStride: 24 },
      tile: 5,
      pos0: 3,
      tokens: 8,
      keys: {},
      kIsV: true,
    },
    // Kv heads of 8, 7 and 5 query heads (heads in tiles of 3 + 3 + 2, 3 + 2 + 2, 3 + 2), tiles
    // of 7 and 5 keys so 4-key and 2-key score tiles end on a single key, a head size of 4k + 1.
    { s: shape(16, 2, 21), tile: 7, pos0: 4, tokens: 6, keys: {} },
    { s: shape(14, 2, 12), tile: 5, pos0: 0, tokens: 9, keys: { window: 5, slots: 13 } },
    { s: shape(10, 2, 33), tile: 64, pos0: 58, tokens: 11, keys: {} },
  ];
}

/** A case's queries, keys and values (deterministic). */
function attentionData(c: AttentionCase, seed: number) {
  const s = c.s, slots = cacheSlots(c);
  const r = c.qRange ?? 2;
  const qs = randomF32(c.tokens * (s.nHeads * s.headDim + Q_PAD), seed, -r, r);
  const ks = randomF32(slots * s.kStride, seed + 1, -2, 2);
  const vs = c.kIsV ? ks : randomF32(slots * s.vStride, seed + 2);
  return { qs, ks, vs };
}

Deno.test("attention_f32 in tiles matches the float64 softmax at tile boundaries, GQA, windows, rings and sinks", () => {
  attentionCases().forEach((c, n) => {
    const { qs, ks, vs } = attentionData(c, 10 * n + 1);
    const s = c.s, w = s.nHeads * s.vHeadDim, qStride = s.nHeads * s.headDim + Q_PAD;
    const got = runAttention(c, qs, ks, vs, 0, c.tokens, [0, s.nHeads]);
    for (let i = 0; i < c.tokens; i++) {
      const q = qs.subarray(i * qStride, i * qStride + s.nHeads * s.headDim);
      const want = attentionRef(q, ks, vs, s, c.pos0 + i, c.keys);
      assertClose(
        got.subarray(i * w, (i + 1) * w),
        want,
        2e-6,
        new Array(w).fill(1),
        `case ${n} token ${i}`,
      );
    }
  });
});

Deno.test("attention_f32: a query's bits do not depend on the tokens or heads that share its call", () => {
  attentionCases().forEach((c, n) => {
    const { qs, ks, vs } = attentionData(c, 10 * n + 1);
    const s = c.s, w = s.nHeads * s.vHeadDim, all = [0, s.nHeads];
    const whole = runAttention(c, qs, ks, vs, 0, c.tokens, all);
    // Token by token, as decode runs them.
    for (let i = 0; i < c.tokens; i++) {
      const one = runAttention(c, qs, ks, vs, i, i + 1, all);
      assert.deepEqual(
        bitsOf(one),
        bitsOf(whole.subarray(i * w, (i + 1) * w)),
        `case ${n} token ${i}`,
      );
    }
    // Two calls cut mid-tile, and heads split unevenly between workers.
    const cut = Math.floor(c.tokens / 2);
    const halves = new Float32Array(whole.length);
    halves.set(runAttention(c, qs, ks, vs, 0, cut, all));
    halves.set(runAttention(c, qs, ks, vs, cut, c.tokens, all), cut * w);
    assert.deepEqual(bitsOf(halves), bitsOf(whole), `case ${n}: two calls`);
    const split = [0, 1, ...(s.nHeads > 3 ? [3] : []), s.nHeads];
    const heads = runAttention(c, qs, ks, vs, 0, c.tokens, split);
    assert.deepEqual(bitsOf(heads), bitsOf(whole), `case ${n}: head split`);
    // Rows of a kv head's heads, as the pool splits them: [h0, h1) counts rows.
    const group = s.nHeads / s.nKvHeads;
    const rows = runAttention(c, qs, ks, vs, 0, c.tokens, [0, 1, s.nKvHeads], group);
    assert.deepEqual(bitsOf(rows), bitsOf(whole), `case ${n}: rows of ${group} heads`);
  });
});

/**
 * Shapes of the models sluice runs and odd ones around them: the demo model's 8 heads over 2 of
 * 32, Qwen3-30B-A3B's 32 over 4 of 128, gpt-oss-like windows in rings with sinks, MQA, MHA, an
 * MLA-like latent cache, head sizes from 1 to 130, calls that start and end mid-tile.
 */
function modelAttentionCases(): AttentionCase[] {
  const shape = (nHeads: number, nKvHeads: number, headDim: number) => ({
    nHeads,
    nKvHeads,
    headDim,
    vHeadDim: headDim,
    kStride: nKvHeads * headDim,
    vStride: nKvHeads * headDim,
    scale: 1 / Math.sqrt(headDim),
  });
  return [
    { s: shape(8, 2, 32), tile: 64, pos0: 0, tokens: 70, keys: {} },
    { s: shape(8, 2, 32), tile: 64, pos0: 61, tokens: 9, keys: {} },
    { s: shape(8, 2, 32), tile: 64, pos0: 125, tokens: 40, keys: {} },
    { s: shape(32, 4, 128), tile: 64, pos0: 100, tokens: 30, keys: {} },
    // Scores hundreds apart: most weights fall below e^−87, which the kernel takes as 0.
    { s: shape(8, 2, 32), tile: 64, pos0: 50, tokens: 30, keys: {}, qRange: 60 },
    {
      s: shape(16, 2, 64),
      tile: 64,
      pos0: 90,
      tokens: 12,
      keys: { window: 40, slots: 51, sinks: randomF32(16, 5, -2, 2) },
    },
    { s: shape(7, 7, 5), tile: 3, pos0: 0, tokens: 11, keys: {} },
    { s: shape(15, 3, 9), tile: 5, pos0: 7, tokens: 13, keys: {} },
    { s: shape(12, 2, 1), tile: 4, pos0: 2, tokens: 9, keys: {} },
    { s: shape(9, 1, 36), tile: 64, pos0: 60, tokens: 10, keys: {} },
    { s: shape(14, 2, 130), tile: 64, pos0: 3, tokens: 7, keys: {} },
    {
      s: { ...shape(6, 1, 40), vHeadDim: 24 },
      tile: 64,
      pos0: 66,
      tokens: 5,
      keys: {},
      kIsV: true,
    },
  ];
}

Deno.test("attention_f32 at model shapes: every token equals its one-token, one-head calls bit for bit, however the call is cut", () => {
  modelAttentionCases().forEach((c, n) => {
    const { qs, ks, vs } = attentionData(c, 100 + n);
    const s = c.s, w = s.nHeads * s.vHeadDim, qStride = s.nHeads * s.headDim + Q_PAD;
    const whole = runAttention(c, qs, ks, vs, 0, c.tokens, [0, s.nHeads]);
    const eachHead = Array.from({ length: s.nHeads + 1 }, (_, h) => h);
    for (let i = 0; i < c.tokens; i++) {
      // The decode path: one token, and here one head per call (no head shares a tile).
      const one = runAttention(c, qs, ks, vs, i, i + 1, eachHead);
      const row = whole.subarray(i * w, (i + 1) * w);
      assert.deepEqual(bitsOf(one), bitsOf(row), `case ${n} token ${i}`);
      if (i === 0 || i === c.tokens - 1) {
        const q = qs.subarray(i * qStride, i * qStride + s.nHeads * s.headDim);
        const want = attentionRef(q, ks, vs, s, c.pos0 + i, c.keys);
        // A score's rounding grows with the query's range.
        const tol = 2e-6 * (c.qRange ?? 2) / 2;
        assertClose(row, want, tol, new Array(w).fill(1), `case ${n} token ${i}`);
      }
    }
    // Prompt chunks cut at seeded random places, each call's heads split at random places.
    let seed = 7 + n;
    const next = (m: number) => {
      seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0;
      return seed % m;
    };
    for (let round = 0; round < 3; round++) {
      const got = new Float32Array(whole.length);
      for (let t0 = 0; t0 < c.tokens;) {
        const t1 = Math.min(c.tokens, t0 + 1 + next(c.tokens));
        const cuts = [...new Set([0, next(s.nHeads + 1), next(s.nHeads + 1), s.nHeads])]
          .sort((a, b) => a - b);
        got.set(runAttention(c, qs, ks, vs, t0, t1, cuts), t0 * w);
        t0 = t1;
      }
      assert.deepEqual(bitsOf(got), bitsOf(whole), `case ${n} round ${round}`);
    }
  });
});

Deno.test("attention_f32: a ring holds the linear cache's results bit for bit; sinks move mass", () => {
  const c = attentionCases()[5];
  const { qs, ks, vs } = attentionData(c, 7);
  const s = c.s, slots = c.keys.slots!, last = c.pos0 + c.tokens - 1;
  const got = runAttention(c, qs, ks, vs, 0, c.tokens, [0, s.nHeads]);
  // The same keys at slot = position in a linear cache.
  const lin = (a: Float32Array, stride: number) =>
    Float32Array.from(
      { length: (last + 1) * stride },
      (_, i) => a[(Math.floor(i / stride) % slots) * stride + i % stride],
    );
  const linear = { ...c, keys: { ...c.keys, slots: 0 } };
  const flat = runAttention(linear, qs, lin(ks, s.kStride), lin(vs, s.vStride), 0, c.tokens, [
    0,
    s.nHeads,
  ]);
  assert.deepEqual(bitsOf(flat), bitsOf(got), "ring against linear");
  const noSinks = runAttention(
    { ...c, keys: { ...c.keys, sinks: undefined } },
    qs,
    ks,
    vs,
    0,
    c.tokens,
    [0, s.nHeads],
  );
  const moved = Math.max(...noSinks.map((v, i) => Math.abs(v - got[i])));
  assert.ok(moved > 1e-3, "the sinks had no effect");
});

Deno.test("swiglu_clamped_f32 matches the reference and clamps at the limit", () => {
  reset();
  const n = 37;
  const gs = randomF32(n, 7, -12, 12), us = randomF32(n, 8, -12, 12);
  const g = putF32(gs), u = putF32(us);
  k.swiglu_clamped_f32(g, u, n, 7, 1.702);
  const got = Float32Array.from(f32At(g, n));
  const want = swigluClampedRef(gs, us, 7, 1.702);
  assertClose(got, want, 1e-6, Array.from(want, (v) => Math.max(1, Math.abs(v))), "swiglu");
  reset();
  const g2 = putF32(Float32Array.of(20)), u2 = putF32(Float32Array.of(-20));
  k.swiglu_clamped_f32(g2, u2, 1, 7, 1.702);
  // gate = min(20, 7) = 7, up = max(−20, −7) = −7: (−7 + 1) · 7 · σ(1.702 · 7).
  const want2 = -6 * 7 / (1 + Math.exp(-1.702 * 7));
  assert.ok(Math.abs(f32At(g2, 1)[0] - want2) < 1e-4, "gate and up clamp at ±7");
});

Deno.test("createArenaMemory rejects sizes V8 cannot map, instantiate rejects tiny memories", () => {
  assert.throws(() => createArenaMemory(17 * 1024 ** 3), /16 GiB/);
  assert.throws(() => createArenaMemory(1000), /KERNEL_RESERVED_BYTES/);
  const mem = createArenaMemory(KERNEL_RESERVED_BYTES + 1);
  assert.equal(mem.buffer.byteLength, KERNEL_RESERVED_BYTES + 65536);
  assert.ok(mem.buffer instanceof SharedArrayBuffer);
});

Deno.test("situ_mul_f32 matches the reference at awkward sizes and extremes", () => {
  for (const n of [1, 3, 7, 33, 4099]) {
    reset();
    // Wide enough that both caps saturate (|g| ≫ β1 = 4, |u| ≫ β2 = 25), and tiny values that
    // take tanh's series branch.
    const gs = randomF32(n, n, -60, 60), us = randomF32(n, n + 1, -90, 90);
    for (let i = 0; i < n; i += 5) gs[i] *= 1e-3;
    for (let i = 2; i < n; i += 7) us[i] *= 1e-4;
    const g = putF32(gs);
    k.situ_mul_f32(g, putF32(us), n, 4, 25);
    const want = situMulRef(gs, us, 4, 25);
    assertClose(f32At(g, n), want, 2e-6, relScale(want, 1e-30), `situ_mul n=${n}`);
  }
  reset();
  const ext = Float32Array.of(1e30, -1e30, Infinity, -Infinity, 0, -0, NaN, 89);
  const g = putF32(ext);
  k.situ_mul_f32(g, putF32(Float32Array.of(1e30, -1e30, 5, 5, 3, 3, 1, -Infinity)), 8, 4, 25);
  const got = Array.from(f32At(g, 8));
  assert.deepEqual(got.slice(0, 2), [100, 0], "saturated caps: β1·β2, and σ(−∞)·… = 0");
  assert.ok(Math.abs(got[2] - 100 * Math.tanh(0.2)) < 1e-5, `g = +Inf: ${got[2]}`);
  assert.ok(got[3] === 0, `g = −Inf gives ±0, got ${got[3]}`);
  assert.ok(got[4] === 0 && got[5] === 0, "g = ±0 gives 0");
  assert.ok(Number.isNaN(got[6]), "NaN propagates");
  assert.equal(got[7], -100);
});

Deno.test("gelu_tanh_mul_f32 matches the tanh GELU at awkward sizes and extremes", () => {
  for (const n of [1, 3, 7, 33, 4099]) {
    reset();
    // Past ±10 the GELU is g or 0 to float precision; tiny g takes tanh's series branch.
    const gs = randomF32(n, n + 7, -12, 12), us = randomF32(n, n + 8, -3, 3);
    for (let i = 0; i < n; i += 5) gs[i] *= 1e-3;
    const g = putF32(gs);
    k.gelu_tanh_mul_f32(g, putF32(us), n);
    const want = geluTanhMulRef(gs, us);
    // 1 + tanh(·) cancels for negative g in float32 (as in PyTorch's float32 GELU): the error is
    // relative to g·u there, not to the tiny result.
    const scale = Array.from(want, (v, i) => Math.max(Math.abs(v), Math.abs(gs[i] * us[i]), 1e-30));
    assertClose(f32At(g, n), want, 2e-6, scale, `gelu_tanh_mul n=${n}`);
  }
  reset();
  const g = putF32(Float32Array.of(1e30, -1e30, Infinity, -Infinity, 0, -0, NaN, 3));
  k.gelu_tanh_mul_f32(g, putF32(Float32Array.of(2, 2, 1, 1, 5, 5, 1, 0)), 8);
  const got = Array.from(f32At(g, 8));
  assert.deepEqual(got.slice(0, 2), [2 * Math.fround(1e30), -0], "saturated: g·u, or −0 (not NaN)");
  assert.equal(got[2], Infinity);
  assert.ok(Number.isNaN(got[3]), `−Inf · (1 + tanh(−Inf)) is NaN as in PyTorch, got ${got[3]}`);
  assert.ok(got[4] === 0 && got[5] === 0, "g = ±0 gives 0");
  assert.ok(Number.isNaN(got[6]), "NaN propagates");
  assert.equal(got[7], 0);
});

Deno.test("softcap_f32 matches cap·tanh(x/cap) at awkward sizes and extremes", () => {
  for (const n of [1, 3, 7, 33, 4099]) {
    reset();
    const xs = randomF32(n, n + 9, -200, 200);
    for (let i = 0; i < n; i += 3) xs[i] *= 1e-4;
    const x = putF32(xs);
    k.softcap_f32(x, n, 30);
    const want = softcapRef(xs, 30);
    assertClose(f32At(x, n), want, 2e-6, relScale(want, 1e-30), `softcap n=${n}`);
  }
  reset();
  const x = putF32(Float32Array.of(Infinity, -Infinity, 1e30, NaN, -0));
  k.softcap_f32(x, 5, 30);
  const got = Array.from(f32At(x, 5));
  assert.deepEqual(got.slice(0, 3), [30, -30, 30], "±Inf and huge values go to ±cap");
  assert.ok(Number.isNaN(got[3]), "NaN propagates");
  assert.equal(got[4], 0);
});

Deno.test("attn_res_f32 matches the reference for 1..9 sources and odd widths", () => {
  for (const [n, d] of [[1, 5], [2, 128], [5, 131], [9, 7]]) {
    reset();
    const stride = d + 3;
    const srcs = Array.from({ length: n }, (_, i) => randomF32(d, 100 * n + i, -4 * (i + 1), 3));
    const blocks = alloc(Math.max(1, n - 1) * stride * 4);
    for (let i = 0; i < n - 1; i++) f32At(blocks + BigInt(i * stride * 4), d).set(srcs[i]);
    const last = putF32(srcs[n - 1]);
    const wn = randomF32(d, 7, 0.5, 1.5), wp = randomF32(d, 8, -0.3, 0.3);
    const out = alloc(d * 4), scores = alloc(n * 4);
    k.attn_res_f32(blocks, n, stride, last, putF32(wn), putF32(wp), out, scores, d, 1e-5);
    const want = attnResRef(srcs, wn, wp, 1e-5);
    const scale = Array.from(
      { length: d },
      (_, j) => srcs.reduce((m, v) => Math.max(m, Math.abs(v[j])), 1e-30),
    );
    assertClose(f32At(out, d), want, 1e-5, scale, `attn_res n=${n} d=${d}`);
    const p = f32At(scores, n);
    assert.ok(Math.abs(p.reduce((a, b) => a + b, 0) - 1) < 1e-6, "probabilities sum to 1");
  }
});

Deno.test("hc_pre/hc_post/hc_head match the float64 hyper-connection reference at odd sizes", () => {
  for (
    const [n, d, tokens, iters] of [[1, 5, 1, 1], [3, 33, 2, 7], [4, 64, 3, 20], [5, 13, 2, 2]]
  ) {
    reset();
    const nd = n * d, rows = (2 + n) * n;
    const x = randomF32(tokens * nd, 11 * n + d, -3, 3);
    const fn = randomF32(rows * nd, 5 + n, -0.3, 0.3);
    const base = randomF32(rows, 6 + n, -1, 1), scale = randomF32(3, 7 + n, 0.5, 1.5);
    const px = putF32(x), mix = alloc(rows * 4);
    const collapsed = alloc(tokens * d * 4), post = alloc(tokens * n * 4);
    const comb = alloc(tokens * n * n * 4), y = randomF32(tokens * d, 9, -2, 2);
    k.hc_pre_f32(
      px,
      tokens,
      n,
      d,
      putF32(fn),
      putF32(base),
      putF32(scale),
      iters,
      1e-6,
      1e-6,
      mix,
      collapsed,
      post,
      comb,
    );
    const out = alloc(tokens * nd * 4);
    k.hc_post_f32(px, putF32(y), post, comb, out, tokens, n, d);
    const headFn = randomF32(n * nd, 12, -0.3, 0.3), headBase = randomF32(n, 13, -1, 1);
    const head = alloc(tokens * d * 4);
    k.hc_head_f32(px, tokens, n, d, putF32(headFn), putF32(headBase), 0.7, 1e-6, 1e-6, mix, head);
    for (let t = 0; t < tokens; t++) {
      const streams = Array.from(
        { length: n },
        (_, j) => Float64Array.from(x.subarray(t * nd + j * d, t * nd + (j + 1) * d)),
      );
      const w = hyperWeights(streams, fn, base, scale, iters, 1e-6, 1e-6, "hc");
      const what = `n=${n} d=${d} token ${t}`;
      const ones = new Float32Array(d).fill(1);
      const unit = (k: number) => new Float32Array(k).fill(1);
      assertClose(f32At(collapsed + BigInt(t * d * 4), d), w.input, 1e-5, ones, `${what} input`);
      assertClose(f32At(post + BigInt(t * n * 4), n), w.post, 1e-5, unit(n), `${what} post`);
      const c = f32At(comb + BigInt(t * n * n * 4), n * n);
      assertClose(c, w.comb.flatMap((r) => [...r]), 1e-5, unit(n * n), `${what} comb`);
      for (let a = 0; a < n; a++) {
        let col = 0;
        for (let b = 0; b < n; b++) col += c[b * n + a];
        assert.ok(Math.abs(col - 1) < 1e-4, `${what}: comb column ${a} sums to ${col}`);
      }
      const next = hyperPost(streams, Float64Array.from(y.subarray(t * d, (t + 1) * d)), w);
      assertClose(
        f32At(out + BigInt(t * nd * 4), nd),
        next.flatMap((s) => [...s]),
        1e-5,
        new Float32Array(nd).fill(4),
        `${what} streams`,
      );
      const want = hyperHead(streams, headFn, headBase, Float32Array.of(0.7), 1e-6, 1e-6);
      assertClose(f32At(head + BigInt(t * d * 4), d), want, 1e-5, ones, `${what} head`);
    }
  }
});

Deno.test("swiglu_limit_f32 matches the reference at odd lengths, clamps included", () => {
  for (const n of [1, 7, 37]) {
    reset();
    const g = randomF32(n, n, -20, 20), u = randomF32(n, n + 1, -20, 20);
    const pg = putF32(g);
    k.swiglu_limit_f32(pg, putF32(u), n, 10);
    const want = swigluLimitRef(g, u, 10);
    assertClose(f32At(pg, n), want, 2e-6, relScale(want, 1e-3), `swiglu_limit n=${n}`);
  }
});

Deno.test("csa_compress_f32 matches the reference: HCA and overlapping CSA windows, odd widths", () => {
  for (
    const [ratio, width, indexed] of [[3, 5, true], [4, 17, true], [2, 9, false], [
      5,
      3,
      false,
    ]] as const
  ) {
    reset();
    const span = indexed ? 2 * width : width, cOff = 3, zOff = cOff + span;
    const rowFloats = zOff + span + 2, positions = 3 * ratio;
    const rows = randomF32(positions * rowFloats, ratio * 31 + width, -3, 3);
    const ape = randomF32(ratio * span, width, -1, 1);
    const pr = putF32(rows), pa = putF32(ape), out = alloc(width * 4);
    for (let w = 0; w < 3; w++) {
      k.csa_compress_f32(pr, rowFloats, cOff, zOff, pa, ratio, width, indexed ? 1 : 0, w, out);
      const want = csaCompressRef(
        (p, ch) => rows[p * rowFloats + cOff + ch],
        (p, ch) => rows[p * rowFloats + zOff + ch],
        ape,
        ratio,
        width,
        indexed,
        w,
      );
      assertClose(f32At(out, width), want, 1e-5, new Float32Array(width).fill(3), `w=${w}`);
    }
  }
});

Deno.test("csa_index_scores_f32 matches the reference with strided keys", () => {
  for (const [heads, dim, count] of [[1, 3, 1], [5, 10, 4], [7, 33, 9]]) {
    reset();
    const stride = dim + 5;
    const q = randomF32(heads * dim, heads, -1, 1), wts = randomF32(heads, dim, -1, 1);
    const keysAll = randomF32(count * stride, count, -1, 1);
    const keys = Array.from(
      { length: count },
      (_, w) => keysAll.slice(w * stride, w * stride + dim),
    );
    const out = alloc(count * 4);
    k.csa_index_scores_f32(putF32(q), heads, dim, putF32(wts), putF32(keysAll), stride, count, out);
    const want = csaIndexScoresRef(q, heads, wts, keys);
    assertClose(
      f32At(out, count),
      want,
      1e-5,
      new Float32Array(count).fill(heads * dim),
      `h=${heads}`,
    );
  }
});
