/**
 * The normalised model description every part of sluice works from. `engine/config.ts` builds it
 * from a Hugging Face config.json; the container's manifest stores it; the forward passes read it.
 * Field names are ours, not any one checkpoint family's.
 *
 * @module
 */

/** How RoPE pairs the dimensions of a head. */
export type RopeLayout =
  /** Pairs (i, i + d/2): Hugging Face Llama, Mixtral, Qwen3. */
  | "half"
  /** Pairs (2i, 2i + 1): llama2.c, DeepSeek-V3's checkpoint layout. */
  | "interleaved";

/** RoPE frequency scaling, already resolved from `rope_scaling`. */
export type RopeScaling =
  | { type: "none" }
  | { type: "linear"; factor: number }
  | {
    type: "llama3";
    factor: number;
    lowFreqFactor: number;
    highFreqFactor: number;
    originalMaxPositions: number;
  }
  | {
    type: "yarn";
    factor: number;
    originalMaxPositions: number;
    betaFast: number;
    betaSlow: number;
    mscale: number;
    mscaleAllDim: number;
    /**
     * false: the correction range [low, high] stays fractional (gpt-oss's config); absent or
     * true: floored and ceiled, transformers' default.
     */
    truncate?: boolean;
  }
  | {
    /**
     * Gemma 4's full layers: frequencies theta^(−2i/dim) over the whole head for the leading
     * `angles` pairs, 0 (no rotation) for the rest; pairs (i, i + dim/2) as `half`.
     */
    type: "proportional";
    angles: number;
  };

/** Rotary position embedding of the attention. */
export interface RopeConfig {
  theta: number;
  layout: RopeLayout;
  /** Number of dimensions of a head that rotate (head_dim, or qk_rope_head_dim for MLA). */
  dim: number;
  scaling: RopeScaling;
}

/** Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2). */
export interface MlaConfig {
  /** null: q comes from one q_proj; else q_a_proj → norm → q_b_proj. */
  qLoraRank: number | null;
  kvLoraRank: number;
  qkNopeHeadDim: number;
  qkRopeHeadDim: number;
  vHeadDim: number;
  /** Kimi-Linear: no rotary anywhere; the rope dims take part in the dot product as projected. */
  nope?: boolean;
  /** Kimi K3: a sigmoid gate (the layer's g_proj projection) on the heads' values before o_proj. */
  outputGate?: boolean;
  /** eps of the latent norms (q_a_layernorm, kv_a_layernorm); absent: rmsNormEps. GLM-5: 1e-6. */
  latentNormEps?: number;
  /** DeepSeek Sparse Attention (GLM-5): a lightning indexer picks the keys each query attends to. */
  indexer?: IndexerConfig;
}

/**
 * The lightning indexer of DeepSeek Sparse Attention (GLM-5, engine/parts/mla.ts): per position
 * one key k = RoPE(LayerNorm(W_k·h)), cached beside the latent row; per query `numHeads` heads
 * q_h = RoPE(W_q·q_latent) and weights w = W_w·h / √numHeads; key t scores
 * Σ_h w_h·relu(q_h·k_t / √headDim), and the query attends only to the `topK` best keys (all of
 * them while it has no more than `topK`), ties broken by the lowest position. RoPE turns the first
 * qkRopeHeadDim dims of q and k, in the MLA's layout.
 */
export interface IndexerConfig {
  numHeads: number;
  headDim: number;
  topK: number;
  /**
   * GLM-5.3-Flash's k-pool indexer: the keys are scored in complete pools of this many positions
   * (pool key Σ_r softmax_r(g_r + ape_r) ⊙ k_r per channel, g = W_g·h cached beside k), the
   * best ⌊topK / pool⌋ pools are kept with the positions after the last complete pool (the tail).
   * Layer tensors `idx_pool_ape` and `idx_pool_gate`. Absent: every position is scored alone.
   */
  pool?: number;
}

/** The most positions an indexer lets one query attend to. */
export function indexerKept(ix: IndexerConfig): number {
  return ix.pool ? Math.floor(ix.topK / ix.pool) * ix.pool + ix.pool - 1 : ix.topK;
}

/** Whether a query that sees `n` positions attends to fewer than all of them. */
export function indexerThins(ix: IndexerConfig, n: number): boolean {
  return ix.pool ? Math.floor(n / ix.pool) > Math.floor(ix.topK / ix.pool) : n > ix.topK;
}

