/**
 * The speculative-decoding flags of generate, chat and serve, declared once for the one
 * argument parser (./args.ts) and read into the session's SpecOptions.
 *
 * @module
 */
import { DEFAULT_DRAFT_MAX, parseSpec, type SpecOptions } from "../../engine/speculate.ts";
import type { Args, Flags } from "./args.ts";

/** The --help lines of {@link SPEC_FLAGS}. */
export const SPEC_HELP =
  `  --spec ngram[:N]      draft from the context itself: the tokens after the latest earlier
                        match of its last N tokens (default N 3); greedy or seeded output is
                        exactly that of plain decoding
  --spec mtp            draft with the model's own multi-token-prediction layer (GLM-4.5,
                        GLM-5, DeepSeek-V3, Qwen3.5, Qwen3-Next containers packed with it);
                        greedy or seeded output is exactly that of plain decoding
  --draft MODEL         draft with a smaller container sharing the tokenizer; greedy output is
                        exactly that of plain decoding, sampled output has its distribution
  --draft-max K         most drafted tokens verified per pass (default ${DEFAULT_DRAFT_MAX})
  --spec-always         keep drafting even when it measures slower than plain decoding`;

/** The speculation flags, with llama.cpp's spellings as aliases. */
export const SPEC_FLAGS: Flags = {
  spec: { type: "string" },
  draft: { type: "string", aliases: ["model-draft"] },
  "draft-max": { type: "string" },
  "spec-always": { type: "boolean" },
};

/** The SpecOptions of {@link SPEC_FLAGS}, or undefined when speculation is off. */
export function specFromArgs(a: Args): SpecOptions | undefined {
  const spec = a.str("spec");
  const draft = a.str("draft");
  if (spec === undefined && draft === undefined) {
    if (a.str("draft-max") !== undefined || a.bool("spec-always")) {
      throw new Error(
        "--draft-max and --spec-always need --spec ngram or --draft MODEL (or --spec mtp)",
      );
    }
    return undefined;
  }
  if (spec !== undefined && draft !== undefined) {
    throw new Error("give --spec or --draft MODEL, not both");
  }
  return {
    ...(spec === undefined ? {} : parseSpec(spec)),
    draft,
    draftMax: a.int("draft-max", 1),
    adaptive: !a.bool("spec-always"),
  };
}
