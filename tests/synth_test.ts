import assert from "node:assert/strict";
import "./shared_guard.ts";
import { readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { loadModelConfig, normalizeConfig } from "../engine/config.ts";
import { EXPERT_MATRICES, type ModelConfig } from "../io/model_config.ts";
import {
  hfExpertName,
  hfFusedExpertSlice,
  hfGlobalName,
  hfLayerName,
  layerTensorsOf,
} from "../engine/tensor_names.ts";
import { loadTokenizer } from "../engine/tokenizer.ts";
import { openCheckpoint } from "../io/safetensors.ts";
import { demoModelPath } from "../tools/demo_model.ts";
import { packCheckpoint } from "../tools/pack.ts";
import {
  parseSize,
  SYNTH_ARCHS,
  type SynthArch,
  synthCheckpoint,
  type SynthOptions,
  type SynthOverrides,
  synthShape,
} from "../tools/synth.ts";
import { denoEval } from "./fixtures.ts";

const DEMO_MODEL_URL = new URL("../tools/demo_model.ts", import.meta.url).href;

const FLAME = fileURLToPath(new URL("../../shared/traces/flame-moe-290m", import.meta.url));
const QUIET = { progress: "off" as const, log: () => {} };

/** Sizes small enough to write in milliseconds, with every dimension distinct where possible. */
const TINY: SynthOverrides = {
  hidden: 64,
  layers: 3,
  experts: 8,
  expertInter: 24,
  denseInter: 80,
  vocab: 300,
  heads: 4,
  kvHeads: 2,
  headDim: 12,
  qLoraRank: 20,
  kvLoraRank: 16,
  ropeDim: 8,
  nopeDim: 12,
  vDim: 10,
  maxPositions: 256,
};

/**
 * Architectures with the usual layout; Kimi K3's own synth test is in kimi_k3_test.ts, Qwen3.5's in
 * qwen3_next_test.ts, DeepSeek-V4's in deepseek_v4_test.ts, GLM-5.3-Flash's in glm5_next_test.ts,
 * Gemma 4's and MiniMax-M2's (per-layer geometry, whole-projection q/k norms) in gemma4_test.ts and
 * minimax_m2_test.ts.
 */
const OWN_TESTS: readonly SynthArch[] = [
  "kimi_k3",
  "qwen3_5_moe",
  "deepseek_v4",
  "glm5_next",
  "gemma4",
  "minimax_m2",
];
const USUAL_ARCHS = SYNTH_ARCHS.filter((a) => !OWN_TESTS.includes(a));

function withTemp(fn: (dir: string) => Promise<void>): () => Promise<void> {
  return async () => {
    const dir = Deno.makeTempDirSync({ prefix: "sluice-synth-" });
    try {
      await fn(dir);
    } finally {
      Deno.removeSync(dir, { recursive: true });
    }
  };
}

function synth(dir: string, name: string, opts: Partial<SynthOptions> & { arch: SynthArch }) {
  return synthCheckpoint({ out: join(dir, name), size: 1e6, overrides: TINY, ...QUIET, ...opts });
}

/**
 * Every tensor a checkpoint of `cfg` must hold and its shape, from the Hugging Face conventions
 * ([out, in] matrices) and the engine's naming table; written independently of tools/synth.ts.
 */
function expectedTensors(cfg: ModelConfig): Map<string, number[]> {
  const h = cfg.hiddenSize, out = new Map<string, number[]>();
  const add = (name: string | null, shape: number[]) => name && out.set(name, shape);
  add(hfGlobalName(cfg, "embed"), [cfg.vocabSize, h]);
  add(hfGlobalName(cfg, "final_norm"), [h]);
  add(hfGlobalName(cfg, "lm_head"), [cfg.vocabSize, h]);
  const q = cfg.numHeads * cfg.headDim, kv = cfg.numKvHeads * cfg.headDim;
  const mla = cfg.mla;
  for (let l = 0; l < cfg.numLayers; l++) {
    const moe = cfg.moe!;
    const shared = moe.sharedIntermediate;
    const shapes: Record<string, number[]> = {
      attn_norm: [h],
      ffn_norm: [h],
      wq: [q, h],
      wk: [kv, h],
      wv: [kv, h],
      wo: mla ? [h, cfg.numHeads * mla.vHeadDim] : [h, q],
      bq: [q],
      bk: [kv],
      bv: [kv],
      bo: [h],
      sinks: [cfg.numHeads],
      router_b: [moe.numExperts],
      q_norm: [cfg.headDim],
      k_norm: [cfg.headDim],
      ffn_gate: [cfg.intermediateSize, h],
      ffn_up: [cfg.intermediateSize, h],
      ffn_down: [h, cfg.intermediateSize],
      router: [moe.numExperts, h],
      router_bias: [moe.numExperts],
      shared_gate: [shared, h],
      shared_up: [shared, h],
      shared_down: [h, shared],
    };
    if (mla) {
      const r = mla.qLoraRank!, kvr = mla.kvLoraRank;
      Object.assign(shapes, {
        wq_a: [r, h],
        q_a_norm: [r],
        wq_b: [cfg.numHeads * (mla.qkNopeHeadDim + mla.qkRopeHeadDim), r],
        wkv_a: [kvr + mla.qkRopeHeadDim, h],
        kv_a_norm: [kvr],
        wkv_b: [cfg.numHeads * (mla.qkNopeHeadDim + mla.vHeadDim), kvr],
      });
    }
    for (const t of layerTensorsOf(cfg, l)) add(hfLayerName(cfg, l, t), shapes[t]);
    if (cfg.layerKinds[l] !== "moe") continue;
    if (hfFusedExpertSlice(cfg, l, "gate")) {
      // gpt-oss: one fused MXFP4 tensor set per matrix kind (gate and up share gate_up_proj).
      const i = moe.expertIntermediate, E = moe.numExperts;
      for (const m of ["up", "down"] as const) {
        const base = hfFusedExpertSlice(cfg, l, m)!.base;
        const [rows, cols] = m === "down" ? [h, i] : [2 * i, h];
        add(`${base}_blocks`, [E, rows, cols / 32, 16]);
        add(`${base}_scales`, [E, rows, cols / 32]);
        add(`${base}_bias`, [E, rows]);
      }
      continue;
    }
    for (let e = 0; e < moe.numExperts; e++) {
      for (const m of EXPERT_MATRICES) {
        const i = moe.expertIntermediate;
        add(hfExpertName(cfg, l, e, m), m === "down" ? [h, i] : [i, h]);
      }
    }
  }
  return out;
}

/**
 * Bytes of a bf16 checkpoint of `cfg`; DeepSeek's selection bias is F32 (2 more bytes each),
 * gpt-oss's MXFP4 blocks and scales U8 (1 byte each).
 */
function bf16Bytes(cfg: ModelConfig): number {
  const moeLayers = cfg.layerKinds.filter((k) => k === "moe").length;
  const bias = cfg.moe!.selectionBias ? 2 * cfg.moe!.numExperts * moeLayers : 0;
  let n = bias;
  for (const [name, s] of expectedTensors(cfg)) {
    n += s.reduce((a, b) => a * b, 1) * (/_(blocks|scales)$/.test(name) ? 1 : 2);
  }
  return n;
}

for (const arch of USUAL_ARCHS) {
  Deno.test(
    `synth ${arch}: config, tensor shapes, tokenizer and pack`,
    withTemp(async (dir) => {
      // gpt-oss's MXFP4 experts need an intermediate size that is a multiple of 32.
      const overrides = arch === "gpt_oss" ? { ...TINY, expertInter: 32 } : TINY;
      const res = await synth(dir, "ckpt", { arch, maxShardBytes: 64 * 1024, overrides });
      const cfg = loadModelConfig(res.dir);
      assert.equal(cfg.modelType, arch);
      assert.equal(cfg.hiddenSize, TINY.hidden);
      assert.equal(cfg.numLayers, TINY.layers);
      assert.equal(cfg.moe!.numExperts, TINY.experts);
      assert.equal(cfg.vocabSize, TINY.vocab);
      assert.ok(cfg.layerKinds.includes("moe"));
      if (arch === "deepseek_v3") assert.equal(cfg.layerKinds[0], "dense");

      const want = expectedTensors(cfg);
      const ckpt = openCheckpoint(res.dir);
      try {
        assert.deepEqual([...ckpt.tensors.keys()].sort(), [...want.keys()].sort());
        for (const [name, t] of ckpt.tensors) {
          assert.deepEqual(t.shape, want.get(name), name);
          const isBias = name.endsWith("e_score_correction_bias");
          const mxfp4 = /_(blocks|scales)$/.test(name);
          assert.equal(t.dtype, isBias ? "F32" : mxfp4 ? "U8" : "BF16", name);
        }
        const files = new Set([...ckpt.tensors.values()].map((t) => t.file));
        assert.ok(files.size > 1, "a 64 KiB shard limit gives several shards");
        const onDisk = [...files].reduce((n, f) => n + statSync(f).size, 0);
        assert.equal(res.totalBytes, onDisk);
        const index = JSON.parse(
          readFileSync(join(res.dir, "model.safetensors.index.json"), "utf8"),
        );
        assert.equal(index.metadata.total_size, bf16Bytes(cfg));
      } finally {
        ckpt.close();
      }

      const tok = await loadTokenizer(res.dir);
      assert.equal(tok.vocabSize, TINY.vocab);
      assert.equal(tok.bosId, 1);
      assert.deepEqual(tok.eosIds, [2]);
      const text = "Once upon a time, 42 birds flew over the river.\n\tThe end!";
      const ids = tok.encode(text);
      assert.equal(ids[0], 1);
      assert.ok(ids.length < new TextEncoder().encode(text).length, "merges shorten the text");
      assert.equal(tok.decode(ids.slice(1)), text);
      assert.ok(tok.chatTemplate?.includes("add_generation_prompt"));

      const packed = await packCheckpoint(res.dir, join(dir, "out.sluice"), QUIET);
      assert.deepEqual(packed.manifest.config, cfg);
    }),
  );
}

Deno.test("synthShape: sizes within 10% of the target, config valid and realistic", () => {
  for (const arch of USUAL_ARCHS) {
    for (const target of [64e6, parseSize("2G"), parseSize("20G")]) {
      const s = synthShape(arch, target);
      const cfg = normalizeConfig(s.config);
      const bytes = bf16Bytes(cfg);
      assert.equal(s.dataBytes, bytes, `${arch} ${target}: solver's byte count`);
      assert.ok(Math.abs(bytes / target - 1) <= 0.1, `${arch} ${target}: ${bytes} bytes`);
      assert.ok(cfg.numLayers >= 2 && cfg.moe!.numExperts >= 8, `${arch} ${target}`);
    }
    // At 2 GiB the real model's width and expert shape are kept.
    const big = normalizeConfig(synthShape(arch, parseSize("2G")).config);
    const real = { mixtral: [1024], glm4_moe: [4096, 1408], gpt_oss: [2880, 2880] }[
      arch as string
    ] ?? [2048, 768];
    assert.equal(big.hiddenSize, real[0]);
    if (real[1]) assert.equal(big.moe!.expertIntermediate, real[1]);
  }
  const fixed = synthShape("qwen3_moe", parseSize("2G"), { layers: 5, experts: 40, topK: 6 });
  assert.equal(fixed.dims.layers, 5);
  assert.equal(fixed.dims.experts, 40);
  assert.equal(fixed.config.num_experts_per_tok, 6);
  const ds = normalizeConfig(synthShape("deepseek_v3", parseSize("20G")).config);
  assert.equal(ds.mla!.kvLoraRank, 512);
  assert.equal(ds.mla!.qkRopeHeadDim, 64);
  assert.equal(ds.moe!.sharedIntermediate, ds.moe!.expertIntermediate);
  assert.equal(ds.moe!.nGroup, 8);
  assert.equal(ds.moe!.topkGroup, 4);
});

Deno.test(
  "synth: same seed gives identical bytes, another seed different ones",
  withTemp(async (dir) => {
    const a = await synth(dir, "a", { arch: "qwen3_moe", seed: 7 });
    const b = await synth(dir, "b", { arch: "qwen3_moe", seed: 7, maxShardBytes: 32 * 1024 });
    const c = await synth(dir, "c", { arch: "qwen3_moe", seed: 8 });
    const a2 = await synth(dir, "a2", { arch: "qwen3_moe", seed: 7 });
    const file = (r: { dir: string }) => readFileSync(join(r.dir, "model.safetensors"));
    assert.deepEqual(file(a2), file(a));
    const [ca, cb, cc] = [a, b, c].map((r) => openCheckpoint(r.dir));
    try {
      for (const name of ca.tensors.keys()) {
        assert.deepEqual(cb.read(name), ca.read(name), `${name}: sharding changes no value`);
      }
      const w = "model.layers.1.mlp.experts.3.up_proj.weight";
      assert.notDeepEqual(cc.read(w), ca.read(w));
    } finally {
      for (const x of [ca, cb, cc]) x.close();
    }
  }),
);

/** bf16 bytes → numbers. */
function bf16(bytes: Uint8Array): Float32Array {
  const u = new Uint16Array(bytes.buffer, bytes.byteOffset, bytes.length / 2);
  const out = new Float32Array(u.length), bits = new Uint32Array(out.buffer);
  for (let i = 0; i < u.length; i++) bits[i] = u[i] << 16;
  return out;
}

Deno.test(
  "synth: values have the documented distributions",
  withTemp(async (dir) => {
    const res = await synth(dir, "v", { arch: "mixtral", seed: 3 });
    const ckpt = openCheckpoint(res.dir);
    try {
      const gather = (pred: (name: string) => boolean) => {
        const parts = [...ckpt.tensors.keys()].filter(pred).map((n) => bf16(ckpt.read(n)));
        return parts.flatMap((p) => [...p]);
      };
      // Tolerances: four standard errors of each statistic for n samples.
      const check = (what: string, v: number[], mean: number, std: number) => {
        const n = v.length;
        const m = v.reduce((a, b) => a + b, 0) / n;
        const sd = Math.sqrt(v.reduce((a, b) => a + (b - m) ** 2, 0) / n);
        assert.ok(
          Math.abs(m - mean) < (4 * std) / Math.sqrt(n),
          `${what}: mean ${m}, want ${mean}`,
        );
        assert.ok(Math.abs(sd / std - 1) < 0.01 + 4 / Math.sqrt(2 * n), `${what}: std ${sd}`);
        // Bell-shaped: about two thirds within one std (normal 0.683, Irwin-Hall n=4 0.666).
        const within = v.filter((x) => Math.abs(x - m) < std).length / n;
        assert.ok(
          Math.abs(within - 0.675) < 0.02 + 2 / Math.sqrt(n),
          `${what}: ${within} in 1 std`,
        );
      };
      check("embedding", gather((n) => n.includes("embed_tokens")), 0, 1);
      check("w1 (fan-in 64)", gather((n) => n.endsWith(".w1.weight")), 0, 1 / 8);
      check("w2 (fan-in 24)", gather((n) => n.endsWith(".w2.weight")), 0, 1 / Math.sqrt(24));
      check("norms", gather((n) => n.includes("norm")), 1, 0.05);
    } finally {
      ckpt.close();
    }
  }),
);

Deno.test(
  "synth: --dtype f32 writes the same values, bf16 being their rounding",
  withTemp(async (dir) => {
    const a = openCheckpoint((await synth(dir, "f", { arch: "deepseek_v3", dtype: "f32" })).dir);
    const b = openCheckpoint((await synth(dir, "b", { arch: "deepseek_v3" })).dir);
    try {
      for (const [name, t] of a.tensors) {
        assert.equal(t.dtype, "F32", name);
        if (name.endsWith("e_score_correction_bias")) continue;
        const f = a.read(name), h = b.read(name);
        const bits = new Uint32Array(f.buffer, f.byteOffset, f.length / 4);
        const half = new Uint16Array(h.buffer, h.byteOffset, h.length / 2);
        for (let i = 0; i < bits.length; i++) {
          const u = bits[i], lower = u & 0xffff, up = u >>> 16;
          const round = lower > 0x8000 || (lower === 0x8000 && (up & 1)) ? up + 1 : up;
          if (half[i] !== round) assert.fail(`${name}[${i}]: bf16 ${half[i]}, f32 ${u}`);
        }
      }
    } finally {
      a.close();
      b.close();
    }
  }),
);

/** How often each expert is among the top-k router logits for Gaussian hidden states. */
function measuredPopularity(w: Float32Array, experts: number, k: number, samples = 3000) {
  const h = w.length / experts, counts = new Array(experts).fill(0);
  let seed = 12345;
  const uni = () => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) + 0.5) / 2 ** 32;
  const x = new Float64Array(h);
  for (let s = 0; s < samples; s++) {
    for (let i = 0; i < h; i++) {
      x[i] = Math.sqrt(-2 * Math.log(uni())) * Math.cos(2 * Math.PI * uni());
    }
    const logits = Array.from({ length: experts }, (_, e) => {
      let d = 0;
      for (let i = 0; i < h; i++) d += w[e * h + i] * x[i];
      return { e, d };
    });
    logits.sort((p, q) => q.d - p.d);
    for (let j = 0; j < k; j++) counts[logits[j].e]++;
  }
  return counts.map((c) => c / samples);
}

