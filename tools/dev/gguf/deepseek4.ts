/**
 * DeepSeek-V4 (`deepseek_v4`) as llama.cpp's `deepseek4` reads it: the tensor names, shapes, types
 * and hyper-parameters of the GGUF that node-llama-cpp 3.21.1's llama.cpp (tag v0.4.0; its
 * src/models/deepseek4.cpp, src/llama-kv-cache-dsv4.cpp and converter conversion/deepseek.py)
 * loads. tools/dev/export_gguf.ts calls {@link checkDeepseek4}, {@link deepseek4Tensors} and
 * {@link deepseek4Keys} for this architecture.
 *
 * What llama.cpp v0.4.0 computes, checked against transformers 5.18's `DeepseekV4ForCausalLM`
 * (the project's reference): hyper-connections (4 streams only; Sinkhorn after a row softmax with
 * one column pass first, comb applied transposed, the hyper head), shared-KV MQA with RoPE on the
 * trailing `rope.dimension_count` dims in interleaved pairs and the output rotated back, the
 * per-head sink, the window, plain RoPE on window-only layers and YaRN on `compress_rope_freq_base`
 * (attention factor cancelled to 1) on CSA/HCA layers, the overlapping ratio-4 compressor and the
 * ratio-128 one, the indexer (weights scaled by 1/sqrt(heads · head_dim), ReLU, top-k of the
 * entries), the grouped output projection, hash routing from `ffn_gate_tid2eid` on the first
 * `hash_layer_count` layers (the gate only weights them), sqrt(softplus) with the selection bias
 * elsewhere, renormalised and scaled weights, the shared expert and silu(min(g, L)) ·
 * clamp(u, ±L). The same function, with two documented differences: the renormalisation clamps
 * the sum at 6.1e-5 where transformers adds 1e-20 (no difference for sqrt(softplus) scores), and
 * the indexer's queries and keys are multiplied by a Hadamard matrix first (an orthogonal map, so
 * the same scores up to rounding) whose size is at least 64 and must divide `index_head_dim`:
 * with a smaller or odd head (tiny-deepseek-v4's 16) llama.cpp stops on an assertion, so the
 * export is refused.
 *
 * Types: routed experts follow the requested type; with `mxfp4` they are ggml MXFP4, and experts
 * the source stores as FP4 (e2m1 pairs, low nibble first, one E8M0 scale per 32 inputs) are
 * repacked bit for bit, not re-encoded: ggml's block keeps the same E8M0 byte and the same 4-bit
 * codes, only with element j in the low nibble and j + 16 in the high nibble of byte j. The rest
 * of an `mxfp4` file is llama.cpp's converter's recipe: FP8 matrices Q8_0 (lossy, 34 bytes per
 * 32 weights against FP8's 32 plus scales, so llama.cpp reads about the bytes sluice reads), other
 * matrices BF16; but the grouped output projection's first half (`attn_output_a`) BF16 (exact),
 * because llama.cpp v0.4.0 cannot multiply it as a Q8_0 weight on a CPU with AMX-INT8. An exact export of the release storage is `bf16` (E4M3 × a power of two, BF16 and
 * E2M1 × a power of two are all BF16 values) or `f32`. Routers, hyper-connection weights,
 * compressor position biases and all vectors stay F32, `tid2eid` is I32.
 *
 * @module
 */
import { existsSync } from "node:fs";
import { join } from "node:path";
import { readExpertRecord } from "../../../io/container.ts";
import {
  EXPERT_MATRICES,
  type ExpertMatrix,
  type GlobalTensor,
  type LayerTensor,
  type ModelConfig,
} from "../../../io/model_config.ts";
import { openCheckpoint } from "../../../io/safetensors.ts";
import { findExpertMatrix, MXFP4_PACKED, readPacked } from "../../../engine/checkpoint_matrix.ts";
import { openContainer } from "../../../engine/container.ts";
import type { FloatWeights } from "../../../engine/float_weights.ts";
import { hfLayerName, layerTensorsOf } from "../../../engine/tensor_names.ts";
import type { GgmlTypeName, GgufValue } from "./format.ts";
import type { EncodableType } from "./quant.ts";
import type { GgufTensorSpec } from "./write.ts";

