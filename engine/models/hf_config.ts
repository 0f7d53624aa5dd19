/**
 * The building blocks of Hugging Face config.json normalisers: typed field access whose errors
 * name the file and the field, RoPE settings, SiLU and top-k checks. Each family file
 * (engine/models/<family>.ts) writes its normalisers with these; engine/config.ts picks one by
 * model_type through the registry (engine/models/mod.ts).
 *
 * @module
 */

import type { ModelConfig, MoeConfig, RopeScaling } from "../../io/model_config.ts";

/** A parsed JSON object. */
export type Json = Record<string, unknown>;

/**
 * Most layers a config may have: the normalisers build per-layer arrays from num_hidden_layers, so
 * it is bounded before they do (a fuzzed 2^32 took a minute and then failed inside V8).
 */
export const MAX_LAYERS = 1 << 16;

/** Typed access to one config object; every error names the source and the field. */
export class Fields {
  /** `src` is the object, `where` names it in errors (file and path). */
  constructor(readonly src: Json, readonly where: string) {}

  /** Whether `key` is present and not null. */
  has(key: string): boolean {
    return this.src[key] !== undefined && this.src[key] !== null;
  }

  private fail(key: string, expected: string): never {
    throw new Error(
      `${this.where}: field ${key} must be ${expected}, got ${JSON.stringify(this.src[key])}`,
    );
  }

  /** A required positive or non-negative integer. */
  int(key: string, opts: { def?: number; min?: number; max?: number } = {}): number {
    const v = this.src[key] ?? opts.def;
    if (v === undefined || v === null) {
      throw new Error(`${this.where}: required field ${key} is missing`);
    }
    const min = opts.min ?? 0, max = opts.max ?? Number.MAX_SAFE_INTEGER;
    if (typeof v !== "number" || !Number.isSafeInteger(v) || v < min || v > max) {
      this.fail(
        key,
        opts.max === undefined ? `an integer >= ${min}` : `an integer in ${min}..${max}`,
      );
    }
    return v;
  }

  /** A finite number, required unless a default is given. */
  num(key: string, def?: number): number {
    const v = this.src[key] ?? def;
    if (v === undefined || v === null) {
      throw new Error(`${this.where}: required field ${key} is missing`);
    }
    if (typeof v !== "number" || !Number.isFinite(v)) this.fail(key, "a finite number");
    return v;
  }

  /** A required boolean (no default). */
  flag(key: string): boolean {
    const v = this.src[key];
    if (v === undefined || v === null) {
      throw new Error(`${this.where}: required field ${key} is missing`);
    }
    if (typeof v !== "boolean") this.fail(key, "a boolean");
    return v;
  }

  /** A required nested object. */
  obj(key: string): Fields {
    const v = this.src[key];
    if (v === undefined || v === null) {
      throw new Error(`${this.where}: required field ${key} is missing`);
    }
    if (typeof v !== "object" || Array.isArray(v)) this.fail(key, "an object");
    return new Fields(v as Json, `${this.where} ${key}`);
  }

  /** Requires `key` to be present and equal to `want` (the only supported value). */
  exactly(key: string, want: string | number | boolean): void {
    const v = this.src[key];
    if (v === undefined || v === null) {
      throw new Error(`${this.where}: required field ${key} is missing`);
    }
    if (v !== want) {
      throw new Error(
        `${this.where}: field ${key} is ${JSON.stringify(v)}; only ${JSON.stringify(want)} is ` +
          `supported`,
      );
    }
  }

  /** A boolean, `def` when absent. */
  bool(key: string, def: boolean): boolean {
    const v = this.src[key] ?? def;
    if (typeof v !== "boolean") this.fail(key, "a boolean");
    return v;
  }

  /** A string, required unless a default is given. */
  str(key: string, def?: string): string {
    const v = this.src[key] ?? def;
    if (v === undefined || v === null) {
      throw new Error(`${this.where}: required field ${key} is missing`);
    }
    if (typeof v !== "string") this.fail(key, "a string");
    return v;
  }

  /** A list of non-negative integers; empty when absent, unless `required`. */
  intList(key: string, required = false): number[] {
    if (required && !this.has(key)) {
      throw new Error(`${this.where}: required field ${key} is missing`);
    }
    const v = this.src[key] ?? [];
    if (!Array.isArray(v) || !v.every((x) => Number.isSafeInteger(x) && x >= 0)) {
      this.fail(key, "a list of integers >= 0");
    }
    return v as number[];
  }
}

/** Default values of Hugging Face's config classes that do not depend on the model's size. */
export interface FamilyDefaults {
  ropeTheta: number;
  rmsNormEps: number;
  maxPositions: number;
}

/** Turns one model_type's config into a ModelConfig (bos/eos are filled in afterwards). */
export type Normaliser = (f: Fields, modelType: string) => Omit<ModelConfig, "bosId" | "eosIds">;

/** Refuses any activation but SiLU (the FFN kernels compute SwiGLU). */
export function requireSilu(f: Fields): void {
  const act = f.str("hidden_act", "silu");
  if (act !== "silu") {
    throw new Error(`${f.where}: hidden_act ${act} is not supported (only silu)`);
  }
}

/** Rope settings in either the classic (`rope_theta` + `rope_scaling`) or the newer
 * (`rope_parameters`) layout of transformers. */
