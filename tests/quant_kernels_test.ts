/**
 * The compact-weight kernels against their scalar references (tests/scalar_quant_kernels.ts) at awkward
 * sizes, and row-split bit-identity: a row's bits never depend on the [r0, r1) range.
 */
import assert from "node:assert/strict";
import { createArenaMemory, KERNEL_RESERVED_BYTES, loadKernelModule } from "../wasm/mod.ts";
import {
  type ExactBatchKernel,
  q8Bytes,
  type QuantKernels,
  quantKernels,
  vq3rLutFloats,
  vq4pLutBytes,
} from "../wasm/quant_kernels.ts";
import {
  denseAbsRef,
  denseMatvecRef,
  dequantizeActQ8,
  matvecVq3rRef,
  matvecVq4pRef,
  quantizeActQ8Ref,
  vq3rAbsRef,
  vq3rLutRef,
  vq4pLutRef,
} from "./scalar_quant_kernels.ts";
import {
  dequantizeVq4p,
  encodeVq4p,
  packVq4p,
  trainVq4p,
  VQ4P_LUT_MAX,
  vq4pIndex,
  vq4pKernelCodebooks,
} from "../engine/quant/vq4p.ts";
import {
  dequantizeMxfp4,
  E2M1_VALUES,
  e8m0ToNumber,
  mxfp4At,
  quantizeMxfp4,
} from "../engine/quant/mxfp4.ts";
import { bf16ToNumber, dequantizeInt4g32, quantizeInt4g32 } from "../engine/quant/int4.ts";
import { dequantizeFp8b128, quantizeFp8b128 } from "../engine/quant/fp8.ts";
import { dequantizeInt8Row, quantizeInt8Row } from "../engine/quant/int8.ts";
import { openCheckpoint } from "../io/safetensors.ts";
import { fixtureDir } from "./fixtures.ts";

const memory = createArenaMemory(64 * 1024 * 1024);
const instance = await WebAssembly.instantiate(await loadKernelModule(), { env: { memory } });
const qk = quantKernels(instance.exports);

/** A bump allocator over the test arena, reset per case. */
let top = KERNEL_RESERVED_BYTES;
function reset(): void {
  top = KERNEL_RESERVED_BYTES;
}
function put(data: ArrayBufferView): bigint {
  const off = top;
  new Uint8Array(memory.buffer, off, data.byteLength).set(
    new Uint8Array(data.buffer, data.byteOffset, data.byteLength),
  );
  top += Math.ceil(data.byteLength / 4096) * 4096 + 4096;
  return BigInt(off);
}
function alloc(bytes: number): bigint {
  return put(new Uint8Array(bytes));
}
function f32At(p: bigint, n: number): Float32Array {
  return new Float32Array(memory.buffer, Number(p), n).slice();
}

/** Seeded uniform [0, 1) (mulberry32), so failures reproduce. */
function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = Math.imul(s ^ (s >>> 15), s | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
function gaussian(n: number, rand: () => number): Float32Array {
  return Float32Array.from({ length: n }, () => {
    const u = 1 - rand(), v = rand();
    return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v);
  });
}

const ROWS = [1, 3, 5, 17];
const BLOCK_COLS = [32, 64, 4096 + 32];

type Matvec = (y: bigint, rows: number, r0: number, r1: number) => void;

/**
 * Runs `mv` over all rows and checks |y − ref| ≤ tol·(Σ|w·x| + tiny) per row; then checks that
 * splitting rows into ranges (including 4-row blocks starting at odd rows) gives the same bits.
 */
function checkMatvec(
  label: string,
  mv: Matvec,
  rows: number,
  ref: Float32Array,
  abs: Float64Array,
  tol: number,
) {
  const y = alloc(rows * 4);
  mv(y, rows, 0, rows);
  const got = f32At(y, rows);
  for (let r = 0; r < rows; r++) {
    const err = Math.abs(got[r] - ref[r]);
    assert.ok(
      err <= tol * abs[r] + 1e-30,
      `${label}: row ${r} got ${got[r]}, reference ${ref[r]} (error ${err}, Σ|w·x| ${abs[r]})`,
    );
  }
  for (const cuts of [[1], [2, 3], [1, 5, 6, 10]]) {
    const y2 = alloc(rows * 4);
    const bounds = [0, ...cuts.filter((c) => c < rows), rows];
    for (let i = 0; i + 1 < bounds.length; i++) mv(y2, rows, bounds[i], bounds[i + 1]);
    const split = f32At(y2, rows);
    for (let r = 0; r < rows; r++) {
      assert.ok(
        Object.is(split[r], got[r]),
        `${label}: row ${r} differs when split at ${cuts}: ${split[r]} vs ${got[r]}`,
      );
    }
  }
}