/** llama.cpp's names (under `blk.N.`) of the deepseek_v4 layer tensors. */
const LAYER: Partial<Record<LayerTensor, string>> = {
  attn_norm: "attn_norm.weight",
  ffn_norm: "ffn_norm.weight",
  wq_a: "attn_q_a.weight",
  q_a_norm: "attn_q_a_norm.weight",
  wq_b: "attn_q_b.weight",
  wkv: "attn_kv.weight",
  kv_norm: "attn_kv_a_norm.weight",
  wo_a: "attn_output_a.weight",
  wo_b: "attn_output_b.weight",
  sinks: "attn_sinks.weight",
  hc_attn_fn: "hc_attn_fn.weight",
  hc_attn_base: "hc_attn_base.weight",
  hc_attn_scale: "hc_attn_scale.weight",
  hc_ffn_fn: "hc_ffn_fn.weight",
  hc_ffn_base: "hc_ffn_base.weight",
  hc_ffn_scale: "hc_ffn_scale.weight",
  cmp_wkv: "attn_compressor_kv.weight",
  cmp_wgate: "attn_compressor_gate.weight",
  cmp_ape: "attn_compressor_ape.weight",
  cmp_norm: "attn_compressor_norm.weight",
  idx_wq_b: "indexer.attn_q_b.weight",
  idx_weights: "indexer.proj.weight",
  idx_wkv: "indexer_compressor_kv.weight",
  idx_wgate: "indexer_compressor_gate.weight",
  idx_ape: "indexer_compressor_ape.weight",
  idx_norm: "indexer_compressor_norm.weight",
  router: "ffn_gate_inp.weight",
  router_bias: "exp_probs_b.bias",
  router_tid2eid: "ffn_gate_tid2eid.weight",
  shared_gate: "ffn_gate_shexp.weight",
  shared_up: "ffn_up_shexp.weight",
  shared_down: "ffn_down_shexp.weight",
};

/** llama.cpp's names of the global tensors. */
const GLOBAL: Partial<Record<GlobalTensor, string>> = {
  embed: "token_embd.weight",
  final_norm: "output_norm.weight",
  lm_head: "output.weight",
  hc_head_fn: "output_hc_fn.weight",
  hc_head_base: "output_hc_base.weight",
  hc_head_scale: "output_hc_scale.weight",
};

/** llama.cpp's ggml names of the routed experts' matrices. */
const EXPERTS: Record<ExpertMatrix, string> = {
  gate: "ffn_gate_exps.weight",
  up: "ffn_up_exps.weight",
  down: "ffn_down_exps.weight",
};

/** Matrices kept F32 whatever the type (the release stores these F32, or they route). */
const F32_ONLY = /(ffn_gate_inp|hc_(attn|ffn)_fn|output_hc_fn|_ape)\.weight$/;

/** llama_expert_gating_func_type's LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS. */
const GATING_SQRT_SOFTPLUS = 4;

/** The Hadamard size llama.cpp rotates the indexer with (llama_kv_cache::build_input_k_rot). */
function hadamardOf(headDim: number): number {
  let n = 64;
  do n *= 2; while (headDim % n === 0);
  return n / 2;
}

/**
 * Refuses (through `fail`) a deepseek_v4 model llama.cpp v0.4.0's deepseek4 cannot run, naming
 * the config key.
 */
