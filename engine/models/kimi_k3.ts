/**
 * The Kimi K3 family (`KimiK3ForConditionalGeneration`, ../shared/K3.md): layers alternate
 * between Kimi Delta Attention and gated NoPE MLA (engine/models/deepseek_v3.ts with rope.dim 0
 * and its output gate). The FFN side (SiTU-GLU, Stable LatentMoE) is in engine/ffn.ts and the
 * Attention Residuals in the layer skeleton (engine/transformer.ts); this file picks each layer's
 * attention and sizes the family's state for the planner.
 *
 * @module
 */
import { alignUp } from "../../io/format.ts";
import type { ModelConfig } from "../../io/model_config.ts";
import { type Arena, PAGE } from "../arena.ts";
import type { Ops } from "../ops.ts";
import type { Attention } from "../transformer.ts";
import type { LayerWeights } from "../weights.ts";
import { MlaAttention } from "./deepseek_v3.ts";

/** Each layer's attention: KDA or gated MLA, as `cfg.k3.attention` says. */
export class KimiK3Attention implements Attention {
  #cfg: ModelConfig;
  #mla: MlaAttention;
  #kda: Attention | null;

  constructor(ops: Ops, arena: Arena, cfg: ModelConfig, maxBatch: number, maxCtx: number) {
    if (!cfg.k3) throw new Error(`${cfg.modelType}: Kimi K3 attention needs the k3 config`);
    this.#cfg = cfg;
    this.#mla = new MlaAttention(ops, arena, cfg, maxBatch, maxCtx);
    this.#kda = cfg.k3.attention.includes("kda") ? kdaAttention(cfg) : null;
  }

  /** out = attention of `layer` on h for `nb` tokens at positions pos... */
  forward(layer: number, lw: LayerWeights, h: number, out: number, nb: number, pos: number): void {
    if (this.#cfg.k3!.attention[layer] === "mla") {
      this.#mla.forward(layer, lw, h, out, nb, pos);
    } else this.#kda!.forward(layer, lw, h, out, nb, pos);
  }
}

/** KDA comes from the kimi_linear family (branch `kimi`), extended for K3's decay and gate. */
function kdaAttention(cfg: ModelConfig): Attention {
  throw new Error(
    `${cfg.modelType}: layer(s) ${
      cfg.k3!.attention.flatMap((a, l) => a === "kda" ? [l] : []).join(", ")
    } use Kimi Delta Attention, which this build cannot run yet`,
  );
}

/** Bytes of the per-context state: the MLA layers' latent caches and the KDA layers' state. */
export function kimiK3StateBytes(cfg: ModelConfig, ctx: number): number {
  const k3 = cfg.k3!, mla = cfg.mla!;
  const { numHeads: H, headDim: D, convKernel: K } = k3.kda;
  let bytes = 0;
  for (const a of k3.attention) {
    bytes += a === "mla"
      ? alignUp(ctx * (mla.kvLoraRank + mla.qkRopeHeadDim) * 4, PAGE)
      // The recurrent state S (H × D × D) and the last K − 1 pre-conv q, k, v inputs.
      : alignUp((H * D * D + 3 * H * D * (K - 1)) * 4, PAGE);
  }
  return bytes;
}

/**
 * Bytes of K3's own scratch for a prefill chunk of `maxBatch`: the Attention Residual snapshots
 * and input, the latent MoE's input and sum, the MLA output gate and KDA's per-token vectors.
 */
export function kimiK3ScratchBytes(cfg: ModelConfig, maxBatch: number): number {
  const k3 = cfg.k3!, d = cfg.hiddenSize;
  const blocks = Math.ceil(cfg.numLayers / k3.attnResBlockSize);
  const P = k3.kda.numHeads * k3.kda.headDim;
  const floats = maxBatch * (blocks * d + d + 2 * k3.latentDim) + blocks + 1 +
    maxBatch * cfg.numHeads * cfg.mla!.vHeadDim +
    // q, k, v before and after the conv, the decay, the gate and the output; beta.
    maxBatch * (9 * P + k3.kda.numHeads + k3.kda.headDim);
  return alignUp(floats * 4, PAGE) + 16 * PAGE;
}
