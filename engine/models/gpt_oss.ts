/**
 * The gpt_oss family (OpenAI gpt-oss-20b/120b, `GptOssForCausalLM`): grouped-query attention with
 * q/k/v/o biases, one learned sink logit per head in the softmax denominator, sliding-window
 * attention on the layers `layer_types` marks (their KV cache a ring holding only what the window
 * needs), YaRN RoPE with the checkpoint's `truncate`; every layer MoE with a biased router (top-k
 * of the logits, softmax over the chosen), biased experts and the clamped SwiGLU, the experts
 * shipped as fused MXFP4 (engine/tensor_names.ts `hfFusedExpertSlice`). Its layers run the
 * grouped-query attention mixer (engine/parts/gqa.ts), whose sinks, o bias and windows are
 * features of `config.attention`.
 *
 * @module
 */
import { manifestField, MAX_DIM } from "../../io/manifest.ts";
import type { Family, MoeNaming } from "./family.ts";
import { checkTopK, type Normaliser, softmaxMoe } from "./hf_config.ts";
import { gqaBase, LLAMA } from "./llama.ts";

/** gpt-oss's config.json: alpha 1.702 is no config key (transformers and llama.cpp hard-code it). */
export const normaliseGptOss: Normaliser = (f, mt) => {
  const base = gqaBase(f, mt, { ropeTheta: 150000, rmsNormEps: 1e-5, maxPositions: 131072 }, {
    qkNorm: false,
  });
  const numExperts = f.int("num_local_experts", { min: 1 });
  const topK = f.int("num_experts_per_tok", {
    min: 1,
    def: f.has("experts_per_token") ? f.int("experts_per_token") : undefined,
  });
  checkTopK(f, numExperts, topK);
  const window = f.int("sliding_window", { def: 128, min: 1 });
  const types = f.src.layer_types ??
    Array.from(
      { length: base.numLayers },
      (_, l) => l % 2 === 0 ? "sliding_attention" : "full_attention",
    );
  if (
    !Array.isArray(types) || types.length !== base.numLayers ||
    !types.every((t) => t === "sliding_attention" || t === "full_attention")
  ) {
    throw new Error(
      `${f.where}: field layer_types must list sliding_attention or full_attention for each of ` +
        `the ${base.numLayers} layers, got ${JSON.stringify(f.src.layer_types)}`,
    );
  }
  return {
    ...base,
    family: "gpt_oss",
    attentionBias: f.bool("attention_bias", true),
    intermediateSize: 0,
    layerKinds: Array(base.numLayers).fill("moe"),
    moe: {
      ...softmaxMoe(numExperts, topK, f.int("intermediate_size", { min: 1 }), false),
      scoring: "topk_softmax",
      routerLogitBias: true,
      expertBias: true,
      clampedSwiglu: { limit: f.num("swiglu_limit", 7), alpha: 1.702 },
    },
    attention: {
      sinks: true,
      outputBias: f.bool("attention_bias", true),
      windows: types.map((t) => t === "sliding_attention" ? window : 0),
    },
  };
};

/** gpt-oss's MoE block: `mlp.router` and fused `mlp.experts.{gate_up,down}_proj_*` tensors. */
export const GPT_OSS_NAMING: MoeNaming = {
  moe: "mlp",
  expert: { gate: "gate_proj", up: "up_proj", down: "down_proj" },
  router: "router",
  fused: true,
};

/** The gpt_oss family. */
export const GPT_OSS: Family = {
  name: "gpt_oss",
  attentionTensors(cfg, layer) {
    const names = LLAMA.attentionTensors(cfg, layer);
    if (cfg.attention?.outputBias) names.bo = "self_attn.o_proj.bias";
    if (cfg.attention?.sinks) names.sinks = "self_attn.sinks";
    return names;
  },
  validateConfig(c, where) {
    const { obj, bool, int } = manifestField;
    if (c.mla !== null) throw new Error(`${where}.mla: the gpt_oss family has no MLA section`);
    const a = obj(c.attention, `${where}.attention`);
    bool(a.sinks, `${where}.attention.sinks`);
    bool(a.outputBias, `${where}.attention.outputBias`);
    const layers = c.numLayers as number;
    if (!Array.isArray(a.windows) || a.windows.length !== layers) {
      throw new Error(`${where}.attention.windows: expected ${layers} entries`);
    }
    a.windows.forEach((x, i) => int(x, `${where}.attention.windows[${i}]`, 0, MAX_DIM));
  },
};
