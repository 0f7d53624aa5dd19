/**
 * The float64 reference of every mixer kind, by the name io/model_config.ts `mixerOf` gives a
 * layer (the engine's are engine/parts/, found the same way): the oracle each part is tested
 * against. Adding a mixer kind adds its reference here.
 *
 * @module
 */
import type { MixerName } from "../../io/model_config.ts";
import type { ReferenceAttention } from "./forward.ts";
import { csaReference } from "./csa.ts";
import { gatedDeltaNetReference } from "./gated_deltanet.ts";
import { gqaReference } from "./gqa.ts";
import { kdaReference } from "./kda.ts";
import { mlaReference } from "./mla.ts";

/** Every mixer kind's reference. */
export const REFERENCE_MIXERS: Readonly<Record<MixerName, ReferenceAttention>> = {
  gqa: gqaReference,
  mla: mlaReference,
  kda: kdaReference,
  csa: csaReference,
  gdn: gatedDeltaNetReference,
};
