import assert from "node:assert/strict";
import { readJsonObject } from "../io/json_file.ts";
import { loadModelConfig, normalizeConfig, SUPPORTED_MODEL_TYPES } from "../engine/config.ts";
import type { LayerTensor, ModelConfig } from "../io/model_config.ts";
import { EXPERT_MATRICES, LAYER_TENSOR_ORDER } from "../io/model_config.ts";
import { hfExpertName, hfGlobalName, hfLayerName, layerTensorsOf } from "../engine/tensor_names.ts";
import { openCheckpoint } from "../io/safetensors.ts";
import { CHECKPOINT_FIXTURES, fixtureDir } from "./fixtures.ts";

function throwsMentioning(fn: () => unknown, ...parts: string[]): void {
  assert.throws(fn, (e: Error) => {
    for (const p of parts) {
      assert.ok(e.message.includes(p), `message "${e.message}" should mention "${p}"`);
    }
    return true;
  });
}

/** The shape each canonical tensor must have, derived from the config's dimensions. */
function expectedShape(cfg: ModelConfig, layer: number, t: LayerTensor): number[] {
  const h = cfg.hiddenSize, hd = cfg.headDim;
  const kda = cfg.kda?.layers[layer] ? cfg.kda : null;
  const mla = kda ? null : cfg.mla;
  const moe = cfg.moe;
  const table: Partial<Record<LayerTensor, number[]>> = {
    attn_norm: [h],
    ffn_norm: [h],
    wq: mla ? [cfg.numHeads * (mla.qkNopeHeadDim + mla.qkRopeHeadDim), h] : [cfg.numHeads * hd, h],
    wk: [cfg.numKvHeads * hd, h],
    wv: [cfg.numKvHeads * hd, h],
    wo: [h, cfg.numHeads * (mla ? mla.vHeadDim : hd)],
    bq: [cfg.numHeads * hd],
    bk: [cfg.numKvHeads * hd],
    bv: [cfg.numKvHeads * hd],
    q_norm: [cfg.qkNormWhole ? cfg.numHeads * hd : hd],
    k_norm: [cfg.qkNormWhole ? cfg.numKvHeads * hd : hd],
    ffn_gate: [cfg.intermediateSize, h],
    ffn_up: [cfg.intermediateSize, h],
    ffn_down: [h, cfg.intermediateSize],
  };
  if (mla) {
    const q = mla.qLoraRank ?? 0;
    Object.assign(table, {
      wq_a: [q, h],
      q_a_norm: [q],
      wq_b: [cfg.numHeads * (mla.qkNopeHeadDim + mla.qkRopeHeadDim), q],
      wkv_a: [mla.kvLoraRank + mla.qkRopeHeadDim, h],
      kv_a_norm: [mla.kvLoraRank],
      wkv_b: [cfg.numHeads * (mla.qkNopeHeadDim + mla.vHeadDim), mla.kvLoraRank],
    });
  }
  if (mla?.indexer) {
    // GLM-5's lightning indexer (../shared/models/README.md, tiny-glm5 tensors).
    const { numHeads: n, headDim: d } = mla.indexer;
    Object.assign(table, {
      idx_wq: [n * d, mla.qLoraRank ?? 0],
      idx_wk: [d, h],
      idx_k_norm: [d],
      idx_k_bias: [d],
      idx_w: [n, h],
    });
    // GLM-5.3-Flash's k-pool (tiny-glm5-next tensors).
    const pool = mla.indexer.pool;
    if (pool) Object.assign(table, { idx_pool_ape: [pool, d], idx_pool_gate: [d, h] });
  }
  if (kda) {
    // Kimi-Linear's checkpoint layout (../shared/models/README.md, tiny-kimi-linear tensors).
    const H = kda.numHeads, dk = kda.headDim, p = H * dk, K = kda.convKernel;
    Object.assign(table, {
      wq: [p, h],
      wk: [p, h],
      wv: [p, h],
      wo: [h, p],
      q_conv: [p, 1, K],
      k_conv: [p, 1, K],
      v_conv: [p, 1, K],
      f_a: [dk, h],
      f_b: [p, dk],
      dt_bias: [p],
      // GLM-5.3-Flash stores one vector (tiny-glm5-next tensors).
      a_log: cfg.family === "glm5_next" ? [H] : [1, 1, H, 1],
      beta_proj: [H, h],
      g_a: [dk, h],
      g_b: [p, dk],
      o_norm: [dk],
    });
  }
  if (cfg.residual?.kind === "hyper") {
    // Hyper-connections (tiny-glm5-next tensors: [(2 + n)·n, n·hidden], [(2 + n)·n], [3]).
    const n = cfg.residual.streams, mixes = (2 + n) * n;
    for (const site of ["attn", "ffn"]) {
      Object.assign(table, {
        [`hc_${site}_fn`]: [mixes, n * h],
        [`hc_${site}_base`]: [mixes],
        [`hc_${site}_scale`]: [3],
      });
    }
  }
  if (moe) {
    const s = moe.sharedIntermediate;
    Object.assign(table, {
      router: [moe.numExperts, h],
      router_bias: [moe.numExperts],
      shared_gate: [s, h],
      shared_up: [s, h],
      shared_down: [h, s],
    });
  }
  const shape = table[t];
  if (!shape) throw new Error(`no expected shape for ${t}`);
  return shape;
}

