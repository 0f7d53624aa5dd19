/**
 * `deno task export-gguf <hf-dir|x.sluice> <out.gguf> [--type f32|f16|bf16|q8_0|mxfp4]`: writes a
 * GGUF v3 file llama.cpp can load, from a Hugging Face checkpoint directory or a sluice container.
 *
 * Architectures: llama.cpp's `llama` (dense Llama, and Mixtral-style MoE with stacked experts
 * `blk.N.ffn_{gate,up,down}_exps` and router `ffn_gate_inp`, the way convert_hf_to_gguf.py writes
 * Mixtral), `qwen3moe` (q/k norms, expert_feed_forward_length), `glm4moe` (GLM-4.5: partial rotary,
 * q/k/v biases, sigmoid routing with `exp_probs_b`, shared experts, leading dense layers; the MTP
 * layers are not exported) and `gpt-oss` (sinks, o and expert biases, YaRN, sliding window; the
 * MXFP4 experts are written dequantised to `--type`), `qwen35moe` (Qwen3.5/3.6-MoE: Gated DeltaNet
 * layers whose value heads llama.cpp orders key head fastest, −exp(A_log), (1 + w) norms stored as
 * 1 + w, the sigmoid-gated shared expert) and `qwen3next` (Qwen3-Next: the same in Hugging Face's
 * head order, in_proj_qkvz taken apart into q/k/v and z); their MTP blocks are not exported;
 * `minimax-m2` (one q/k norm over each whole projection, partial RoPE, sigmoid routing with
 * `exp_probs_b`; FP8 weights written dequantised to `--type`), `gemma4` (Gemma 4 with the MoE
 * block; its mapping is tools/dev/gguf/gemma4.ts) and `deepseek4` (DeepSeek-V4:
 * tools/dev/gguf/deepseek4.ts). Tensor names, dims order, q/k row permutation, metadata keys and
 * their order follow llama.cpp's converter, so an f32 export of a Llama or Mixtral Hugging Face
 * directory reproduces its output. The vocabulary is written, by the tokenizer's kind, as
 * SentencePiece metadata (tools/dev/gguf/spm_vocab.ts) or byte-level BPE metadata
 * (tools/dev/gguf/bpe_vocab.ts).
 *
 * @module
 */

import { MODEL_TYPES } from "../../engine/models/mod.ts";
import {
  checkpointWeights,
  containerWeights,
  type FloatWeights,
} from "../../engine/float_weights.ts";
import { existsSync, statSync } from "node:fs";
import { basename, join } from "node:path";
import { parseArgs } from "node:util";
import { openContainer } from "../../engine/container.ts";
import {
  EXPERT_MATRICES,
  type ExpertMatrix,
  type GatedDeltaNetConfig,
  type LayerTensor,
  mixerOf,
  type ModelConfig,
} from "../../io/model_config.ts";
import {
  hfExpertName,
  hfFusedExpertSlice,
  hfGlobalName,
  hfLayerName,
  layerTensorsOf,
} from "../../engine/tensor_names.ts";
import { GGML_BLOCK, type GgmlTypeName, type GgufValue } from "./gguf/format.ts";
import { type EncodableType, encodeTensor } from "./gguf/quant.ts";
import { bpeVocabFromTokenizerJson, isByteLevelBpe } from "./gguf/bpe_vocab.ts";
import { spmVocabFromTokenizerJson } from "./gguf/spm_vocab.ts";
import {
  gemma4LayerTensors,
  gemma4Metadata,
  gemma4RopeFreqs,
  gemma4Unsupported,
} from "./gguf/gemma4.ts";
import { readJsonObject } from "../../io/json_file.ts";
import { type GgufTensorSpec, writeGguf } from "./gguf/write.ts";
import { checkDeepseek4, deepseek4Keys, deepseek4Tensors } from "./gguf/deepseek4.ts";
import { Progress, type ProgressMode } from "../progress.ts";

/** The llama.cpp architectures the exporter writes. */
export type GgufArch =
  | "llama"
  | "qwen3moe"
  | "glm4moe"
  | "gpt-oss"
  | "qwen35moe"
  | "qwen3next"
  | "minimax-m2"
  | "gemma4"
  | "deepseek4";

/**
 * Output types of the weight matrices (vectors and routers always stay f32). `mxfp4`: routed
 * experts as ggml MXFP4, everything else bf16 (how gpt-oss GGUFs are made; llama.cpp runs MXFP4
 * natively).
 */
export type ExportType = "f32" | "f16" | "bf16" | "q8_0" | "mxfp4";

/** Options of {@link exportGguf}. */
export interface ExportGgufOptions {
  type?: ExportType;
  /** general.name (default: the source directory's name without `.sluice`). */
  name?: string;
  /** Replace an existing output file. */
  force?: boolean;
  progress?: ProgressMode;
}

/** What {@link exportGguf} wrote. */
export interface ExportGgufResult {
  arch: GgufArch;
  tensors: number;
  bytes: number;
  /** Tensor name → ggml type, for the tensors not written as the requested type. */
  fallbacks: Record<string, GgmlTypeName>;
}