Deno.test("quantize_act_q8 matches the reference bytes", () => {
  const rand = rng(1);
  for (const cols of BLOCK_COLS) {
    reset();
    const x = gaussian(cols, rand).map((v, i) => (i < 32 && cols > 32 ? 0 : v * 3));
    x[cols - 1] = 0.5; // exact ties appear when |x| / scale lands on .5
    const xp = put(x), xq = alloc(q8Bytes(cols));
    qk.quantize_act_q8(xp, xq, cols);
    const want = quantizeActQ8Ref(x).bytes;
    const got = new Uint8Array(memory.buffer, Number(xq), want.length);
    assert.deepEqual(got.slice(), want, `cols ${cols}`);
  }
});

Deno.test("matvec_mxfp4 and matvec_int4g32 match the reference", () => {
  const rand = rng(2);
  for (const rows of ROWS) {
    for (const cols of BLOCK_COLS) {
      reset();
      const w = gaussian(rows * cols, rand);
      const x = gaussian(cols, rand);
      const q8 = quantizeActQ8Ref(x), xd = dequantizeActQ8(q8);
      const xq = alloc(q8Bytes(cols));
      qk.quantize_act_q8(put(x), xq, cols);

      const mx = quantizeMxfp4(w, rows, cols);
      const wm = dequantizeMxfp4(mx);
      const [mW, mS] = [put(mx.blocks), put(mx.scales)];
      const mxv: Matvec = (y, n, r0, r1) => qk.matvec_mxfp4(mW, mS, xq, y, n, cols, r0, r1);
      const tag = `mxfp4 ${rows}×${cols}`;
      checkMatvec(
        tag,
        mxv,
        rows,
        denseMatvecRef(wm, xd, rows, cols),
        denseAbsRef(wm, xd, rows, cols),
        1e-5,
      );
      // Against the exact f32 product: the Q8 activations cost at most 1e-2 of Σ|w·x|.
      checkMatvec(
        `${tag} vs f32 x`,
        mxv,
        rows,
        denseMatvecRef(wm, x, rows, cols),
        denseAbsRef(wm, x, rows, cols),
        1e-2,
      );

      const i4 = quantizeInt4g32(w, rows, cols);
      const wi = dequantizeInt4g32(i4);
      const [iW, iS] = [put(i4.packed), put(i4.scales)];
      const i4v: Matvec = (y, n, r0, r1) => qk.matvec_int4g32(iW, iS, xq, y, n, cols, r0, r1);
      const tag4 = `int4 ${rows}×${cols}`;
      checkMatvec(
        tag4,
        i4v,
        rows,
        denseMatvecRef(wi, xd, rows, cols),
        denseAbsRef(wi, xd, rows, cols),
        1e-5,
      );
      checkMatvec(
        `${tag4} vs f32 x`,
        i4v,
        rows,
        denseMatvecRef(wi, x, rows, cols),
        denseAbsRef(wi, x, rows, cols),
        1e-2,
      );
    }
  }
});

Deno.test("matvec_mxfp4 decodes raw codes and every scale byte, NaN for scale 255", () => {
  const rand = rng(3);
  const rows = 5, cols = 256 * 32;
  const blocks = Uint8Array.from({ length: (rows * cols) / 2 }, () => Math.floor(rand() * 256));
  const x = gaussian(cols, rand);
  // Scales 0..199 with x as is, and 200..254 with x scaled by 2^-100 so that f32 never overflows.
  for (const [lo, n, xScale] of [[0, 200, 1], [200, 55, 2 ** -100]]) {
    reset();
    const scales = Uint8Array.from(
      { length: rows * 256 },
      (_, i) => lo + ((i + 37 * (i >> 8)) % n),
    );
    const xs = x.map((v) => v * xScale);
    const xq = alloc(q8Bytes(cols));
    qk.quantize_act_q8(put(xs), xq, cols);
    // Decoded in float64: 6 · 2^127 is beyond f32.
    const m = { rows, cols, blocks, scales };
    const wm = Float64Array.from(
      { length: rows * cols },
      (_, i) => mxfp4At(m, Math.floor(i / cols), i % cols),
    );
    const xd = dequantizeActQ8(quantizeActQ8Ref(xs));
    const [W, S] = [put(blocks), put(scales)];
    checkMatvec(
      `mxfp4 raw, scales ${lo}..${lo + n - 1}`,
      (y, nr, r0, r1) => qk.matvec_mxfp4(W, S, xq, y, nr, cols, r0, r1),
      rows,
      denseMatvecRef(wm, xd, rows, cols),
      denseAbsRef(wm, xd, rows, cols),
      1e-5,
    );
  }
  reset();
  const scales = new Uint8Array(rows * 256).fill(127);
  scales[2 * 256 + 255] = 255;
  const xq = alloc(q8Bytes(cols));
  qk.quantize_act_q8(put(x), xq, cols);
  const y = alloc(rows * 4);
  qk.matvec_mxfp4(put(blocks), put(scales), xq, y, rows, cols, 0, rows);
  const got = f32At(y, rows);
  got.forEach((v, r) => assert.equal(Number.isNaN(v), r === 2, `row ${r}: ${v}`));
});

