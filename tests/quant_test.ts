/**
 * The TypeScript weight formats (engine/quant/*): decoders against the format definitions, the
 * FP8 decoder against the fixture pair tiny-deepseek-v3-fp8 / tiny-deepseek-v3 (same weights
 * stored as FP8 and as F32), quantise → dequantise round trips, the INT4 packing convention, and
 * VQ3R training/encoding on the stories260k-moe experts.
 */
import "./shared_guard.ts";
import assert from "node:assert/strict";
import {
  dequantizeMxfp4,
  E2M1_VALUES,
  e8m0ToNumber,
  mxfp4At,
  quantizeMxfp4,
} from "../engine/quant/mxfp4.ts";
import {
  decodeE4m3,
  dequantizeFp8b128,
  E4M3_TABLE,
  encodeE4m3,
  quantizeFp8b128,
} from "../engine/quant/fp8.ts";
import { bf16ToNumber, dequantizeInt4g32, int4At, quantizeInt4g32 } from "../engine/quant/int4.ts";
import { dequantizeInt8Row, quantizeInt8Row, relativeError } from "../engine/quant/int8.ts";
import {
  dequantizeVq3r,
  encodeVq3r,
  type MatrixF32,
  trainVq3r,
  vq3rKernelCodebooks,
} from "../engine/quant/vq3r.ts";

const MODELS = new URL("../../shared/models/", import.meta.url);

/** Minimal safetensors reader: name → raw bytes, dtype and shape. */
function readSafetensors(
  url: URL,
): Map<string, { dtype: string; shape: number[]; bytes: Uint8Array }> {
  const file = Deno.readFileSync(url);
  const n = Number(new DataView(file.buffer).getBigUint64(0, true));
  const header = JSON.parse(new TextDecoder().decode(file.subarray(8, 8 + n)));
  const out = new Map();
  for (const [name, t] of Object.entries(header)) {
    if (name === "__metadata__") continue;
    const { dtype, shape, data_offsets: [a, b] } = t as {
      dtype: string;
      shape: number[];
      data_offsets: [number, number];
    };
    out.set(name, { dtype, shape, bytes: file.slice(8 + n + a, 8 + n + b) });
  }
  return out;
}

function f32s(bytes: Uint8Array): Float32Array {
  return new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
}

function gaussian(n: number, seed: number): Float32Array {
  let s = seed >>> 0;
  const u = () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return (s + 0.5) / 4294967296;
  };
  return Float32Array.from(
    { length: n },
    () => Math.sqrt(-2 * Math.log(u())) * Math.cos(2 * Math.PI * u()),
  );
}

Deno.test("MXFP4: every nibble and every scale byte decode as OCP MX defines them", () => {
  for (let code = 0; code < 16; code++) {
    // E2M1: sign bit, 2-bit exponent (bias 1), 1-bit mantissa; exponent 0 is subnormal (m · 0.5).
    const s = code >> 3, e = (code >> 1) & 3, m = code & 1;
    const want = (s ? -1 : 1) * (e === 0 ? m * 0.5 : 2 ** (e - 1) * (1 + m / 2));
    assert.ok(
      Object.is(E2M1_VALUES[code], want),
      `E2M1 code ${code}: ${E2M1_VALUES[code]} vs ${want}`,
    );
    for (let sc = 0; sc < 256; sc++) {
      const blocks = new Uint8Array(16).fill(code | (code << 4));
      const mat = { rows: 1, cols: 32, blocks, scales: Uint8Array.of(sc) };
      const scale = sc === 255 ? NaN : 2 ** (sc - 127);
      for (const c of [0, 1, 30, 31]) {
        assert.ok(
          Object.is(mxfp4At(mat, 0, c), want * scale),
          `code ${code}, scale ${sc}, element ${c}`,
        );
      }
      assert.ok(Object.is(e8m0ToNumber(sc), scale));
    }
  }
  // Low nibble = even element.
  const mat = { rows: 1, cols: 32, blocks: new Uint8Array(16), scales: Uint8Array.of(127) };
  mat.blocks[3] = 0x72; // element 6 = code 2 (1.0), element 7 = code 7 (6.0)
  assert.equal(mxfp4At(mat, 0, 6), 1);
  assert.equal(mxfp4At(mat, 0, 7), 6);
});