function ranks(v: number[]): number[] {
  const order = v.map((x, i) => ({ x, i })).sort((a, b) => a.x - b.x);
  const r = new Array(v.length);
  order.forEach((o, j) => r[o.i] = j);
  return r;
}

function spearman(a: number[], b: number[]): number {
  const ra = ranks(a), rb = ranks(b), n = a.length;
  const d2 = ra.reduce((s, r, i) => s + (r - rb[i]) ** 2, 0);
  return 1 - (6 * d2) / (n * (n * n - 1));
}

Deno.test(
  "synth: skewed routing follows the trace's popularity, uniform routing stays flat",
  withTemp(async (dir) => {
    const over = { ...TINY, hidden: 128, experts: 16, topK: 4, layers: 2 };
    const skewed = await synth(dir, "s", {
      arch: "qwen3_moe",
      overrides: over,
      routing: "skewed",
      trace: FLAME,
    });
    const flat = await synth(dir, "u", { arch: "qwen3_moe", overrides: over });
    // The trace's own skew, counted here: most popular expert of layer 0 over the mean.
    const counts = new Array(64).fill(0);
    for (const line of readFileSync(join(FLAME, "trace.jsonl"), "utf8").split("\n")) {
      if (!line) continue;
      const ev = JSON.parse(line);
      if (ev.layer === 0) { for (const e of ev.experts) counts[e]++; }
    }
    const traceSkew = Math.max(...counts) / (counts.reduce((a, b) => a + b) / 64);
    /** Coefficient of variation. */
    const cv = (p: number[]) => {
      const m = p.reduce((a, b) => a + b) / p.length;
      return Math.sqrt(p.reduce((a, b) => a + (b - m) ** 2, 0) / p.length) / m;
    };
    for (const l of [0, 1]) {
      const target = skewed.routing.get(l)!.target;
      assert.ok(Math.abs(target.reduce((a, b) => a + b) - 4) < 1e-9);
      const targetSkew = Math.max(...target) / (4 / 16);
      assert.ok(Math.abs(targetSkew / traceSkew - 1) < 0.35, `${targetSkew} vs ${traceSkew}`);
      const name = `model.layers.${l}.mlp.gate.weight`;
      const [cs, cu] = [skewed, flat].map((r) => openCheckpoint(r.dir));
      try {
        const ps = measuredPopularity(bf16(cs.read(name)), 16, 4);
        const pu = measuredPopularity(bf16(cu.read(name)), 16, 4);
        assert.ok(spearman(ps, target) > 0.8, `layer ${l}: ${ps} vs ${target}`);
        // The measured spread matches the target's; random routers alone spread far less.
        assert.ok(
          Math.abs(cv(ps) / cv(target) - 1) < 0.3,
          `layer ${l}: ${cv(ps)} vs ${cv(target)}`,
        );
        assert.ok(cv(pu) < cv(target) / 2, `layer ${l}: uniform ${cv(pu)}`);
      } finally {
        cs.close();
        cu.close();
      }
    }
  }),
);