Deno.test("fixture configs normalise to the values their README states", () => {
  const dense = loadModelConfig(fixtureDir("stories260k"));
  assert.equal(dense.family, "llama");
  assert.equal(dense.modelType, "llama");
  assert.deepEqual(
    [dense.vocabSize, dense.hiddenSize, dense.numLayers, dense.numHeads, dense.numKvHeads],
    [512, 64, 5, 8, 4],
  );
  assert.equal(dense.headDim, 8);
  assert.equal(dense.intermediateSize, 172);
  assert.equal(dense.rmsNormEps, 1e-5);
  assert.deepEqual(dense.rope, { theta: 10000, layout: "half", dim: 8, scaling: { type: "none" } });
  assert.equal(dense.attnScale, 1 / Math.sqrt(8));
  assert.equal(dense.tieWordEmbeddings, true);
  assert.deepEqual(dense.layerKinds, Array(5).fill("dense"));
  assert.equal(dense.moe, null);
  assert.equal(dense.bosId, 1);
  assert.deepEqual(dense.eosIds, [2]);

  const mix = loadModelConfig(fixtureDir("stories260k-moe"));
  assert.equal(mix.modelType, "mixtral");
  assert.deepEqual(mix.layerKinds, Array(5).fill("moe"));
  assert.equal(mix.moe!.numExperts, 8);
  assert.equal(mix.moe!.topK, 2);
  assert.equal(mix.moe!.expertIntermediate, 172);
  assert.equal(mix.moe!.scoring, "softmax");
  assert.equal(mix.moe!.normTopK, true);
  assert.equal(mix.moe!.sharedIntermediate, 0);
  assert.equal(mix.qkNorm, false);
  const mix64 = loadModelConfig(fixtureDir("stories260k-moe64"));
  assert.deepEqual([mix64.moe!.numExperts, mix64.moe!.topK], [64, 4]);

  const qwen = loadModelConfig(fixtureDir("stories260k-qwen3moe"));
  assert.equal(qwen.modelType, "qwen3_moe");
  assert.equal(qwen.qkNorm, true);
  assert.equal(qwen.moe!.normTopK, true);
  assert.equal(qwen.moe!.expertIntermediate, 172);
  assert.deepEqual(qwen.layerKinds, Array(5).fill("moe"));

  for (const dir of ["tiny-deepseek-v3", "tiny-deepseek-v3-fp8"]) {
    const ds = loadModelConfig(fixtureDir(dir));
    assert.equal(ds.family, "deepseek_v3");
    assert.deepEqual(ds.layerKinds, ["dense", "moe", "moe", "moe"]);
    assert.equal(ds.intermediateSize, 172);
    assert.ok(Math.abs(ds.attnScale - 0.26464226) < 5e-9, `attnScale ${ds.attnScale}`);
    assert.deepEqual(ds.mla, {
      qLoraRank: 32,
      kvLoraRank: 32,
      qkNopeHeadDim: 16,
      qkRopeHeadDim: 8,
      vHeadDim: 16,
    });
    assert.equal(ds.rope.layout, "interleaved");
    assert.equal(ds.rope.dim, 8);
    assert.deepEqual(ds.rope.scaling, {
      type: "yarn",
      factor: 4,
      originalMaxPositions: 128,
      betaFast: 32,
      betaSlow: 1,
      mscale: 1,
      mscaleAllDim: 1,
    });
    assert.deepEqual(ds.moe, {
      numExperts: 16,
      topK: 4,
      expertIntermediate: 32,
      scoring: "sigmoid",
      normTopK: true,
      routedScaling: 2.5,
      nGroup: 4,
      topkGroup: 2,
      selectionBias: true,
      sharedIntermediate: 32,
    });
    assert.equal(ds.rmsNormEps, 1e-6);
    assert.equal(ds.tieWordEmbeddings, false);
    assert.equal(ds.bosId, 1);
    assert.deepEqual(ds.eosIds, [2]);
  }
});

