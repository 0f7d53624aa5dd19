/**
 * The Kimi K3 family (`KimiK3ForConditionalGeneration`, ../shared/K3.md). Its attention is the
 * Kimi-Linear one (engine/models/kimi_linear.ts: KDA layers and NoPE MLA layers) with what the
 * K3 config switches on there: KDA's lower-bounded decay and full-rank output gate
 * (engine/kda.ts), and MLA's output gate (engine/models/deepseek_v3.ts). Its FFN is Stable
 * LatentMoE with SiTU-GLU (engine/ffn.ts), and its residual stream Attention Residuals (the layer
 * skeleton, engine/transformer.ts). This file sizes K3's own scratch for the planner.
 *
 * @module
 */
import { alignUp } from "../../io/format.ts";
import type { ModelConfig } from "../../io/model_config.ts";
import { PAGE } from "../arena.ts";

/**
 * Bytes of K3's own scratch for a prefill chunk of `maxBatch`: the Attention Residual snapshots,
 * mixed input and scores, the latent MoE's input and sum, and the MLA output gate.
 */
export function kimiK3ScratchBytes(cfg: ModelConfig, maxBatch: number): number {
  const k3 = cfg.k3;
  if (!k3) return 0;
  const d = cfg.hiddenSize;
  const blocks = Math.ceil(cfg.numLayers / k3.attnResBlockSize);
  const floats = maxBatch * (blocks * d + d + 2 * k3.latentDim) + blocks + 1 +
    maxBatch * cfg.numHeads * cfg.mla!.vHeadDim;
  // Six regions, each rounded up to a page.
  return alignUp(floats * 4, PAGE) + 6 * PAGE;
}
