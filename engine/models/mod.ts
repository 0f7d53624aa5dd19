/**
 * The model registry: every supported Hugging Face model_type, one line each, and the family
 * whose tensor naming it shares. One file per family beside this one holds everything about that
 * family (engine/models/family.ts says what); the config parser, manifest validation and the
 * packer's tensor names look families up here instead of switching on names. docs/ENGINE.md "Adding a model family" lists the steps.
 *
 * @module
 */
import type { ModelConfig } from "../../io/model_config.ts";
import { DEEPSEEK_V3, normaliseDeepseekV3, normaliseGlmMoeDsa } from "./deepseek_v3.ts";
import { DEEPSEEK_V4, DEEPSEEK_V4_NAMING, normaliseDeepseekV4 } from "./deepseek_v4.ts";
import { GEMMA4, GEMMA4_NAMING, normaliseGemma4 } from "./gemma4.ts";
import { GLM5_NEXT, normaliseGlm5Next } from "./glm5_next.ts";
import type { Family, ModelType, MtpNaming, MtpTensor } from "./family.ts";
import { GPT_OSS, GPT_OSS_NAMING, normaliseGptOss } from "./gpt_oss.ts";
import { KIMI_K3, normaliseKimiK3 } from "./kimi_k3.ts";
import { KIMI_LINEAR, normaliseKimiLinear } from "./kimi_linear.ts";
import { MINIMAX_M2_NAMING, normaliseMinimaxM2 } from "./minimax_m2.ts";
import {
  normaliseQwen3_5Moe,
  normaliseQwen3Next,
  QWEN3_5_NAMING,
  QWEN3_NEXT,
  QWEN3_NEXT_NAMING,
} from "./qwen3_next.ts";
import {
  LLAMA,
  MIXTRAL_NAMING,
  MLP_NAMING,
  normaliseGlm4Moe,
  normaliseLlama,
  normaliseMixtral,
  normaliseQwen3Moe,
} from "./llama.ts";

/** DeepSeek-V3 and GLM: MTP layer j is layer numLayers + j with its own tensors beside it. */
const NEXTN_MTP: MtpNaming = {
  block: (cfg, j) => `${modelTypeOf(cfg).prefix ?? "model."}layers.${cfg.numLayers + j}.`,
  own: (cfg, j, t) => `${NEXTN_MTP.block(cfg, j)}${NEXTN_OWN[t]}`,
};
const NEXTN_OWN: Record<MtpTensor, string> = {
  mtp_enorm: "enorm.weight",
  mtp_hnorm: "hnorm.weight",
  mtp_proj: "eh_proj.weight",
  mtp_head_norm: "shared_head.norm.weight",
};

/** Qwen3-Next and Qwen3.5: one `mtp.` block, its experts stored one tensor per expert. */
const QWEN_MTP: MtpNaming = {
  block: (_cfg, j) => `mtp.layers.${j}.`,
  own: (_cfg, _j, t) => `mtp.${QWEN_OWN[t]}`,
  perExpert: true,
  skippedPrefix: "mtp.",
};
const QWEN_OWN: Record<MtpTensor, string> = {
  mtp_enorm: "pre_fc_norm_embedding.weight",
  mtp_hnorm: "pre_fc_norm_hidden.weight",
  mtp_proj: "fc.weight",
  mtp_head_norm: "norm.weight",
};

/** Every attention family, by the name a stored config carries as `family`. */
export const FAMILIES: Readonly<Record<string, Family>> = {
  llama: LLAMA,
  deepseek_v3: DEEPSEEK_V3,
  deepseek_v4: DEEPSEEK_V4,
  gpt_oss: GPT_OSS,
  kimi_linear: KIMI_LINEAR,
  kimi_k3: KIMI_K3,
  gemma4: GEMMA4,
  glm5_next: GLM5_NEXT,
  qwen3_next: QWEN3_NEXT,
};