export function checkDeepseek4(cfg: ModelConfig, fail: (why: string) => never): void {
  const csa = cfg.csa, moe = cfg.moe, hc = cfg.residual;
  if (!csa || !moe || hc?.kind !== "hyper" || hc.collapse) {
    return fail("deepseek4 needs the deepseek_v4 config (hyper head, CSA layers, MoE)");
  }
  // graph::build_hc_pre asserts four streams.
  if (hc.streams !== 4) fail(`llama.cpp's deepseek4 runs hc_mult 4, not ${hc.streams}`);
  if (moe.sharedIntermediate % moe.expertIntermediate) {
    fail("n_shared_experts must give the shared expert a whole number of experts' width");
  }
  const ih = csa.indexer.headDim;
  if (csa.layers.some((l) => l.indexed) && ih % 64) {
    fail(
      `llama.cpp's deepseek4 rotates the indexer's queries and keys with a Hadamard matrix of ` +
        `${hadamardOf(ih)} rows, which needs index_head_dim a multiple of 64 (it is ${ih}; ` +
        `llama.cpp v0.4.0 stops on ggml_reshape_2d's assertion in llama_mul_mat_hadamard)`,
    );
  }
}

/** One output tensor: its spec, a sort key and its data (f32 rows, or bytes already in type). */
export interface Deepseek4Tensor {
  spec: GgufTensorSpec;
  key: string;
  chunks: () => Iterable<Float32Array | Uint8Array>;
}

/** What {@link deepseek4Tensors} plans. */
export interface Deepseek4Plan {
  tensors: Deepseek4Tensor[];
  /** Tensor name → type, for the matrices not written as asked for lack of whole Q8_0 blocks. */
  fallbacks: Record<string, GgmlTypeName>;
}

/**
 * ggml block_mxfp4 bytes of a matrix stored as sluice's / DeepSeek's FP4 (`data` [rows, cols/2],
 * element 2i in the low nibble of byte i; `scale` [rows, cols/32] E8M0): the same codes and scale
 * bytes, element j of a block in the low nibble of byte j and j + 16 in its high nibble.
 */
export function mxfp4ToGgml(data: Uint8Array, scale: Uint8Array, what: string): Uint8Array {
  const blocks = scale.length;
  if (data.length !== blocks * 16) {
    throw new Error(`${what}: ${data.length} FP4 bytes for ${blocks} scale bytes (16 per scale)`);
  }
  const out = new Uint8Array(blocks * 17);
  const code = (b: number, k: number) => (data[b * 16 + (k >> 1)] >> ((k & 1) * 4)) & 15;
  for (let b = 0; b < blocks; b++) {
    out[b * 17] = scale[b];
    for (let j = 0; j < 16; j++) out[b * 17 + 1 + j] = code(b, j) | (code(b, j + 16) << 4);
  }
  return out;
}

/** How the source stores things: FP4 expert bytes when it keeps them, and FP8 trunk matrices. */
interface SourceStorage {
  /** The FP4 data and scale bytes of one expert matrix, or null when not stored as FP4. */
  fp4(l: number, e: number, m: ExpertMatrix): { data: Uint8Array; scale: Uint8Array } | null;
  /** Whether layer tensor `t` of layer `l` is stored as FP8 E4M3. */
  fp8(l: number, t: LayerTensor): boolean;
}

/** The hyper-connection config of a deepseek_v4 model. */
function hyperOf(cfg: ModelConfig): { streams: number; sinkhornIters: number; eps: number } {
  const r = cfg.residual;
  if (r?.kind !== "hyper") throw new Error("deepseek4: the model has no hyper-connections");
  return r;
}

