/**
 * `mod.ts inspect <x.sluice> [--json] [--verify]` (also `deno task inspect`): what a container holds: architecture,
 * dense/MoE layers, total and active parameters, bytes read per token, the record layout of
 * each expert bank and the size of every file.
 *
 * @module
 */

import { HELP_FLAG, helpShown, parseCommandArgs } from "./cli/args.ts";
import { resolveModel } from "./cli/models.ts";
import { readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { EXPERT_MATRICES } from "../io/model_config.ts";
import { type TensorEntry, verifyContainer } from "../io/container.ts";
import { openContainer } from "../engine/container.ts";
import { RECORD_HEADER_BYTES } from "../io/format.ts";
import { formatBytes } from "./progress.ts";

/** Layout of one expert bank. */
export interface BankReport {
  layer: number;
  experts: number;
  format: string;
  /** Header plus payload bytes of one record. */
  recordBytes: number;
  stride: number;
  /** Matrix → [offset, bytes] (and scale offset/bytes) inside a record. */
  layout: Record<
    string,
    { offset: number; bytes: number; shape: number[]; scale?: [number, number] }
  >;
}

/** Everything `inspect` reports. */
export interface InspectReport {
  path: string;
  family: string;
  modelType: string;
  layers: { total: number; dense: number; moe: number };
  experts: { perLayer: number; topK: number; shared: boolean } | null;
  params: {
    total: number;
    /** Trunk parameters (embedding included) plus top-k routed experts per MoE layer. */
    active: number;
  };
  /**
   * Bytes a decoded token reads: every layer run, the final norm, the LM head (the embedding when
   * tied) and one embedding row (trunk), plus top-k records per MoE layer (experts).
   */
  bytesPerToken: { trunk: number; experts: number; total: number };
  /** The multi-token-prediction layers kept for `--spec mtp` (not in the counts above). */
  mtp: { layers: number; params: number; bytes: number } | null;
  banks: BankReport[];
  files: { name: string; bytes: number }[];
}

function elems(e: TensorEntry): number {
  return e.shape.reduce((a, b) => a * b, 1);
}

/** Collects the report of the container at `path` (validating its manifest). */
export function inspectContainer(path: string): InspectReport {
  const c = openContainer(path);
  const { config: cfg, manifest: m } = c;
  const g = m.trunk.globals.tensors;
  let trunkParams = 0;
  for (const e of Object.values(g)) trunkParams += elems(e!);
  for (const run of m.trunk.layers) {
    for (const e of Object.values(run.tensors)) trunkParams += elems(e);
  }
  let expertParams = 0, activeExpertParams = 0, expertBytesPerToken = 0;
  const banks: BankReport[] = [];
  for (const bank of m.experts) {
    if (!bank) continue;
    const per = EXPERT_MATRICES.reduce((n, k) => n + elems(bank.matrices[k]), 0);
    expertParams += per * bank.count;
    activeExpertParams += per * cfg.moe!.topK;
    expertBytesPerToken += bank.stride * cfg.moe!.topK;
    let end = RECORD_HEADER_BYTES;
    const layout: BankReport["layout"] = {};
    for (const k of EXPERT_MATRICES) {
      const e = bank.matrices[k];
      layout[k] = { offset: e.offset, bytes: e.bytes, shape: e.shape };
      end = Math.max(end, e.offset + e.bytes);
      if (e.scale) {
        layout[k].scale = [e.scale.offset, e.scale.bytes];
        end = Math.max(end, e.scale.offset + e.scale.bytes);
      }
    }
    banks.push({
      layer: bank.layer,
      experts: bank.count,
      format: bank.format,
      recordBytes: end,
      stride: bank.stride,
      layout,
    });
  }
  const head = g.lm_head ?? g.embed!;
  const rowBytes = g.embed!.bytes / g.embed!.shape[0];
  const trunkPerToken = m.trunk.layers.reduce((n, r) => n + r.bytes, 0) + g.final_norm!.bytes +
    head.bytes + rowBytes;
  const files = readdirSync(path).sort().map((name) => ({
    name,
    bytes: statSync(join(path, name)).size,
  }));
  const moeLayers = cfg.layerKinds.filter((k) => k === "moe").length;
  let mtp: InspectReport["mtp"] = null;
  if (m.mtp) {
    let params = 0, bytes = 0;
    for (const run of m.mtp.layers) {
      for (const e of Object.values(run.tensors)) params += elems(e);
      bytes += run.bytes;
    }
    for (const bank of m.mtp.experts) {
      if (!bank) continue;
      params += bank.count * EXPERT_MATRICES.reduce((n, k) => n + elems(bank.matrices[k]), 0);
      bytes += bank.count * bank.stride;
    }
    mtp = { layers: m.mtp.layers.length, params, bytes };
  }
  return {
    path,
    family: cfg.family,
    modelType: cfg.modelType,
    layers: { total: cfg.numLayers, dense: cfg.numLayers - moeLayers, moe: moeLayers },
    experts: cfg.moe
      ? { perLayer: cfg.moe.numExperts, topK: cfg.moe.topK, shared: cfg.moe.sharedIntermediate > 0 }
      : null,
    params: { total: trunkParams + expertParams, active: trunkParams + activeExpertParams },
    bytesPerToken: {
      trunk: trunkPerToken,
      experts: expertBytesPerToken,
      total: trunkPerToken + expertBytesPerToken,
    },
    mtp,
    banks,
    files,
  };
}

/** Renders a report as text. */
export function formatReport(r: InspectReport): string {
  const lines = [
    `${r.path}`,
    `architecture  ${r.family} (model_type ${r.modelType})`,
    `layers        ${r.layers.total}: ${r.layers.dense} dense, ${r.layers.moe} MoE`,
  ];
  if (r.experts) {
    lines.push(
      `experts       ${r.experts.perLayer} per MoE layer, top-${r.experts.topK}` +
        (r.experts.shared ? ", plus shared experts" : ""),
    );
  }
  lines.push(
    `parameters    ${r.params.total.toLocaleString("en-US")} total, ` +
      `${r.params.active.toLocaleString("en-US")} active per token`,
    `bytes/token   ${formatBytes(r.bytesPerToken.total)} (trunk ${
      formatBytes(r.bytesPerToken.trunk)
    }, experts ${formatBytes(r.bytesPerToken.experts)})`,
  );
  if (r.mtp) {
    lines.push(
      `mtp           ${r.mtp.layers} multi-token-prediction layer(s) for --spec mtp, ` +
        `${r.mtp.params.toLocaleString("en-US")} parameters, ${formatBytes(r.mtp.bytes)}`,
    );
  }
  for (const b of r.banks) {
    const parts = Object.entries(b.layout).map(([k, v]) =>
      `${k} ${v.offset}+${v.bytes}` + (v.scale ? ` (scale ${v.scale[0]}+${v.scale[1]})` : "")
    );
    lines.push(
      `bank L${b.layer}      ${b.experts} × ${b.format}, record ${b.recordBytes} B, stride ` +
        `${b.stride} B: header 0+${RECORD_HEADER_BYTES}, ${parts.join(", ")}`,
    );
  }
  lines.push("files");
  for (const f of r.files) lines.push(`  ${f.name.padEnd(28)} ${formatBytes(f.bytes)}`);
  return lines.join("\n");
}

/** Runs the inspect command with command-line `args`; returns the exit code. */
export async function inspectCommand(args: string[]): Promise<number> {
  const usage = "usage: deno run -A mod.ts inspect <x.sluice> [--json] [--verify]";
  try {
    const a = parseCommandArgs("inspect", args, {
      json: { type: "boolean" },
      verify: { type: "boolean" },
      ...HELP_FLAG,
    }, { positionals: true });
    if (helpShown(a, usage)) return 0;
    if (a.positionals.length !== 1) throw new Error(`expected one container path\n${usage}`);
    const path = await resolveModel(a.positionals[0]);
    const report = inspectContainer(path);
    if (a.bool("verify")) verifyContainer(openContainer(path));
    console.log(a.bool("json") ? JSON.stringify(report, null, 2) : formatReport(report));
    if (a.bool("verify") && !a.bool("json")) console.log("verify        all CRCs match");
    return 0;
  } catch (e) {
    console.error(`inspect: ${(e as Error).message}`);
    return 1;
  }
}

if (import.meta.main) Deno.exit(await inspectCommand(Deno.args));
