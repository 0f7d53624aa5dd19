/**
 * Turns a Hugging Face `config.json` (+ `generation_config.json`) into a {@link ModelConfig}.
 * The normaliser of each model_type lives in its family's file and is found through the registry
 * (engine/models/mod.ts); this file picks the config object and model_type, and fills in the
 * special token ids. Fields that change the math and have no documented Hugging Face default must
 * be present; missing ones are errors naming the field.
 *
 * @module
 */

import { readJson } from "../io/json_file.ts";
import { existsSync } from "node:fs";
import { join } from "node:path";
import type { ModelConfig } from "../io/model_config.ts";
import { Fields, type Json } from "./models/hf_config.ts";
import { REFUSED_ARCHITECTURES } from "./models/deepseek_v4.ts";
import { MODEL_TYPES } from "./models/mod.ts";
import { checkConfigBounds } from "./tensor_shapes.ts";

/** The model_types {@link normalizeConfig} accepts. */
export const SUPPORTED_MODEL_TYPES: readonly string[] = Object.keys(MODEL_TYPES);

function asObject(v: unknown, where: string): Json {
  if (v === null || typeof v !== "object" || Array.isArray(v)) {
    throw new Error(`${where}: expected a JSON object`);
  }
  return v as Json;
}

/** Picks the config object and model_type to normalise, descending into `text_config`. */
function dispatch(hf: Json, where: string): { cfg: Json; modelType: string; where: string } {
  const mt = hf.model_type;
  if (typeof mt === "string" && Object.hasOwn(MODEL_TYPES, mt)) {
    return { cfg: hf, modelType: mt, where };
  }
  if (hf.text_config !== undefined && hf.text_config !== null) {
    const inner = asObject(hf.text_config, `${where} text_config`);
    return dispatch(inner, `${where} text_config`);
  }
  const archs = Array.isArray(hf.architectures) ? hf.architectures : [];
  for (const a of archs) {
    if (typeof a === "string" && Object.hasOwn(REFUSED_ARCHITECTURES, a)) {
      throw new Error(`${where}: architectures: ${REFUSED_ARCHITECTURES[a]}`);
    }
  }
  for (const a of archs) {
    const known = Object.entries(MODEL_TYPES).find(([, t]) => t.architectures.includes(a));
    if (typeof a === "string" && known && mt === undefined) {
      return { cfg: hf, modelType: known[0], where };
    }
  }
  throw new Error(
    `${where}: model_type ${mt === undefined ? "(none)" : JSON.stringify(mt)} (architectures ` +
      `${JSON.stringify(archs)}) is not ` +
      `supported; supported model_types: ${SUPPORTED_MODEL_TYPES.join(", ")}`,
  );
}

/**
 * How many multi-token-prediction layers the config declares (`num_nextn_predict_layers`, or
 * Qwen's `mtp_num_hidden_layers`); pack keeps them only where the checkpoint holds them.
 */
function mtpLayersOf(cfg: Json, text: Json, where: string): number {
  for (const key of ["num_nextn_predict_layers", "mtp_num_hidden_layers"]) {
    const v = cfg[key] ?? text[key];
    if (v === undefined || v === null) continue;
    if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 0 || v > 64) {
      throw new Error(
        `${where}: field ${key} must be an integer in 0..64, got ${JSON.stringify(v)}`,
      );
    }
    return v;
  }
  return 0;
}

function tokenId(v: unknown, field: string, where: string): number {
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 0) {
    throw new Error(`${where}: field ${field} must be a token id, got ${JSON.stringify(v)}`);
  }
  return v;
}

/**
 * Normalises a parsed Hugging Face config (and optional generation config) into a ModelConfig.
 * bos/eos come from the generation config when it sets them, else from the config.
 */
export function normalizeConfig(
  hf: unknown,
  generation?: unknown,
  where = "config.json",
): ModelConfig {
  const top = asObject(hf, where);
  const { cfg, modelType, where: at } = dispatch(top, where);
  const base = MODEL_TYPES[modelType].normalise(new Fields(cfg, at), modelType);
  const gen = generation === undefined || generation === null
    ? {}
    : asObject(generation, "generation_config.json");
  // A normaliser that descends into text_config itself (Qwen3.5) leaves the ids there.
  const text = cfg === top && top.text_config && typeof top.text_config === "object"
    ? top.text_config as Json
    : {};
  const pick = (key: string): { v: unknown; from: string } => {
    if (gen[key] !== undefined && gen[key] !== null) {
      return { v: gen[key], from: "generation_config.json" };
    }
    if (cfg[key] !== undefined && cfg[key] !== null) return { v: cfg[key], from: at };
    if (text[key] !== undefined && text[key] !== null) {
      return { v: text[key], from: `${where} text_config` };
    }
    return { v: top[key], from: where };
  };
  const bos = pick("bos_token_id");
  const eos = pick("eos_token_id");
  const eosList = eos.v === undefined || eos.v === null
    ? []
    : Array.isArray(eos.v)
    ? eos.v
    : [eos.v];
  const mtp = MODEL_TYPES[modelType].mtp ? mtpLayersOf(cfg, text, at) : 0;
  const cfgOut: ModelConfig = {
    ...base,
    ...(mtp > 0 ? { mtp: { layers: mtp } } : {}),
    bosId: bos.v === undefined || bos.v === null ? null : tokenId(bos.v, "bos_token_id", bos.from),
    eosIds: eosList.map((v) => tokenId(v, "eos_token_id", eos.from)),
  };
  const ids: [number | null, string][] = [
    [cfgOut.bosId, bos.from],
    ...cfgOut.eosIds.map((id): [number, string] => [id, eos.from]),
  ];
  for (const [id, from] of ids) {
    if (id !== null && id >= cfgOut.vocabSize) {
      throw new Error(
        `${from}: special token id ${id} is outside the vocabulary of ${cfgOut.vocabSize} ` +
          `(vocab_size of ${at})`,
      );
    }
  }
  checkConfigBounds(cfgOut, at);
  return cfgOut;
}

/** Reads `config.json` (and `generation_config.json` when present) of a checkpoint directory. */
export function loadModelConfig(dir: string): ModelConfig {
  const cfgPath = join(dir, "config.json");
  const genPath = join(dir, "generation_config.json");
  const gen = existsSync(genPath) ? readJson(genPath) : undefined;
  return normalizeConfig(readJson(cfgPath), gen, cfgPath);
}