Deno.test("every canonical tensor name resolves to a checkpoint tensor of the expected shape", () => {
  for (const dir of CHECKPOINT_FIXTURES) {
    const cfg = loadModelConfig(fixtureDir(dir));
    const ck = openCheckpoint(fixtureDir(dir));
    const used = new Set<string>();
    const expect = (name: string | null, shape: number[], what: string) => {
      assert.ok(name, `${dir}: ${what} has no name`);
      const t = ck.tensors.get(name);
      assert.ok(t, `${dir}: ${what} → ${name} is not in the checkpoint`);
      assert.deepEqual(t.shape, shape, `${dir}: ${name}`);
      used.add(name);
      if (t.dtype === "F8_E4M3") used.add(name + "_scale_inv");
    };
    const [v, h] = [cfg.vocabSize, cfg.hiddenSize];
    expect(hfGlobalName(cfg, "embed"), [v, h], "embed");
    expect(hfGlobalName(cfg, "final_norm"), [h], "final_norm");
    if (cfg.tieWordEmbeddings) assert.equal(hfGlobalName(cfg, "lm_head"), null);
    else expect(hfGlobalName(cfg, "lm_head"), [v, h], "lm_head");
    for (let l = 0; l < cfg.numLayers; l++) {
      const present = layerTensorsOf(cfg, l);
      for (const t of LAYER_TENSOR_ORDER) {
        const name = hfLayerName(cfg, l, t);
        assert.equal(name !== null, present.includes(t), `${dir} layer ${l} ${t}`);
        if (name !== null) expect(name, expectedShape(cfg, l, t), `layer ${l} ${t}`);
      }
      if (cfg.layerKinds[l] !== "moe") continue;
      const inter = cfg.moe!.expertIntermediate;
      for (let e = 0; e < cfg.moe!.numExperts; e++) {
        for (const m of EXPERT_MATRICES) {
          const shape = m === "down" ? [h, inter] : [inter, h];
          expect(hfExpertName(cfg, l, e, m), shape, `layer ${l} expert ${e} ${m}`);
        }
      }
    }
    // Nothing in the checkpoint is left unnamed (a tied model may keep an explicit lm_head copy)
    // but the layers at index >= num_hidden_layers (GLM's MTP layer), which are not the model's.
    const beyond = (n: string) =>
      Number(/^model\.(?:language_model\.)?layers\.(\d+)\./.exec(n)?.[1]) >= cfg.numLayers;
    const rest = [...ck.tensors.keys()].filter((n) => !used.has(n) && !beyond(n));
    assert.deepEqual(
      rest,
      cfg.tieWordEmbeddings && ck.tensors.has("lm_head.weight") ? ["lm_head.weight"] : [],
      dir,
    );
    ck.close();
  }
});

