/**
 * The pure parts of `deno task bench compare`: the job/result shapes shared by the engine
 * runners, bytes per token from a container manifest, roofline ratios, the `--json` report and
 * the stdout table. No I/O here, so tests can drive it with stubbed runs.
 *
 * @module
 */

/** What one engine process is asked to do. */
export interface EngineJob {
  /** Container (sluice) or GGUF file (llama.cpp). */
  model: string;
  threads: number;
  /** Prompt token ids, BOS included; both engines get the same ids. */
  promptIds: number[];
  /** Decode steps timed after the first generated token. */
  decodeTokens: number;
  /** sluice arena budget in bytes; null = whole model resident. Ignored by llama.cpp. */
  budget: number | null;
  /** Run a short generation first so that first-touch costs are not timed. */
  warmup: boolean;
  /** Stop decoding after this many seconds (the run reports how many steps it did). */
  maxSeconds: number;
  /** llama.cpp: an F32 KV cache instead of its default F16 (exact comparisons). */
  kvF32?: boolean;
}

/** What one engine process measured (one JSON line on its stdout). */
export interface EngineRun {
  engine: "sluice" | "llama.cpp";
  prompt_tokens: number;
  /** Prompt tokens per second of the prompt pass (chunked prefill / prompt processing). */
  prefill_tok_s: number;
  /** Decode steps timed: intervals between consecutive generated tokens. */
  decode_tokens: number;
  decode_tok_s: number;
  /** Generated ids (greedy), to check that both engines computed the same thing. */
  ids: number[];
  load_ms: number;
  /** sluice: bytes read from disk per decode step; null where unknown. */
  decode_bytes_read_per_token: number | null;
  decode_io_wait_ms: number | null;
  peak_rss_bytes: number | null;
  threads: number;
  /** The time limit cut decoding short. */
  stopped_early: boolean;
  notes: string;
}

/** The parts of a manifest tensor entry this module reads. */
interface BytesEntry {
  bytes: number;
  shape?: number[];
}

/** The parts of a container manifest this module reads. */
export interface ManifestBytes {
  trunk: {
    globals: { tensors: Partial<Record<string, BytesEntry>> };
    layers: { bytes: number }[];
  };
  experts: ({ matrices: Partial<Record<string, BytesEntry>> } | null)[];
}

/**
 * Weight bytes one decode token must read: every trunk layer, the final norm and LM head, one
 * embedding row, and `topK` experts (all their matrices) in each MoE layer. This is the numerator
 * of the DRAM roofline (the KV cache is left out: it is small at the bench's context lengths).
 */
export function activeBytesPerToken(m: ManifestBytes, topK: number): number {
  let bytes = 0;
  for (const layer of m.trunk.layers) bytes += layer.bytes;
  const g = m.trunk.globals.tensors;
  for (const [name, t] of Object.entries(g)) {
    if (!t) continue;
    if (name === "embed") {
      const rows = t.shape?.[0] ?? 1;
      bytes += t.bytes / rows;
    } else bytes += t.bytes;
  }
  for (const bank of m.experts) {
    if (bank === null) continue;
    let expert = 0;
    for (const mat of Object.values(bank.matrices)) if (mat) expert += mat.bytes;
    bytes += topK * expert;
  }
  return bytes;
}

/** Tokens per second a stream of `bytesPerToken` allows at `gbps` (1e9 B/s). */
export function rooflineTokS(bytesPerToken: number, gbps: number): number {
  return bytesPerToken > 0 ? (gbps * 1e9) / bytesPerToken : Infinity;
}

/** a ÷ b, or null when either is missing or b is not positive. */
export function ratio(a: number | null, b: number | null): number | null {
  if (a === null || b === null || !Number.isFinite(a) || !Number.isFinite(b) || b <= 0) {
    return null;
  }
  return a / b;
}