const EXPORT_TYPES: Record<ExportType, EncodableType> = {
  f32: "F32",
  f16: "F16",
  bf16: "BF16",
  q8_0: "Q8_0",
  mxfp4: "BF16",
};

/** llama.cpp's llama_ftype of a whole file of each type. */
const FILE_TYPE: Record<ExportType, number> = { f32: 0, f16: 1, q8_0: 7, bf16: 32, mxfp4: 38 };

/** GGUF names of the canonical layer tensors this exporter knows. */
const LAYER_GGUF: Partial<Record<LayerTensor, string>> = {
  attn_norm: "attn_norm.weight",
  wq: "attn_q.weight",
  wk: "attn_k.weight",
  wv: "attn_v.weight",
  wo: "attn_output.weight",
  bq: "attn_q.bias",
  bk: "attn_k.bias",
  bv: "attn_v.bias",
  q_norm: "attn_q_norm.weight",
  k_norm: "attn_k_norm.weight",
  ffn_norm: "ffn_norm.weight",
  ffn_gate: "ffn_gate.weight",
  ffn_up: "ffn_up.weight",
  ffn_down: "ffn_down.weight",
  router: "ffn_gate_inp.weight",
  router_bias: "exp_probs_b.bias",
  router_b: "ffn_gate_inp.bias",
  bo: "attn_output.bias",
  sinks: "attn_sinks.weight",
  shared_gate: "ffn_gate_shexp.weight",
  shared_up: "ffn_up_shexp.weight",
  shared_down: "ffn_down_shexp.weight",
};

const GLOBAL_GGUF: Record<"embed" | "final_norm" | "lm_head", string> = {
  embed: "token_embd.weight",
  final_norm: "output_norm.weight",
  lm_head: "output.weight",
};

/** The model's float32 weights, with what the export needs besides. */
interface WeightSource extends FloatWeights {
  /** Directory holding tokenizer.json. */
  tokenizerDir: string;
  defaultName: string;
}

function checkpointSource(dir: string): WeightSource {
  return {
    ...checkpointWeights(dir),
    tokenizerDir: dir,
    defaultName: basename(dir.replace(/\/+$/, "")),
  };
}

function containerSource(path: string): WeightSource {
  const w = containerWeights(path);
  if (!openContainer(path).manifest.tokenizer.files.includes("tokenizer.json")) {
    throw new Error(`${path}: the container holds no tokenizer.json to export the vocabulary from`);
  }
  return {
    ...w,
    tokenizerDir: path,
    defaultName: basename(path.replace(/\/+$/, "")).replace(/\.sluice$/, ""),
  };
}

/**
 * Rows of a q/k projection from Hugging Face's rotate_half order to llama.cpp's pair order:
 * within each head, output row 2i + c is input row c·hd/2 + i. `cols` is 1 for a bias.
 */
export function permuteToPairs(
  w: Float32Array,
  heads: number,
  headDim: number,
  cols: number,
): Float32Array {
  if (w.length !== heads * headDim * cols) {
    throw new Error(
      `q/k permutation: ${w.length} values for ${heads} heads × ${headDim} × ${cols}`,
    );
  }
  const out = new Float32Array(w.length);
  const half = headDim / 2;
  for (let h = 0; h < heads; h++) {
    for (let i = 0; i < half; i++) {
      for (let c = 0; c < 2; c++) {
        const src = (h * headDim + c * half + i) * cols;
        out.set(w.subarray(src, src + cols), (h * headDim + 2 * i + c) * cols);
      }
    }
  }
  return out;
}

/**
 * Value heads from Hugging Face's order (value head j reads key head j / r) to llama.cpp's
 * qwen35moe order (key head fastest: position p holds value head (p mod Hk)·r + p div Hk), for a
 * [rows, cols] matrix whose heads are blocks of `width` rows (or columns) from `from` on.
 */
export function tileValueHeads(
  w: Float32Array,
  rows: number,
  cols: number,
  g: GatedDeltaNetConfig,
  along: "rows" | "cols",
  from: number,
  width: number,
): Float32Array {
  const out = Float32Array.from(w);
  const Hk = g.numKeyHeads, Hv = g.numValueHeads, r = Hv / Hk;
  for (let p = 0; p < Hv; p++) {
    const j = (p % Hk) * r + Math.floor(p / Hk);
    for (let i = 0; i < width; i++) {
      const dst = from + p * width + i, src = from + j * width + i;
      if (along === "rows") out.set(w.subarray(src * cols, (src + 1) * cols), dst * cols);
      else for (let row = 0; row < rows; row++) out[row * cols + dst] = w[row * cols + src];
    }
  }
  return out;
}

/** 1 + w of a (1 + w) RMSNorm weight, as llama.cpp's qwen35moe stores it. */
const plusOne = (v: Float32Array) => v.map((x) => 1 + x);

/** One GGUF tensor made from a canonical one: its name under `blk.N.`, shape and values. */
interface HybridTensor {
  rel: string;
  shape: number[];
  map: (v: Float32Array) => Float32Array;
}