Deno.test("synth: bad input is refused with a message naming it", async () => {
  assert.throws(() => synthShape("llama" as SynthArch, 1e6), /unknown architecture llama/);
  assert.throws(() => synthShape("mixtral", 1e6, { layers: 0 }), /layers must be an integer/);
  assert.throws(() => parseSize("lots"), /size "lots"/);
  assert.equal(parseSize("2G"), 2 * 1024 ** 3);
  assert.equal(parseSize("500MB"), 5e8);
  assert.equal(parseSize("1.5KiB"), 1536);
  await assert.rejects(
    synthCheckpoint({ arch: "mixtral", out: "/tmp", size: 1e6, ...QUIET }),
    /\/tmp already exists/,
  );
  const dir = Deno.makeTempDirSync();
  try {
    await assert.rejects(
      synth(dir, "x", { arch: "mixtral", routing: "skewed" }),
      /--routing skewed needs --trace/,
    );
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test(
  "demo model: created once in $SLUICE_CACHE, small, reused",
  withTemp(async (dir) => {
    // The cache folder comes from $SLUICE_CACHE, read in a process of its own: setting it here
    // would move the demo builds of tests running beside this one into a folder this test deletes.
    const probe = await denoEval(
      `import { cacheDir } from "${DEMO_MODEL_URL}"; console.log(cacheDir());`,
      { SLUICE_CACHE: dir },
    );
    assert.equal(probe.stdout.trim(), dir);
    const [p1, p2] = await Promise.all([demoModelPath(true, dir), demoModelPath(true, dir)]);
    assert.equal(p1, p2);
    assert.ok(p1.startsWith(dir));
    let bytes = 0;
    for (const f of Deno.readDirSync(p1)) bytes += statSync(join(p1, f.name)).size;
    assert.ok(bytes <= 30e6, `${bytes} bytes`);
    assert.deepEqual([...Deno.readDirSync(dir)].map((e) => e.name), [p1.slice(dir.length + 1)]);
    // A rebuild starts in a new folder beside the container: the cache folder would change.
    const first = statSync(dir).mtimeMs;
    assert.equal(await demoModelPath(true, dir), p1);
    assert.equal(statSync(dir).mtimeMs, first, "the second call reuses the container");
    const cfg = loadModelConfig(p1);
    assert.equal(cfg.modelType, "mixtral");
  }),
);
