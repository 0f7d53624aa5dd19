/**
 * The weight-format registry: every format a container stores weights in, one entry each (in
 * its file beside this one), as ggml's type_traits table lists its types. The kernel dispatch
 * (engine/tensor.ts, engine/quant_matmul.ts), decoding for references (stored_decode.ts), pack's
 * encoder and `--experts` choices, quant-report and the benches read it. docs/ENGINE.md "Adding
 * a weight format" lists the steps.
 *
 * @module
 */
import type { ExpertFormat } from "../../io/format.ts";
import { F8_E4M3 } from "./fp8.ts";
import type { WeightFormat } from "./format.ts";
import { INT4G32 } from "./int4.ts";
import { INT8ROW } from "./int8.ts";
import { MXFP4 } from "./mxfp4.ts";
import { BF16, F16, F32 } from "./plain.ts";
import { VQ3R } from "./vq3r.ts";

/** Every weight format, lossy ones first (the order quant-report reports them in). */
export const WEIGHT_FORMATS: readonly WeightFormat[] = [
  MXFP4,
  INT4G32,
  INT8ROW,
  F8_E4M3,
  VQ3R,
  BF16,
  F32,
  F16,
];

const BY_ID = new Map<string, WeightFormat>(WEIGHT_FORMATS.map((f) => [f.id, f]));

/** The format stored as `dtype`, or undefined when no weight is stored so. */
export function findFormat(dtype: string): WeightFormat | undefined {
  return BY_ID.get(dtype);
}

/** The format stored as `dtype`; an error names `what` and the dtype when there is none. */
export function formatOf(dtype: string, what = "weights"): WeightFormat {
  const f = BY_ID.get(dtype);
  if (!f) throw new Error(`${what}: no weight format ${dtype}`);
  return f;
}

/** `pack --experts` choices and the container format each one stores, in registry order. */
export const EXPERT_OPTIONS: Readonly<Record<string, ExpertFormat>> = Object.fromEntries(
  WEIGHT_FORMATS.filter((f) => f.option).map((f) => [f.option!, f.id]),
);