/** Every supported model_type: its family, normaliser, naming, and llama.cpp's name for it. */
export const MODEL_TYPES: Readonly<Record<string, ModelType>> = {
  llama: {
    family: LLAMA,
    normalise: normaliseLlama,
    naming: MLP_NAMING,
    architectures: ["LlamaForCausalLM"],
    llamaCppArch: "llama",
  },
  mixtral: {
    family: LLAMA,
    normalise: normaliseMixtral,
    naming: MIXTRAL_NAMING,
    architectures: ["MixtralForCausalLM"],
    // llama.cpp runs Mixtral as its llama architecture with experts.
    llamaCppArch: "llama",
  },
  qwen3_moe: {
    family: LLAMA,
    normalise: normaliseQwen3Moe,
    naming: MLP_NAMING,
    architectures: ["Qwen3MoeForCausalLM"],
    llamaCppArch: "qwen3moe",
  },
  deepseek_v3: {
    family: DEEPSEEK_V3,
    normalise: normaliseDeepseekV3,
    naming: MLP_NAMING,
    architectures: ["DeepseekV3ForCausalLM"],
    mtp: NEXTN_MTP,
  },
  // DeepSeek-V4 ships its original tensor names (no `model.` prefix, `embed`, `head`).
  deepseek_v4: {
    family: DEEPSEEK_V4,
    normalise: normaliseDeepseekV4,
    naming: DEEPSEEK_V4_NAMING,
    architectures: ["DeepseekV4ForCausalLM"],
    prefix: "",
    lmHead: "head.weight",
    globalNames: { embed: "embed.weight", lm_head: "head.weight" },
    llamaCppArch: "deepseek4",
  },
  glm_moe_dsa: {
    family: DEEPSEEK_V3,
    normalise: normaliseGlmMoeDsa,
    naming: MLP_NAMING,
    architectures: ["GlmMoeDsaForCausalLM"],
    mtp: NEXTN_MTP,
  },
  // GLM-5.3-Flash: the text model under text_config and model.language_model.; the MTP layer
  // (index num_hidden_layers) and the vision tower are not packed.
  glm5_next: {
    family: GLM5_NEXT,
    normalise: normaliseGlm5Next,
    naming: MLP_NAMING,
    architectures: ["Glm5NextForConditionalGeneration"],
    prefix: "model.language_model.",
    skipped: { "model.visual.": "the vision tower; sluice runs the text model" },
  },
  glm4_moe: {
    family: LLAMA,
    normalise: normaliseGlm4Moe,
    naming: MLP_NAMING,
    architectures: ["Glm4MoeForCausalLM"],
    mtp: NEXTN_MTP,
    llamaCppArch: "glm4moe",
  },
  gpt_oss: {
    family: GPT_OSS,
    normalise: normaliseGptOss,
    naming: GPT_OSS_NAMING,
    architectures: ["GptOssForCausalLM"],
    llamaCppArch: "gpt-oss",
  },
  // Gemma 4's config nests the language model under text_config (model_type gemma4_text there);
  // the top-level gemma4 picks this entry, whose normaliser descends. Its vision tower is skipped.
  gemma4: {
    family: GEMMA4,
    normalise: normaliseGemma4,
    naming: GEMMA4_NAMING,
    llamaCppArch: "gemma4",
    architectures: ["Gemma4ForConditionalGeneration"],
    prefix: "model.language_model.",
    skipped: {
      "model.vision_tower.": "the vision tower",
      "model.embed_vision.": "the vision embedding",
    },
  },
  minimax_m2: {
    family: LLAMA,
    normalise: normaliseMinimaxM2,
    llamaCppArch: "minimax-m2",
    naming: MINIMAX_M2_NAMING,
    architectures: ["MiniMaxM2ForCausalLM"],
  },
  // Kimi-K2 ships the DeepSeek-V3 structure under its own model_type.
  kimi_k2: {
    family: DEEPSEEK_V3,
    normalise: normaliseDeepseekV3,
    naming: MLP_NAMING,
    architectures: [],
  },
  kimi_linear: {
    family: KIMI_LINEAR,
    normalise: normaliseKimiLinear,
    // block_sparse_moe with w1/w3/w2 experts, as Mixtral names them.
    naming: MIXTRAL_NAMING,
    architectures: ["KimiLinearForCausalLM"],
  },
  // Kimi K3's config nests the language model under text_config (its model_type is kimi_linear
  // there); the top-level kimi_k3 picks this entry, whose normaliser descends.
  kimi_k3: {
    family: KIMI_K3,
    normalise: normaliseKimiK3,
    naming: MIXTRAL_NAMING,
    architectures: ["KimiK3ForConditionalGeneration"],
    prefix: "language_model.model.",
    lmHead: "language_model.lm_head.weight",
  },
  qwen3_next: {
    family: QWEN3_NEXT,
    normalise: normaliseQwen3Next,
    naming: QWEN3_NEXT_NAMING,
    architectures: ["Qwen3NextForCausalLM"],
    mtp: QWEN_MTP,
    llamaCppArch: "qwen3next",
    skipped: { "mtp.": "the multi-token-prediction block, left out by --no-mtp" },
  },
  // Qwen3.5/3.6-MoE: the text model nested under text_config and model.language_model.
  qwen3_5_moe: {
    family: QWEN3_NEXT,
    normalise: normaliseQwen3_5Moe,
    naming: QWEN3_5_NAMING,
    architectures: ["Qwen3_5MoeForConditionalGeneration"],
    mtp: QWEN_MTP,
    llamaCppArch: "qwen35moe",
    prefix: "model.language_model.",
    skipped: {
      "mtp.": "the multi-token-prediction block, left out by --no-mtp",
      "model.visual.": "the vision tower; sluice runs the text model",
    },
  },
};

/** The family of a config; an error names the family and the known ones. */
export function familyOf(cfg: Pick<ModelConfig, "family" | "modelType">): Family {
  const f = Object.hasOwn(FAMILIES, cfg.family) ? FAMILIES[cfg.family] : undefined;
  if (!f) {
    throw new Error(
      `${cfg.modelType}: unknown model family ${cfg.family} (known: ${
        Object.keys(FAMILIES).join(", ")
      })`,
    );
  }
  return f;
}

/** The registry entry of a config's model_type; an error names it and the known ones. */
export function modelTypeOf(cfg: Pick<ModelConfig, "modelType">): ModelType {
  const t = Object.hasOwn(MODEL_TYPES, cfg.modelType) ? MODEL_TYPES[cfg.modelType] : undefined;
  if (!t) {
    throw new Error(
      `no tensor naming for model_type ${cfg.modelType} (known: ${
        Object.keys(MODEL_TYPES).join(", ")
      })`,
    );
  }
  return t;
}
