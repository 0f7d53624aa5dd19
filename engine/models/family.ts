/**
 * What one family file (engine/models/<family>.ts) provides, and what one model_type entry of
 * the registry (engine/models/mod.ts) is. Three names, one meaning each:
 * - model_type: the Hugging Face `model_type` of a checkpoint (`mixtral`, `kimi_k2`);
 * - family: the tensor naming and config sections a model_type shares with others (`llama`:
 *   GQA models, `deepseek_v3`: MLA models); stored as `config.family` in the manifest;
 * - llama.cpp arch: the GGUF `general.architecture` the developers' GGUF export writes.
 *
 * docs/ENGINE.md "Adding a model family" lists the steps.
 *
 * @module
 */
import type { GlobalTensor, LayerTensor, ModelConfig } from "../../io/model_config.ts";
import type { Json, Normaliser } from "./hf_config.ts";

/** Hugging Face naming of a model_type's MoE block, relative to `model.layers.N.`. */
export interface MoeNaming {
  /** Prefix of the MoE block (router, experts, shared experts). */
  moe: string;
  /** Expert matrix names inside `experts.E.`. */
  expert: Record<"gate" | "up" | "down", string>;
  /** The router's module name inside the MoE block (default `gate`). */
  router?: string;
  /**
   * The selection bias's name inside the MoE block (default `gate.e_score_correction_bias`;
   * MiniMax-M2 keeps it beside the router).
   */
  selectionBias?: string;
  /** gpt-oss: all experts of a layer in fused MXFP4 tensors (`_blocks`/`_scales`/`_bias`). */
  fused?: boolean;
  /**
   * Qwen3.5 and Gemma 4: all experts of a layer stacked in two plain tensors without a `.weight`
   * suffix, `experts.gate_up_proj` [E, 2I, H] (each expert's gate rows, then its up rows) and
   * `experts.down_proj` [E, H, I] (engine/tensor_names.ts `hfFusedExpertSlice`).
   */
  stacked?: boolean;
  /** The shared experts' module inside the MoE block (default `shared_experts`). */
  shared?: string;
}

/** The MTP layers' own tensors (io/model_config.ts `MtpConfig`). */
export type MtpTensor = "mtp_enorm" | "mtp_hnorm" | "mtp_proj" | "mtp_head_norm";

/**
 * How a model_type's checkpoints name their multi-token-prediction layers: DeepSeek-V3 and GLM
 * as layers numLayers + j (`enorm`, `hnorm`, `eh_proj`, `shared_head.norm` beside a decoder
 * layer's tensors), Qwen3-Next and Qwen3.5 under `mtp.` (`pre_fc_norm_embedding`,
 * `pre_fc_norm_hidden`, `fc`, `norm`, and the decoder layer `mtp.layers.j.`).
 */
export interface MtpNaming {
  /** Checkpoint name prefix (ending in a dot) of MTP layer j's decoder layer. */
  block(cfg: ModelConfig, j: number): string;
  /** Full checkpoint name of MTP layer j's own tensor `t`. */
  own(cfg: ModelConfig, j: number, t: MtpTensor): string;
  /** Its routed experts are one tensor per expert even where the main layers stack them. */
  perExpert?: boolean;
  /** A {@link ModelType.skipped} prefix that is the MTP block: packed, so not reported. */
  skippedPrefix?: string;
}

/** One supported Hugging Face model_type. */
export interface ModelType {
  /** The family whose math it runs. */
  family: Family;
  /** config.json → ModelConfig (bos/eos are filled in by engine/config.ts). */
  normalise: Normaliser;
  /** How its checkpoints name the MoE block. */
  naming: MoeNaming;
  /** `architectures` entries that mean this model_type in configs without a model_type. */
  architectures: readonly string[];
  /** llama.cpp's architecture name, when the GGUF export supports this model_type. */
  llamaCppArch?: string;
  /** Prefix of every checkpoint name but the LM head's (default `model.`). */
  prefix?: string;
  /** Checkpoint name of the untied LM head (default `lm_head.weight`). */
  lmHead?: string;
  /**
   * Full checkpoint names of global tensors that do not follow the Hugging Face layout
   * (DeepSeek's original names: `embed.weight`, `head.weight`).
   */
  globalNames?: Partial<Record<GlobalTensor, string>>;
  /**
   * Checkpoint name prefixes of parts sluice does not run, with what they are (Qwen3.5's
   * `mtp.` and `model.visual.`): pack skips them with a notice.
   */
  skipped?: Readonly<Record<string, string>>;
  /** How its MTP layers are named, when pack keeps them (absent: MTP layers are skipped). */
  mtp?: MtpNaming;
}

/**
 * One family: how its checkpoints name the tensors of the layer parts its config chooses (the
 * mixer of each layer by io/model_config.ts `mixerOf`, the feed-forward by `layerKinds`, the
 * residual stream by `residual`; the parts themselves are engine/parts/), and the check of its
 * own sections of a stored config.
 */
export interface Family {
  /** The name stored as `config.family`. */
  readonly name: string;
  /**
   * The mixer's trunk tensors that layer `layer` of `cfg` holds, and any tensors of the family's
   * own parts (a residual stream's, a latent MoE's), each with its Hugging Face name relative to
   * `model.layers.N.` (norms, FFN and router are named by engine/tensor_names.ts from the
   * model_type's {@link MoeNaming}, unless the family names them: its names come first). A hybrid
   * returns each layer kind's own set.
   */
  attentionTensors(cfg: ModelConfig, layer: number): Partial<Record<LayerTensor, string>>;
  /**
   * true: {@link attentionTensors} names every tensor of a layer, the skeleton's norms, router
   * and shared experts included (checkpoints in a model's original, non-Hugging Face naming).
   */
  readonly namesEveryTensor?: boolean;
  /**
   * Checks the family's own parts of a stored config (its sections such as `mla`, and that the
   * sections of other families are absent). `where` names the manifest field.
   */
  validateConfig(config: Json, where: string): void;
}
