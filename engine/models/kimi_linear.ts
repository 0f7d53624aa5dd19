/**
 * The Kimi-Linear family (`KimiLinearForCausalLM`): a hybrid of KDA layers (engine/kda.ts,
 * fixed-size recurrent state) and full-attention MLA layers without rotary (NoPE, the DeepSeek
 * family's absorbed latent attention with its latent cache), chosen per layer by
 * `linear_attn_config`. The FFN side (dense first layer, sigmoid routing with the correction
 * bias, routed scaling, shared expert) is the shared one of engine/ffn.ts.
 *
 * @module
 */
import type { Arena } from "../arena.ts";
import { KdaAttention } from "../kda.ts";
import { isKdaLayer, type ModelConfig } from "../../io/model_config.ts";
import type { Ops } from "../ops.ts";
import type { Attention } from "../transformer.ts";
import type { LayerWeights } from "../weights.ts";
import { MlaAttention } from "./deepseek_v3.ts";

/** Each layer's attention: KDA or NoPE MLA. */
export class KimiLinearAttention implements Attention {
  #cfg: ModelConfig;
  #kda: KdaAttention;
  #mla: MlaAttention;

  constructor(ops: Ops, arena: Arena, cfg: ModelConfig, maxBatch: number, maxCtx: number) {
    this.#cfg = cfg;
    this.#kda = new KdaAttention(ops, arena, cfg, maxBatch);
    this.#mla = new MlaAttention(ops, arena, cfg, maxBatch, maxCtx);
  }

  /** Runs layer `layer`'s own kind of attention. */
  forward(layer: number, lw: LayerWeights, h: number, out: number, nb: number, pos: number): void {
    if (isKdaLayer(this.#cfg, layer)) this.#kda.forward(layer, lw, h, out, nb, pos);
    else this.#mla.forward(layer, lw, h, out, nb, pos);
  }
}
