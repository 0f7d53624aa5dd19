/**
 * The gemma4 family: Gemma 4 with the MoE block (`Gemma4ForConditionalGeneration`, the 26B-A4B;
 * text only), from the release layout: the language model's config under `text_config`, its
 * tensors under `model.language_model.`, the embedding tied to the head, the experts fused per
 * layer (`experts.gate_up_proj` [E, 2·I, H], gate rows first; `experts.down_proj` [E, H, I]). The
 * vision tower's tensors are not the language model's: pack skips them and says so.
 *
 * What it computes (transformers 5.18 `modeling_gemma4.py`; ../shared/models/README.md
 * "tiny-gemma4-moe"):
 * - attention: sliding layers (window W counting the token itself) with head_dim and
 *   num_key_value_heads, full layers with their own global_head_dim and
 *   num_global_key_value_heads (`attention.fullLayers`), where V is the k_proj output when
 *   attention_k_eq_v; per-head q/k RMSNorms with weights, a weightless one on V, scale 1.0; RoPE
 *   default on sliding layers, "proportional" on full ones (frequencies over the whole head, none
 *   past the rotary fraction);
 * - the residual stream (`residual` "sandwich", engine/parts/sandwich.ts): embedding × √hidden,
 *   each sublayer's output normed before it joins the stream, the whole stream × `layer_scalar`
 *   after each layer; GELU-tanh MLPs (`glu`), and the final logits softcapped (`logitSoftcap`);
 * - the feed-forward (`moe.denseBeside`): a dense MLP and the experts side by side, each on its own
 *   norm of x and with its own post-norm, summed; the router reads x through a weightless
 *   RMSNorm × `router.scale` × hidden^−½, softmax over all experts, top-k renormalised, then ×
 *   `per_expert_scale`.
 *
 * @module
 */
import { manifestField, MAX_DIM } from "../../io/manifest.ts";
import { layerGeometry, type LayerTensor, type ModelConfig } from "../../io/model_config.ts";
import type { Family, MoeNaming } from "./family.ts";
import { checkTopK, type Fields, MAX_LAYERS, type Normaliser, softmaxMoe } from "./hf_config.ts";

/** Gemma's scale of the embedding, √hidden, rounded to the dtype the release computes it in. */
function embedScale(hidden: number, dtype: string): number {
  const s = Math.fround(Math.sqrt(hidden));
  if (dtype !== "bfloat16") return s;
  // Round to nearest even on the 16 high bits, as torch casts.
  const bits = new Uint32Array(new Float32Array([s]).buffer)[0];
  const rounded = (bits + 0x7fff + ((bits >> 16) & 1)) & 0xffff0000;
  return new Float32Array(new Uint32Array([rounded]).buffer)[0];
}

/** One entry of `rope_parameters` by layer type, `want` its only supported rope_type. */
function ropeOf(f: Fields, type: string, want: string) {
  const p = f.obj("rope_parameters").obj(type);
  p.exactly("rope_type", want);
  if (p.num("factor", 1) !== 1) {
    throw new Error(`${p.where}: field factor must be 1 (RoPE scaling is not supported)`);
  }
  return p;
}

/**
 * Gemma 4's config.json (model_type gemma4, the text model under `text_config`). Settings of the
 * other Gemma 4 sizes that change the math (per-layer input embeddings, KV-shared layers, no MoE
 * block, an attention softcap) are refused by field.
 */