/**
 * llama.cpp's qwen35moe / qwen3next names (under `blk.N.`), PyTorch-order shapes and values of
 * layer tensor `t` of layer `l`, where they differ from the other architectures'; null where they
 * do not. qwen35moe orders value heads key head fastest ({@link tileValueHeads}); qwen3next keeps
 * Hugging Face's order, takes the fused in_proj_qkvz apart into flat q/k/v and z, and keeps
 * in_proj_ba as it is.
 */
function hybridTensors(
  cfg: ModelConfig,
  arch: GgufArch,
  l: number,
  t: LayerTensor,
): HybridTensor[] | null {
  const g = cfg.gdn!, H = cfg.hiddenSize, Hk = g.numKeyHeads, Hv = g.numValueHeads;
  const dk = g.keyHeadDim, dv = g.valueHeadDim;
  const qk = 2 * Hk * dk, C = qk + Hv * dv, vDim = Hv * dv;
  const same = (v: Float32Array) => v;
  const tile = (rows: number, cols: number, along: "rows" | "cols", from: number, w: number) =>
    arch === "qwen35moe"
      ? (v: Float32Array) => tileValueHeads(v, rows, cols, g, along, from, w)
      : same;
  const one = (rel: string, shape: number[], map = same) => [{ rel, shape, map }];
  switch (t) {
    case "attn_norm":
      return one("attn_norm.weight", [H], plusOne);
    case "ffn_norm":
      return one("post_attention_norm.weight", [H], plusOne);
    case "q_norm":
    case "k_norm":
      return one(`attn_${t[0]}_norm.weight`, [cfg.headDim], plusOne);
    case "wq":
      return one("attn_q.weight", [2 * cfg.numHeads * cfg.headDim, H]);
    case "gdn_qkv":
      return one("attn_qkv.weight", [C, H], tile(C, H, "rows", qk, dv));
    case "gdn_z":
      return one("attn_gate.weight", [vDim, H], tile(vDim, H, "rows", 0, dv));
    case "gdn_b":
      return one("ssm_beta.weight", [Hv, H], tile(Hv, H, "rows", 0, 1));
    case "gdn_a":
      return one("ssm_alpha.weight", [Hv, H], tile(Hv, H, "rows", 0, 1));
    case "gdn_qkvz": {
      // Per key head i the stored rows are [q_i | k_i | v of its value heads | z of them]: the
      // rows of part `at` (offset, count within a key head's block) of every key head in order.
      const rv = (Hv / Hk) * dv, block = 2 * dk + 2 * rv;
      const gather = (v: Float32Array, ...parts: [number, number][]) => {
        const out = new Float32Array(parts.reduce((a, [, n]) => a + n, 0) * Hk * H);
        let at = 0;
        for (const [off, n] of parts) {
          for (let i = 0; i < Hk; i++) {
            out.set(v.subarray((i * block + off) * H, (i * block + off + n) * H), at);
            at += n * H;
          }
        }
        return out;
      };
      return [
        {
          rel: "attn_qkv.weight",
          shape: [C, H],
          map: (v) => gather(v, [0, dk], [dk, dk], [2 * dk, rv]),
        },
        { rel: "attn_gate.weight", shape: [vDim, H], map: (v) => gather(v, [2 * dk + rv, rv]) },
      ];
    }
    case "gdn_ba":
      return one("ssm_ba.weight", [2 * Hv, H]);
    case "qkv_conv":
      return one("ssm_conv1d.weight", [C, 4], tile(C, 4, "rows", qk, dv));
    case "dt_bias":
      return one("ssm_dt.bias", [Hv], tile(Hv, 1, "rows", 0, 1));
    case "a_log":
      return one("ssm_a", [Hv], (v) => tile(Hv, 1, "rows", 0, 1)(v.map((x) => -Math.exp(x))));
    case "o_norm":
      return one("ssm_norm.weight", [dv]);
    case "wo":
      return mixerOf(cfg, l) === "gdn"
        ? one("ssm_out.weight", [H, vDim], tile(H, vDim, "cols", 0, dv))
        : null;
    case "shared_expert_gate":
      return one("ffn_gate_inp_shexp.weight", [1, H]);
    default:
      return null;
  }
}

