/**
 * Builds the container's `manifest.json` from the layout and the journal: the config, the source
 * fingerprint, every trunk region and tensor entry, each expert bank with its codebook references,
 * and the pack settings.
 *
 * @module
 */

import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import {
  EXPERT_MATRICES,
  type ExpertMatrix,
  type GlobalTensor,
  type ModelConfig,
} from "../../io/model_config.ts";
import {
  type CodebookRef,
  CODEBOOKS_FILE,
  CONTAINER_FORMAT,
  CONTAINER_VERSION,
  type ExpertBank,
  expertBankFile,
  type LayerRun,
  type Manifest,
  type PackSettings,
  type TensorEntry,
  TRUNK_FILE,
} from "../../io/manifest_schema.ts";
import type { Journal } from "./journal.ts";
import { codebookSetBytes, type PackLayout } from "./layout.ts";

function readOptionalJson(path: string): unknown {
  return existsSync(path) ? JSON.parse(readFileSync(path, "utf-8")) : undefined;
}

/**
 * The manifest of a finished pack of `src`: layout from `layout`, region and codebook CRCs from
 * the completed `journal`, `fp` the source fingerprint; `tokenizer.files` is left empty.
 */
export function buildManifest(
  src: string,
  cfg: ModelConfig,
  layout: PackLayout,
  journal: Journal,
  fp: string,
  settings: PackSettings,
): Manifest {
  const globals: Partial<Record<GlobalTensor, TensorEntry>> = {};
  for (const [g, p] of layout.globals.items) globals[g] = p.entry;
  const layers: LayerRun[] = layout.layers.map((lp, l) => ({
    ...journal.layers[l],
    tensors: Object.fromEntries([...lp.items].map(([t, p]) => [t, p.entry])),
  }));
  const experts: (ExpertBank | null)[] = layout.banks.map((b, l) => {
    if (!b) return null;
    const bank: ExpertBank = {
      layer: l,
      file: expertBankFile(l),
      count: b.experts.length,
      stride: b.stride,
      format: b.format,
      matrices: b.matrices,
    };
    if (Object.keys(b.fallback).length) bank.fallback = b.fallback;
    if (b.shipped) bank.activations = "f32";
    if (b.biases) bank.biases = b.biases;
    const refs: Partial<Record<ExpertMatrix, CodebookRef>> = {};
    for (const m of EXPERT_MATRICES) {
      const offset = b.codebookOffsets[m];
      if (offset === undefined) continue;
      refs[m] = { offset, bytes: codebookSetBytes(b, m), crc32: journal.codebooks[l][m]! };
    }
    if (Object.keys(refs).length) bank.codebooks = refs;
    return bank;
  });
  // The MTP layers' runs and banks follow the main ones in the layout; the manifest keeps them
  // apart, so everything that walks the model's layers walks only those.
  const n = cfg.numLayers;
  return {
    format: CONTAINER_FORMAT,
    version: CONTAINER_VERSION,
    config: cfg,
    source: {
      config: readOptionalJson(join(src, "config.json")),
      generation_config: readOptionalJson(join(src, "generation_config.json")),
      fingerprint: fp,
    },
    trunk: {
      file: TRUNK_FILE,
      bytes: layout.trunkBytes,
      globals: { region: journal.globals!, tensors: globals },
      layers: layers.slice(0, n),
    },
    experts: experts.slice(0, n),
    ...(cfg.mtp ? { mtp: { layers: layers.slice(n), experts: experts.slice(n) } } : {}),
    ...(layout.codebooksBytes > 0
      ? { codebooks: { file: CODEBOOKS_FILE, bytes: layout.codebooksBytes } }
      : {}),
    pack: settings,
    tokenizer: { files: [] },
  };
}
