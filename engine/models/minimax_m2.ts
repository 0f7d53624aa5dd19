/**
 * MiniMax-M2 / M2.1 / M2.5 (`MiniMaxM2ForCausalLM`): grouped-query attention whose q and k each
 * take one RMSNorm over the token's whole projection before the head split (`qk_norm_type
 * "per_layer"`), RoPE on the leading `rotary_dim` dims of each head, a query wider than the hidden
 * size; every layer MoE with sigmoid scores, a selection-only bias beside the router and the
 * chosen scores renormalised, no shared expert. The attention is the llama family's (its
 * `qkNormWhole` feature); the multi-token-prediction keys (`use_mtp`, …) describe modules the
 * release does not ship, so nothing reads them. FP8 releases pack like any FP8 checkpoint.
 *
 * @module
 */
import type { MoeNaming } from "./family.ts";
import { checkTopK, type Normaliser } from "./hf_config.ts";
import { gqaBase } from "./llama.ts";

/** `block_sparse_moe.{gate, e_score_correction_bias, experts.E.w1|w3|w2}`. */
export const MINIMAX_M2_NAMING: MoeNaming = {
  moe: "block_sparse_moe",
  expert: { gate: "w1", up: "w3", down: "w2" },
  selectionBias: "e_score_correction_bias",
};

/** MiniMax-M2's config.json, keys as the MiniMaxAI releases spell them. */
export const normaliseMinimaxM2: Normaliser = (f, mt) => {
  const qkNorm = f.bool("use_qk_norm", true);
  if (qkNorm) f.exactly("qk_norm_type", "per_layer");
  const base = gqaBase(f, mt, { ropeTheta: 5e6, rmsNormEps: 1e-6, maxPositions: 196608 }, {
    qkNorm,
  });
  // attn_type_list: 1 is softmax attention; MiniMax-01's lightning (linear) layers are 0.
  const kinds = f.intList("attn_type_list");
  if (kinds.length && (kinds.length !== base.numLayers || kinds.some((k) => k !== 1))) {
    throw new Error(
      `${f.where}: attn_type_list must give 1 (softmax attention) for each of the ` +
        `${base.numLayers} layers; lightning attention (0) is not supported`,
    );
  }
  const rotDim = f.int("rotary_dim", { def: base.headDim, min: 2, max: base.headDim });
  if (rotDim % 2) throw new Error(`${f.where}: rotary_dim ${rotDim} must be even`);
  if (f.int("shared_intermediate_size", { def: 0 }) !== 0) {
    throw new Error(`${f.where}: shared_intermediate_size > 0 (a shared expert) is not supported`);
  }
  const numExperts = f.int("num_local_experts", { min: 1 });
  const topK = f.int("num_experts_per_tok", { min: 1 });
  checkTopK(f, numExperts, topK);
  // transformers scores with a sigmoid and adds e_score_correction_bias whatever these say.
  const scoring = f.str("scoring_func", "sigmoid");
  if (scoring !== "sigmoid" || !f.bool("use_routing_bias", true)) {
    throw new Error(
      `${f.where}: only sigmoid routing with the selection bias is supported (scoring_func ` +
        `${scoring}, use_routing_bias ${f.src.use_routing_bias})`,
    );
  }
  return {
    ...base,
    attentionBias: false,
    qkNormWhole: qkNorm,
    rope: { ...base.rope, dim: rotDim },
    intermediateSize: 0,
    layerKinds: Array(base.numLayers).fill("moe"),
    // intermediate_size is the experts' width: there is no dense MLP.
    moe: {
      numExperts,
      topK,
      expertIntermediate: f.int("intermediate_size", { min: 1 }),
      scoring: "sigmoid",
      normTopK: true,
      routedScaling: 1,
      nGroup: 1,
      topkGroup: 1,
      selectionBias: true,
      sharedIntermediate: 0,
    },
  };
};