/**
 * An exact 4-bit kernel against float64 (1e-6 of Σ|w·x|) and row-split bit-identity, at awkward
 * sizes with random bytes (every code).
 */
function checkExactQ4(
  label: string,
  run: (
    W: bigint,
    S: bigint,
    X: bigint,
    y: bigint,
    rows: number,
    cols: number,
    r0: number,
    r1: number,
  ) => void,
  scaleBytes: (rows: number, cols: number) => Uint8Array,
  value: (code: number) => number,
  scaleOf: (scales: Uint8Array, cols: number) => (row: number, block: number) => number,
  seed: number,
) {
  const rand = rng(seed);
  for (const rows of [...ROWS, 30]) {
    for (const cols of [...BLOCK_COLS, 96, 256 * 32]) {
      reset();
      const data = Uint8Array.from({ length: (rows * cols) / 2 }, () => Math.floor(rand() * 256));
      const scales = scaleBytes(rows, cols);
      const x = gaussian(cols, rand);
      const scale = scaleOf(scales, cols);
      const wm = Float64Array.from({ length: rows * cols }, (_, i) => {
        const r = Math.floor(i / cols), c = i % cols;
        const byte = data[i >> 1];
        return value(c & 1 ? byte >> 4 : byte & 15) * scale(r, c >> 5);
      });
      const [W, S, X] = [put(data), put(scales), put(x)];
      const mv: Matvec = (y, nr, r0, r1) => run(W, S, X, y, nr, cols, r0, r1);
      checkMatvec(
        `${label} ${rows}×${cols}`,
        mv,
        rows,
        denseMatvecRef(wm, x, rows, cols),
        denseAbsRef(wm, x, rows, cols),
        1e-6,
      );
    }
  }
}

Deno.test("matvec_mxfp4_exact: f32 activations, raw codes and every scale byte", () => {
  checkExactQ4(
    "mxfp4 exact",
    qk.matvec_mxfp4_exact,
    // Scales 1..200: every value stays a normal or subnormal f32 times a gaussian x.
    (rows, cols) => Uint8Array.from({ length: (rows * cols) / 32 }, (_, i) => 1 + (i * 7) % 200),
    (code) => E2M1_VALUES[code],
    (scales, cols) => (r, b) => e8m0ToNumber(scales[r * (cols / 32) + b]),
    4,
  );
  reset();
  const rows = 3, cols = 64;
  const scales = new Uint8Array(rows * 2).fill(127);
  scales[3] = 255;
  const y = alloc(rows * 4);
  const W = put(new Uint8Array((rows * cols) / 2).fill(0x21));
  qk.matvec_mxfp4_exact(
    W,
    put(scales),
    put(new Float32Array(cols).fill(1)),
    y,
    rows,
    cols,
    0,
    rows,
  );
  // 0x21: low nibble 1 (0.5), high nibble 2 (1.0), so every pair sums to 1.5.
  assert.deepEqual(Array.from(f32At(y, rows)), [48, NaN, 48]);
});

Deno.test("matvec_int4g32_exact: f32 activations, every stored nibble, bf16 scales", () => {
  checkExactQ4(
    "int4 exact",
    qk.matvec_int4g32_exact,
    // bf16 scales 2^-20..2^12 with random mantissas, and some groups of scale 0.
    (rows, cols) => {
      const s = Uint16Array.from(
        { length: (rows * cols) / 32 },
        (_, i) =>
          i % 11 === 5
            ? 0
            : ((107 + (i * 13) % 32) << 7) | ((i * 37) & 0x7f) | (i & 4 ? 0x8000 : 0),
      );
      return new Uint8Array(s.buffer);
    },
    (code) => code - 8,
    (scales, cols) => {
      const s = new Uint16Array(scales.slice().buffer);
      return (r, b) => bf16ToNumber(s[r * (cols / 32) + b]);
    },
    5,
  );
  reset();
  const rows = 3, cols = 64;
  // bf16 1.0 everywhere but one NaN group in row 1.
  const scales = new Uint16Array(rows * 2).fill(0x3f80);
  scales[3] = 0x7fc0;
  const y = alloc(rows * 4);
  // 0x9f: low nibble 15 (q = 7), high nibble 9 (q = 1), so every pair sums to 8.
  const W = put(new Uint8Array((rows * cols) / 2).fill(0x9f));
  qk.matvec_int4g32_exact(
    W,
    put(scales),
    put(new Float32Array(cols).fill(1)),
    y,
    rows,
    cols,
    0,
    rows,
  );
  assert.deepEqual(Array.from(f32At(y, rows)), [256, NaN, 256]);
});