export const normaliseGemma4: Normaliser = (top, mt) => {
  const f = top.obj("text_config");
  f.exactly("hidden_activation", "gelu_pytorch_tanh");
  f.exactly("enable_moe_block", true);
  for (const k of ["hidden_size_per_layer_input", "num_kv_shared_layers"]) {
    if (f.int(k, { def: 0 }) !== 0) {
      throw new Error(
        `${f.where}: field ${k} must be 0 (per-layer inputs and shared KV layers ` +
          `of the small Gemma 4 sizes are not supported)`,
      );
    }
  }
  if (f.bool("attention_bias", false)) {
    throw new Error(`${f.where}: field attention_bias must be false`);
  }
  if (f.has("attn_logit_softcapping")) {
    throw new Error(`${f.where}: field attn_logit_softcapping must be null`);
  }
  if (!f.bool("tie_word_embeddings", top.bool("tie_word_embeddings", true))) {
    throw new Error(`${f.where}: field tie_word_embeddings must be true (Gemma 4 ties its head)`);
  }
  const hidden = f.int("hidden_size", { min: 1 });
  const numLayers = f.int("num_hidden_layers", { min: 1, max: MAX_LAYERS });
  const numHeads = f.int("num_attention_heads", { min: 1 });
  const headDim = f.int("head_dim", { min: 1 });
  const numKvHeads = f.int("num_key_value_heads", { min: 1 });
  const globalHeadDim = f.int("global_head_dim", { def: headDim, min: 1 });
  const globalKvHeads = f.int("num_global_key_value_heads", { def: numKvHeads, min: 1 });
  for (const kv of [numKvHeads, globalKvHeads]) {
    if (numHeads % kv) {
      throw new Error(`${f.where}: num_attention_heads ${numHeads} is not a multiple of ${kv}`);
    }
  }
  const types = f.src.layer_types;
  if (
    !Array.isArray(types) || types.length !== numLayers ||
    !types.every((t) => t === "sliding_attention" || t === "full_attention")
  ) {
    throw new Error(
      `${f.where}: field layer_types must list sliding_attention or full_attention for each of ` +
        `the ${numLayers} layers, got ${JSON.stringify(types)}`,
    );
  }
  const window = f.int("sliding_window", { min: 1 });
  const sliding = ropeOf(f, "sliding_attention", "default");
  const full = ropeOf(f, "full_attention", "proportional");
  const fraction = full.num("partial_rotary_factor", 1);
  // transformers: int(partial_rotary_factor · head_dim // 2) rotated pairs.
  const angles = Math.floor((fraction * globalHeadDim) / 2);
  if (!(fraction > 0 && fraction <= 1) || angles < 1 || globalHeadDim % 2 || headDim % 2) {
    throw new Error(
      `${full.where}: partial_rotary_factor ${fraction} of global_head_dim ${globalHeadDim} must ` +
        `rotate at least one pair of an even head`,
    );
  }
  const numExperts = f.int("num_experts", { min: 1 });
  const topK = f.int("top_k_experts", { min: 1 });
  checkTopK(f, numExperts, topK);
  const dtype = f.str("dtype", top.str("dtype", top.str("torch_dtype", "float32")));
  return {
    family: "gemma4",
    modelType: mt,
    vocabSize: f.int("vocab_size", { min: 1 }),
    hiddenSize: hidden,
    numLayers,
    numHeads,
    numKvHeads,
    headDim,
    intermediateSize: f.int("intermediate_size", { min: 1 }),
    rmsNormEps: f.num("rms_norm_eps", 1e-6),
    rope: {
      theta: sliding.num("rope_theta"),
      layout: "half",
      dim: headDim,
      scaling: { type: "none" },
    },
    maxPositions: f.int("max_position_embeddings", { min: 1 }),
    tieWordEmbeddings: true,
    qkNorm: true,
    attentionBias: false,
    layerKinds: Array(numLayers).fill("moe"),
    moe: {
      ...softmaxMoe(numExperts, topK, f.int("moe_intermediate_size", { min: 1 }), true),
      scaledRouterInput: true,
      expertScale: true,
      denseBeside: true,
    },
    mla: null,
    // The q/k norms set the scale.
    attnScale: 1,
    attention: {
      sinks: false,
      outputBias: false,
      windows: types.map((t) => t === "sliding_attention" ? window : 0),
      valueNorm: true,
      fullLayers: {
        headDim: globalHeadDim,
        numKvHeads: globalKvHeads,
        rope: {
          theta: full.num("rope_theta"),
          layout: "half",
          dim: globalHeadDim,
          scaling: { type: "proportional", angles },
        },
        kEqV: f.bool("attention_k_eq_v", false),
      },
    },
    residual: { kind: "sandwich", embedScale: embedScale(hidden, dtype) },
    glu: { kind: "gelu_tanh" },
    ...(f.has("final_logit_softcapping") ? { logitSoftcap: f.num("final_logit_softcapping") } : {}),
  };
};

/** The MoE block's names: `router.proj`, fused `experts.{gate_up,down}_proj` beside the MLP. */
export const GEMMA4_NAMING: MoeNaming = {
  moe: "",
  expert: { gate: "gate_proj", up: "up_proj", down: "down_proj" },
  router: "router.proj",
  stacked: true,
};

/** Every trunk tensor of a Gemma 4 layer and its name under `model.language_model.layers.N.`. */
function gemma4Tensors(cfg: ModelConfig, layer: number): Partial<Record<LayerTensor, string>> {
  const g = layerGeometry(cfg, layer);
  return {
    attn_norm: "input_layernorm.weight",
    wq: "self_attn.q_proj.weight",
    wk: "self_attn.k_proj.weight",
    ...(g.kEqV ? {} : { wv: "self_attn.v_proj.weight" }),
    wo: "self_attn.o_proj.weight",
    q_norm: "self_attn.q_norm.weight",
    k_norm: "self_attn.k_norm.weight",
    attn_post_norm: "post_attention_layernorm.weight",
    ffn_norm: "pre_feedforward_layernorm.weight",
    ffn_gate: "mlp.gate_proj.weight",
    ffn_up: "mlp.up_proj.weight",
    ffn_down: "mlp.down_proj.weight",
    router: "router.proj.weight",
    router_scale: "router.scale",
    expert_scale: "router.per_expert_scale",
    dense_post_norm: "post_feedforward_layernorm_1.weight",
    moe_norm: "pre_feedforward_layernorm_2.weight",
    moe_post_norm: "post_feedforward_layernorm_2.weight",
    ffn_post_norm: "post_feedforward_layernorm.weight",
    layer_scalar: "layer_scalar",
  };
}

/** The gemma4 family. */
export const GEMMA4: Family = {
  name: "gemma4",
  attentionTensors: gemma4Tensors,
  validateConfig(c, where) {
    const { obj, bool, int, rope } = manifestField;
    if (c.mla !== null) throw new Error(`${where}.mla: the gemma4 family has no MLA section`);
    const a = obj(c.attention, `${where}.attention`);
    for (const k of ["sinks", "outputBias", "valueNorm"]) bool(a[k], `${where}.attention.${k}`);
    const layers = c.numLayers as number;
    if (!Array.isArray(a.windows) || a.windows.length !== layers) {
      throw new Error(`${where}.attention.windows: expected ${layers} entries`);
    }
    a.windows.forEach((x, i) => int(x, `${where}.attention.windows[${i}]`, 0, MAX_DIM));
    const full = obj(a.fullLayers, `${where}.attention.fullLayers`);
    int(full.headDim, `${where}.attention.fullLayers.headDim`, 2, MAX_DIM);
    int(full.numKvHeads, `${where}.attention.fullLayers.numKvHeads`, 1, MAX_DIM);
    bool(full.kEqV, `${where}.attention.fullLayers.kEqV`);
    rope(full.rope, `${where}.attention.fullLayers.rope`);
  },
};