/** Which llama.cpp architecture a model maps to; throws for what llama.cpp cannot express. */
function archOf(cfg: ModelConfig, src: string): GgufArch {
  const fail = (why: string): never => {
    throw new Error(`${src}: cannot export model_type ${cfg.modelType} to GGUF: ${why}`);
  };
  const known = Object.hasOwn(MODEL_TYPES, cfg.modelType) ? MODEL_TYPES[cfg.modelType] : null;
  const arch = known?.llamaCppArch as GgufArch | undefined;
  const archs = [
    "llama",
    "qwen3moe",
    "glm4moe",
    "gpt-oss",
    "qwen35moe",
    "qwen3next",
    "minimax-m2",
    "gemma4",
    "deepseek4",
  ];
  if (!arch || !archs.includes(arch)) {
    const names = Object.entries(MODEL_TYPES).filter(([, t]) => t.llamaCppArch).map(([n]) => n);
    return fail(`supported model_types are ${names.join(", ")}`);
  }
  if (arch === "deepseek4") {
    checkDeepseek4(cfg, fail);
    return arch;
  }
  if (cfg.mla) fail("only GQA attention is supported");
  if (arch === "gemma4") return gemma4Unsupported(cfg) ? fail(gemma4Unsupported(cfg)!) : arch;
  if (arch === "qwen35moe" || arch === "qwen3next") {
    // llama.cpp's Qwen hybrids: Gated DeltaNet layers (flat projections in qwen35moe, fused per
    // key head in qwen3next), gated attention, every layer MoE with a gated shared expert,
    // (1 + w) norms, partial rotate-half RoPE.
    const g = cfg.gdn;
    const projections = arch === "qwen35moe" ? "flat" : "grouped";
    if (!g || g.projections !== projections || g.convKernel !== 4) {
      fail(`${arch} needs Gated DeltaNet layers with ${projections} projections and a conv of 4`);
    }
    if (!cfg.attnOutputGate || !cfg.normUnitOffset || !cfg.qkNorm || cfg.rope.layout !== "half") {
      fail(`${arch} needs gated attention, (1 + w) norms and rotate-half RoPE`);
    }
    if (cfg.layerKinds.includes("dense") || !cfg.moe?.sharedExpertGate) {
      fail(`${arch} needs every layer MoE with a gated shared expert`);
    }
    if (cfg.rope.scaling.type !== "none") fail(`${arch} takes no rope scaling`);
    // llama.cpp places the full-attention layers by one interval.
    const every = g!.layers.indexOf(false) + 1;
    if (every < 1 || !g!.layers.every((x, i) => x === ((i + 1) % every !== 0))) {
      fail(`${arch} needs a full-attention layer every N layers, the rest Gated DeltaNet`);
    }
    return arch;
  }
  const yarn = arch === "gpt-oss" && cfg.rope.scaling.type === "yarn";
  if (cfg.rope.scaling.type !== "none" && cfg.rope.scaling.type !== "linear" && !yarn) {
    fail(`rope scaling ${cfg.rope.scaling.type} is not supported`);
  }
  const partial = arch === "glm4moe" || arch === "minimax-m2";
  if (cfg.rope.layout !== "half" || (cfg.rope.dim !== cfg.headDim && !partial)) {
    fail("RoPE must be rotate_half over the whole head");
  }
  if (arch === "minimax-m2") {
    // llama.cpp's minimax-m2: one q/k RMSNorm over each whole projection, sigmoid routing whose
    // bias only selects, renormalised weights, no shared expert, every layer MoE.
    const m = cfg.moe;
    if (!cfg.qkNorm || !cfg.qkNormWhole || cfg.attentionBias || cfg.layerKinds.includes("dense")) {
      fail("minimax-m2 needs whole-projection q/k norms, no attention biases and every layer MoE");
    }
    if (
      !m || m.scoring !== "sigmoid" || !m.selectionBias || !m.normTopK || m.routedScaling !== 1 ||
      m.sharedIntermediate !== 0
    ) {
      fail("minimax-m2 routing must be sigmoid with a selection bias, renormalised, unshared");
    }
    return arch;
  }
  if (arch === "llama" && cfg.qkNorm) fail("llama has no q/k norms");
  if (arch === "qwen3moe" && (!cfg.qkNorm || cfg.attentionBias)) {
    fail("qwen3moe needs q/k norms and no attention biases");
  }
  const moe = cfg.moe;
  if (arch === "glm4moe") {
    const first = cfg.layerKinds.indexOf("moe");
    if (!moe || first < 0 || cfg.layerKinds.slice(first).includes("dense")) {
      fail("glm4moe needs its dense layers first, then MoE layers");
    }
    if (moe!.scoring !== "sigmoid" || !moe!.selectionBias || moe!.nGroup !== 1) {
      fail("glm4moe routing must be sigmoid noaux_tc with one group");
    }
    return arch;
  }
  const kinds = new Set(cfg.layerKinds);
  if (kinds.size !== 1) fail("llama.cpp needs every layer to be dense or every layer MoE");
  if (arch === "gpt-oss") {
    // llama.cpp hard-codes these: sliding layers 0, 2, 4, …, and the clamped SwiGLU's constants.
    const w = cfg.attention?.windows ?? [];
    if (!w.every((x, l) => (x > 0) === (l % 2 === 0) && (x === 0 || x === w[0]))) {
      fail("llama.cpp's gpt-oss slides the even layers with one window");
    }
    const c = moe?.clampedSwiglu;
    if (!c || c.limit !== 7 || c.alpha !== 1.702) {
      fail("llama.cpp's gpt-oss clamps at 7, alpha 1.702");
    }
    return arch;
  }
  if (kinds.has("moe")) {
    if (
      !moe || moe.scoring !== "softmax" || !moe.normTopK || moe.routedScaling !== 1 ||
      moe.nGroup !== 1 || moe.selectionBias || moe.sharedIntermediate !== 0
    ) {
      fail("MoE routing must be softmax top-k with renormalised weights and no shared experts");
    }
  } else if (arch === "qwen3moe") fail("qwen3moe needs MoE layers");
  return arch!;
}

/** One output tensor: its spec, a sort key (the converter's source order) and its data. */
interface Planned {
  spec: GgufTensorSpec;
  key: string;
  /** Float32 row-major chunks, each a whole number of rows of dims[0], or bytes already in type. */
  chunks: () => Iterable<Float32Array | Uint8Array>;
}