/**
 * Kimi Delta Attention (Kimi-Linear, Kimi K3): gated delta-rule linear attention behind a causal
 * short conv, with a fixed-size recurrent state per layer instead of a KV cache.
 */
export interface KdaConfig {
  numHeads: number;
  /** Key and value dims of a head (equal in every released checkpoint). */
  headDim: number;
  /** Width of the depthwise causal conv on q, k and v. */
  convKernel: number;
  /** Per layer: true for a KDA layer, false for a full-attention (MLA) layer. */
  layers: boolean[];
  /**
   * null: Kimi-Linear's forget gate g = −exp(A_log)·softplus(z); a number lb: K3's bounded
   * g = lb·σ(exp(A_log)·z).
   */
  gateLowerBound: number | null;
  /**
   * false: the output gate is σ(W_gb·W_ga·u) through a low-rank pair (Kimi-Linear's g_a/g_b);
   * true: σ(W_g·u) through one full-rank projection (`g_proj`, Kimi K3).
   */
  fullRankOutputGate: boolean;
}

/** One layer of compressed sparse attention: its compression ratio (0: the window only). */
export interface CsaLayer {
  /** Tokens per compressed entry; 0 for a layer that attends to its window only. */
  ratio: number;
  /**
   * true: overlapping windows (each entry mixes two windows' slots) and a Lightning indexer that
   * keeps `indexer.topK` entries (CSA); false: disjoint windows, every entry kept (HCA).
   */
  indexed: boolean;
}

/**
 * DeepSeek-V4's attention (mixer `csa`): one shared key-value head (the same vector is key and
 * value) after a low-rank q (`qLoraRank`) with unweighted per-head q norms; RoPE on the trailing
 * `rope.dim` dims of each head in interleaved pairs, the output rotated back; a learned sink per
 * head; a sliding window of `window` positions; per layer, entries compressed from `ratio`
 * tokens each (see {@link CsaLayer}), rotated with `compressRope` as are those layers' queries and
 * keys; the output projection grouped (`oGroups` groups of heads, each to `oLoraRank`, then
 * one projection to the hidden size).
 */
export interface CsaConfig {
  qLoraRank: number;
  oGroups: number;
  oLoraRank: number;
  window: number;
  layers: CsaLayer[];
  compressRope: RopeConfig;
  indexer: { heads: number; headDim: number; topK: number };
}

/**
 * Gated DeltaNet (Qwen3-Next, Qwen3.5/3.6-MoE): a short causal conv + SiLU over the fused q/k/v
 * channels, a delta rule with one decay per value head, value heads sharing key heads, and an
 * RMSNorm gated by SiLU(z) on the output; a fixed-size recurrent state per layer.
 */
export interface GatedDeltaNetConfig {
  numKeyHeads: number;
  /** A multiple of numKeyHeads: value head j reads key head j / (numValueHeads / numKeyHeads). */
  numValueHeads: number;
  keyHeadDim: number;
  valueHeadDim: number;
  /** Width of the depthwise causal conv over the q, k and v channels. */
  convKernel: number;
  /** Per layer: true for a Gated DeltaNet layer, false for a full-attention layer. */
  layers: boolean[];
  /**
   * How the input projections are stored: `flat` as Qwen3.5 ships them (in_proj_qkv rows
   * [q | k | v], in_proj_z, in_proj_b, in_proj_a); `grouped` as Qwen3-Next does (in_proj_qkvz
   * and in_proj_ba, each a block per key head: [q_h | k_h | v and z of its value heads]).
   */
  projections: "flat" | "grouped";
}

/**
 * The residual stream of a layer skeleton. Absent: the plain stream (x += sublayer(norm(x))).
 * `attn_res`: Attention Residuals (Kimi K3, ../shared/K3.md): the stream is cut into blocks of
 * `blockSize` layers, a snapshot is kept at each block start (layer L with L % blockSize = 0), and
 * each sublayer's input, and the final norm's, is a softmax-weighted mix of the snapshots and the
 * running sum of the current block (layer tensors `attn_res_*`, `mlp_res_*`; globals `out_res_*`).
 * `hyper`: hyper-connections (manifold-constrained, DeepSeek-V4): `streams` copies of the
 * residual, collapsed before each sublayer, its output spread back and the old streams mixed by
 * a doubly stochastic matrix (`sinkhornIters` Sinkhorn iterations, `eps` added where the
 * reference adds hc_eps); the hyper head (or their mean) collapses them before the final norm
 * (layer tensors `hc_attn_*`, `hc_ffn_*`; globals `hc_head_*`).
 */