/** A shipped 4-bit format's exact kernels, as {@link checkExactMatrix} drives them. */
interface ExactKernels {
  label: string;
  dequant: QuantKernels["dequant_mxfp4_bf16"];
  gemm: string;
  /** Bytes of one decoded weight (2 for bf16, 4 for f32). */
  bytesPerWeight: number;
  matvec: QuantKernels["matvec_mxfp4_exact"];
  /** The batched kernel: dequant and GEMM a tile of rows at a time through scratch D. */
  batched: ExactBatchKernel;
}

const MXFP4_EXACT: ExactKernels = {
  label: "mxfp4",
  dequant: qk.dequant_mxfp4_bf16,
  gemm: "gemm_bf16",
  bytesPerWeight: 2,
  matvec: qk.matvec_mxfp4_exact,
  batched: qk.gemm_mxfp4_exact,
};

/**
 * A shipped 4-bit matrix's batched path: the dequant kernel, split as the pool splits rows,
 * writes every weight exactly (`want(r, c)`, f32 rounding only overflows), and the GEMM on those
 * weights, and the batched kernel (tiles of rows, split at an odd row), give the exact matvec's
 * bits for every column of batches of 1 to 9.
 */
function checkExactMatrix(
  k: ExactKernels,
  blocks: Uint8Array,
  scales: Uint8Array,
  rows: number,
  cols: number,
  want: (r: number, c: number) => number,
  rand: () => number,
) {
  const gemmFn = instance.exports[k.gemm] as (...a: (number | bigint)[]) => void;
  const label = `${k.label} ${rows}×${cols}`;
  const [W, S] = [put(blocks), put(scales)];
  const decoded = alloc(rows * cols * k.bytesPerWeight);
  k.dequant(W, S, decoded, rows, cols, 0, 2);
  k.dequant(W, S, decoded, rows, cols, 2, rows);
  const got = k.bytesPerWeight === 4 ? f32At(decoded, rows * cols) : Float32Array.from(
    new Uint16Array(memory.buffer, Number(decoded), rows * cols),
    (h) => new Float32Array(new Uint32Array([h << 16]).buffer)[0],
  );
  for (let i = 0; i < rows * cols; i++) {
    const w = Math.fround(want(Math.floor(i / cols), i % cols));
    // === : a zero code decodes to +0 or -0 alike (a dot's sum never becomes -0 from +0).
    assert.ok(
      got[i] === w || (Number.isNaN(got[i]) && Number.isNaN(w)),
      `${label} weight ${i}: ${got[i]} vs ${w}`,
    );
  }
  for (const nb of [1, 2, 3, 4, 5, 6, 7, 9]) {
    // Weights up to 6 · 2^127 times gaussians overflow to ±Inf: small x keep most rows finite.
    const x = gaussian(nb * cols, rand).map((v) => v * 2 ** -100);
    const X = put(x);
    const Y = alloc(nb * rows * 4), y1 = alloc(rows * 4);
    gemmFn(decoded, X, Y, rows, cols, nb, 0, rows);
    const batch = f32At(Y, nb * rows);
    const Y2 = alloc(nb * rows * 4), D = alloc(rows * cols * k.bytesPerWeight);
    const cut = Math.min(rows, 13);
    k.batched(W, S, X, Y2, D, rows, cols, nb, 0, cut);
    k.batched(W, S, X, Y2, D, rows, cols, nb, cut, rows);
    const tiled = f32At(Y2, nb * rows);
    for (let b = 0; b < nb; b++) {
      k.matvec(W, S, X + BigInt(b * cols * 4), y1, rows, cols, 0, rows);
      const one = f32At(y1, rows);
      for (let r = 0; r < rows; r++) {
        assert.ok(
          Object.is(one[r], batch[b * rows + r]),
          `${label} batch ${nb} column ${b} row ${r}: ${one[r]} vs ${batch[b * rows + r]}`,
        );
        assert.ok(
          Object.is(one[r], tiled[b * rows + r]),
          `${label} batched kernel, batch ${nb} column ${b} row ${r}: ${one[r]} vs ${
            tiled[b * rows + r]
          }`,
        );
      }
    }
  }
}