/**
 * Tensors kept f32 whatever the type: routers (llama.cpp's converter does so), and the Gated
 * DeltaNet conv (llama.cpp's ssm_conv asserts f32 weights) and shared-expert gate beside them.
 */
const F32_ONLY = /(ffn_gate_inp|ffn_gate_inp_shexp|ssm_conv1d)\.weight$/;

/** The ggml type of a tensor: vectors and {@link F32_ONLY} f32; Q8_0 → F16 for odd rows. */
function typeFor(dims: number[], f32Only: boolean, want: EncodableType): EncodableType {
  if (dims.length === 1 || f32Only) return "F32";
  if (want === "Q8_0" && dims[0] % 32 !== 0) return "F16";
  return want;
}

function planTensors(
  src: WeightSource,
  arch: GgufArch,
  want: EncodableType,
  expertType: EncodableType,
) {
  const cfg = src.cfg;
  const out: Planned[] = [];
  const add = (name: string, shape: number[], key: string, read: () => Float32Array) => {
    const dims = [...shape].reverse();
    const type = typeFor(dims, F32_ONLY.test(name), want);
    out.push({ spec: { name, dims, type }, key, chunks: () => [read()] });
  };
  const permute = (t: LayerTensor, v: Float32Array) => {
    if (arch !== "llama") return v;
    const heads = t === "wq" || t === "bq" ? cfg.numHeads : cfg.numKvHeads;
    const cols = t[0] === "b" ? 1 : cfg.hiddenSize;
    return t === "wq" || t === "wk" || t === "bq" || t === "bk"
      ? permuteToPairs(v, heads, cfg.headDim, cols)
      : v;
  };
  const V = cfg.vocabSize, H = cfg.hiddenSize;
  add(GLOBAL_GGUF.embed, [V, H], hfGlobalName(cfg, "embed")!, () => src.global("embed"));
  add(
    GLOBAL_GGUF.final_norm,
    [H],
    hfGlobalName(cfg, "final_norm")!,
    () => cfg.normUnitOffset ? plusOne(src.global("final_norm")) : src.global("final_norm"),
  );
  if (src.hasLmHead) {
    add(GLOBAL_GGUF.lm_head, [V, H], "lm_head.weight", () => src.global("lm_head"));
  }
  if (arch === "gemma4") {
    const r = gemma4RopeFreqs(cfg);
    add(r.name, [r.values.length], r.name, () => r.values);
  }
  const q = cfg.numHeads * cfg.headDim, kv = cfg.numKvHeads * cfg.headDim;
  for (let l = 0; l < cfg.numLayers; l++) {
    const shapes: Partial<Record<LayerTensor, number[]>> = {
      attn_norm: [H],
      ffn_norm: [H],
      wq: [q, H],
      wk: [kv, H],
      wv: [kv, H],
      wo: [H, q],
      bq: [q],
      bk: [kv],
      bv: [kv],
      q_norm: [cfg.qkNormWhole ? q : cfg.headDim],
      k_norm: [cfg.qkNormWhole ? kv : cfg.headDim],
      ffn_gate: [cfg.intermediateSize, H],
      ffn_up: [cfg.intermediateSize, H],
      ffn_down: [H, cfg.intermediateSize],
      router: [cfg.moe?.numExperts ?? 0, H],
      router_bias: [cfg.moe?.numExperts ?? 0],
      router_b: [cfg.moe?.numExperts ?? 0],
      bo: [H],
      sinks: [cfg.numHeads],
      shared_gate: [cfg.moe?.sharedIntermediate ?? 0, H],
      shared_up: [cfg.moe?.sharedIntermediate ?? 0, H],
      shared_down: [H, cfg.moe?.sharedIntermediate ?? 0],
    };
    for (const t of layerTensorsOf(cfg, l)) {
      const hybrid = cfg.gdn
        ? hybridTensors(cfg, arch, l, t)
        : arch === "gemma4"
        ? gemma4LayerTensors(cfg, l, t)
        : null;
      if (hybrid) {
        for (const h of hybrid) {
          const key = `${hfLayerName(cfg, l, t)!}\u0000${h.rel}`;
          add(`blk.${l}.${h.rel}`, h.shape, key, () => h.map(src.layer(l, t)));
        }
        continue;
      }
      // llama.cpp's glm4moe and gpt-oss call the FFN norm the post-attention norm.
      const rel = t === "ffn_norm" && (arch === "glm4moe" || arch === "gpt-oss")
        ? "post_attention_norm.weight"
        : LAYER_GGUF[t];
      if (!rel) throw new Error(`layer ${l}: tensor ${t} has no GGUF name for ${arch}`);
      add(
        `blk.${l}.${rel}`,
        shapes[t]!,
        hfLayerName(cfg, l, t)!,
        () => permute(t, src.layer(l, t)),
      );
    }
    if (cfg.layerKinds[l] !== "moe") continue;
    const moe = cfg.moe!;
    // A fused checkpoint names one tensor per matrix kind; others one per expert and matrix.
    const hfName = (e: number, m: ExpertMatrix) =>
      hfFusedExpertSlice(cfg, l, m)?.base ?? hfExpertName(cfg, l, e, m);
    let last = "";
    for (let e = 0; e < moe.numExperts; e++) {
      for (const m of EXPERT_MATRICES) {
        const n = hfName(e, m);
        if (n > last) last = n;
      }
    }
    for (const m of EXPERT_MATRICES) {
      const shape = m === "down" ? [H, moe.expertIntermediate] : [moe.expertIntermediate, H];
      const dims = [shape[1], shape[0], moe.numExperts];
      // Stacked tensors come out once the last expert is read, in the HF matrix-name order.
      const key = `${last}\u0000${hfName(0, m)}\u0000${m}`;
      out.push({
        spec: {
          name: `blk.${l}.ffn_${m}_exps.weight`,
          dims,
          type: expertType === "MXFP4" && dims[0] % 32 === 0 ? "MXFP4" : typeFor(dims, false, want),
        },
        key,
        chunks: function* () {
          for (let e = 0; e < moe.numExperts; e++) yield src.expert(l, e, m);
        },
      });
      if (!moe.expertBias) continue;
      out.push({
        spec: {
          name: `blk.${l}.ffn_${m}_exps.bias`,
          dims: [shape[0], moe.numExperts],
          type: "F32",
        },
        key: `${key}\u0000bias`,
        chunks: function* () {
          for (let e = 0; e < moe.numExperts; e++) yield src.expertBias(l, e, m);
        },
      });
    }
  }
  return out.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
}

