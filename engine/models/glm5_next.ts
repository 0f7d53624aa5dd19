/**
 * The glm5_next family (GLM-5.3-Flash, `Glm5NextForConditionalGeneration`, text model only, as
 * transformers 5.18 computes it): KDA layers (engine/parts/kda.ts, with the bounded forget gate)
 * and NoPE MLA layers with DeepSeek Sparse Attention's k-pool indexer (engine/parts/mla.ts), in
 * the order the config's `layer_types` list gives; dense or sigmoid-routed MoE feed-forwards by
 * `mlp_layer_types`, every gated MLP with the clamped SwiGLU (engine/parts/feed_forward.ts); and
 * hyper-connections collapsed by their mean as the residual stream (engine/parts/hyper.ts). This
 * file holds the config normaliser (the release's nested `text_config`), each layer kind's
 * tensors' Hugging Face names (under `model.language_model.`) and the stored-config check. The
 * MTP layer after num_hidden_layers and the vision tower are not run (pack says so).
 *
 * @module
 */
import { manifestField } from "../../io/manifest.ts";
import { isKdaLayer } from "../../io/model_config.ts";
import { mlaTensors } from "./deepseek_v3.ts";
import { HYPER_NAMES } from "./deepseek_v4.ts";
import type { Family } from "./family.ts";
import { type Fields, groupedMoe, MAX_LAYERS, type Normaliser, requireSilu } from "./hf_config.ts";
import { KDA_TENSORS, KIMI_LINEAR } from "./kimi_linear.ts";

/** Bound of the indexer's sizes (the release: 32 heads of 128, top 2048), far above any model's. */
const MAX_INDEXER = 2 ** 16;

/** `layer_types` values of an MLA layer (transformers reads every value but KDA's as one). */
const MLA_LAYER_TYPES = ["deepseek_sparse_attention", "indexed_attention", "full_attention"];

/** One string per layer from list `key`, each one of `allowed`. */
function layerList(f: Fields, key: string, numLayers: number, allowed: string[]): string[] {
  const v = f.src[key];
  if (!Array.isArray(v) || v.length < numLayers) {
    throw new Error(`${f.where}: field ${key} must list at least ${numLayers} layer types`);
  }
  return v.slice(0, numLayers).map((t, i) => {
    if (typeof t !== "string" || !allowed.includes(t)) {
      throw new Error(
        `${f.where}: ${key}[${i}] is ${JSON.stringify(t)}; expected one of ${allowed.join(", ")}`,
      );
    }
    return t;
  });
}

/**
 * Which layers run KDA: `layer_types` in list order, else linear_attn_config's 0-based
 * `kda_layers`; where both are given they must agree.
 */
function kdaLayers(f: Fields, lin: Fields, numLayers: number): boolean[] {
  const listed = lin.has("kda_layers") ? new Set(lin.intList("kda_layers")) : null;
  for (const l of listed ?? []) {
    if (l >= numLayers) {
      throw new Error(
        `${lin.where}: kda_layers entry ${l} is outside 0..${numLayers - 1} (0-based)`,
      );
    }
  }
  if (!f.has("layer_types")) {
    if (!listed) {
      throw new Error(`${f.where}: required field layer_types (or kda_layers) is missing`);
    }
    return Array.from({ length: numLayers }, (_, l) => listed.has(l));
  }
  const types = layerList(f, "layer_types", numLayers, ["linear_attention", ...MLA_LAYER_TYPES]);
  const kda = types.map((t) => t === "linear_attention");
  kda.forEach((k, l) => {
    if (listed && listed.has(l) !== k) {
      throw new Error(
        `${f.where}: layer_types[${l}] is ${types[l]} but linear_attn_config.kda_layers ` +
          `${listed.has(l) ? "lists" : "does not list"} layer ${l}`,
      );
    }
  });
  return kda;
}

/**
 * GLM-5.3-Flash's config: the language model under `text_config`. Settings transformers refuses
 * or sluice does not run (rotary dims, a shared indexer, no pool tail, other routing) are errors.
 */
