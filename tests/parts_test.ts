/**
 * Each mixer part on its own, against its float64 reference (engine/reference/mixers.ts) at
 * awkward sizes: one layer, random weights in the arena, a few positions run as one chunk and
 * then token by token; outputs within 1e-5 relative. The hyper-connection stream likewise, over
 * two layers and a chunk with a stand-in sublayer. The other residual streams and the
 * feed-forward are held to the reference through whole models (tests/kimi_k3_test.ts,
 * synth_engine_test.ts).
 */
import assert from "node:assert/strict";
import { Arena } from "../engine/arena.ts";
import { Ops } from "../engine/ops.ts";
import { MIXERS } from "../engine/parts/mod.ts";
import { residualPartOf } from "../engine/parts/residual.ts";
import { hyperHead, hyperMean, hyperPost, hyperWeights } from "../engine/reference/math.ts";
import { Pool } from "../engine/pool.ts";
import { ReferenceModel } from "../engine/reference/forward.ts";
import { indexScoresReference, poolKeysReference, topKReference } from "../engine/reference/mla.ts";
import { REFERENCE_MIXERS } from "../engine/reference/mixers.ts";
import { topK, topKTiled } from "../engine/routing.ts";
import { layerTensorsOf } from "../engine/tensor_names.ts";
import { layerTensorSpec } from "../engine/tensor_shapes.ts";
import { rowBlock, type TensorRef } from "../engine/tensor.ts";
import { quantizeFp8b128 } from "../engine/quant/fp8.ts";
import type { LayerWeights } from "../engine/weights.ts";
import {
  type GlobalTensor,
  type LayerTensor,
  layerTensorName,
  type MixerName,
  mixerOf,
  type ModelConfig,
} from "../io/model_config.ts";
import { loadKernelModule } from "../wasm/mod.ts";
import { maxRelDiff } from "./fixtures.ts";

/** A one-layer config around a mixer's own sections (no FFN: parts are tested alone). */
function config(over: Partial<ModelConfig>): ModelConfig {
  return {
    family: "llama",
    modelType: "qwen3_moe",
    vocabSize: 8,
    hiddenSize: 40,
    numLayers: 1,
    numHeads: 5,
    numKvHeads: 1,
    headDim: 12,
    intermediateSize: 8,
    rmsNormEps: 1e-6,
    rope: { theta: 10000, layout: "half", dim: 8, scaling: { type: "none" } },
    maxPositions: 64,
    tieWordEmbeddings: true,
    qkNorm: false,
    attentionBias: false,
    layerKinds: ["dense"],
    moe: null,
    mla: null,
    attnScale: 1 / Math.sqrt(12),
    bosId: null,
    eosIds: [],
    ...over,
  };
}

const MLA_CFG = {
  family: "deepseek_v3",
  modelType: "deepseek_v3",
  numHeads: 3,
  numKvHeads: 3,
  headDim: 18,
  rope: { theta: 10000, layout: "interleaved", dim: 6, scaling: { type: "none" } },
  mla: { qLoraRank: 20, kvLoraRank: 24, qkNopeHeadDim: 12, qkRopeHeadDim: 6, vHeadDim: 10 },
  attnScale: 1 / Math.sqrt(18),
} as const;

const KDA_CFG = {
  family: "kimi_linear",
  modelType: "kimi_linear",
  numHeads: 3,
  numKvHeads: 3,
  headDim: 18,
  mla: { ...MLA_CFG.mla, nope: true },
  rope: MLA_CFG.rope,
  attnScale: MLA_CFG.attnScale,
} as const;

/** DeepSeek-V4's attention on one layer of compression `layer` (window 3, rotary dims 6). */
function csaConfig(layer: { ratio: number; indexed: boolean }): ModelConfig {
  return config({
    family: "deepseek_v4",
    modelType: "deepseek_v4",
    numHeads: 3,
    numKvHeads: 1,
    headDim: 18,
    rope: { theta: 10000, layout: "interleaved", dim: 6, scaling: { type: "none" } },
    csa: {
      qLoraRank: 20,
      oGroups: 3,
      oLoraRank: 7,
      window: 3,
      layers: [layer],
      compressRope: {
        theta: 1000,
        layout: "interleaved",
        dim: 6,
        scaling: {
          type: "yarn",
          factor: 4,
          originalMaxPositions: 16,
          betaFast: 32,
          betaSlow: 1,
          mscale: 1,
          mscaleAllDim: 1,
        },
      },
      // Top-1 of the entries: from position 5 on the indexer chooses between two.
      indexer: { heads: 5, headDim: 10, topK: 1 },
    },
    attnScale: 1 / Math.sqrt(18),
  });
}