/** {@link checkExactMatrix} on random codes at awkward sizes. */
function checkExactBatch(
  k: ExactKernels,
  scaleBytes: (rows: number, cols: number) => Uint8Array,
  want: (
    blocks: Uint8Array,
    scales: Uint8Array,
    rows: number,
    cols: number,
  ) => (r: number, c: number) => number,
  seed: number,
) {
  const rand = rng(seed);
  // 30 × 4128: tiles of 28 (bf16) and 12 (f32) rows, so the batched kernel runs several.
  for (
    const [rows, cols] of [[1, 32], [5, 64], [17, 4096 + 32], [6, 96], [30, 160], [3, 32], [
      30,
      4096 + 32,
    ]]
  ) {
    reset();
    const blocks = Uint8Array.from({ length: (rows * cols) / 2 }, () => Math.floor(rand() * 256));
    const scales = scaleBytes(rows, cols);
    checkExactMatrix(k, blocks, scales, rows, cols, want(blocks, scales, rows, cols), rand);
  }
}

Deno.test("dequant_mxfp4_bf16 is exact; gemm_bf16 on it and gemm_mxfp4_exact equal matvec_mxfp4_exact bit for bit", () => {
  checkExactBatch(
    MXFP4_EXACT,
    // Every scale byte: subnormal weights (0, 1), overflow (253, 254), NaN (255), and the rest.
    (rows, cols) =>
      Uint8Array.from({ length: (rows * cols) / 32 }, (_, i) => (i * 37 + rows) % 256),
    (blocks, scales, rows, cols) => (r, c) => mxfp4At({ rows, cols, blocks, scales }, r, c),
    5,
  );
});

Deno.test("dequant_int4g32_f32 is exact; gemm_f32 on it and gemm_int4g32_exact equal matvec_int4g32_exact bit for bit", () => {
  checkExactBatch(
    {
      label: "int4",
      dequant: qk.dequant_int4g32_f32,
      gemm: "gemm_f32",
      bytesPerWeight: 4,
      matvec: qk.matvec_int4g32_exact,
      batched: qk.gemm_int4g32_exact,
    },
    // bf16 scales over the whole exponent range (subnormal to 2^127, some Inf / NaN), some 0.
    (rows, cols) => {
      const s = Uint16Array.from(
        { length: (rows * cols) / 32 },
        (_, i) => i % 13 === 7 ? 0 : ((i * 97 + rows) & 0x7fff) | (i & 2 ? 0x8000 : 0),
      );
      return new Uint8Array(s.buffer);
    },
    (blocks, scales, _rows, cols) => {
      const s = new Uint16Array(scales.slice().buffer);
      return (r, c) => {
        const byte = blocks[(r * cols + c) >> 1];
        return ((c & 1 ? byte >> 4 : byte & 15) - 8) * bf16ToNumber(s[r * (cols / 32) + (c >> 5)]);
      };
    },
    6,
  );
});

Deno.test("tiny-deepseek-v4-fp8: DeepSeek-V4's FP4 experts (I8 e2m1 pairs + F8_E8M0 per 32) are MXFP4 bytes", () => {
  // The README's rule, decoded here on its own: element j of a row is nibble j of the row's bytes
  // (low nibble first), an E2M1 code times 2^(scale - 127) of its 32-column block.
  const ckpt = openCheckpoint(fixtureDir("tiny-deepseek-v4-fp8"));
  const rand = rng(7);
  let checked = 0;
  try {
    for (const t of ckpt.tensors.values()) {
      if (t.dtype !== "I8") continue;
      const scale = ckpt.tensors.get(t.name.replace(/\.weight$/, ".scale"));
      assert.equal(scale?.dtype, "F8_E8M0", `${t.name}: its scale`);
      const [rows, half] = t.shape, cols = 2 * half;
      assert.deepEqual(scale.shape, [rows, cols / 32], `${t.name}: scale shape`);
      reset();
      const blocks = ckpt.read(t.name), scales = ckpt.read(scale.name);
      const at = (r: number, c: number) => {
        const byte = blocks[r * half + (c >> 1)];
        return E2M1_VALUES[c & 1 ? byte >> 4 : byte & 15] *
          2 ** (scales[r * (cols / 32) + (c >> 5)] - 127);
      };
      const wm = Float64Array.from(
        { length: rows * cols },
        (_, i) => at(Math.floor(i / cols), i % cols),
      );
      const x = gaussian(cols, rand);
      const [W, S, X] = [put(blocks), put(scales), put(x)];
      checkMatvec(
        t.name,
        (y, nr, r0, r1) => qk.matvec_mxfp4_exact(W, S, X, y, nr, cols, r0, r1),
        rows,
        denseMatvecRef(wm, x, rows, cols),
        denseAbsRef(wm, x, rows, cols),
        1e-6,
      );
      checkExactMatrix(MXFP4_EXACT, blocks, scales, rows, cols, at, rand);
      checked++;
    }
  } finally {
    ckpt.close();
  }
  assert.ok(checked > 0, "no FP4 expert tensor in the fixture");
});