export const normaliseGlm5Next: Normaliser = (top, mt) => {
  const f = top.obj("text_config");
  const lin = f.obj("linear_attn_config");
  requireSilu(f);
  const numLayers = f.int("num_hidden_layers", { min: 1, max: MAX_LAYERS });
  const numHeads = f.int("num_attention_heads", { min: 1 });
  if (f.has("num_key_value_heads")) f.exactly("num_key_value_heads", numHeads);
  // transformers refuses rope dims here: the DSA layers are NoPE.
  if (f.has("qk_rope_head_dim")) f.exactly("qk_rope_head_dim", 0);
  if (f.has("attention_bias")) f.exactly("attention_bias", false);
  if (f.has("scoring_func")) f.exactly("scoring_func", "sigmoid");
  if (f.has("index_kpool_always_select_tail")) f.exactly("index_kpool_always_select_tail", true);
  // GLM's cross-layer sharing reuses one selection in later layers; sluice runs one per layer.
  const indexers = f.has("indexer_types")
    ? layerList(f, "indexer_types", numLayers, ["full", "shared"])
    : [];
  const shared = indexers.indexOf("shared");
  if (shared >= 0) {
    throw new Error(
      `${f.where}: indexer_types[${shared}] is "shared" (a selection reused from an earlier ` +
        `layer), which sluice does not run`,
    );
  }
  const kda = kdaLayers(f, lin, numLayers);
  const kinds = f.has("mlp_layer_types")
    ? layerList(f, "mlp_layer_types", numLayers, ["dense", "sparse"])
    // transformers' default: three dense layers, then MoE.
    : Array.from({ length: numLayers }, (_, l) => l < 3 ? "dense" : "sparse");
  const layerKinds = kinds.map((k) => k === "sparse" ? "moe" : "dense") as ("dense" | "moe")[];
  const qkNope = f.int("qk_nope_head_dim", { min: 1 });
  const pool = f.int("index_kpool", { min: 1, max: MAX_INDEXER });
  const indexTopK = f.int("index_topk", { min: 1, max: MAX_INDEXER });
  if (indexTopK % pool) {
    throw new Error(
      `${f.where}: index_topk ${indexTopK} must be a multiple of index_kpool ${pool}`,
    );
  }
  const limit = f.num("swiglu_limit", 10);
  if (!(limit > 0)) throw new Error(`${f.where}: field swiglu_limit must be > 0, got ${limit}`);
  return {
    family: "glm5_next",
    modelType: mt,
    vocabSize: f.int("vocab_size", { min: 1 }),
    hiddenSize: f.int("hidden_size", { min: 1 }),
    numLayers,
    numHeads,
    numKvHeads: numHeads,
    headDim: qkNope,
    intermediateSize: layerKinds.includes("dense") ? f.int("intermediate_size", { min: 1 }) : 0,
    rmsNormEps: f.num("rms_norm_eps", 1e-5),
    // No rotary anywhere (NoPE MLA, KDA); dim 0 says so.
    rope: { theta: 10000, layout: "half", dim: 0, scaling: { type: "none" } },
    maxPositions: f.int("max_position_embeddings", { def: 1048576, min: 1 }),
    tieWordEmbeddings: f.bool("tie_word_embeddings", false),
    qkNorm: false,
    attentionBias: false,
    layerKinds,
    // transformers always routes by sigmoid scores with the selection bias (its defaults here).
    moe: layerKinds.includes("moe")
      ? {
        ...groupedMoe(f, f.int("n_routed_experts", { min: 1 }), "sigmoid", "noaux_tc", {
          routedScaling: 2.5,
          groups: 1,
          sharedExperts: 1,
        }),
        swigluLimit: limit,
      }
      : null,
    mla: {
      qLoraRank: f.int("q_lora_rank", { min: 1 }),
      kvLoraRank: f.int("kv_lora_rank", { min: 1 }),
      qkNopeHeadDim: qkNope,
      qkRopeHeadDim: 0,
      vHeadDim: f.int("v_head_dim", { min: 1 }),
      nope: true,
      indexer: {
        numHeads: f.int("index_n_heads", { min: 1, max: MAX_INDEXER }),
        headDim: f.int("index_head_dim", { min: 1, max: MAX_INDEXER }),
        topK: indexTopK,
        pool,
      },
    },
    kda: {
      numHeads: lin.int("num_heads", { min: 1 }),
      headDim: lin.int("head_dim", { min: 1 }),
      convKernel: lin.int("short_conv_kernel_size", { def: 4, min: 1 }),
      layers: kda,
      gateLowerBound: lin.num("gate_lower_bound", -5),
      fullRankOutputGate: false,
    },
    residual: {
      kind: "hyper",
      streams: f.int("hc_mult", { def: 4, min: 1 }),
      sinkhornIters: f.int("hc_sinkhorn_iters", { def: 20, min: 1 }),
      eps: f.num("hc_eps", 1e-6),
      collapse: "mean",
    },
    attnScale: 1 / Math.sqrt(qkNope),
  };
};

/** The glm5_next family. */
export const GLM5_NEXT: Family = {
  name: "glm5_next",
  attentionTensors: (cfg, layer) => ({
    ...(isKdaLayer(cfg, layer) ? KDA_TENSORS : mlaTensors(cfg)),
    ...HYPER_NAMES,
  }),
  validateConfig(c, where) {
    KIMI_LINEAR.validateConfig(c, where);
    const m = manifestField.obj(c.mla, `${where}.mla`);
    if (m.nope !== true || m.indexer === undefined) {
      throw new Error(`${where}.mla: glm5_next runs NoPE MLA with an indexer`);
    }
    const r = manifestField.obj(c.residual, `${where}.residual`);
    if (r.kind !== "hyper" || r.collapse !== "mean") {
      throw new Error(
        `${where}.residual: glm5_next runs hyper-connections collapsed by their mean`,
      );
    }
  },
};
