/**
 * The kimi_k3 family (`KimiK3ForConditionalGeneration`, ../shared/K3.md): Kimi-Linear's hybrid of
 * KDA and NoPE MLA layers (engine/models/kimi_linear.ts) with K3's features set from its config:
 * KDA's lower-bounded decay and full-rank output gate, MLA's output gate (engine/parts/kda.ts,
 * mla.ts), a latent MoE gated by SiTU (engine/parts/feed_forward.ts) and Attention Residuals as
 * the residual stream (engine/parts/attn_res.ts). This file holds the config normaliser, each
 * layer's tensors' Hugging Face names and the stored-config check.
 *
 * @module
 */
import { manifestField, MAX_DIM } from "../../io/manifest.ts";
import { isKdaLayer, type LayerTensor } from "../../io/model_config.ts";
import type { Family } from "./family.ts";
import { checkTopK, type Normaliser } from "./hf_config.ts";
import { KDA_TENSORS, KIMI_LINEAR } from "./kimi_linear.ts";
import { mlaTensors } from "./deepseek_v3.ts";

/**
 * Kimi K3's config: the language model is under `text_config`. As in kimi-k3-in-c, every field the
 * forward pass depends on must be present (a missing one is an error naming it; nothing is
 * defaulted), and settings other than the release's (hidden_act situ, NoPE MLA with an output
 * gate, full-rank KDA gate, sigmoid noaux_tc routing, the latent norm, no MTP) are refused.
 */
export const normaliseKimiK3: Normaliser = (top, mt) => {
  const f = top.obj("text_config");
  const lin = f.obj("linear_attn_config");
  f.exactly("hidden_act", "situ");
  f.exactly("mla_use_nope", true);
  f.exactly("mla_use_output_gate", true);
  f.exactly("latent_moe_use_norm", true);
  f.exactly("moe_router_activation_func", "sigmoid");
  f.exactly("topk_method", "noaux_tc");
  f.exactly("num_nextn_predict_layers", 0);
  f.exactly("moe_layer_freq", 1);
  f.exactly("tie_word_embeddings", false);
  lin.exactly("use_full_rank_gate", true);
  const numLayers = f.int("num_hidden_layers", { min: 1 });
  const full = new Set(lin.intList("full_attn_layers", true));
  for (const l of full) {
    if (l < 1 || l > numLayers) {
      throw new Error(
        `${lin.where}: full_attn_layers entry ${l} is outside 1..${numLayers} (1-based)`,
      );
    }
  }
  const firstDense = f.int("first_k_dense_replace");
  const layerKinds = Array.from(
    { length: numLayers },
    (_, l) => l >= firstDense ? "moe" : "dense",
  ) as ("dense" | "moe")[];
  const numExperts = f.int("num_experts", { min: 1 });
  const topK = f.int("num_experts_per_token", { min: 1 });
  checkTopK(f, numExperts, topK);
  const nGroup = f.int("num_expert_group", { min: 1 });
  const topkGroup = f.int("topk_group", { min: 1 });
  if (numExperts % nGroup || topkGroup > nGroup) {
    throw new Error(
      `${f.where}: num_expert_group ${nGroup} must divide num_experts ${numExperts} and be >= ` +
        `topk_group ${topkGroup}`,
    );
  }
  const expertInter = f.int("moe_intermediate_size", { min: 1 });
  const qkNope = f.int("qk_nope_head_dim", { min: 1 });
  const qkRope = f.int("qk_rope_head_dim", { min: 0 });
  const numHeads = f.int("num_attention_heads", { min: 1 });
  const kdaHeads = lin.int("num_heads", { min: 1 });
  const kdaDim = lin.int("head_dim", { min: 1 });
  return {
    family: "kimi_k3",
    modelType: mt,
    vocabSize: f.int("vocab_size", { min: 1 }),
    hiddenSize: f.int("hidden_size", { min: 1 }),
    numLayers,
    numHeads,
    numKvHeads: numHeads,
    headDim: qkNope + qkRope,
    intermediateSize: layerKinds.includes("dense") ? f.int("intermediate_size", { min: 1 }) : 0,
    rmsNormEps: f.num("rms_norm_eps"),
    // Read but unused (NoPE): the rope dims take part in the scores unrotated.
    rope: { theta: f.num("rope_theta"), layout: "half", dim: qkRope, scaling: { type: "none" } },
    maxPositions: f.int("max_position_embeddings", { min: 1 }),
    tieWordEmbeddings: false,
    qkNorm: false,
    attentionBias: false,
    layerKinds,
    moe: {
      numExperts,
      topK,
      expertIntermediate: expertInter,
      latentDim: f.int("routed_expert_hidden_size", { min: 1 }),
      scoring: "sigmoid",
      normTopK: f.flag("moe_renormalize"),
      routedScaling: f.num("routed_scaling_factor"),
      nGroup,
      topkGroup,
      selectionBias: true,
      // The shared experts are stored fused: num_shared_experts × moe_intermediate_size rows.
      sharedIntermediate: expertInter * f.int("num_shared_experts", { min: 0 }),
    },
    mla: {
      qLoraRank: f.int("q_lora_rank", { min: 1 }),
      kvLoraRank: f.int("kv_lora_rank", { min: 1 }),
      qkNopeHeadDim: qkNope,
      qkRopeHeadDim: qkRope,
      vHeadDim: f.int("v_head_dim", { min: 1 }),
      nope: true,
      outputGate: true,
    },
    kda: {
      numHeads: kdaHeads,
      headDim: kdaDim,
      convKernel: lin.int("short_conv_kernel_size", { min: 1 }),
      // full_attn_layers is 1-based: layer L (0-based) is MLA when L + 1 is listed.
      layers: Array.from({ length: numLayers }, (_, l) => !full.has(l + 1)),
      gateLowerBound: lin.num("gate_lower_bound"),
      fullRankOutputGate: true,
    },
    residual: { kind: "attn_res", blockSize: f.int("attn_res_block_size", { min: 1 }) },
    glu: {
      kind: "situ",
      beta: f.num("activation_situ_beta"),
      linearBeta: f.num("activation_situ_linear_beta"),
    },
    attnScale: 1 / Math.sqrt(qkNope + qkRope),
  };
};