/** The targets, as issue 16 raised them (in RAM 0.85 of DRAM, prefill on par with llama.cpp). */
export const TARGETS = {
  inRamVsLlamacpp: 1.0,
  inRamVsDram: 0.85,
  overCapVsLlamacpp: 5.0,
  overCapVsDisk: 0.85,
  prefillVsLlamacpp: 1.0,
} as const;

/** The machine figures measured in the same run. */
export interface MachineFigures {
  dram_gbps: number | null;
  odirect_gbps: number | null;
  threads: number;
  cpu: string;
  ram_bytes: number;
}

/** One regime's inputs: the runs (null = skipped) and why a run is missing. */
export interface RegimeRuns {
  model_bytes: number;
  sluice: EngineRun | null;
  llamacpp: EngineRun | null;
  skipped: string | null;
}

/** Everything the bench measured, before it is reduced to the report. */
export interface CompareInputs {
  precision: string;
  arch: string;
  machine: MachineFigures;
  /** Active weight bytes per decode token of the in-RAM model. */
  in_ram_active_bytes: number;
  in_ram: RegimeRuns;
  over_cap: RegimeRuns & { cap_bytes: number; budget_bytes: number };
  /**
   * At the first generated position where the in-RAM runs' ids differ, each engine's logit of its
   * own id less its logit of the other's, from an untimed pass over the prompt and the common
   * prefix; null when not measured.
   */
  in_ram_logit_gaps?: { sluice: number | null; llamacpp: number | null };
}

/** Where two runs' greedy ids first differ. */
export interface IdDivergence {
  /** Index into the generated ids (0: the first token after the prompt). */
  position: number;
  sluice_id: number;
  llamacpp_id: number;
  /** sluice's logit of its own id less its logit of llama.cpp's there (how close the call was). */
  sluice_logit_gap: number | null;
  /** llama.cpp's logit of its own id less its logit of sluice's there. */
  llamacpp_logit_gap: number | null;
}

/** The `--json` report. */
export interface CompareReport {
  precision: string;
  arch: string;
  machine: MachineFigures;
  in_ram: {
    model_bytes: number;
    sluice_tok_s: number | null;
    llamacpp_tok_s: number | null;
    ratio: number | null;
    active_bytes_per_token: number;
    dram_roofline_tok_s: number | null;
    dram_roofline_ratio: number | null;
    /** Every id both runs generated is the same (null: a run is missing or generated none). */
    same_ids: boolean | null;
    /** Ids compared: all that both runs generated. */
    ids_compared: number;
    first_divergence: IdDivergence | null;
    skipped: string | null;
  };
  over_cap: {
    model_bytes: number;
    cap_bytes: number;
    budget_bytes: number;
    sluice_tok_s: number | null;
    llamacpp_tok_s: number | null;
    ratio: number | null;
    missed_bytes_per_token: number | null;
    disk_roofline_tok_s: number | null;
    disk_roofline_ratio: number | null;
    sluice_io_wait_share: number | null;
    llamacpp_stopped_early: boolean | null;
    skipped: string | null;
  };
  prefill: {
    prompt_tokens: number | null;
    sluice_tok_s: number | null;
    llamacpp_tok_s: number | null;
    ratio: number | null;
  };
  runs: { in_ram: RegimeRuns; over_cap: RegimeRuns };
}

