// KDA's and Gated DeltaNet's kernels (kernels/kda.c) against the float64 references of
// tests/scalar_kernels.ts at awkward sizes (Gated DeltaNet: value heads sharing key heads, one
// decay per head, strong decays), plus the invariants the engine relies on: head splits and token
// splits of a call never change a bit.
import assert from "node:assert/strict";
import {
  createArenaMemory,
  instantiateKernels,
  KERNEL_RESERVED_BYTES,
  type Kernels,
  loadKernelModule,
  type Ptr,
} from "../wasm/mod.ts";
import { kdaRecurrentRef, type KdaShape, shortConvRef } from "./scalar_kernels.ts";

const memory = createArenaMemory(64 * 2 ** 20);
const k: Kernels = await instantiateKernels(await loadKernelModule(), memory);

let top = KERNEL_RESERVED_BYTES;
function alloc(n: number): Ptr {
  const p = top;
  top += Math.ceil((n * 4) / 64) * 64;
  assert.ok(top <= memory.buffer.byteLength, "test arena exhausted");
  return BigInt(p);
}
function view(p: Ptr, n: number): Float32Array {
  return new Float32Array(memory.buffer, Number(p), n);
}
function put(a: ArrayLike<number>): Ptr {
  const p = alloc(a.length);
  view(p, a.length).set(a);
  return p;
}

/** Deterministic values in [lo, hi). */
function rand(n: number, seed: number, lo = -1, hi = 1): Float32Array {
  let s = seed >>> 0 || 1;
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    out[i] = lo + ((s >>> 0) / 2 ** 32) * (hi - lo);
  }
  return out;
}

/** Inputs of one KDA call in a layout with padded strides (as the engine's scratch has). */
interface KdaCase {
  s: KdaShape;
  q: Float32Array;
  k: Float32Array;
  v: Float32Array;
  g: Float32Array;
  beta: Float32Array;
}

function kdaCase(s: KdaShape, seed: number, gLow = -3): KdaCase {
  const n = s.T * s.nHeads, nv = n * (s.ratio ?? 1);
  return {
    s,
    q: rand(n * s.dk, seed),
    k: rand(n * s.dk, seed + 1),
    v: rand(nv * s.dv, seed + 2),
    // Log-decays as the gate makes them: −exp(A)·softplus(z) spans small to large decays.
    g: rand(nv * (s.gChannels ?? s.dk), seed + 3, gLow, -0.001),
    beta: rand(nv, seed + 4, 0, 1),
  };
}

/** Value heads of a shape. */
const valueHeads = (s: KdaShape) => s.nHeads * (s.ratio ?? 1);

const PAD = 3;

/** Runs kda_recurrent_f32 on tokens [t0, t1) of `c` with head ranges `splits`. */
function runKda(
  c: KdaCase,
  S: Ptr,
  t0: number,
  t1: number,
  splits: number[][],
): Float32Array {
  const { nHeads: H, dk, dv } = c.s;
  const V = valueHeads(c.s), gc = c.s.gChannels ?? dk;
  const T = t1 - t0;
  const qkStride = H * dk + PAD, vStride = V * dv + PAD, gStride = V * gc + PAD;
  const outStride = V * dv + PAD;
  const strided = (src: Float32Array, per: number, stride: number) => {
    const a = new Float32Array(T * stride).fill(NaN);
    for (let t = 0; t < T; t++) {
      a.set(src.subarray((t0 + t) * per, (t0 + t + 1) * per), t * stride);
    }
    return put(a);
  };
  const q = strided(c.q, H * dk, qkStride), kk = strided(c.k, H * dk, qkStride);
  const v = strided(c.v, V * dv, vStride), g = strided(c.g, V * gc, gStride);
  const beta = strided(c.beta, V, V + 1);
  const out = alloc(T * outStride);
  view(out, T * outStride).fill(NaN);
  for (const [h0, h1] of splits) {
    k.kda_recurrent_f32(
      S,
      q,
      kk,
      v,
      g,
      beta,
      out,
      T,
      H,
      dk,
      dv,
      qkStride,
      vStride,
      gStride,
      V + 1,
      outStride,
      c.s.ratio ?? 1,
      gc,
      h0,
      h1,
    );
  }
  const o = view(out, T * outStride);
  const dense = new Float32Array(T * V * dv);
  for (let t = 0; t < T; t++) {
    dense.set(o.subarray(t * outStride, t * outStride + V * dv), t * V * dv);
  }
  return dense;
}

function assertNear(got: ArrayLike<number>, want: ArrayLike<number>, tol: number, what: string) {
  let scale = 0;
  for (let i = 0; i < want.length; i++) scale = Math.max(scale, Math.abs(want[i]));
  for (let i = 0; i < want.length; i++) {
    const err = Math.abs(got[i] - want[i]);
    assert.ok(err <= tol * Math.max(scale, 1e-30), `${what}[${i}]: ${got[i]} vs ${want[i]}`);
  }
}

