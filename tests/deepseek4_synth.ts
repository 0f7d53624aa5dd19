/**
 * A DeepSeek-V4 model llama.cpp's deepseek4 can run, for the GGUF export tests: tools/synth's
 * deepseek_v4 at tiny-deepseek-v4's sizes and layer pattern (window-only, CSA, HCA; hash routing
 * on layers 0–2) in the release's storage (FP8 + E8M0 blocks, FP4 experts, BF16, F32, I64
 * `tid2eid`), but with index_head_dim 64: llama.cpp v0.4.0 stops on the fixture's 16
 * (tools/dev/gguf/deepseek4.ts).
 *
 * @module
 */
import { join } from "node:path";
import { synthCheckpoint, type SynthOverrides } from "../tools/synth.ts";
import { tempDir } from "./fixtures.ts";

/** tiny-deepseek-v4-fp8's sizes, for the synthesiser (README "config.json"). */
export const DEEPSEEK4_FIXTURE_DIMS: SynthOverrides = {
  hidden: 64,
  layers: 6,
  experts: 16,
  topK: 4,
  expertInter: 32,
  vocab: 512,
  heads: 4,
  headDim: 32,
  ropeDim: 8,
  qLoraRank: 32,
  oGroups: 2,
  oLoraRank: 16,
  window: 16,
  indexHeads: 32,
  indexHeadDim: 16,
  indexTopK: 4,
  hashLayers: 3,
  hcMult: 4,
  maxPositions: 1048576,
};

/** tiny-deepseek-v4's sizes with a 64-wide indexer head. */
export const DEEPSEEK4_GGUF_DIMS: SynthOverrides = { ...DEEPSEEK4_FIXTURE_DIMS, indexHeadDim: 64 };

let made: Promise<string> | null = null;

/** The checkpoint directory (made once per test process). */
export function deepseek4GgufCheckpoint(): Promise<string> {
  made ??= synthCheckpoint({
    arch: "deepseek_v4",
    out: join(tempDir(), "deepseek4-ix64"),
    size: 1e6,
    overrides: DEEPSEEK4_GGUF_DIMS,
    progress: "off",
    log: () => {},
  }).then((r) => r.dir);
  return made;
}