Deno.test("matvec_fp8b128 matches the reference, all codes, partial blocks", () => {
  const rand = rng(4);
  for (const rows of [...ROWS, 130]) {
    for (const cols of [...BLOCK_COLS, 172, 7, 300]) {
      reset();
      const codes = Uint8Array.from({ length: rows * cols }, () => {
        const c = Math.floor(rand() * 256);
        return (c & 0x7f) === 0x7f ? c - 1 : c;
      });
      const nsb = Math.ceil(rows / 128) * Math.ceil(cols / 128);
      const scales = Float32Array.from(
        { length: nsb },
        () => 2 ** Math.floor(rand() * 8 - 12) * (1 + rand()),
      );
      const m = { rows, cols, codes, scales };
      const wd = dequantizeFp8b128(m);
      const x = gaussian(cols, rand);
      const [W, S, X] = [put(codes), put(scales), put(x)];
      checkMatvec(
        `fp8 ${rows}×${cols}`,
        (y, n, r0, r1) => qk.matvec_fp8b128(W, S, X, y, n, cols, r0, r1),
        rows,
        denseMatvecRef(wd, x, rows, cols),
        denseAbsRef(wd, x, rows, cols),
        1e-5,
      );
    }
  }
  reset();
  const rows = 3, cols = 40;
  const w = gaussian(rows * cols, rand);
  const m = quantizeFp8b128(w, rows, cols);
  m.codes[cols + 21] = 0xff;
  m.codes[2 * cols + 39] = 0x7f; // in the scalar tail
  const y = alloc(rows * 4);
  qk.matvec_fp8b128(put(m.codes), put(m.scales), put(gaussian(cols, rand)), y, rows, cols, 0, rows);
  const got = f32At(y, rows);
  assert.ok(Number.isFinite(got[0]) && Number.isNaN(got[1]) && Number.isNaN(got[2]), `${got}`);
});

Deno.test("gemm_fp8b128 gives matvec_fp8b128's bits per column at every column grouping; x past 2^8 changes no bits", () => {
  const rand = rng(14);
  const bits = (p: bigint, n: number) => new Uint32Array(memory.buffer, Number(p), n).slice();
  for (const [rows, cols] of [[1, 7], [5, 300], [9, 4096 + 32], [130, 172]]) {
    reset();
    const codes = Uint8Array.from({ length: rows * cols }, () => Math.floor(rand() * 256));
    for (let r = 0; r < rows; r++) codes[r * cols + 5 % cols] = 0; // column 5: +0 weights
    codes[(rows - 1) * cols + 3 % cols] = 0xff; // the last row holds a NaN code
    const scales = Float32Array.from(
      { length: Math.ceil(rows / 128) * Math.ceil(cols / 128) },
      () => 2 ** Math.floor(rand() * 8 - 12) * (1 + rand()),
    );
    const [W, S] = [put(codes), put(scales)];
    // Every path: the matvec alone, groups of 4, 8 and 16 columns, and their mixes.
    for (const nb of [1, 2, 3, 4, 5, 7, 9, 12, 17, 29, 33, 64, 129]) {
      const x = gaussian(nb * cols, rand);
      const X = put(x), Y = alloc(nb * rows * 4);
      const cut = Math.min(rows, 3);
      qk.gemm_fp8b128(W, S, X, Y, rows, cols, nb, 0, cut);
      qk.gemm_fp8b128(W, S, X, Y, rows, cols, nb, cut, rows);
      const got = bits(Y, nb * rows);
      for (let b = 0; b < nb; b++) {
        const y = alloc(rows * 4);
        qk.matvec_fp8b128(W, S, X + BigInt(b * cols * 4), y, rows, cols, 0, rows);
        const want = bits(y, rows);
        // x[5] = 300 takes the path that scales weights instead of x; its weights are +0.
        const xb = x.slice(b * cols, (b + 1) * cols);
        if (cols > 5) xb[5] = 300;
        const y2 = alloc(rows * 4);
        qk.matvec_fp8b128(W, S, put(xb), y2, rows, cols, 0, rows);
        const big = bits(y2, rows);
        const nan = new Float32Array(want.buffer);
        assert.ok(Number.isNaN(nan[rows - 1]), `fp8 ${rows}×${cols}: NaN code, ${nan[rows - 1]}`);
        for (let r = 0; r < rows - 1; r++) {
          const at = `fp8 ${rows}×${cols} batch ${nb} column ${b} row ${r}`;
          assert.equal(got[b * rows + r], want[r], `${at}: gemm vs matvec`);
          assert.equal(big[r], want[r], `${at}: |x| ≥ 2^8 vs < 2^8`);
        }
        assert.ok(Number.isNaN(new Float32Array(got.buffer)[b * rows + rows - 1]));
      }
    }
  }
});