/** gguf-py's parameter-count notation: "293K", "1.5M", "8x7.2B". */
export function sizeLabel(planned: readonly GgufTensorSpec[]): string {
  let shared = 0, expert = 0, expertSum = 0, expertTensors = 0;
  for (const t of planned) {
    const n = t.dims.reduce((a, b) => a * b, 1);
    if (t.name.includes("_exps.")) {
      const count = t.dims[t.dims.length - 1];
      expert += n / count;
      expertSum += count;
      expertTensors++;
    } else shared += n;
  }
  const count = expertTensors ? Math.floor(expertSum / expertTensors) : 0;
  const params = count ? shared + expert : shared;
  const [scale, suffix] = params > 1e12
    ? [1e-12, "T"]
    : params > 1e9
    ? [1e-9, "B"]
    : params > 1e6
    ? [1e-6, "M"]
    : [1e-3, "K"];
  const v = params * scale;
  const digits = Math.max(2 - String(Math.round(v)).length, 0);
  return `${count ? `${count}x` : ""}${v.toFixed(digits)}${suffix}`;
}

function metadataFor(
  src: WeightSource,
  arch: GgufArch,
  type: ExportType,
  name: string,
  specs: GgufTensorSpec[],
): Map<string, GgufValue> {
  const cfg = src.cfg;
  const m = new Map<string, GgufValue>();
  const u32 = (k: string, v: number) => m.set(k, { type: "u32", value: v });
  const f32 = (k: string, v: number) => m.set(k, { type: "f32", value: v });
  const str = (k: string, v: string) => m.set(k, { type: "string", value: v });
  str("general.architecture", arch);
  str("general.type", "model");
  str("general.name", name);
  str("general.size_label", sizeLabel(specs));
  const moe = cfg.layerKinds.includes("moe") ? cfg.moe : null;
  const firstMoe = cfg.layerKinds.indexOf("moe");
  u32(`${arch}.block_count`, cfg.numLayers);
  u32(`${arch}.context_length`, cfg.maxPositions);
  u32(`${arch}.embedding_length`, cfg.hiddenSize);
  // gpt-oss's and GLM's converters write intermediate_size here (GLM: the dense layers').
  const ff = arch === "gpt-oss" || arch === "qwen35moe" || arch === "qwen3next" ||
      arch === "minimax-m2"
    ? moe!.expertIntermediate
    : arch === "glm4moe" && firstMoe > 0
    ? cfg.intermediateSize
    : moe
    ? moe.expertIntermediate
    : cfg.intermediateSize;
  // qwen35moe's converter writes none.
  if (arch !== "qwen35moe") u32(`${arch}.feed_forward_length`, ff);
  u32(`${arch}.attention.head_count`, cfg.numHeads);
  u32(`${arch}.attention.head_count_kv`, cfg.numKvHeads);
  if (arch === "qwen35moe") {
    // The multimodal RoPE's sections of the rotary pairs (all positions alike for text).
    const pairs = cfg.rope.dim / 2, a = Math.ceil(pairs / 3), b = Math.ceil((pairs - a) / 2);
    m.set(`${arch}.rope.dimension_sections`, {
      type: "array",
      elem: "i32",
      value: [a, b, pairs - a - b, 0],
    });
  }
  f32(`${arch}.rope.freq_base`, cfg.rope.theta);
  f32(`${arch}.attention.layer_norm_rms_epsilon`, cfg.rmsNormEps);
  if (moe) {
    u32(`${arch}.expert_count`, moe.numExperts);
    u32(`${arch}.expert_used_count`, moe.topK);
  }
  u32(`${arch}.attention.key_length`, cfg.headDim);
  u32(`${arch}.attention.value_length`, cfg.headDim);
  u32("general.file_type", FILE_TYPE[type]);
  if (arch !== "llama" && moe) u32(`${arch}.expert_feed_forward_length`, moe.expertIntermediate);
  if (arch === "glm4moe") {
    u32(`${arch}.rope.dimension_count`, cfg.rope.dim);
    u32(`${arch}.expert_shared_count`, moe!.sharedIntermediate / moe!.expertIntermediate);
    u32(`${arch}.leading_dense_block_count`, firstMoe);
    f32(`${arch}.expert_weights_scale`, moe!.routedScaling);
    m.set(`${arch}.expert_weights_norm`, { type: "bool", value: moe!.normTopK });
    // llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID.
    u32(`${arch}.expert_gating_func`, 2);
  }
  if (arch === "minimax-m2") {
    u32(`${arch}.rope.dimension_count`, cfg.rope.dim);
    // llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID (its converter writes it from scoring_func).
    u32(`${arch}.expert_gating_func`, 2);
  }
  if (arch === "gemma4") gemma4Metadata(cfg, m);
  if (arch === "qwen35moe" || arch === "qwen3next") {
    const g = cfg.gdn!;
    u32(`${arch}.expert_shared_feed_forward_length`, moe!.sharedIntermediate);
    u32(`${arch}.ssm.conv_kernel`, g.convKernel);
    u32(`${arch}.ssm.state_size`, g.keyHeadDim);
    u32(`${arch}.ssm.group_count`, g.numKeyHeads);
    u32(`${arch}.ssm.time_step_rank`, g.numValueHeads);
    u32(`${arch}.ssm.inner_size`, g.numValueHeads * g.valueHeadDim);
    u32(`${arch}.full_attention_interval`, g.layers.indexOf(false) + 1);
    u32(`${arch}.rope.dimension_count`, cfg.rope.dim);
  }
  if (arch === "gpt-oss") {
    const w = cfg.attention?.windows.find((x) => x > 0);
    if (w) u32(`${arch}.attention.sliding_window`, w);
    const s = cfg.rope.scaling;
    if (s.type === "yarn") {
      // llama.cpp has no key for YaRN's truncate flag: it always floors/ceils the ramp.
      str(`${arch}.rope.scaling.type`, "yarn");
      f32(`${arch}.rope.scaling.factor`, s.factor);
      u32(`${arch}.rope.scaling.original_context_length`, s.originalMaxPositions);
    }
  }
  if (arch === "deepseek4") { for (const [k, v] of deepseek4Keys(cfg)) m.set(k, v); }
  if (arch === "llama") {
    u32(`${arch}.vocab_size`, cfg.vocabSize);
    u32(`${arch}.rope.dimension_count`, cfg.rope.dim);
  }
  if (cfg.rope.scaling.type === "linear") {
    str(`${arch}.rope.scaling.type`, "linear");
    f32(`${arch}.rope.scaling.factor`, cfg.rope.scaling.factor);
  }
  // The newer converter that writes the Qwen hybrids puts the quantization version first.
  const quantFirst = arch === "qwen35moe" || arch === "qwen3next";
  if (quantFirst) u32("general.quantization_version", 2);
  const specials = { bosId: cfg.bosId, eosId: cfg.eosIds[0] ?? null };
  if (isByteLevelBpe(readJsonObject(join(src.tokenizerDir, "tokenizer.json")))) {
    const vocab = bpeVocabFromTokenizerJson(src.tokenizerDir, cfg.vocabSize, arch, specials);
    str("tokenizer.ggml.model", "gpt2");
    str("tokenizer.ggml.pre", vocab.pre);
    m.set("tokenizer.ggml.tokens", { type: "array", elem: "string", value: vocab.tokens });
    m.set("tokenizer.ggml.token_type", { type: "array", elem: "i32", value: vocab.types });
    m.set("tokenizer.ggml.merges", { type: "array", elem: "string", value: vocab.merges });
    if (vocab.bosId !== null) u32("tokenizer.ggml.bos_token_id", vocab.bosId);
    if (vocab.eosId !== null) u32("tokenizer.ggml.eos_token_id", vocab.eosId);
    if (vocab.padId !== null) u32("tokenizer.ggml.padding_token_id", vocab.padId);
    m.set("tokenizer.ggml.add_bos_token", { type: "bool", value: vocab.addBos });
    m.set("tokenizer.ggml.add_eos_token", { type: "bool", value: vocab.addEos });
  } else {
    const vocab = spmVocabFromTokenizerJson(src.tokenizerDir, cfg.vocabSize, specials);
    str("tokenizer.ggml.model", "llama");
    str("tokenizer.ggml.pre", "default");
    m.set("tokenizer.ggml.tokens", { type: "array", elem: "string", value: vocab.tokens });
    m.set("tokenizer.ggml.scores", { type: "array", elem: "f32", value: vocab.scores });
    m.set("tokenizer.ggml.token_type", { type: "array", elem: "i32", value: vocab.types });
    if (vocab.bosId !== null) u32("tokenizer.ggml.bos_token_id", vocab.bosId);
    if (vocab.eosId !== null) u32("tokenizer.ggml.eos_token_id", vocab.eosId);
    // llama.cpp's SPM vocabulary assumes unk = 0; only a different id needs saying.
    if (vocab.unkId !== null && vocab.unkId !== 0) {
      u32("tokenizer.ggml.unknown_token_id", vocab.unkId);
    }
    m.set("tokenizer.ggml.add_bos_token", { type: "bool", value: vocab.addBos });
    m.set("tokenizer.ggml.add_eos_token", { type: "bool", value: vocab.addEos });
    if (!vocab.addSpacePrefix) {
      m.set("tokenizer.ggml.add_space_prefix", { type: "bool", value: false });
    }
  }
  if (!quantFirst) u32("general.quantization_version", 2);
  return m;
}