export type ResidualConfig =
  | { kind: "attn_res"; blockSize: number }
  | {
    kind: "hyper";
    streams: number;
    sinkhornIters: number;
    eps: number;
    /**
     * How the streams become one before the final norm. Absent: the hyper head (DeepSeek-V4);
     * `mean`: their unweighted mean, no tensors (GLM-5.3-Flash).
     */
    collapse?: "mean";
  }
  | {
    /**
     * Sandwich norms (Gemma 4): the embedding rows × `embedScale`; each sublayer's output is
     * RMS-normed (`attn_post_norm`, `ffn_post_norm`) before it joins the stream, and after each
     * layer the whole stream is × the layer's `layer_scalar`.
     */
    kind: "sandwich";
    embedScale: number;
  };

/**
 * The gate of every gated MLP (dense, shared and routed experts). Absent: SwiGLU,
 * silu(gate) · up. `situ`: SiTU-GLU (Kimi K3), a gate and up capped by β1 = `beta` and
 * β2 = `linearBeta` (engine/reference/math.ts `situ`).
 */
export type GluConfig =
  | { kind: "situ"; beta: number; linearBeta: number }
  /** gelu_tanh(gate) · up with PyTorch's tanh-approximated GELU (Gemma's GeGLU). */
  | { kind: "gelu_tanh" };

/** Mixture-of-experts FFN, shared by all MoE layers of the model. */
export interface MoeConfig {
  numExperts: number;
  topK: number;
  /** Rows of one expert's gate/up matrices. */
  expertIntermediate: number;
  /**
   * softmax: Mixtral/Qwen3 (softmax over all experts, then top-k); sigmoid: DeepSeek-V3 and
   * GLM-4.5 (noaux_tc); topk_softmax: gpt-oss (top-k of the raw logits, then softmax over those k);
   * sqrtsoftplus: DeepSeek-V4 (sqrt(softplus(logit)), then as sigmoid).
   */
  scoring: "softmax" | "sigmoid" | "topk_softmax" | "sqrtsoftplus";
  /** Divide the chosen weights by their sum. */
  normTopK: boolean;
  /** Multiplies the routing weights after normalisation (DeepSeek: routed_scaling_factor). */
  routedScaling: number;
  /** Group-limited selection (1 group and topkGroup 1 = plain top-k). */
  nGroup: number;
  topkGroup: number;
  /** Whether a per-expert selection bias (e_score_correction_bias) exists. */
  selectionBias: boolean;
  /** Rows of the shared experts' gate/up, 0 when there are none (all shared experts as one MLP). */
  sharedIntermediate: number;
  /**
   * Latent MoE (Kimi K3's Stable LatentMoE): the routed experts work in this width; the layer
   * projects the input down once (`latent_down`), and RMS-norms (`latent_norm`) and projects the
   * weighted expert sum back up (`latent_up`). Absent: the experts read the hidden size.
   */
  latentDim?: number;
  /** gpt-oss: the router has a bias added to its logits (layer tensor `router_b`). */
  routerLogitBias?: boolean;
  /** gpt-oss: every expert matrix has a bias vector, stored in the expert's record. */
  expertBias?: boolean;
  /**
   * Qwen3-Next / Qwen3.5: the shared expert's output is scaled by σ(w·h), one learned vector `w`
   * per layer (layer tensor `shared_expert_gate`).
   */
  sharedExpertGate?: boolean;
  /**
   * gpt-oss's activation instead of silu(gate)·up: gate = min(gate, limit), up = clamp(up, ±limit),
   * (up + 1) · gate · σ(alpha · gate).
   */
  clampedSwiglu?: { limit: number; alpha: number };
  /**
   * DeepSeek-V4's clamp of every gated MLP (routed and shared experts): silu(min(gate, limit)) ·
   * clamp(up, ±limit).
   */
  swigluLimit?: number;
  /**
   * DeepSeek-V4's hash routing: the first `hashLayers` layers choose their experts by the token
   * id (layer tensor `router_tid2eid`, vocab × topK expert ids), the router only weights them.
   */
  hashLayers?: number;
  /**
   * The router reads the layer's residual stream x, not the normed input: unit RMSNorm(x) ×
   * `router_scale` × hidden^−½ (Gemma 4).
   */
  scaledRouterInput?: boolean;
  /** Each chosen weight is multiplied by its expert's `expert_scale` after renormalising. */
  expertScale?: boolean;
  /**
   * Every MoE layer also runs the dense MLP (intermediateSize rows) beside the experts: the dense
   * branch on `ffn_norm`(x), the experts on `moe_norm`(x), each output normed (`dense_post_norm`,
   * `moe_post_norm`) and the two summed (Gemma 4).
   */
  denseBeside?: boolean;
}