Deno.test("layer tensor lists follow the fixed order and the layer's kind", () => {
  const ds = loadModelConfig(fixtureDir("tiny-deepseek-v3"));
  assert.deepEqual(layerTensorsOf(ds, 0), [
    "attn_norm",
    "wo",
    "wq_a",
    "q_a_norm",
    "wq_b",
    "wkv_a",
    "kv_a_norm",
    "wkv_b",
    "ffn_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
  ]);
  assert.ok(layerTensorsOf(ds, 1).includes("router_bias"));
  const mix = loadModelConfig(fixtureDir("stories260k-moe"));
  assert.equal(
    hfExpertName(mix, 2, 5, "up"),
    "model.layers.2.block_sparse_moe.experts.5.w3.weight",
  );
  assert.equal(
    hfExpertName(mix, 2, 5, "down"),
    "model.layers.2.block_sparse_moe.experts.5.w2.weight",
  );
  throwsMentioning(() => hfExpertName(mix, 2, 8, "up"), "expert 8");
  throwsMentioning(() => hfLayerName(mix, 5, "wq"), "layer 5");
  const dense = loadModelConfig(fixtureDir("stories260k"));
  throwsMentioning(() => hfExpertName(dense, 0, 0, "gate"), "layer 0", "not a MoE");
});

function dsv3(): Record<string, unknown> {
  return readJsonObject(fixtureDir("tiny-deepseek-v3/config.json"));
}

function qwen(): Record<string, unknown> {
  return readJsonObject(fixtureDir("stories260k-qwen3moe/config.json"));
}

Deno.test("config field variants", () => {
  // Qwen3: sparse step and mlp_only_layers make dense layers; head_dim defaults to hidden/heads.
  const q = qwen();
  Object.assign(q, { decoder_sparse_step: 2, mlp_only_layers: [3], norm_topk_prob: false });
  delete q.head_dim;
  const qc = normalizeConfig(q);
  assert.deepEqual(qc.layerKinds, ["dense", "moe", "dense", "dense", "dense"]);
  assert.equal(qc.intermediateSize, 172);
  assert.equal(qc.moe!.normTopK, false);
  assert.equal(qc.headDim, 8);

  // DeepSeek: moe_layer_freq, q_lora_rank null (plain q_proj), no yarn mscale_all_dim.
  const d = dsv3();
  Object.assign(d, {
    moe_layer_freq: 2,
    q_lora_rank: null,
    rope_scaling: { type: "yarn", factor: 4, original_max_position_embeddings: 128 },
  });
  const dc = normalizeConfig(d);
  assert.deepEqual(dc.layerKinds, ["dense", "dense", "moe", "dense"]);
  assert.equal(dc.attnScale, 1 / Math.sqrt(24));
  assert.equal(hfLayerName(dc, 0, "wq"), "model.layers.0.self_attn.q_proj.weight");
  assert.equal(hfLayerName(dc, 0, "wq_a"), null);
  // Kimi-K2 has its own model_type and the DeepSeek-V3 structure; a nested text_config works.
  const k = normalizeConfig({ ...dsv3(), model_type: "kimi_k2" });
  assert.equal(k.family, "deepseek_v3");
  assert.equal(hfExpertName(k, 1, 3, "gate"), "model.layers.1.mlp.experts.3.gate_proj.weight");
  const nested = normalizeConfig({ model_type: "kimi_vl", text_config: dsv3(), eos_token_id: 7 });
  assert.equal(nested.numLayers, 4);

  // Rope scaling kinds.
  const ll = readJsonObject(fixtureDir("stories260k/config.json"));
  const withScaling = (s: unknown) => normalizeConfig({ ...ll, rope_scaling: s }).rope.scaling;
  assert.deepEqual(withScaling({ type: "linear", factor: 2 }), { type: "linear", factor: 2 });
  assert.deepEqual(
    withScaling({
      rope_type: "llama3",
      factor: 8,
      low_freq_factor: 1,
      high_freq_factor: 4,
      original_max_position_embeddings: 8192,
    }),
    {
      type: "llama3",
      factor: 8,
      lowFreqFactor: 1,
      highFreqFactor: 4,
      originalMaxPositions: 8192,
    },
  );
  throwsMentioning(() => withScaling({ type: "longrope", factor: 2 }), "longrope");
  throwsMentioning(() => withScaling({ type: "llama3", factor: 8 }), "low_freq_factor");

  // bos/eos: generation_config wins; eos may be a list.
  const gc = normalizeConfig(ll, { bos_token_id: 3, eos_token_id: [2, 5] });
  assert.equal(gc.bosId, 3);
  assert.deepEqual(gc.eosIds, [2, 5]);
  const noIds = { ...ll };
  delete noIds.bos_token_id;
  delete noIds.eos_token_id;
  assert.equal(normalizeConfig(noIds).bosId, null);
  throwsMentioning(() => normalizeConfig(ll, { eos_token_id: 999 }), "999");
  // Mixtral renormalises whatever norm_topk_prob says; num_key_value_heads defaults to heads.
  const mx = readJsonObject(fixtureDir("stories260k-moe/config.json"));
  delete mx.num_key_value_heads;
  const mxc = normalizeConfig({ ...mx, norm_topk_prob: false });
  assert.equal(mxc.moe!.normTopK, true);
  assert.equal(mxc.numKvHeads, 8);
  // Without model_type, architectures decide.
  const noType = { ...ll };
  delete noType.model_type;
  assert.equal(normalizeConfig(noType).modelType, "llama");
});