/**
 * Exports `src` (a Hugging Face checkpoint directory or a `.sluice` container) to the GGUF file
 * `out`. Matrices are written as `opts.type` (default f32); vectors and routers stay f32, and
 * Q8_0 falls back to F16 for matrices whose rows are not a multiple of 32.
 */
export function exportGguf(
  src: string,
  out: string,
  opts: ExportGgufOptions = {},
): ExportGgufResult {
  const type = opts.type ?? "f32";
  if (!Object.hasOwn(EXPORT_TYPES, type)) {
    throw new Error(`--type must be one of ${Object.keys(EXPORT_TYPES).join(", ")}, got ${type}`);
  }
  if (!existsSync(src) || !statSync(src).isDirectory()) {
    throw new Error(`${src}: not a directory (expected a Hugging Face checkpoint or a .sluice)`);
  }
  if (existsSync(out) && !opts.force) {
    throw new Error(`${out} already exists; pass --force to replace it`);
  }
  const source = existsSync(`${src}/manifest.json`) ? containerSource(src) : checkpointSource(src);
  try {
    const arch = archOf(source.cfg, src);
    const expertType = type === "mxfp4" ? "MXFP4" : EXPORT_TYPES[type];
    const dsv4 = arch === "deepseek4"
      ? deepseek4Tensors(source, EXPORT_TYPES[type], type === "mxfp4")
      : null;
    const planned = dsv4?.tensors ?? planTensors(source, arch, EXPORT_TYPES[type], expertType);
    const specs = planned.map((p) => p.spec);
    const meta = metadataFor(source, arch, type, opts.name ?? source.defaultName, specs);
    const fallbacks: Record<string, GgmlTypeName> = dsv4?.fallbacks ?? {};
    for (const s of dsv4 ? [] : specs) {
      const wanted = s.name.includes("_exps.") ? expertType : EXPORT_TYPES[type];
      // Vectors, routers and the stacked expert biases ([rows, experts]) are f32 by design.
      const f32 = s.dims.length === 1 || s.name.endsWith("gate_inp.weight") ||
        s.name.endsWith("_exps.bias");
      if (s.type !== wanted && !f32) {
        fallbacks[s.name] = s.type;
      }
    }
    const total = specs.reduce((a, s) => a + s.dims.reduce((x, y) => x * y, 4), 0);
    const progress = new Progress({ label: "export-gguf", total, mode: opts.progress ?? "auto" });
    const bytes = writeGguf(out, meta, specs, function* (spec, i) {
      for (const x of planned[i].chunks()) {
        // The total counts f32 bytes; a chunk already encoded counts as the values it holds.
        const b = GGML_BLOCK[spec.type];
        progress.add(
          x instanceof Float32Array ? x.byteLength : (x.byteLength / b.bytes) * b.elems * 4,
        );
        yield x instanceof Float32Array
          ? encodeTensor(x, spec.type as EncodableType, `${src}: ${spec.name}`)
          : x;
      }
    });
    progress.finish();
    return { arch, tensors: specs.length, bytes, fallbacks };
  } finally {
    source.close();
  }
}