/** The gpt_oss family's attention extras. */
export interface AttentionExtras {
  /** One learned logit per query head in the softmax denominator (layer tensor `sinks`). */
  sinks: boolean;
  /** o_proj has a bias (layer tensor `bo`). */
  outputBias: boolean;
  /**
   * Per layer: 0 for full causal attention, else the sliding window W (a query sees itself and
   * the W − 1 positions before it); a sliding layer's KV cache holds only what its window needs.
   */
  windows: number[];
  /** Each value head takes an RMSNorm without weight before attention (Gemma 4). */
  valueNorm?: boolean;
  /**
   * The full-attention layers' (window 0) own geometry, where it differs from the model's
   * headDim / numKvHeads / rope (Gemma 4's global layers).
   */
  fullLayers?: FullLayerGeometry;
}

/** Head width, KV heads and RoPE of the full-attention layers of a model that has two kinds. */
export interface FullLayerGeometry {
  headDim: number;
  numKvHeads: number;
  rope: RopeConfig;
  /** No v_proj: the values are the keys as projected, before any norm or rotation. */
  kEqV: boolean;
}

/** Everything the engine needs to know about a model's math. */
export interface ModelConfig {
  /** The attention family, a key of the engine's registry (engine/models/mod.ts FAMILIES). */
  family: string;
  /** The checkpoint's model_type, kept for messages and export. */
  modelType: string;
  vocabSize: number;
  hiddenSize: number;
  numLayers: number;
  numHeads: number;
  numKvHeads: number;
  /** Per-head dimension of q/k/v for GQA models. */
  headDim: number;
  /** Rows of the dense FFN's gate/up (0 when no layer is dense). */
  intermediateSize: number;
  rmsNormEps: number;
  rope: RopeConfig;
  maxPositions: number;
  tieWordEmbeddings: boolean;
  /** Qwen3: per-head RMSNorm of q and k before RoPE. */
  qkNorm: boolean;
  /**
   * With qkNorm: one RMSNorm over each token's whole q projection (all heads together) and one
   * over its whole k projection, before the head split (MiniMax-M2); absent: one per head.
   */
  qkNormWhole?: boolean;
  /** Biases on q/k/v projections (Qwen2-style). */
  attentionBias: boolean;
  /** "dense" or "moe" for each layer, in order. */
  layerKinds: ("dense" | "moe")[];
  moe: MoeConfig | null;
  mla: MlaConfig | null;
  /** KDA layers (absent for families without them). */
  kda?: KdaConfig;
  /** Gated DeltaNet layers (absent for families without them). */
  gdn?: GatedDeltaNetConfig;
  /**
   * Every RMSNorm of the layer skeleton and the attention's q/k norms scale by (1 + w) instead
   * of w (Qwen3-Next, Qwen3.5); absent means w.
   */
  normUnitOffset?: boolean;
  /**
   * Gated attention (Qwen3-Next, Qwen3.5): q_proj holds, per head, the query then as many rows of
   * an output gate; the heads' values are multiplied by σ(gate) before o_proj.
   */
  attnOutputGate?: boolean;
  /** The residual stream's kind (absent: plain). */
  residual?: ResidualConfig;
  /** The gated MLPs' activation (absent: SwiGLU). */
  glu?: GluConfig;
  /** Softmax scale of attention scores, already including YaRN's mscale² where it applies. */
  attnScale: number;
  /** The gpt_oss family: sinks, o_proj bias, sliding windows (absent for the other families). */
  attention?: AttentionExtras;
  /** The final logits are soft-capped, c · tanh(logits / c), with this c (absent: none). */
  logitSoftcap?: number;
  /** DeepSeek-V4's compressed sparse attention on every layer (absent for other families). */
  csa?: CsaConfig;
  /** Multi-token-prediction layers the container keeps after the main ones (absent: none). */
  mtp?: MtpConfig;
  bosId: number | null;
  eosIds: number[];
}