/** Reduces the measured runs to the report (ratios, rooflines, id agreement). */
export function buildReport(x: CompareInputs): CompareReport {
  const ir = x.in_ram, oc = x.over_cap;
  const irS = ir.sluice?.decode_tok_s ?? null, irL = ir.llamacpp?.decode_tok_s ?? null;
  const dramTokS = x.machine.dram_gbps === null
    ? null
    : rooflineTokS(x.in_ram_active_bytes, x.machine.dram_gbps);
  const ocS = oc.sluice?.decode_tok_s ?? null, ocL = oc.llamacpp?.decode_tok_s ?? null;
  const missed = oc.sluice?.decode_bytes_read_per_token ?? null;
  const diskTokS = missed === null || x.machine.odirect_gbps === null
    ? null
    : rooflineTokS(missed, x.machine.odirect_gbps);
  const ocSteps = oc.sluice?.decode_tokens ?? 0;
  const waitShare = oc.sluice && oc.sluice.decode_io_wait_ms !== null && ocS && ocSteps > 0
    ? oc.sluice.decode_io_wait_ms / ((ocSteps * 1000) / ocS)
    : null;
  const ids = ir.sluice && ir.llamacpp ? compareIds(ir.sluice.ids, ir.llamacpp.ids) : null;
  const at = ids?.firstDivergence ?? null;
  const preS = ir.sluice?.prefill_tok_s ?? null, preL = ir.llamacpp?.prefill_tok_s ?? null;
  return {
    precision: x.precision,
    arch: x.arch,
    machine: x.machine,
    in_ram: {
      model_bytes: ir.model_bytes,
      sluice_tok_s: irS,
      llamacpp_tok_s: irL,
      ratio: ratio(irS, irL),
      active_bytes_per_token: x.in_ram_active_bytes,
      dram_roofline_tok_s: dramTokS,
      dram_roofline_ratio: ratio(irS, dramTokS),
      same_ids: ids && ids.compared > 0 ? at === null : null,
      ids_compared: ids?.compared ?? 0,
      first_divergence: at === null ? null : {
        position: at,
        sluice_id: ir.sluice!.ids[at],
        llamacpp_id: ir.llamacpp!.ids[at],
        sluice_logit_gap: x.in_ram_logit_gaps?.sluice ?? null,
        llamacpp_logit_gap: x.in_ram_logit_gaps?.llamacpp ?? null,
      },
      skipped: ir.skipped,
    },
    over_cap: {
      model_bytes: oc.model_bytes,
      cap_bytes: oc.cap_bytes,
      budget_bytes: oc.budget_bytes,
      sluice_tok_s: ocS,
      llamacpp_tok_s: ocL,
      ratio: ratio(ocS, ocL),
      missed_bytes_per_token: missed,
      disk_roofline_tok_s: diskTokS,
      disk_roofline_ratio: ratio(ocS, diskTokS),
      sluice_io_wait_share: waitShare,
      llamacpp_stopped_early: oc.llamacpp?.stopped_early ?? null,
      skipped: oc.skipped,
    },
    prefill: {
      prompt_tokens: ir.sluice?.prompt_tokens ?? ir.llamacpp?.prompt_tokens ?? null,
      sluice_tok_s: preS,
      llamacpp_tok_s: preL,
      ratio: ratio(preS, preL),
    },
    runs: { in_ram: ir, over_cap: oc },
  };
}

/**
 * Compares every id two greedy runs both generated: how many that is, and the first position
 * where they differ (null when none). A difference is reported, not hidden: the summation order
 * differs between the engines, so a near-tie may flip, and the logit gap there says how near.
 */
export function compareIds(
  a: readonly number[],
  b: readonly number[],
): { compared: number; firstDivergence: number | null } {
  const compared = Math.min(a.length, b.length);
  for (let i = 0; i < compared; i++) if (a[i] !== b[i]) return { compared, firstDivergence: i };
  return { compared, firstDivergence: null };
}

function fmt(v: number | null, digits = 2): string {
  return v === null ? "n/a" : v.toFixed(digits);
}

function verdict(r: number | null, target: number): string {
  if (r === null) return "n/a";
  return r >= target ? "met" : `missed (${((r / target) * 100).toFixed(0)}% of target)`;
}

/**
 * The verdict against a roofline: above 1 the probe read less than sluice itself streamed in the
 * same run, so the probe, not the engine, is off (a shared host moves it by up to 2×).
 */
function rooflineVerdict(r: number | null, target: number): string {
  if (r !== null && r > 1) return "not judged: the probe read less than sluice streamed";
  return verdict(r, target);
}