Deno.test("MXFP4: quantiser follows the OCP rule and round-trips", () => {
  // Block max 5.9 → shared exponent floor(log2 5.9) − 2 = 0; 5 is a tie between 4 and 6 → 4.
  const w = new Float32Array(32);
  w.set([5.9, 5, -2.5, 0.25, 0.3, 1.25, -0.74, 7e-3]);
  const q = quantizeMxfp4(w, 1, 32);
  assert.equal(q.scales[0], 127);
  const d = dequantizeMxfp4(q);
  assert.deepEqual(Array.from(d.subarray(0, 8)), [6, 4, -2, 0, 0.5, 1, -0.5, 0]);
  const rows = 7, cols = 96;
  const g = gaussian(rows * cols, 3).map((v, i) => v * 2 ** ((i % 13) - 6));
  const mq = quantizeMxfp4(g, rows, cols);
  const back = dequantizeMxfp4(mq);
  // Dequantised values are on the grid: quantising them again changes nothing.
  const again = quantizeMxfp4(back, rows, cols);
  assert.deepEqual(again.blocks, mq.blocks);
  assert.deepEqual(again.scales, mq.scales);
  // Error bound: half the largest grid step (1, between 4 and 6) times the scale, or the clamp
  // at 6 of block maxima up to 8 · scale (OCP's shared exponent leaves max/scale in [4, 8)).
  for (let i = 0; i < g.length; i++) {
    const scale = e8m0ToNumber(mq.scales[Math.floor(i / 32)]);
    assert.ok(Math.abs(g[i] - back[i]) <= 2 * scale, `element ${i}`);
  }
  assert.ok(relativeError(g, back) < 0.2, `relative error ${relativeError(g, back)}`);
});

Deno.test("FP8 e4m3fn: all 256 codes against the format definition", () => {
  const view = new DataView(new ArrayBuffer(4));
  for (let c = 0; c < 256; c++) {
    const v = E4M3_TABLE[c];
    if ((c & 0x7f) === 0x7f) {
      assert.ok(Number.isNaN(v) && Number.isNaN(decodeE4m3(c)), `code ${c} is NaN`);
      continue;
    }
    // Independent route: sign | code << 20 as f32 bits, times 2^120 (rebias 7 → 127).
    view.setUint32(0, ((c & 0x80) << 24) | ((c & 0x7f) << 20));
    assert.ok(Object.is(v, view.getFloat32(0) * 2 ** 120), `code ${c}: ${v}`);
    assert.equal(encodeE4m3(v), c === 0x80 ? 0 : c, `encode(decode(${c}))`);
  }
  assert.equal(E4M3_TABLE[0x7e], 448);
  assert.equal(E4M3_TABLE[0x38], 1);
  assert.equal(E4M3_TABLE[0x01], 2 ** -9);
  assert.equal(encodeE4m3(1e6), 0x7e); // saturates
  assert.equal(encodeE4m3(1.0625), 0x38); // tie between 1 and 1.125 → even mantissa
  assert.equal(encodeE4m3(1.1875), 0x3a); // tie between 1.125 and 1.25 → even mantissa
});

Deno.test("FP8: dequantising tiny-deepseek-v3-fp8 gives the F32 fixture bit for bit", () => {
  const fp8 = readSafetensors(
    new URL("tiny-deepseek-v3-fp8/model-00001-of-00002.safetensors", MODELS),
  );
  const ref = readSafetensors(new URL("tiny-deepseek-v3/model.safetensors", MODELS));
  let checked = 0;
  for (const [name, t] of fp8) {
    if (t.dtype !== "F8_E4M3") continue;
    const [rows, cols] = t.shape;
    const scales = f32s(fp8.get(`${name}_scale_inv`)!.bytes);
    const got = dequantizeFp8b128({ rows, cols, codes: t.bytes, scales });
    assert.deepEqual(got, f32s(ref.get(name)!.bytes), name);
    checked++;
  }
  assert.ok(checked > 40, `checked ${checked} FP8 tensors`);
});