const KDA_SHAPES: KdaShape[] = [
  { T: 7, nHeads: 3, dk: 5, dv: 19 },
  { T: 5, nHeads: 4, dk: 16, dv: 16 },
  { T: 9, nHeads: 2, dk: 7, dv: 36 },
  { T: 3, nHeads: 1, dk: 128, dv: 128 },
  { T: 1, nHeads: 2, dk: 33, dv: 3 },
];

/** Gated DeltaNet: one decay per value head, value heads ≠ key heads (and dk ≠ dv). */
const GDN_SHAPES: KdaShape[] = [
  { T: 7, nHeads: 2, dk: 16, dv: 16, ratio: 2, gChannels: 1 },
  { T: 5, nHeads: 3, dk: 5, dv: 19, ratio: 3, gChannels: 1 },
  { T: 9, nHeads: 1, dk: 33, dv: 20, ratio: 4, gChannels: 1 },
  { T: 2, nHeads: 2, dk: 128, dv: 128, ratio: 2, gChannels: 1 },
  { T: 4, nHeads: 5, dk: 7, dv: 3, ratio: 1, gChannels: 1 },
];

Deno.test("kda_recurrent_f32 matches the float64 delta rule at awkward sizes", () => {
  for (const [i, s] of KDA_SHAPES.entries()) {
    top = KERNEL_RESERVED_BYTES;
    const c = kdaCase(s, 100 + i);
    const S0 = rand(s.nHeads * s.dk * s.dv, 7 + i, -0.5, 0.5);
    const S = put(S0);
    const got = runKda(c, S, 0, s.T, [[0, s.nHeads]]);
    const Sref = Float64Array.from(S0);
    const want = kdaRecurrentRef(Sref, c.q, c.k, c.v, c.g, c.beta, s);
    assertNear(got, want, 2e-6, `out ${JSON.stringify(s)}`);
    assertNear(view(S, Sref.length), Sref, 2e-6, `state ${JSON.stringify(s)}`);
  }
});

Deno.test("kda_recurrent_f32: head splits and token splits give the same bits", () => {
  for (const [i, s] of KDA_SHAPES.entries()) {
    top = KERNEL_RESERVED_BYTES;
    const c = kdaCase(s, 200 + i);
    const S0 = rand(s.nHeads * s.dk * s.dv, 9 + i, -0.5, 0.5);
    const Sa = put(S0), Sb = put(S0);
    const whole = runKda(c, Sa, 0, s.T, [[0, s.nHeads]]);
    const splits = Array.from({ length: s.nHeads }, (_, h) => [h, h + 1]).reverse();
    const cut = Math.floor(s.T / 2);
    const parts = [
      ...(cut > 0 ? runKda(c, Sb, 0, cut, splits) : []),
      ...runKda(c, Sb, cut, s.T, splits),
    ];
    assert.deepEqual(new Float32Array(parts), whole, `out ${JSON.stringify(s)}`);
    const n = s.nHeads * s.dk * s.dv;
    assert.deepEqual(view(Sb, n).slice(), view(Sa, n).slice(), `state ${JSON.stringify(s)}`);
  }
});

Deno.test("Gated DeltaNet (shared key heads, one decay a head) matches the float64 rule", () => {
  // Strong decays too: log-decays down to −20 (e^g ≈ 2e−9) wipe the state within one token.
  for (const [gLow, tol] of [[-3, 2e-6], [-20, 2e-6]] as const) {
    for (const [i, s] of GDN_SHAPES.entries()) {
      top = KERNEL_RESERVED_BYTES;
      const c = kdaCase(s, 1000 + i, gLow);
      const S0 = rand(valueHeads(s) * s.dk * s.dv, 17 + i, -0.5, 0.5);
      const S = put(S0);
      const got = runKda(c, S, 0, s.T, [[0, s.nHeads]]);
      const Sref = Float64Array.from(S0);
      const want = kdaRecurrentRef(Sref, c.q, c.k, c.v, c.g, c.beta, s);
      assertNear(got, want, tol, `out ${JSON.stringify(s)} g ≥ ${gLow}`);
      assertNear(view(S, Sref.length), Sref, tol, `state ${JSON.stringify(s)} g ≥ ${gLow}`);
    }
  }
});