/** The stdout table: one row per comparison with its ratio and target. */
export function formatTable(r: CompareReport): string {
  const gb = (b: number) => `${(b / 2 ** 30).toFixed(2)} GiB`;
  const rows: string[][] = [
    ["comparison", "sluice", "peer", "ratio", "target", "verdict"],
    [
      `in RAM decode tok/s vs llama.cpp (${gb(r.in_ram.model_bytes)})`,
      fmt(r.in_ram.sluice_tok_s),
      fmt(r.in_ram.llamacpp_tok_s),
      fmt(r.in_ram.ratio),
      `≥ ${TARGETS.inRamVsLlamacpp}`,
      verdict(r.in_ram.ratio, TARGETS.inRamVsLlamacpp),
    ],
    [
      "in RAM decode tok/s vs DRAM roofline",
      fmt(r.in_ram.sluice_tok_s),
      fmt(r.in_ram.dram_roofline_tok_s),
      fmt(r.in_ram.dram_roofline_ratio),
      `≥ ${TARGETS.inRamVsDram}`,
      rooflineVerdict(r.in_ram.dram_roofline_ratio, TARGETS.inRamVsDram),
    ],
    [
      `over cap decode tok/s vs llama.cpp (${gb(r.over_cap.model_bytes)}, cap ${
        gb(r.over_cap.cap_bytes)
      })`,
      fmt(r.over_cap.sluice_tok_s),
      fmt(r.over_cap.llamacpp_tok_s),
      fmt(r.over_cap.ratio),
      `≥ ${TARGETS.overCapVsLlamacpp}`,
      verdict(r.over_cap.ratio, TARGETS.overCapVsLlamacpp),
    ],
    [
      "over cap decode tok/s vs disk roofline",
      fmt(r.over_cap.sluice_tok_s),
      fmt(r.over_cap.disk_roofline_tok_s),
      fmt(r.over_cap.disk_roofline_ratio),
      `≥ ${TARGETS.overCapVsDisk}`,
      rooflineVerdict(r.over_cap.disk_roofline_ratio, TARGETS.overCapVsDisk),
    ],
    [
      `prefill tok/s vs llama.cpp prompt (${r.prefill.prompt_tokens ?? "?"} tokens)`,
      fmt(r.prefill.sluice_tok_s, 1),
      fmt(r.prefill.llamacpp_tok_s, 1),
      fmt(r.prefill.ratio),
      `≥ ${TARGETS.prefillVsLlamacpp}`,
      verdict(r.prefill.ratio, TARGETS.prefillVsLlamacpp),
    ],
  ];
  const widths = rows[0].map((_, c) => Math.max(...rows.map((row) => row[c].length)));
  const line = (row: string[]) => `| ${row.map((s, c) => s.padEnd(widths[c])).join(" | ")} |`;
  const sep = `|${widths.map((w) => "-".repeat(w + 2)).join("|")}|`;
  const notes: string[] = [];
  const d = r.in_ram.first_divergence;
  if (d) {
    const gap = (who: string, g: number | null) =>
      g === null ? "" : `, ${who} logit gap ${g.toPrecision(3)}`;
    notes.push(
      `in RAM greedy ids: first differ at generated position ${d.position} of ` +
        `${r.in_ram.ids_compared} (sluice ${d.sluice_id}, llama.cpp ${d.llamacpp_id}` +
        `${gap("sluice", d.sluice_logit_gap)}${gap("llama.cpp", d.llamacpp_logit_gap)})`,
    );
  } else if (r.in_ram.same_ids) {
    notes.push(`in RAM greedy ids: all ${r.in_ram.ids_compared} the same`);
  }
  if (r.in_ram.skipped) notes.push(`in RAM: ${r.in_ram.skipped}`);
  if (r.over_cap.skipped) notes.push(`over cap: ${r.over_cap.skipped}`);
  return [line(rows[0]), sep, ...rows.slice(1).map(line), ...notes].join("\n");
}