const USAGE = "usage: deno task export-gguf <hf-dir|x.sluice> <out.gguf> " +
  "[--type f32|f16|bf16|q8_0|mxfp4] [--name NAME] [--force] [--progress auto|tty|lines|off]";

function main(args: string[]): void {
  const { values, positionals } = parseArgs({
    args,
    allowPositionals: true,
    options: {
      type: { type: "string", default: "f32" },
      name: { type: "string" },
      force: { type: "boolean", default: false },
      progress: { type: "string", default: "auto" },
      help: { type: "boolean", short: "h", default: false },
    },
  });
  if (values.help || positionals.length !== 2) {
    console.error(USAGE);
    Deno.exit(values.help ? 0 : 2);
  }
  const r = exportGguf(positionals[0], positionals[1], {
    type: values.type as ExportType,
    name: values.name,
    force: values.force,
    progress: values.progress as ProgressMode,
  });
  console.error(`wrote ${positionals[1]}: arch ${r.arch}, ${r.tensors} tensors, ${r.bytes} bytes`);
  const fb = Object.entries(r.fallbacks);
  if (fb.length) {
    console.error(`kept as ${fb[0][1]} (rows not a multiple of 32): ${fb.length} tensors`);
  }
}

if (import.meta.main) {
  try {
    main(Deno.args);
  } catch (e) {
    console.error(`export-gguf: ${(e as Error).message}`);
    Deno.exit(1);
  }
}