/** KDA's tensors with K3's one full-rank output gate (`g_proj`) in place of g_a → g_b. */
const { g_a: _a, g_b: _b, ...KDA_BASE } = KDA_TENSORS;
const K3_KDA_TENSORS: Partial<Record<LayerTensor, string>> = {
  ...KDA_BASE,
  g_proj: "self_attn.g_proj.weight",
};

/** Every layer's Attention Residual pairs. */
const ATTN_RES_TENSORS: Partial<Record<LayerTensor, string>> = {
  attn_res_norm: "self_attention_res_norm.weight",
  attn_res_proj: "self_attention_res_proj.weight",
  mlp_res_norm: "mlp_res_norm.weight",
  mlp_res_proj: "mlp_res_proj.weight",
};

/** A MoE layer's latent projections and the norm of the weighted expert sum. */
const LATENT_TENSORS: Partial<Record<LayerTensor, string>> = {
  latent_down: "block_sparse_moe.routed_expert_down_proj.weight",
  latent_norm: "block_sparse_moe.routed_expert_norm.weight",
  latent_up: "block_sparse_moe.routed_expert_up_proj.weight",
};

/** The kimi_k3 family. */
export const KIMI_K3: Family = {
  name: "kimi_k3",
  attentionTensors: (cfg, layer) => ({
    ...(isKdaLayer(cfg, layer)
      ? K3_KDA_TENSORS
      : { ...mlaTensors(cfg), g_proj: "self_attn.g_proj.weight" }),
    ...ATTN_RES_TENSORS,
    ...(cfg.layerKinds[layer] === "moe" ? LATENT_TENSORS : {}),
  }),
  validateConfig(c, where) {
    KIMI_LINEAR.validateConfig(c, where);
    const m = manifestField.obj(c.mla, `${where}.mla`);
    manifestField.bool(m.outputGate, `${where}.mla.outputGate`);
    // Its parts: Attention Residuals, the SiTU gate and a latent MoE (their fields are checked
    // with the rest of the config; here, that they are there).
    if (manifestField.obj(c.residual, `${where}.residual`).kind !== "attn_res") {
      throw new Error(`${where}.residual.kind: kimi_k3 runs Attention Residuals`);
    }
    if (manifestField.obj(c.glu, `${where}.glu`).kind !== "situ") {
      throw new Error(`${where}.glu.kind: kimi_k3 gates its MLPs with SiTU`);
    }
    manifestField.int(
      manifestField.obj(c.moe, `${where}.moe`).latentDim,
      `${where}.moe.latentDim`,
      1,
      MAX_DIM,
    );
  },
};