Deno.test("matvec_int8row matches the reference", () => {
  const rand = rng(5);
  for (const rows of ROWS) {
    for (const cols of [...BLOCK_COLS, 37, 5]) {
      reset();
      const w = gaussian(rows * cols, rand);
      const m = quantizeInt8Row(w, rows, cols);
      const wd = dequantizeInt8Row(m);
      const x = gaussian(cols, rand);
      const [W, S, X] = [put(m.q), put(m.scales), put(x)];
      checkMatvec(
        `int8 ${rows}×${cols}`,
        (y, n, r0, r1) => qk.matvec_int8row(W, S, X, y, n, cols, r0, r1),
        rows,
        denseMatvecRef(wd, x, rows, cols),
        denseAbsRef(wd, x, rows, cols),
        1e-5,
      );
    }
  }
});

Deno.test("vq3r_lut and matvec_vq3r match the reference", () => {
  const rand = rng(6);
  for (const rows of ROWS) {
    for (const cols of [8, 24, 128, 4096 + 40]) {
      reset();
      const book = gaussian(3 * 8 * 256, rand);
      const x = gaussian(cols, rand);
      const lut = alloc(vq3rLutFloats(cols) * 4);
      qk.vq3r_lut(put(book), put(x), lut, cols);
      const want = vq3rLutRef(book, x);
      const got = f32At(lut, want.length);
      for (let i = 0; i < want.length; i++) {
        const e = (i >> 8) % (cols / 8), s = Math.floor(i / (256 * (cols / 8)));
        let abs = 0;
        for (let d = 0; d < 8; d++) {
          abs += Math.abs(book[(s * 8 + d) * 256 + (i & 255)] * x[8 * e + d]);
        }
        assert.ok(Math.abs(got[i] - want[i]) <= 1e-6 * abs + 1e-30, `lut ${cols}: entry ${i}`);
      }
      const idx = Uint8Array.from(
        { length: rows * 3 * (cols / 8) },
        () => Math.floor(rand() * 256),
      );
      const scales = gaussian(rows, rand);
      const [I, S] = [put(idx), put(scales)];
      checkMatvec(
        `vq3r ${rows}×${cols}`,
        (y, n, r0, r1) => qk.matvec_vq3r(I, S, lut, y, n, cols, r0, r1),
        rows,
        matvecVq3rRef(idx, scales, got, rows, cols),
        vq3rAbsRef(idx, scales, got, rows, cols),
        1e-5,
      );
    }
  }
});

/** Random VQ4P indices ([rows][4][nch], 0..63) packed for the kernel. */
function randomVq4p(rows: number, cols: number, rand: () => number) {
  const indices = Uint8Array.from({ length: rows * 4 * (cols / 8) }, () => Math.floor(rand() * 64));
  return packVq4p({ rows, cols, indices, scales: gaussian(rows, rand) });
}