/** Every mixer kind, at sizes no kernel is tuned for, with its features on. */
const CASES: [string, ModelConfig][] = [
  ["csa with a window of 3 only", csaConfig({ ratio: 0, indexed: false })],
  ["csa with overlapping entries of 3 and an indexer", csaConfig({ ratio: 3, indexed: true })],
  ["csa with heavy entries of 2", csaConfig({ ratio: 2, indexed: false })],
  ["gqa with q/k norm, biases and partial RoPE", config({ qkNorm: true, attentionBias: true })],
  [
    "gqa with sinks, o bias and a window of 3",
    config({
      family: "gpt_oss",
      modelType: "gpt_oss",
      numKvHeads: 5,
      attention: { sinks: true, outputBias: true, windows: [3] },
    }),
  ],
  ["mla", config(MLA_CFG)],
  [
    "mla with a sparse-attention indexer keeping 3 keys, latent norms at 1e-4",
    config({
      ...MLA_CFG,
      mla: {
        ...MLA_CFG.mla,
        latentNormEps: 1e-4,
        indexer: { numHeads: 5, headDim: 10, topK: 3 },
      },
    }),
  ],
  [
    "mla without rotary, with a k-pool indexer keeping 2 pools of 3 and the tail",
    config({
      ...MLA_CFG,
      mla: {
        ...MLA_CFG.mla,
        nope: true,
        indexer: { numHeads: 3, headDim: 10, topK: 7, pool: 3 },
      },
    }),
  ],
  [
    "mla without rotary, with an output gate",
    config({
      ...MLA_CFG,
      family: "kimi_k3",
      modelType: "kimi_k3",
      residual: { kind: "attn_res", blockSize: 1 },
      mla: { ...MLA_CFG.mla, nope: true, outputGate: true },
    }),
  ],
  [
    "kda",
    config({
      ...KDA_CFG,
      kda: {
        numHeads: 3,
        headDim: 12,
        convKernel: 4,
        layers: [true],
        gateLowerBound: null,
        fullRankOutputGate: false,
      },
    }),
  ],
  [
    "kda with a bounded gate and a full-rank output gate",
    config({
      ...KDA_CFG,
      family: "kimi_k3",
      modelType: "kimi_k3",
      residual: { kind: "attn_res", blockSize: 1 },
      kda: {
        numHeads: 3,
        headDim: 12,
        convKernel: 3,
        layers: [true],
        gateLowerBound: -5,
        fullRankOutputGate: true,
      },
      mla: { ...KDA_CFG.mla, outputGate: true },
    }),
  ],
];

/** Deterministic values in [−scale, scale) (norm weights around 1). */
function values(n: number, seed: number, scale: number, around = 0): Float32Array {
  const out = new Float32Array(n);
  let s = seed >>> 0;
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    out[i] = around + scale * (s / 2 ** 32 * 2 - 1);
  }
  return out;
}

const POSITIONS = 12;