Deno.test("bad configs are errors naming the field or the model_type", () => {
  const ll = readJsonObject(fixtureDir("stories260k/config.json"));
  for (const field of ["hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size"]) {
    const c = { ...ll };
    delete c[field];
    throwsMentioning(() => normalizeConfig(c), field);
  }
  throwsMentioning(() => normalizeConfig({ ...ll, hidden_size: "64" }), "hidden_size");
  const noHeadDim: Record<string, unknown> = { ...ll, hidden_size: 65 };
  delete noHeadDim.head_dim;
  throwsMentioning(() => normalizeConfig(noHeadDim), "hidden_size");
  throwsMentioning(() => normalizeConfig({ ...ll, hidden_act: "gelu" }), "gelu");
  throwsMentioning(
    () => normalizeConfig({ ...ll, model_type: "mamba", architectures: ["MambaForCausalLM"] }),
    "mamba",
    ...SUPPORTED_MODEL_TYPES,
  );
  throwsMentioning(() => normalizeConfig([]), "object");
  const q = qwen();
  delete q.moe_intermediate_size;
  throwsMentioning(() => normalizeConfig(q), "moe_intermediate_size");
  throwsMentioning(
    () => normalizeConfig({ ...qwen(), num_experts_per_tok: 9 }),
    "num_experts_per_tok",
  );
  for (const field of ["kv_lora_rank", "qk_rope_head_dim", "n_group", "first_k_dense_replace"]) {
    const d = dsv3();
    delete d[field];
    throwsMentioning(() => normalizeConfig(d), field);
  }
  throwsMentioning(() => normalizeConfig({ ...dsv3(), n_group: 3 }), "n_group");
  // loadModelConfig names the file.
  const dir = Deno.makeTempDirSync();
  try {
    Deno.writeTextFileSync(`${dir}/config.json`, "{not json");
    throwsMentioning(() => loadModelConfig(dir), `${dir}/config.json`);
    const c = { ...ll };
    delete c.rms_norm_eps;
    delete c.intermediate_size;
    Deno.writeTextFileSync(`${dir}/config.json`, JSON.stringify(c));
    throwsMentioning(() => loadModelConfig(dir), `${dir}/config.json`, "intermediate_size");
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});
