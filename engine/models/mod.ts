/**
 * One file per architecture family: each supplies the attention half of its layers; the shared
 * layer skeleton is engine/transformer.ts.
 *
 * @module
 */
import type { Arena } from "../arena.ts";
import type { ModelConfig } from "../../io/model_config.ts";
import type { Ops } from "../ops.ts";
import type { Attention } from "../transformer.ts";
import { MlaAttention } from "./deepseek_v3.ts";
import { KimiLinearAttention } from "./kimi_linear.ts";
import { GqaAttention } from "./llama.ts";

/** The attention of `cfg.family`, with its KV cache allocated in `arena`. */
export function createAttention(
  ops: Ops,
  arena: Arena,
  cfg: ModelConfig,
  maxBatch: number,
  maxCtx: number,
): Attention {
  switch (cfg.family) {
    case "llama":
      return new GqaAttention(ops, arena, cfg, maxBatch, maxCtx);
    case "deepseek_v3":
      return new MlaAttention(ops, arena, cfg, maxBatch, maxCtx);
    case "kimi_linear":
    case "kimi_k3":
      // K3's attention is Kimi-Linear's (KDA + NoPE MLA) with its bounded decay, full-rank gate
      // and MLA output gate switched on by the config.
      return new KimiLinearAttention(ops, arena, cfg, maxBatch, maxCtx);
  }
}