for (const [what, cfg] of CASES) {
  Deno.test(`the ${what} mixer matches its float64 reference`, async () => {
    const name: MixerName = mixerOf(cfg, 0);
    const part = MIXERS[name];
    const d = cfg.hiddenSize;
    const weights = new Map<string, Float32Array>();
    const tensors = layerTensorsOf(cfg, 0).filter((t) => !t.startsWith("ffn_"));
    tensors.forEach((t, i) => {
      const shape = layerTensorSpec(cfg, t, 0).shape;
      const n = shape.reduce((a, b) => a * b, 1);
      const norm = t.endsWith("norm");
      weights.set(t, values(n, 17 + i, norm ? 0.2 : t === "a_log" ? 1 : 0.3, norm ? 1 : 0));
    });
    const arena = new Arena(64 * 2 ** 20);
    const pool = await Pool.create(arena, await loadKernelModule(), 2);
    try {
      const ops = new Ops(arena, pool);
      const refs = new Map<LayerTensor, TensorRef>();
      for (const t of tensors) {
        const v = weights.get(t)!;
        const shape = layerTensorSpec(cfg, t, 0).shape;
        const ptr = arena.alloc(`w ${t}`, v.length * 4, 64);
        arena.f32(ptr, v.length).set(v);
        refs.set(t, {
          ptr,
          dtype: "f32",
          rows: shape[0],
          cols: shape.length > 1 ? shape.at(-1)! : 1,
        });
      }
      const lw: LayerWeights = {
        get: (t) => refs.get(t) ?? assert.fail(`no ${t}`),
        has: (t) => refs.has(t),
      };
      const maxBatch = 4;
      const mixer = part.create(ops, arena, cfg, [0], maxBatch, 32, 1);
      const h = arena.alloc("h", maxBatch * d * 4);
      const out = arena.alloc("out", maxBatch * d * 4);
      const inputs = Array.from({ length: POSITIONS }, (_, p) => values(d, 100 + p, 1));
      const ref = new ReferenceModel(cfg, (n) => {
        const t = n.slice(n.lastIndexOf(".") + 1);
        if (n !== layerTensorName(0, t as LayerTensor)) assert.fail(`no reference weight ${n}`);
        return weights.get(t) ?? assert.fail(`no ${n}`);
      });
      const want = inputs.map((x, p) => REFERENCE_MIXERS[name](ref, 0, Float64Array.from(x), p));
      // A chunk of 3, one token at a time (ring wrap and state carry included), then a chunk
      // whose first token still attends to every position and whose others the indexers thin.
      const chunks = [[0, 3], [3, 1], [4, 1], [5, 1], [6, 1], [7, 4], [11, 1]];
      for (const [p0, nb] of chunks) {
        mixer.begin?.(p0, nb);
        for (let b = 0; b < nb; b++) arena.f32(h + b * d * 4, d).set(inputs[p0 + b]);
        mixer.forward(0, lw, h, out, nb, p0);
        for (let b = 0; b < nb; b++) {
          const diff = maxRelDiff(arena.f32(out + b * d * 4, d), want[p0 + b]);
          assert.ok(diff <= 1e-5, `${what}: position ${p0 + b} off by ${diff}`);
        }
      }
    } finally {
      pool.close();
    }
  });
}

for (const collapse of [undefined, "mean" as const]) {
  Deno.test(
    `the hyper-connection stream matches its float64 reference over layers and a chunk, collapsed by ${
      collapse ?? "the hyper head"
    }`,
    async () => {
      const cfg = config({
        hiddenSize: 37,
        numLayers: 2,
        layerKinds: ["dense", "dense"],
        residual: { kind: "hyper", streams: 3, sinkhornIters: 6, eps: 1e-6, collapse },
      });
      const part = residualPartOf(cfg);
      const d = cfg.hiddenSize, n = 3, nb = 3;
      const arena = new Arena(16 * 2 ** 20);
      const pool = await Pool.create(arena, await loadKernelModule(), 1);
      try {
        const ops = new Ops(arena, pool);
        const put = (name: string, shape: number[], seed: number): [TensorRef, Float32Array] => {
          const v = values(
            shape.reduce((a, b) => a * b, 1),
            seed,
            name.endsWith("scale") ? 0.5 : 0.4,
          );
          if (name.endsWith("scale")) v.forEach((x, i) => v[i] = 1 + x);
          const ptr = arena.alloc(name, v.length * 4, 64);
          arena.f32(ptr, v.length).set(v);
          return [{ ptr, dtype: "f32", rows: shape[0], cols: shape.at(-1)! }, v];
        };
        const globals = new Map(
          part.globalTensors.map((t, i) => [t, put(t, part.shape(cfg, t), 50 + i)]),
        );
        const layers = [0, 1].map((l) =>
          new Map(
            part.layerTensors.map((
              t,
              i,
            ) => [t, put(`${l}${t}`, part.shape(cfg, t), 60 + 10 * l + i)]),
          )
        );
        const stream = part.create(ops, arena, cfg, (t) => globals.get(t)![0], nb);
        const embedded = values(nb * d, 7, 1);
        arena.f32(stream.x, nb * d).set(embedded);
        stream.start(nb);
        // A stand-in sublayer: out = 0.5·input + 0.1 (any function of the input would do).
        const sub = (v: ArrayLike<number>) => Float64Array.from(v, (u) => 0.5 * u + 0.1);
        const out = arena.alloc("out", nb * d * 4);
        const want: Float64Array[][] = Array.from({ length: nb }, (_, b) => {
          const e = Float64Array.from(embedded.subarray(b * d, (b + 1) * d));
          return Array.from({ length: n }, () => e.slice());
        });
        for (let l = 0; l < 2; l++) {
          const lw: LayerWeights = {
            get: (t) => layers[l].get(t)?.[0] ?? assert.fail(`no ${t}`),
            has: (t) => layers[l].has(t),
          };
          for (const [which, site] of [["mixer", "attn"], ["ffn", "ffn"]] as const) {
            const input = stream.input(which, l, lw, nb);
            const got = arena.f32(input, nb * d);
            for (let b = 0; b < nb; b++) {
              const w = hyperWeights(
                want[b],
                layers[l].get(`hc_${site}_fn`)![1],
                layers[l].get(`hc_${site}_base`)![1],
                layers[l].get(`hc_${site}_scale`)![1],
                6,
                cfg.rmsNormEps,
                1e-6,
                site,
              );
              const diff = maxRelDiff(got.subarray(b * d, (b + 1) * d), w.input);
              assert.ok(diff <= 1e-5, `layer ${l} ${which} token ${b}: input off by ${diff}`);
              want[b] = hyperPost(want[b], sub(w.input), w);
            }
            arena.f32(out, nb * d).set(Float32Array.from(sub(got)));
            stream.add(which, l, out, nb);
          }
        }
        const final = arena.f32(stream.output(1, nb), (nb - 1) * d);
        for (let b = 1; b < nb; b++) {
          const [fn, base, scale] = ["hc_head_fn", "hc_head_base", "hc_head_scale"].map((t) =>
            globals.get(t as GlobalTensor)![1]
          );
          const w = collapse === "mean"
            ? hyperMean(want[b])
            : hyperHead(want[b], fn, base, scale, cfg.rmsNormEps, 1e-6);
          const diff = maxRelDiff(final.subarray((b - 1) * d, b * d), w);
          assert.ok(diff <= 1e-5, `token ${b}: ${collapse ?? "hyper head"} off by ${diff}`);
        }
      } finally {
        pool.close();
      }
    },
  );
}