Deno.test("vq4p_lut rounds the reference table; matvec_vq4p equals the exact reference", () => {
  const rand = rng(8);
  for (const rows of [1, 3, 5, 17, 33]) {
    // 129 and 517 chunks end in partial scale groups of 16 chunks.
    for (const cols of [8, 24, 1032, 4096 + 40]) {
      reset();
      const book = gaussian(4 * 8 * 64, rand);
      // One outlier column: only its own group's scales may grow.
      const x = gaussian(cols, rand).map((v, i) => (i === cols - 3 ? v * 50 : v));
      const lut = alloc(vq4pLutBytes(cols));
      qk.vq4p_lut(put(book), put(x), lut, cols);
      const want = vq4pLutRef(book, x);
      const nch = cols / 8, ng = Math.ceil(nch / 16);
      const table = new Int8Array(memory.buffer, Number(lut), want.length).slice();
      const q = f32At(lut + BigInt(want.length), ng * 4);
      for (let g = 0; g < ng; g++) {
        for (let s = 0; s < 4; s++) {
          let max = 0;
          for (let k = 16 * g; k < Math.min(nch, 16 * g + 16); k++) {
            for (let e = 0; e < 64; e++) max = Math.max(max, Math.abs(want[k * 256 + s * 64 + e]));
          }
          const qs = q[g * 4 + s];
          assert.ok(Math.abs(qs - max / VQ4P_LUT_MAX) <= 1e-6 * qs, `lut ${cols}: q[${g}][${s}]`);
          for (let k = 16 * g; k < Math.min(nch, 16 * g + 16); k++) {
            for (let e = 0; e < 64; e++) {
              const i = k * 256 + s * 64 + e;
              // Rounding to nearest, allowing where a relaxed FMA lands across a half.
              assert.ok(Math.abs(table[i] - want[i] / qs) <= 0.5 + 1e-4, `lut ${cols}: entry ${i}`);
            }
          }
        }
      }
      const m = randomVq4p(rows, cols, rand);
      const [I, S] = [put(m.indices), put(m.scales)];
      checkMatvec(
        `vq4p ${rows}×${cols}`,
        (y, n, r0, r1) => qk.matvec_vq4p(I, S, lut, y, n, cols, r0, r1),
        rows,
        matvecVq4pRef((r, st, k) => vq4pIndex(m, r, st, k), m.scales, table, q, rows, cols),
        new Float64Array(rows),
        0,
      );
    }
  }
});

Deno.test("matvec_vq4p: every entry at ±127 over 517 chunks does not overflow", () => {
  reset();
  const rows = 20, cols = 4096 + 40, nch = cols / 8;
  const rand = rng(9);
  const m = randomVq4p(rows, cols, rand);
  for (const sign of [1, -1]) {
    const bytes = new Uint8Array(vq4pLutBytes(cols));
    bytes.fill(sign > 0 ? 127 : 256 - 127, 0, nch * 256);
    new Float32Array(bytes.buffer, nch * 256).fill(1);
    const lut = put(bytes), y = alloc(rows * 4);
    qk.matvec_vq4p(put(m.indices), put(m.scales), lut, y, rows, cols, 0, rows);
    const got = f32At(y, rows);
    for (let r = 0; r < rows; r++) {
      assert.equal(got[r], Math.fround(m.scales[r] * sign * 127 * 4 * nch), `row ${r}`);
    }
  }
});

Deno.test("vq4p: encoded matrices multiply as their dequantised weights, within the table's rounding", () => {
  const rand = rng(10);
  for (const [rows, cols] of [[17, 64], [40, 200]]) {
    reset();
    const w = gaussian(rows * cols, rand);
    const book = trainVq4p([{ data: w, rows, cols }], { sampleSize: 4096, iterations: 4 });
    const m = encodeVq4p({ data: w, rows, cols }, book);
    const wd = dequantizeVq4p(m, book);
    const rel = Math.sqrt(
      wd.reduce((a, v, i) => a + (v - w[i]) ** 2, 0) / w.reduce((a, v) => a + v * v, 0),
    );
    assert.ok(rel < 0.5, `${rows}×${cols}: relative weight error ${rel}`);
    const x = gaussian(cols, rand);
    const lut = alloc(vq4pLutBytes(cols));
    qk.vq4p_lut(put(vq4pKernelCodebooks(book)), put(x), lut, cols);
    const nch = cols / 8;
    const q = f32At(lut + BigInt(nch * 256), Math.ceil(nch / 16) * 4);
    const y = alloc(rows * 4);
    qk.matvec_vq4p(put(m.indices), put(m.scales), lut, y, rows, cols, 0, rows);
    const got = f32At(y, rows), want = denseMatvecRef(wd, x, rows, cols);
    for (let r = 0; r < rows; r++) {
      // Each lookup is off by at most half its table's scale (plus f32 rounding).
      let bound = 0;
      for (let k = 0; k < nch; k++) {
        for (let st = 0; st < 4; st++) bound += q[Math.floor(k / 16) * 4 + st] / 2;
      }
      bound = Math.abs(m.scales[r]) * bound * 1.001 + 1e-5;
      assert.ok(Math.abs(got[r] - want[r]) <= bound, `row ${r}: ${got[r]} vs ${want[r]}`);
    }
  }
});