Deno.test("FP8: quantise → dequantise stays within e4m3 precision", () => {
  const rows = 200, cols = 300;
  const w = gaussian(rows * cols, 4);
  const m = quantizeFp8b128(w, rows, cols);
  assert.equal(m.scales.length, 2 * 3);
  const back = dequantizeFp8b128(m);
  for (let i = 0; i < w.length; i++) {
    const r = Math.floor(i / cols), c = i % cols;
    const s = m.scales[Math.floor(r / 128) * 3 + Math.floor(c / 128)];
    // Relative step 2^-3 for normals (half: 2^-4), absolute 2^-9·scale below the normal range.
    assert.ok(
      Math.abs(w[i] - back[i]) <= Math.max(Math.abs(w[i]) * 2 ** -4, s * 2 ** -10) * 1.000001,
      `element ${i}`,
    );
  }
});

Deno.test("INT4: compressed-tensors packing (q + 8, element i of a word in bits 4i)", () => {
  const w = new Float32Array(32);
  // Group max 7.5 → scale bf16(1.0); q = round(w).
  w.set([1, -7.5, 7, 0, -3, 2.5, 3.5, -1]);
  const m = quantizeInt4g32(w, 1, 32);
  assert.equal(bf16ToNumber(m.scales[0]), 1);
  const q = [1, -8, 7, 0, -3, 2, 4, -1]; // −7.5 rounds to −8 (even), 2.5 → 2, 3.5 → 4
  let word = 0;
  for (let i = 0; i < 8; i++) word |= (q[i] + 8) << (4 * i);
  assert.equal(m.packed[0], word);
  for (let i = 0; i < 8; i++) assert.equal(int4At(m, 0, i), q[i]);
  const rows = 5, cols = 64;
  const g = gaussian(rows * cols, 5);
  const mm = quantizeInt4g32(g, rows, cols);
  const back = dequantizeInt4g32(mm);
  for (let i = 0; i < g.length; i++) {
    const s = bf16ToNumber(mm.scales[Math.floor(i / 32)]);
    assert.ok(Math.abs(g[i] - back[i]) <= s * 0.5 * 1.02 + 1e-7, `element ${i}`);
  }
});

Deno.test("int8 per row: scale max|row|/127 and round trip within half a step", () => {
  const rows = 4, cols = 37;
  const g = gaussian(rows * cols, 6);
  g.fill(0, 2 * cols, 3 * cols); // an all-zero row
  const m = quantizeInt8Row(g, rows, cols);
  assert.equal(m.scales[2], 0);
  const back = dequantizeInt8Row(m);
  for (let r = 0; r < rows; r++) {
    let max = 0;
    for (let c = 0; c < cols; c++) max = Math.max(max, Math.abs(g[r * cols + c]));
    assert.equal(m.scales[r], Math.fround(max / 127));
    for (let c = 0; c < cols; c++) {
      assert.ok(Math.abs(g[r * cols + c] - back[r * cols + c]) <= m.scales[r] * 0.5000001);
    }
  }
});

Deno.test("VQ3R: deterministic training, encode/decode error on stories260k-moe experts", () => {
  const st = readSafetensors(new URL("stories260k-moe/model.safetensors", MODELS));
  const mats: MatrixF32[] = [];
  for (let e = 0; e < 8; e++) {
    const t = st.get(`model.layers.1.block_sparse_moe.experts.${e}.w2.weight`)!;
    mats.push({ data: f32s(t.bytes), rows: t.shape[0], cols: t.shape[1] });
  }
  const opts = { seed: 7, sampleSize: 4096, iterations: 6 };
  const book = trainVq3r(mats, opts);
  assert.deepEqual(trainVq3r(mats, opts), book, "same seed, same codebooks");
  assert.notDeepEqual(trainVq3r(mats, { ...opts, seed: 8 }), book);
  let num = 0, den = 0;
  for (const m of mats) {
    const back = dequantizeVq3r(encodeVq3r(m, book), book);
    for (let i = 0; i < back.length; i++) {
      num += (back[i] - m.data[i]) ** 2;
      den += m.data[i] ** 2;
    }
  }
  const rel = Math.sqrt(num / den);
  // 3 bits per weight: the published figure for this fixture is about 19.4 %.
  assert.ok(rel > 0.05 && rel < 0.3, `relative error ${rel}`);
  const k = vq3rKernelCodebooks(book);
  assert.equal(k[(2 * 8 + 5) * 256 + 17], book[(2 * 256 + 17) * 8 + 5]);
});