Deno.test("the indexer's scores, top-k and pool keys match their scalar reference at awkward sizes", async () => {
  const arena = new Arena(4 * 2 ** 20);
  const pool = await Pool.create(arena, await loadKernelModule(), 1);
  try {
    const ops = new Ops(arena, pool);
    const put = (v: Float32Array) => {
      const ptr = arena.alloc("v", v.length * 4, 64);
      arena.f32(ptr, v.length).set(v);
      return ptr;
    };
    for (
      const [heads, dim, n, k, size] of [
        [5, 10, 37, 3, 3],
        [3, 7, 64, 17, 4],
        [1, 9, 5, 5, 1],
        [7, 13, 20, 19, 5],
      ]
    ) {
      const ix = { numHeads: heads, headDim: dim, topK: k };
      const q = values(heads * dim, 3 + n, 1);
      const w = values(heads, 5 + n, 1);
      // Rows of [key | gate], as the mixer caches them; repeated keys tie on the cut.
      const rows = Array.from({ length: n }, (_, t) => {
        const row = new Float32Array(2 * dim);
        row.set(values(dim, 7 + t * n, 1));
        row.set(values(dim, 9 + t * n, 4), dim);
        return row;
      });
      for (let t = 4; t < n; t += 4) rows[t].set(rows[t - 3].subarray(0, dim));
      const flat = new Float32Array(n * 2 * dim);
      rows.forEach((r, t) => flat.set(r, t * 2 * dim));
      const rowsPtr = put(flat);
      // The mixer folds 1/√(heads·dim) into the head weights.
      const wPtr = put(w.map((x) => x / Math.sqrt(heads * dim)));
      const scores = arena.alloc("scores", n * 4);
      ops.csaIndexScores(put(q), heads, dim, wPtr, rowsPtr, 2 * dim, n, scores);
      const got = arena.f32(scores, n);
      const keys = rows.map((r) => r.subarray(0, dim));
      const want = indexScoresReference(ix, q, w.map((x) => x / Math.sqrt(heads)), keys);
      assert.ok(maxRelDiff(got, want) <= 1e-5, `${heads}×${dim}, ${n} keys: scores differ`);
      for (const take of [1, k, n - 1, n]) {
        assert.deepEqual(
          topK(got, take).sort((a, b) => a - b),
          topKReference(got, take),
          `top ${take}`,
        );
      }
      const even = new Float32Array(n).fill(0.5);
      assert.deepEqual(topK(even, k).sort((a, b) => a - b), Array.from({ length: k }, (_, t) => t));
      assert.deepEqual(topKReference(even, k), Array.from({ length: k }, (_, t) => t));
      // Pool keys, as the mixer makes them when a pool completes.
      const ape = values(size * dim, 19 + size, 2);
      const pooled = poolKeysReference(rows, ape, size, dim);
      const out = arena.alloc("pool key", dim * 4);
      pooled.forEach((K, j) => {
        ops.csaCompress({
          rows: rowsPtr,
          rowFloats: 2 * dim,
          cOff: 0,
          zOff: dim,
          ape: put(ape),
          ratio: size,
          width: dim,
          indexed: false,
          w: j,
          out,
        });
        const diff = maxRelDiff(arena.f32(out, dim), K);
        assert.ok(diff <= 1e-5, `pool ${j} of ${size}×${dim} off by ${diff}`);
      });
      assert.equal(pooled.length, Math.floor(n / size));
    }
  } finally {
    pool.close();
  }
});

