/**
 * What one family file (engine/models/<family>.ts) provides, and what one model_type entry of
 * the registry (engine/models/mod.ts) is. Three names, one meaning each:
 * - model_type: the Hugging Face `model_type` of a checkpoint (`mixtral`, `kimi_k2`);
 * - family: the attention math a model_type runs (`llama` = GQA, `deepseek_v3` = MLA); stored as
 *   `config.family` in the manifest;
 * - llama.cpp arch: the GGUF `general.architecture` the developers' GGUF export writes.
 *
 * docs/ENGINE.md "Adding a model family" lists the steps.
 *
 * @module
 */
import type { TensorSpec } from "../../io/manifest.ts";
import type { LayerTensor, ModelConfig } from "../../io/model_config.ts";
import type { Arena } from "../arena.ts";
import type { Ops } from "../ops.ts";
import type { ReferenceAttention } from "../reference/forward.ts";
import type { Attention } from "../transformer.ts";
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
   * gpt-oss: all experts of a layer in fused MXFP4 tensors (engine/tensor_names.ts
   * `hfFusedExpertSlice`) instead of one tensor per expert and matrix.
   */
  fused?: boolean;
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
}

/**
 * One attention family: the half of a layer that differs between families. The rest of a layer
 * (norms, residuals, dense FFN, MoE) is the shared skeleton, engine/transformer.ts and ffn.ts.
 */
export interface Family {
  /** The name stored as `config.family`. */
  readonly name: string;
  /**
   * The family's trunk tensors that layer `layer` of `cfg` holds, each with its Hugging Face name
   * relative to `model.layers.N.` (norms, FFN and router are the skeleton's). Layers may differ:
   * a hybrid family returns each layer kind's own set.
   */
  attentionTensors(cfg: ModelConfig, layer: number): Partial<Record<LayerTensor, string>>;
  /**
   * The shape of each attention tensor `attentionTensors` names for layer `layer` ([rows, cols]
   * as in PyTorch, [n] for a vector; a full spec where the shape is looser), derived from the
   * config: engine/tensor_shapes.ts checks checkpoints (at pack) and manifests (at open) against
   * it. Anything but a 2-D shape is stored as an f32 vector.
   */
  attentionShape(cfg: ModelConfig, t: LayerTensor, layer: number): number[] | TensorSpec;
  /**
   * Checks the family's own parts of a stored config (its sections such as `mla`, and that the
   * sections of other families are absent). `where` names the manifest field.
   */
  validateConfig(config: Json, where: string): void;
  /**
   * Bytes of layer `layer`'s KV cache or recurrent state for `ctx` positions and prefill chunks
   * of up to `maxBatch` tokens (for the planner).
   */
  stateBytes(cfg: ModelConfig, layer: number, ctx: number, maxBatch: number): number;
  /** Floats of attention scratch for a batch of `maxBatch` tokens (for the planner). */
  scratchFloats(cfg: ModelConfig, maxBatch: number): number;
  /** Bytes the attention allocates once per model besides state and scratch (for the planner). */
  persistentBytes(cfg: ModelConfig): number;
  /** The engine's attention of every layer, with its state and scratch allocated in `arena`. */
  createAttention(
    ops: Ops,
    arena: Arena,
    cfg: ModelConfig,
    maxBatch: number,
    maxCtx: number,
  ): Attention;
  /** The float64 reference of the same attention (engine/reference/), the engine's oracle. */
  reference: ReferenceAttention;
}