function storageOf(src: FloatWeights): SourceStorage {
  const cfg = src.cfg;
  if (existsSync(join(src.dir, "manifest.json"))) {
    const c = openContainer(src.dir);
    return {
      fp4(l, e, m) {
        const entry = c.manifest.experts[l]?.matrices[m];
        if (entry?.dtype !== "mxfp4" || !entry.scale) return null;
        const rec = readExpertRecord(c, l, e).record;
        return {
          data: rec.subarray(entry.offset, entry.offset + entry.bytes),
          scale: rec.subarray(entry.scale.offset, entry.scale.offset + entry.scale.bytes),
        };
      },
      fp8: (l, t) => c.manifest.trunk.layers[l]?.tensors[t]?.dtype === "f8_e4m3",
    };
  }
  const ckpt = openCheckpoint(src.dir);
  return {
    fp4(l, e, m) {
      const s = findExpertMatrix(ckpt, cfg, l, e, m);
      return s.dtype === MXFP4_PACKED ? readPacked(ckpt, s) : null;
    },
    fp8: (l, t) => ckpt.tensors.get(hfLayerName(cfg, l, t) ?? "")?.dtype === "F8_E4M3",
  };
}

/**
 * The GGUF tensors of deepseek_v4 model `src` as `want` (the export's matrix type; `mxfp4`: the
 * recipe in the module comment). The MTP layer is not exported.
 */
export function deepseek4Tensors(
  src: FloatWeights,
  want: EncodableType,
  mxfp4: boolean,
): Deepseek4Plan {
  const cfg = src.cfg, H = cfg.hiddenSize, V = cfg.vocabSize, n = hyperOf(cfg).streams;
  const moe = cfg.moe!;
  const storage = storageOf(src);
  // llama.cpp's converter's types, except attn_output_a: on a CPU with AMX-INT8 ggml moves Q8_0
  // weights into its AMX buffer, whose matmul wants contiguous activations, and llama.cpp
  // multiplies this one, reshaped to 3-D, by permuted ones: no backend takes the node
  // (GGML_ASSERT(*cur_backend_id != -1)). BF16 is exact and stays in the plain CPU buffer.
  const recipeType = (l: number, t: LayerTensor): EncodableType =>
    storage.fp8(l, t) && t !== "wo_a" ? "Q8_0" : "BF16";
  const tensors: Deepseek4Tensor[] = [];
  const fallbacks: Record<string, GgmlTypeName> = {};
  const typeFor = (name: string, dims: number[], asked: EncodableType): GgmlTypeName => {
    if (dims.length === 1 || F32_ONLY.test(name)) return "F32";
    if (asked === "Q8_0" && dims[0] % 32) return fallbacks[name] = "F16";
    return asked;
  };
  const add = (name: string, shape: number[], read: () => Float32Array, asked = want) => {
    const dims = [...shape].reverse();
    const spec = { name, dims, type: typeFor(name, dims, asked) };
    tensors.push({ spec, key: name, chunks: () => [read()] });
  };
  const globalShapes: Partial<Record<GlobalTensor, number[]>> = {
    embed: [V, H],
    final_norm: [H],
    lm_head: [V, H],
    hc_head_fn: [n, n * H],
    hc_head_base: [n],
    hc_head_scale: [1],
  };
  for (const [t, name] of Object.entries(GLOBAL) as [GlobalTensor, string][]) {
    if (t === "lm_head" && !src.hasLmHead) continue;
    add(name, globalShapes[t]!, () => src.global(t));
  }
  for (let l = 0; l < cfg.numLayers; l++) {
    for (const t of layerTensorsOf(cfg, l)) {
      const rel = LAYER[t];
      if (!rel) throw new Error(`layer ${l}: tensor ${t} has no deepseek4 GGUF name`);
      const name = `blk.${l}.${rel}`, shape = src.layerShape(l, t);
      if (t === "router_tid2eid") {
        // [vocab, topK] expert ids, as llama.cpp's converter writes them: I32.
        tensors.push({
          spec: { name, dims: [...shape].reverse(), type: "I32" },
          key: name,
          chunks: () => [Int32Array.from(src.layer(l, t))].map((v) => new Uint8Array(v.buffer)),
        });
        continue;
      }
      add(name, shape, () => src.layer(l, t), mxfp4 ? recipeType(l, t) : want);
    }
    for (const m of EXPERT_MATRICES) {
      const [rows, cols] = src.expertShape(l, 0, m);
      const name = `blk.${l}.${EXPERTS[m]}`, dims = [cols, rows, moe.numExperts];
      const type = mxfp4 && cols % 32 === 0 ? "MXFP4" : typeFor(name, dims, want);
      tensors.push({
        spec: { name, dims, type },
        key: name,
        chunks: function* () {
          for (let e = 0; e < moe.numExperts; e++) {
            const fp4 = type === "MXFP4" ? storage.fp4(l, e, m) : null;
            yield fp4
              ? mxfp4ToGgml(fp4.data, fp4.scale, `layer ${l} expert ${e} ${m}`)
              : src.expert(l, e, m);
          }
        },
      });
    }
  }
  return { tensors, fallbacks };
}