Deno.test("Gated DeltaNet: key-head splits and token splits give the same bits", () => {
  for (const [i, s] of GDN_SHAPES.entries()) {
    top = KERNEL_RESERVED_BYTES;
    const c = kdaCase(s, 1100 + i);
    const S0 = rand(valueHeads(s) * s.dk * s.dv, 19 + i, -0.5, 0.5);
    const Sa = put(S0), Sb = put(S0);
    const whole = runKda(c, Sa, 0, s.T, [[0, s.nHeads]]);
    const splits = Array.from({ length: s.nHeads }, (_, h) => [h, h + 1]).reverse();
    const parts: number[] = [];
    for (let t = 0; t < s.T; t++) parts.push(...runKda(c, Sb, t, t + 1, splits));
    assert.deepEqual(new Float32Array(parts), whole, `out ${JSON.stringify(s)}`);
    const n = valueHeads(s) * s.dk * s.dv;
    assert.deepEqual(view(Sb, n).slice(), view(Sa, n).slice(), `state ${JSON.stringify(s)}`);
  }
});

Deno.test("kda_recurrent_f32 keeps a zero state finite with a decay of exactly 1", () => {
  top = KERNEL_RESERVED_BYTES;
  const s = { T: 4, nHeads: 1, dk: 8, dv: 8 };
  const c = kdaCase(s, 300);
  c.g.fill(0);
  const S = put(new Float32Array(s.dk * s.dv));
  const got = runKda(c, S, 0, s.T, [[0, 1]]);
  const want = kdaRecurrentRef(new Float64Array(s.dk * s.dv), c.q, c.k, c.v, c.g, c.beta, s);
  assertNear(got, want, 2e-6, "g = 0");
});

/** Runs short_conv_f32 on tokens [t0, t1) with head ranges `splits`. */
function runConv(
  x: Float32Array,
  state: Ptr,
  w: Ptr,
  channels: number,
  K: number,
  group: number,
  t0: number,
  t1: number,
  splits: number[][],
): Float32Array {
  const T = t1 - t0;
  const xs = channels + 2, ys = channels + 1;
  const xa = new Float32Array(T * xs).fill(NaN);
  for (let t = 0; t < T; t++) {
    xa.set(x.subarray((t0 + t) * channels, (t0 + t + 1) * channels), t * xs);
  }
  const xp = put(xa), y = alloc(T * ys);
  for (const [r0, r1] of splits) {
    k.short_conv_f32(xp, state, w, y, T, channels, K, xs, ys, group, r0, r1);
  }
  const yv = view(y, T * ys);
  const out = new Float32Array(T * channels);
  for (let t = 0; t < T; t++) out.set(yv.subarray(t * ys, t * ys + channels), t * channels);
  return out;
}

const CONV_SHAPES = [
  { T: 6, channels: 15, group: 5, K: 4 },
  { T: 1, channels: 12, group: 4, K: 4 },
  { T: 2, channels: 9, group: 3, K: 4 },
  { T: 5, channels: 64, group: 16, K: 3 },
  { T: 3, channels: 7, group: 7, K: 1 },
];

Deno.test("short_conv_f32 matches the float64 causal conv + SiLU and carries its window", () => {
  for (const [i, c] of CONV_SHAPES.entries()) {
    top = KERNEL_RESERVED_BYTES;
    const x = rand(c.T * c.channels, 400 + i, -2, 2);
    const w = rand(c.channels * c.K, 500 + i);
    const st0 = rand((c.K - 1) * c.channels, 600 + i, -2, 2);
    const state = put(st0), wp = put(w);
    const rows = c.channels / c.group;
    const got = runConv(x, state, wp, c.channels, c.K, c.group, 0, c.T, [[0, rows]]);
    const stRef = Float64Array.from(st0);
    const want = shortConvRef(x, stRef, w, c.T, c.channels, c.K);
    assertNear(got, want, 1e-6, `conv ${JSON.stringify(c)}`);
    assert.deepEqual(view(state, stRef.length).slice(), Float32Array.from(stRef), "window");
  }
});

Deno.test("short_conv_f32: head splits and token splits give the same bits", () => {
  for (const [i, c] of CONV_SHAPES.entries()) {
    top = KERNEL_RESERVED_BYTES;
    const x = rand(c.T * c.channels, 700 + i, -2, 2);
    const w = put(rand(c.channels * c.K, 800 + i));
    const st0 = rand((c.K - 1) * c.channels, 900 + i, -2, 2);
    const sa = put(st0), sb = put(st0);
    const rows = c.channels / c.group;
    const whole = runConv(x, sa, w, c.channels, c.K, c.group, 0, c.T, [[0, rows]]);
    const splits = Array.from({ length: rows }, (_, r) => [r, r + 1]).reverse();
    const parts: number[] = [];
    for (let t = 0; t < c.T; t++) {
      parts.push(...runConv(x, sb, w, c.channels, c.K, c.group, t, t + 1, splits));
    }
    assert.deepEqual(new Float32Array(parts), whole, `conv ${JSON.stringify(c)}`);
    const n = (c.K - 1) * c.channels;
    assert.deepEqual(view(sb, n).slice(), view(sa, n).slice(), "window");
  }
});