/**
 * Canonical names of per-layer trunk tensors, as stored in the container, in the order a layer's
 * run lists them: the skeleton's attention norm, then every family's attention tensors, then the
 * skeleton's FFN and MoE tensors. Which of them a layer holds is its family's business
 * (engine/models/); a new family appends its new names to its part of the list.
 */
export const LAYER_TENSOR_ORDER = [
  "attn_norm",
  "wq",
  "wk",
  "wv",
  "wo",
  "bq",
  "bk",
  "bv",
  "bo",
  "sinks",
  "q_norm",
  "k_norm",
  // Gemma 4: the attention output's norm before the residual add.
  "attn_post_norm",
  "wq_a",
  "q_a_norm",
  "wq_b",
  "wkv_a",
  "kv_a_norm",
  "wkv_b",
  // GLM-5: DeepSeek Sparse Attention's lightning indexer.
  "idx_wq",
  "idx_wk",
  "idx_k_norm",
  "idx_k_bias",
  "idx_w",
  "idx_pool_ape",
  "idx_pool_gate",
  "q_conv",
  "k_conv",
  "v_conv",
  "f_a",
  "f_b",
  "dt_bias",
  "a_log",
  "beta_proj",
  "g_a",
  "g_b",
  "g_proj",
  "o_norm",
  // DeepSeek-V4's compressed sparse attention (wq_a, q_a_norm, wq_b, sinks above; engine/parts/csa.ts).
  "wkv",
  "kv_norm",
  "wo_a",
  "wo_b",
  "cmp_wkv",
  "cmp_wgate",
  "cmp_ape",
  "cmp_norm",
  "idx_wq_b",
  "idx_weights",
  "idx_wkv",
  "idx_wgate",
  "idx_ape",
  "idx_norm",
  // Gated DeltaNet: the fused q/k/v projection (flat) or q/k/v/z (grouped per key head), the
  // output gate z, β and decay inputs (flat: b and a; grouped: ba), the conv over q/k/v.
  "gdn_qkv",
  "gdn_qkvz",
  "gdn_z",
  "gdn_b",
  "gdn_a",
  "gdn_ba",
  "qkv_conv",
  // Kimi K3: the attention's Attention Residual.
  "attn_res_norm",
  "attn_res_proj",
  // Hyper-connections: the weights before the attention.
  "hc_attn_fn",
  "hc_attn_base",
  "hc_attn_scale",
  "ffn_norm",
  "ffn_gate",
  "ffn_up",
  "ffn_down",
  "router",
  "router_bias",
  "router_b",
  "router_tid2eid",
  // Gemma 4: the router's input scale and per-expert scale, the experts' branch norms beside the
  // dense MLP's, the feed-forward output's norm and the residual stream's scalar.
  "router_scale",
  "expert_scale",
  "dense_post_norm",
  "moe_norm",
  "moe_post_norm",
  "ffn_post_norm",
  "layer_scalar",
  "shared_gate",
  "shared_up",
  "shared_down",
  "shared_expert_gate",
  // Kimi K3: the MLP's Attention Residual and the latent MoE's projections and norm.
  "mlp_res_norm",
  "mlp_res_proj",
  "latent_down",
  "latent_norm",
  "latent_up",
  // Hyper-connections: the weights before the feed-forward.
  "hc_ffn_fn",
  "hc_ffn_base",
  "hc_ffn_scale",
  // MTP layers: the norms of the token's embedding and of the hidden state, the projection of
  // their concatenation, and the norm before the shared LM head.
  "mtp_enorm",
  "mtp_hnorm",
  "mtp_proj",
  "mtp_head_norm",
] as const;

/** One of {@link LAYER_TENSOR_ORDER}. */
export type LayerTensor = typeof LAYER_TENSOR_ORDER[number];

/**
 * Head width, KV heads, RoPE and k = v of layer `layer`'s attention: the full layers' own
 * (`attention.fullLayers`, Gemma 4) where the model has them, else the model's.
 */
export function layerGeometry(cfg: ModelConfig, layer: number): FullLayerGeometry {
  const full = cfg.attention?.fullLayers;
  if (full && (cfg.attention?.windows[layer] ?? 0) === 0) return full;
  return { headDim: cfg.headDim, numKvHeads: cfg.numKvHeads, rope: cfg.rope, kEqV: false };
}

