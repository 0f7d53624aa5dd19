/**
 * `deno task quant-report <hf-dir|x.sluice> [--json] [--prompt TEXT]... [--steps N]`: how much
 * each compact format loses on one model.
 *
 * 1. Weight error: for every trunk matmul weight and every (MoE layer, expert matrix kind), the
 *    relative error ‖w − ŵ‖ / ‖w‖ of mxfp4, int4 (group 32), int8 (per row), fp8 (128×128 blocks)
 *    and, for experts, vq3r (codebooks trained as pack trains them). Expert errors pool the
 *    squared errors of evenly spaced sampled experts.
 * 2. Model quality (from a checkpoint directory): the checkpoint is packed once as is and once per
 *    variant (`--experts F` for each format, and `--trunk int8`) into a temporary directory; each
 *    container is teacher-forced over the same tokens (story prompts followed by the unquantised
 *    model's greedy continuation); per position, KL(p_ref ‖ p_variant) of the next-token
 *    distributions and whether the top-1 tokens agree.
 *
 * A container input gets the weight errors of its stored (dequantised) weights only: re-packing
 * needs the checkpoint.
 *
 * @module
 */
import { existsSync, statSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { Model } from "../../engine/model.ts";
import { EXPERT_MATRICES, type LayerTensor, type ModelConfig } from "../../io/model_config.ts";
import { WEIGHT_FORMATS } from "../../engine/quant/mod.ts";
import { storedBytes } from "../../io/format.ts";
import { dequantizeVq3r, encodeVq3r, type MatrixF32, trainVq3r } from "../../engine/quant/vq3r.ts";
import {
  checkpointWeights,
  containerWeights,
  type FloatWeights,
} from "../../engine/float_weights.ts";
import { argmax } from "../../engine/sampler.ts";
import { layerTensorsOf } from "../../engine/tensor_names.ts";
import { loadTokenizer } from "../../engine/tokenizer.ts";
import { openContainer } from "../../engine/container.ts";
import { type ExpertsOption, packCheckpoint } from "../pack.ts";

/** Formats whose weight error is reported: the lossy weight formats, by their `--experts` names. */
export const REPORT_FORMATS: readonly string[] = WEIGHT_FORMATS.filter((f) => f.lossy).map((f) =>
  f.option!
);
/** A reported format: one of {@link REPORT_FORMATS}. */
export type ReportFormat = string;

/** Default story prompts of the quality run. */
export const DEFAULT_PROMPTS = [
  "Once upon a time, there was a little girl",
  "One day, a boy named Tom went to the park",
  "The cat and the dog were best friends",
];

/** Relative weight error of one matrix (or one expert matrix kind of a layer) per format. */
export interface WeightErrorRow {
  /** "L3 wq" or "L3 experts.gate". */
  matrix: string;
  rows: number;
  cols: number;
  /** Experts pooled (1 for a trunk matrix). */
  count: number;
  /** null where the format cannot hold the matrix (cols not a multiple of 32) or is not tried. */
  errors: Record<ReportFormat, number | null>;
}

/** KL divergence and top-1 agreement of one packed variant against the unquantised container. */
export interface QualityRow {
  variant: string;
  /** Mean KL(p_ref ‖ p_variant) in nats over all teacher-forced positions. */
  kl: number;
  /** Largest per-position KL. */
  klMax: number;
  /** Fraction of positions whose argmax agrees with the reference's. */
  top1: number;
  positions: number;
  /** Bytes of trunk, banks and codebooks. */
  containerBytes: number;
}

/** The whole report. */
export interface QuantReport {
  source: string;
  weights: WeightErrorRow[];
  /** Per format, the pooled error over expert rows and over trunk rows. */
  summary: Record<ReportFormat, { experts: number | null; trunk: number | null }>;
  quality: QualityRow[];
  /** Tokens of each teacher-forced sequence. */
  sequences: number[][];
}

/** Options of {@link quantReport}. */
export interface QuantReportOptions {
  prompts?: string[];
  /** Greedy tokens appended to each prompt by the reference model (default 40). */
  steps?: number;
  /** Experts per layer whose matrices are measured (default 8). */
  expertsSampled?: number;
  /** VQ3R training settings (defaults as in pack). */
  vq3r?: { sampleSize?: number; iterations?: number };
  /** Skip the model-quality part. */
  weightsOnly?: boolean;
  /** Informational lines (default stderr). */
  log?: (line: string) => void;
}

/** Squared error and squared norm of one format's reconstruction, for pooling. */
interface Sums {
  err: number;
  norm: number;
}

function sums(w: Float32Array, approx: Float32Array): Sums {
  let err = 0, norm = 0;
  for (let i = 0; i < w.length; i++) {
    err += (approx[i] - w[i]) ** 2;
    norm += w[i] ** 2;
  }
  return { err, norm };
}

/** The reconstruction of `w` [rows, cols] in format `f`, or null when `f` cannot hold it. */
function roundTrip(
  f: ReportFormat,
  w: Float32Array,
  rows: number,
  cols: number,
): Float32Array | null {
  const fmt = WEIGHT_FORMATS.find((x) => x.option === f)!;
  if (Number.isNaN(storedBytes(fmt.id, [rows, cols]))) return null;
  const e = fmt.encode(w, rows, cols, `${f} [${rows}, ${cols}]`);
  return fmt.decode(e.data, e.scale ?? undefined, rows, cols, `${f} [${rows}, ${cols}]`);
}

/** Errors of a group of matrices of one shape, pooled; vq3r trained on the group when asked. */
function groupErrors(
  mats: MatrixF32[],
  vq3r: QuantReportOptions["vq3r"] | null,
): Record<ReportFormat, number | null> {
  const out = {} as Record<ReportFormat, number | null>;
  for (const f of REPORT_FORMATS) {
    if (f === "vq3r" && !vq3r) {
      out[f] = null;
      continue;
    }
    const books = f === "vq3r" ? trainVq3r(mats, vq3r ?? {}) : null;
    const total: Sums = { err: 0, norm: 0 };
    let ok = true;
    for (const m of mats) {
      const approx = books
        ? dequantizeVq3r(encodeVq3r(m, books), books)
        : roundTrip(f, m.data, m.rows, m.cols);
      if (!approx) {
        ok = false;
        break;
      }
      const s = sums(m.data, approx);
      total.err += s.err;
      total.norm += s.norm;
    }
    out[f] = ok ? (total.norm > 0 ? Math.sqrt(total.err / total.norm) : 0) : null;
  }
  return out;
}

/** A float32 tensor as a matrix; an error names `what` unless it is 2-D. */
function matrixOf(data: Float32Array, shape: number[], what: string): MatrixF32 {
  if (shape.length !== 2) throw new Error(`${what}: not a 2-D tensor`);
  return { data, rows: shape[0], cols: shape[1] };
}

/** A layer's 2-D trunk matmul weights (not norms, routers or biases). */
function trunkNames(cfg: ModelConfig, layer: number): LayerTensor[] {
  return layerTensorsOf(cfg, layer).filter((t) =>
    !t.endsWith("norm") && t !== "router" && t !== "router_bias" && !/^b[qkv]$/.test(t)
  );
}

/** Per-matrix relative weight errors of every format. */
export function weightErrors(
  src: FloatWeights,
  opts: QuantReportOptions,
): WeightErrorRow[] {
  const cfg = src.cfg;
  const rows: WeightErrorRow[] = [];
  for (let l = 0; l < cfg.numLayers; l++) {
    for (const name of trunkNames(cfg, l)) {
      const w = matrixOf(src.layer(l, name), src.layerShape(l, name), `${src.dir}: ${name}`);
      rows.push({
        matrix: `L${l} ${name}`,
        rows: w.rows,
        cols: w.cols,
        count: 1,
        errors: groupErrors([w], null),
      });
    }
    if (cfg.layerKinds[l] !== "moe") continue;
    const E = cfg.moe!.numExperts;
    const n = Math.max(1, Math.min(E, opts.expertsSampled ?? 8));
    for (const m of EXPERT_MATRICES) {
      const mats = Array.from({ length: n }, (_, i) => {
        const e = Math.floor((i * E) / n);
        const [rows, cols] = src.expertShape(l, e, m);
        return { data: src.expert(l, e, m), rows, cols };
      });
      rows.push({
        matrix: `L${l} experts.${m}`,
        rows: mats[0].rows,
        cols: mats[0].cols,
        count: n,
        errors: groupErrors(mats, opts.vq3r ?? {}),
      });
      opts.log?.(`quant-report: weight errors of layer ${l} experts.${m} done`);
    }
  }
  return rows;
}

/** Softmax of float logits in float64. */
function softmax64(logits: ArrayLike<number>): Float64Array {
  let max = -Infinity;
  for (let i = 0; i < logits.length; i++) max = Math.max(max, logits[i]);
  const p = new Float64Array(logits.length);
  let sum = 0;
  for (let i = 0; i < logits.length; i++) sum += p[i] = Math.exp(logits[i] - max);
  for (let i = 0; i < p.length; i++) p[i] /= sum;
  return p;
}

/** KL(p ‖ q) in nats of the next-token distributions given by two logit vectors. */
export function klDivergence(refLogits: ArrayLike<number>, logits: ArrayLike<number>): number {
  const p = softmax64(refLogits), q = softmax64(logits);
  let kl = 0;
  for (let i = 0; i < p.length; i++) {
    if (p[i] > 0) kl += p[i] * Math.log(p[i] / Math.max(q[i], Number.MIN_VALUE));
  }
  return Math.max(0, kl);
}

/** Logits of every position of each sequence (teacher forcing). */
async function teacherForce(dir: string, sequences: number[][]): Promise<Float32Array[][]> {
  const model = await Model.open(dir, {
    quiet: true,
    ctx: Math.max(...sequences.map((s) => s.length)),
  });
  try {
    const V = model.cfg.vocabSize;
    return sequences.map((seq) => {
      const out: Float32Array[] = [];
      for (let p0 = 0; p0 < seq.length; p0 += model.prefillChunk) {
        const chunk = seq.slice(p0, p0 + model.prefillChunk);
        const all = model.forward(chunk, p0, true);
        for (let i = 0; i < chunk.length; i++) out.push(all.subarray(i * V, (i + 1) * V));
      }
      return out;
    });
  } finally {
    model.close();
  }
}

/** The sequences to teacher-force: each prompt plus the reference model's greedy continuation. */
async function referenceSequences(
  dir: string,
  prompts: string[],
  steps: number,
): Promise<number[][]> {
  const tok = await loadTokenizer(dir);
  const model = await Model.open(dir, { quiet: true, ctx: 512 });
  try {
    return prompts.map((text) => {
      const seq = tok.encode(text);
      let logits = model.forward(seq, 0);
      for (let i = 0; i < steps; i++) {
        const next = argmax(logits);
        seq.push(next);
        logits = model.forward([next], seq.length - 1);
      }
      return seq;
    });
  } finally {
    model.close();
  }
}

function containerBytes(dir: string): number {
  const m = openContainer(dir).manifest;
  let n = m.trunk.bytes + (m.codebooks?.bytes ?? 0);
  for (const b of m.experts) if (b) n += b.count * b.stride;
  return n;
}

/** Packs `hfDir` as is and per variant, and compares each variant's logits to the reference. */
async function qualityRows(
  hfDir: string,
  opts: QuantReportOptions,
  log: (line: string) => void,
): Promise<{ rows: QualityRow[]; sequences: number[][] }> {
  const tmp = Deno.makeTempDirSync({ prefix: "sluice-quant-report-" });
  try {
    const pack = async (name: string, experts?: ExpertsOption, trunk?: "int8") => {
      const out = join(tmp, `${name}.sluice`);
      await packCheckpoint(hfDir, out, {
        experts,
        trunk,
        vq3r: opts.vq3r,
        progress: "off",
        log: () => {},
      });
      return out;
    };
    const ref = await pack("reference");
    const cfg = openContainer(ref).config;
    const sequences = await referenceSequences(
      ref,
      opts.prompts ?? DEFAULT_PROMPTS,
      opts.steps ?? 40,
    );
    const want = await teacherForce(ref, sequences);
    const variants: [string, ExpertsOption | undefined, "int8" | undefined][] = [];
    if (cfg.moe) {
      for (const f of REPORT_FORMATS) variants.push([`experts ${f}`, f, undefined]);
    }
    variants.push(["trunk int8", undefined, "int8"]);
    const rows: QualityRow[] = [];
    for (const [name, experts, trunk] of variants) {
      log(`quant-report: packing and running ${name}`);
      const dir = await pack(name.replace(" ", "-"), experts, trunk);
      const got = await teacherForce(dir, sequences);
      let kl = 0, klMax = 0, agree = 0, n = 0;
      want.forEach((seq, s) =>
        seq.forEach((w, p) => {
          const k = klDivergence(w, got[s][p]);
          kl += k;
          klMax = Math.max(klMax, k);
          if (argmax(w) === argmax(got[s][p])) agree++;
          n++;
        })
      );
      rows.push({
        variant: name,
        kl: kl / n,
        klMax,
        top1: agree / n,
        positions: n,
        containerBytes: containerBytes(dir),
      });
    }
    rows.unshift({
      variant: "reference",
      kl: 0,
      klMax: 0,
      top1: 1,
      positions: want.reduce((a, s) => a + s.length, 0),
      containerBytes: containerBytes(ref),
    });
    return { rows, sequences };
  } finally {
    Deno.removeSync(tmp, { recursive: true });
  }
}

function summarise(rows: WeightErrorRow[]): QuantReport["summary"] {
  const out = {} as QuantReport["summary"];
  for (const f of REPORT_FORMATS) {
    const pooled = (pick: (r: WeightErrorRow) => boolean) => {
      const xs = rows.filter(pick).map((r) => r.errors[f]).filter((x): x is number => x !== null);
      return xs.length ? Math.sqrt(xs.reduce((a, x) => a + x * x, 0) / xs.length) : null;
    };
    out[f] = {
      experts: pooled((r) => r.matrix.includes("experts.")),
      trunk: pooled((r) => !r.matrix.includes("experts.")),
    };
  }
  return out;
}

/** Builds the report for a checkpoint directory or a container. */
export async function quantReport(
  path: string,
  opts: QuantReportOptions = {},
): Promise<QuantReport> {
  const log = opts.log ?? ((s: string) => console.error(s));
  const isContainer = existsSync(join(path, "manifest.json"));
  if (!isContainer && !(existsSync(path) && statSync(path).isDirectory())) {
    throw new Error(`${path}: not a checkpoint directory or a sluice container`);
  }
  const src = isContainer ? containerWeights(path) : checkpointWeights(path);
  let weights: WeightErrorRow[];
  try {
    weights = weightErrors(src, { ...opts, log });
  } finally {
    src.close();
  }
  let quality: QualityRow[] = [], sequences: number[][] = [];
  if (!isContainer && !opts.weightsOnly) {
    ({ rows: quality, sequences } = await qualityRows(path, opts, log));
  } else if (isContainer) {
    log("quant-report: a container input gets weight errors only (KL needs the checkpoint)");
  }
  return { source: path, weights, summary: summarise(weights), quality, sequences };
}

const pct = (x: number | null) => (x === null ? "—" : `${(100 * x).toFixed(2)}%`);

/** The report as text tables. */
export function formatReport(r: QuantReport): string {
  const lines = [`quant-report: ${r.source}`, "", "relative weight error ‖w − ŵ‖ / ‖w‖"];
  const head = ["matrix", "shape", ...REPORT_FORMATS];
  const body = r.weights.map((w) => [
    w.count > 1 ? `${w.matrix} (${w.count})` : w.matrix,
    `${w.rows}×${w.cols}`,
    ...REPORT_FORMATS.map((f) => pct(w.errors[f])),
  ]);
  body.push(["all experts", "", ...REPORT_FORMATS.map((f) => pct(r.summary[f].experts))]);
  body.push(["all trunk", "", ...REPORT_FORMATS.map((f) => pct(r.summary[f].trunk))]);
  lines.push(...table(head, body));
  if (r.quality.length) {
    const n = r.sequences.reduce((a, s) => a + s.length, 0);
    lines.push(
      "",
      `next-token quality vs the unquantised model (${r.sequences.length} sequences, ${n} positions)`,
    );
    lines.push(...table(
      ["variant", "KL mean (nats)", "KL max", "top-1 agree", "bytes"],
      r.quality.map((q) => [
        q.variant,
        q.kl.toExponential(3),
        q.klMax.toExponential(3),
        `${(100 * q.top1).toFixed(1)}%`,
        String(q.containerBytes),
      ]),
    ));
  }
  return lines.join("\n");
}

function table(head: string[], body: string[][]): string[] {
  const widths = head.map((h, i) => Math.max(h.length, ...body.map((r) => r[i].length)));
  const row = (r: string[]) =>
    r.map((c, i) => (i < 2 ? c.padEnd(widths[i]) : c.padStart(widths[i]))).join("  ");
  return [row(head), widths.map((w) => "-".repeat(w)).join("  "), ...body.map(row)];
}

const USAGE = "usage: deno task quant-report <hf-dir|x.sluice> [--json] [--prompt TEXT]... " +
  "[--steps N] [--experts-sampled N] [--vq3r-sample N] [--vq3r-iterations N] [--weights-only]";

async function main(args: string[]): Promise<number> {
  let parsed;
  try {
    parsed = parseArgs({
      args,
      allowPositionals: true,
      options: {
        json: { type: "boolean" },
        prompt: { type: "string", multiple: true },
        steps: { type: "string" },
        "experts-sampled": { type: "string" },
        "vq3r-sample": { type: "string" },
        "vq3r-iterations": { type: "string" },
        "weights-only": { type: "boolean" },
        help: { type: "boolean" },
      },
    });
  } catch (e) {
    console.error(`quant-report: ${(e as Error).message}\n${USAGE}`);
    return 1;
  }
  const v = parsed.values;
  if (v.help) {
    console.log(USAGE);
    return 0;
  }
  if (parsed.positionals.length !== 1) {
    console.error(`quant-report: expected one checkpoint directory or container\n${USAGE}`);
    return 1;
  }
  const count = (s: string | undefined, flag: string) => {
    if (s === undefined) return undefined;
    const n = Number(s);
    if (!Number.isInteger(n) || n < 1) throw new Error(`--${flag} must be a positive integer`);
    return n;
  };
  try {
    const report = await quantReport(parsed.positionals[0], {
      prompts: v.prompt,
      steps: count(v.steps, "steps"),
      expertsSampled: count(v["experts-sampled"], "experts-sampled"),
      vq3r: {
        sampleSize: count(v["vq3r-sample"], "vq3r-sample"),
        iterations: count(v["vq3r-iterations"], "vq3r-iterations"),
      },
      weightsOnly: v["weights-only"],
    });
    console.log(v.json ? JSON.stringify(report, null, 1) : formatReport(report));
    return 0;
  } catch (e) {
    console.error(`quant-report: ${(e as Error).message}`);
    return 1;
  }
}

if (import.meta.main) Deno.exit(await main(Deno.args));