Deno.test("indexer top-k a tile at a time picks what top-k over every score picks, in its order", () => {
  for (const [n, seed] of [[1, 1], [7, 2], [64, 3], [301, 4], [1000, 5]]) {
    // Few distinct values, both zeros and both infinities: ties everywhere, across tile edges.
    const pick = values(n, seed, 1);
    const tied = Float32Array.from(
      pick,
      (v) => [0, -0, 0.25, -1, Infinity, -Infinity][((v + 1) * 3) | 0],
    );
    for (const all of [pick, tied]) {
      for (const k of [1, 2, Math.ceil(n / 3), n - 1, n, n + 4].filter((k) => k > 0)) {
        for (const tile of [1, 3, 7, 64, n, n + 5]) {
          // One buffer, overwritten by every call, as the kernel's is.
          const buf = new Float32Array(tile);
          const got = topKTiled(n, k, tile, (from, count) => {
            buf.fill(NaN).set(all.subarray(from, from + count));
            return buf.subarray(0, count);
          });
          assert.deepEqual(got, topK(all, k), `n ${n}, k ${k}, tile ${tile}`);
        }
      }
    }
  }
});

Deno.test("rowBlock: a clean cut of a weight multiplies to the same bits as its rows of the whole", async () => {
  const arena = new Arena(8 * 2 ** 20);
  const pool = await Pool.create(arena, await loadKernelModule(), 2);
  try {
    const ops = new Ops(arena, pool);
    const put = (bytes: Uint8Array) => {
      const ptr = arena.alloc("w", bytes.length, 64);
      arena.u8(ptr, bytes.length).set(bytes);
      return ptr;
    };
    const [rows, cols] = [300, 200];
    const w = values(rows * cols, 3, 1), x = values(cols, 5, 1);
    const fp8 = quantizeFp8b128(w, rows, cols);
    const weights: TensorRef[] = [
      { ptr: put(new Uint8Array(w.buffer)), dtype: "f32", rows, cols },
      {
        ptr: put(fp8.codes),
        scale: put(new Uint8Array(fp8.scales.buffer)),
        dtype: "f8_e4m3",
        rows,
        cols,
      },
    ];
    const xPtr = put(new Uint8Array(x.buffer));
    const y = arena.alloc("y", rows * 4), yb = arena.alloc("yb", rows * 4);
    for (const whole of weights) {
      ops.matmul({ w: whole, x: xPtr, y, nb: 1 });
      const cuts = whole.dtype === "f32"
        ? [[0, 1], [7, 5], [128, 172]]
        : [[0, 128], [128, 128], [256, 44], [0, 300]];
      for (const [first, n] of cuts) {
        const part = rowBlock(whole, first, n);
        assert.ok(part, `${whole.dtype}: rows ${first}+${n} cut cleanly`);
        ops.matmul({ w: part, x: xPtr, y: yb, nb: 1 });
        assert.deepEqual(
          arena.f32(yb, n),
          arena.f32(y + first * 4, n),
          `${whole.dtype}: rows ${first}+${n}`,
        );
      }
    }
    // FP8's 128 × 128 scale blocks: a cut inside one cannot be taken, nor rows beyond the end.
    assert.equal(rowBlock(weights[1], 100, 28), null);
    assert.equal(rowBlock(weights[1], 16, 16), null);
    assert.equal(rowBlock(weights[0], 290, 11), null);
  } finally {
    pool.close();
  }
});