/**
 * The multi-token-prediction (MTP) layers a checkpoint ships (DeepSeek-V3 tech report §2.2):
 * layer numLayers + j is a full decoder layer (the mixer `mixerOf` gives it, a MoE feed-forward
 * when the model has one) with its own norms of the embedding and of the hidden state, the
 * projection of their concatenation, and a norm before the shared LM head. The main pass never
 * runs them; they draft (engine/speculate.ts).
 */
export interface MtpConfig {
  /** How many; layer indices numLayers .. numLayers + layers − 1. */
  layers: number;
}

/** Indices of a config's MTP layers (none without an `mtp` section). */
export function mtpLayerIds(cfg: ModelConfig): number[] {
  return Array.from({ length: cfg.mtp?.layers ?? 0 }, (_, j) => cfg.numLayers + j);
}

/**
 * How many of a model's MTP layers a run with MTP drafts loads, plans and runs: the first; a
 * chain of drafts reuses it, as vLLM runs one MTP layer for k drafts.
 */
export const MTP_DRAFT_LAYERS = 1;

/** Indices of the MTP layers a run with MTP drafts loads ({@link MTP_DRAFT_LAYERS}). */
export function mtpDraftLayerIds(cfg: ModelConfig): number[] {
  return mtpLayerIds(cfg).slice(0, MTP_DRAFT_LAYERS);
}

/** "dense" or "moe" of any layer, MTP layers (MoE when the model has experts) included. */
export function layerKindOf(cfg: ModelConfig, layer: number): "dense" | "moe" {
  if (layer < cfg.numLayers) return cfg.layerKinds[layer];
  return cfg.moe ? "moe" : "dense";
}

/** Whether `layer` is a KDA (linear-attention) layer. */
export function isKdaLayer(cfg: ModelConfig, layer: number): boolean {
  return cfg.kda?.layers[layer] ?? false;
}

/** Canonical names of the tensors outside the layers. */
export type GlobalTensor =
  | "embed"
  | "final_norm"
  | "lm_head"
  // Kimi K3: the model-level Attention Residual over the block snapshots.
  | "out_res_norm"
  | "out_res_proj"
  // Hyper-connections: the hyper head that collapses the streams before the final norm.
  | "hc_head_fn"
  | "hc_head_base"
  | "hc_head_scale";

/** The three matrices of one expert, in record order (gpt-oss's biases follow them). */
export const EXPERT_MATRICES = ["gate", "up", "down"] as const;

/** One of {@link EXPERT_MATRICES}. */
export type ExpertMatrix = typeof EXPERT_MATRICES[number];

/** Container name of a per-layer trunk tensor, e.g. `layers.3.wq`. */
export function layerTensorName(layer: number, tensor: LayerTensor): string {
  return `layers.${layer}.${tensor}`;
}

/** The global tensors a model has, in container order (Attention Residuals add their output mix). */
export function globalTensorsOf(cfg: ModelConfig): GlobalTensor[] {
  return [
    "embed",
    "final_norm",
    ...(cfg.tieWordEmbeddings ? [] : ["lm_head" as const]),
    ...(cfg.residual?.kind === "attn_res"
      ? ["out_res_norm" as const, "out_res_proj" as const]
      : []),
    ...(cfg.residual?.kind === "hyper" && cfg.residual.collapse !== "mean"
      ? ["hc_head_fn" as const, "hc_head_base" as const, "hc_head_scale" as const]
      : []),
  ];
}

/** Width of the vectors routed experts read and write: the hidden size, or the latent width. */
export function expertWidth(cfg: ModelConfig): number {
  return cfg.moe?.latentDim ?? cfg.hiddenSize;
}

/** The kinds of token mixer a layer may run (engine/parts/, engine/reference/mixers.ts). */
export type MixerName = "gqa" | "mla" | "kda" | "csa" | "gdn";

/**
 * The token mixer of layer `layer`, from the config's sections: a KDA layer where `kda.layers`
 * says so, a Gated DeltaNet layer where `gdn.layers` does, else compressed sparse attention with
 * a `csa` section, MLA with an `mla` section, else grouped-query attention.
 */
export function mixerOf(cfg: ModelConfig, layer: number): MixerName {
  if (cfg.kda?.layers[layer]) return "kda";
  if (cfg.gdn?.layers[layer]) return "gdn";
  if (cfg.csa) return "csa";
  return cfg.mla ? "mla" : "gqa";
}