/** The deepseek4 hyper-parameters beside the ones every architecture writes. */
export function deepseek4Keys(cfg: ModelConfig): [string, GgufValue][] {
  const a = "deepseek4", csa = cfg.csa!, moe = cfg.moe!, hc = hyperOf(cfg);
  const y = csa.compressRope.scaling;
  if (y.type !== "yarn") throw new Error("deepseek4: the compressed layers' RoPE must be YaRN");
  const u32 = (k: string, value: number): [string, GgufValue] => [k, { type: "u32", value }];
  const f32 = (k: string, value: number): [string, GgufValue] => [k, { type: "f32", value }];
  const perLayer = Array<number>(cfg.numLayers).fill(moe.swigluLimit!);
  return [
    u32(`${a}.rope.dimension_count`, cfg.rope.dim),
    u32(`${a}.attention.q_lora_rank`, csa.qLoraRank),
    u32(`${a}.attention.sliding_window`, csa.window),
    u32(`${a}.expert_shared_count`, moe.sharedIntermediate / moe.expertIntermediate),
    f32(`${a}.expert_weights_scale`, moe.routedScaling),
    [`${a}.expert_weights_norm`, { type: "bool", value: moe.normTopK }],
    u32(`${a}.expert_gating_func`, GATING_SQRT_SOFTPLUS),
    [`${a}.swiglu_clamp_exp`, { type: "array", elem: "f32", value: perLayer }],
    [`${a}.swiglu_clamp_shexp`, { type: "array", elem: "f32", value: perLayer }],
    u32(`${a}.attention.indexer.head_count`, csa.indexer.heads),
    u32(`${a}.attention.indexer.key_length`, csa.indexer.headDim),
    u32(`${a}.attention.indexer.top_k`, csa.indexer.topK),
    u32(`${a}.attention.output_group_count`, csa.oGroups),
    u32(`${a}.attention.output_lora_rank`, csa.oLoraRank),
    [`${a}.attention.compress_ratios`, {
      type: "array",
      elem: "i32",
      value: csa.layers.map((l) => l.ratio),
    }],
    f32(`${a}.attention.compress_rope_freq_base`, csa.compressRope.theta),
    u32(`${a}.hyper_connection.count`, hc.streams),
    u32(`${a}.hyper_connection.sinkhorn_iterations`, hc.sinkhornIters),
    f32(`${a}.hyper_connection.epsilon`, hc.eps),
    u32(`${a}.hash_layer_count`, moe.hashLayers ?? 0),
    u32(`${a}.embedding_length_out`, cfg.hiddenSize * hc.streams),
    // llama.cpp applies these to the compressed layers only (window-only layers: plain RoPE).
    [`${a}.rope.scaling.type`, { type: "string", value: "yarn" }],
    f32(`${a}.rope.scaling.factor`, y.factor),
    u32(`${a}.rope.scaling.original_context_length`, y.originalMaxPositions),
    f32(`${a}.rope.scaling.yarn_beta_fast`, y.betaFast),
    f32(`${a}.rope.scaling.yarn_beta_slow`, y.betaSlow),
  ];
}