export function ropeSource(
  f: Fields,
  defaults: FamilyDefaults,
): { theta: number; scaling: RopeScaling } {
  const params = f.src.rope_parameters;
  let theta: number;
  let raw: unknown;
  if (params && typeof params === "object" && !Array.isArray(params)) {
    const p = new Fields(params as Json, `${f.where} rope_parameters`);
    theta = p.num("rope_theta", f.has("rope_theta") ? f.num("rope_theta") : defaults.ropeTheta);
    raw = params;
  } else {
    theta = f.num("rope_theta", defaults.ropeTheta);
    raw = f.src.rope_scaling;
  }
  return { theta, scaling: resolveRopeScaling(raw, f) };
}

/** Resolves a `rope_scaling` object into a {@link RopeScaling}. */
function resolveRopeScaling(raw: unknown, f: Fields): RopeScaling {
  if (raw === undefined || raw === null) return { type: "none" };
  if (typeof raw !== "object" || Array.isArray(raw)) {
    throw new Error(`${f.where}: field rope_scaling must be an object or null`);
  }
  const r = new Fields(raw as Json, `${f.where} rope_scaling`);
  const type = r.str("rope_type", r.has("type") ? r.str("type") : "default");
  switch (type) {
    case "default":
      return { type: "none" };
    case "linear":
      return { type: "linear", factor: r.num("factor") };
    case "llama3":
      return {
        type: "llama3",
        factor: r.num("factor"),
        lowFreqFactor: r.num("low_freq_factor"),
        highFreqFactor: r.num("high_freq_factor"),
        originalMaxPositions: r.int("original_max_position_embeddings", { min: 1 }),
      };
    case "yarn": {
      const truncate = r.has("truncate") ? { truncate: r.bool("truncate", true) } : {};
      return {
        type: "yarn",
        factor: r.num("factor"),
        originalMaxPositions: r.int("original_max_position_embeddings", {
          min: 1,
          def: f.has("max_position_embeddings") ? f.int("max_position_embeddings") : undefined,
        }),
        betaFast: r.num("beta_fast", 32),
        betaSlow: r.num("beta_slow", 1),
        mscale: r.num("mscale", 1),
        mscaleAllDim: r.num("mscale_all_dim", 0),
        ...truncate,
      };
    }
    default:
      throw new Error(
        `${f.where}: rope_scaling type ${type} is not supported (default, linear, llama3, yarn)`,
      );
  }
}

/** Softmax top-k routing as in Mixtral / Qwen3 (no groups, no bias, no shared expert). */
export function softmaxMoe(
  numExperts: number,
  topK: number,
  inter: number,
  normTopK: boolean,
): MoeConfig {
  return {
    numExperts,
    topK,
    expertIntermediate: inter,
    scoring: "softmax",
    normTopK,
    routedScaling: 1,
    nGroup: 1,
    topkGroup: 1,
    selectionBias: false,
    sharedIntermediate: 0,
  };
}

/**
 * DeepSeek-style routing (DeepSeek-V3, Kimi-K2, GLM-4.5): sigmoid or softmax scores, optional
 * group-limited selection, the noaux_tc selection bias, routed_scaling_factor and shared experts.
 * `defaults` stands in for fields a model_type's config class defaults (GLM's).
 */
export function groupedMoe(
  f: Fields,
  numExperts: number,
  scoring: string,
  topkMethod: string,
  defaults: { routedScaling?: number; groups?: number; sharedExperts?: number } = {},
): MoeConfig {
  const topK = f.int("num_experts_per_tok", { min: 1 });
  checkTopK(f, numExperts, topK);
  if (scoring !== "sigmoid" && scoring !== "softmax") {
    throw new Error(`${f.where}: scoring_func ${scoring} is not supported (sigmoid, softmax)`);
  }
  if (!["noaux_tc", "greedy", "group_limited_greedy"].includes(topkMethod)) {
    throw new Error(`${f.where}: topk_method ${topkMethod} is not supported`);
  }
  const grouped = topkMethod !== "greedy";
  const nGroup = grouped ? f.int("n_group", { min: 1, def: defaults.groups }) : 1;
  const topkGroup = grouped ? f.int("topk_group", { min: 1, def: defaults.groups }) : 1;
  if (numExperts % nGroup || topkGroup > nGroup) {
    throw new Error(
      `${f.where}: n_group ${nGroup} must divide n_routed_experts ${numExperts} and be >= ` +
        `topk_group ${topkGroup}`,
    );
  }
  const inter = f.int("moe_intermediate_size", { min: 1 });
  return {
    numExperts,
    topK,
    expertIntermediate: inter,
    scoring,
    normTopK: f.bool("norm_topk_prob", true),
    routedScaling: f.num("routed_scaling_factor", defaults.routedScaling),
    nGroup,
    topkGroup,
    selectionBias: topkMethod === "noaux_tc",
    sharedIntermediate: inter * f.int("n_shared_experts", { def: defaults.sharedExperts }),
  };
}

/** num_experts_per_tok must be in 1..numExperts. */
export function checkTopK(f: Fields, numExperts: number, topK: number): void {
  if (topK < 1 || topK > numExperts) {
    throw new Error(`${f.where}: num_experts_per_tok ${topK} must be in 1..${numExperts}`);
  }
}
