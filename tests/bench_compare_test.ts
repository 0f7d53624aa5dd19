import assert from "node:assert/strict";
import { findCgroupRoot, limitFile } from "../tools/dev/bench/cgroup.ts";
import {
  activeBytesPerToken,
  buildReport,
  compareIds,
  type CompareInputs,
  type EngineRun,
  formatTable,
  type ManifestBytes,
  ratio,
  rooflineTokS,
} from "../tools/dev/bench/compare_report.ts";
import { benchDepsDir } from "../tools/dev/bench/llamacpp.ts";
import { logitGap } from "../tools/dev/bench/compare_sluice.ts";
import { Model } from "../engine/model.ts";
import { argmax } from "../engine/sampler.ts";
import { HAVE_FIXTURES, packedFixture } from "./fixtures.ts";
import { renderBarChart } from "../tools/dev/bar_chart.ts";

/** A manifest of 2 MoE layers (8 experts of 3 matrices) and a dense layer, by hand. */
function manifest(): ManifestBytes {
  const mat = (bytes: number) => ({ bytes });
  const bank = { matrices: { gate: mat(100), up: mat(100), down: mat(50) } };
  return {
    trunk: {
      globals: {
        tensors: {
          embed: { bytes: 64 * 1000, shape: [1000, 32] },
          final_norm: { bytes: 128 },
          lm_head: { bytes: 64_000 },
        },
      },
      layers: [{ bytes: 4096 }, { bytes: 4096 }, { bytes: 8192 }],
    },
    experts: [bank, bank, null],
  };
}

Deno.test("active bytes per token: trunk + head + one embedding row + topK experts", () => {
  // Independent sum: 3 trunk layers, norm, head, 64-byte row, 2 layers × 2 experts × 250 B.
  const expected = 4096 + 4096 + 8192 + 128 + 64_000 + 64 + 2 * 2 * 250;
  assert.equal(activeBytesPerToken(manifest(), 2), expected);
  assert.equal(
    activeBytesPerToken(manifest(), 4) - activeBytesPerToken(manifest(), 2),
    2 * 2 * 250,
  );
});

Deno.test("roofline and ratio math", () => {
  assert.equal(rooflineTokS(1e9, 20), 20);
  assert.equal(rooflineTokS(5e8, 1), 2);
  assert.equal(ratio(3, 2), 1.5);
  assert.equal(ratio(null, 2), null);
  assert.equal(ratio(1, 0), null);
  assert.equal(ratio(1, Infinity), null);
});

Deno.test("greedy ids are compared at every position both runs generated", () => {
  assert.deepEqual(compareIds([1, 2, 3, 4, 9], [1, 2, 3, 4, 7]), {
    compared: 5,
    firstDivergence: 4,
  });
  assert.deepEqual(compareIds([1, 2, 3], [1, 5, 3]), { compared: 3, firstDivergence: 1 });
  assert.deepEqual(compareIds([1, 2, 3], [1, 2, 3, 4]), { compared: 3, firstDivergence: null });
  assert.deepEqual(compareIds([], [1]), { compared: 0, firstDivergence: null });
});

Deno.test("cgroup root: v1 memory mount wins, v2 needs the memory controller", () => {
  const v1 = [
    "tmpfs /sys/fs/cgroup tmpfs rw 0 0",
    "cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0",
    "cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0",
    "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0",
  ].join("\n");
  assert.deepEqual(findCgroupRoot(v1, () => ""), { version: 1, dir: "/sys/fs/cgroup/memory" });
  const v2 = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0";
  assert.deepEqual(findCgroupRoot(v2, () => "cpuset cpu io memory pids"), {
    version: 2,
    dir: "/sys/fs/cgroup",
  });
  assert.equal(findCgroupRoot(v2, () => "cpu io pids"), null);
  assert.equal(findCgroupRoot(v2, () => null), null);
  assert.equal(limitFile(1), "memory.limit_in_bytes");
  assert.equal(limitFile(2), "memory.max");
});

Deno.test("bench deps dir follows SLUICE_CACHE, else HOME", () => {
  const env = (m: Record<string, string>) => (k: string) => m[k];
  assert.equal(benchDepsDir(env({ SLUICE_CACHE: "/c", HOME: "/h" })), "/c/bench-deps");
  assert.equal(benchDepsDir(env({ HOME: "/h" })), "/h/.cache/sluice/bench-deps");
});

function run(engine: EngineRun["engine"], decode: number, prefill: number): EngineRun {
  return {
    engine,
    prompt_tokens: 128,
    prefill_tok_s: prefill,
    decode_tokens: 16,
    decode_tok_s: decode,
    ids: [5, 6, 7, 8, 9],
    load_ms: 1,
    decode_bytes_read_per_token: engine === "sluice" ? 2e8 : null,
    decode_io_wait_ms: engine === "sluice" ? 1000 : null,
    peak_rss_bytes: null,
    threads: 2,
    stopped_early: false,
    notes: "",
  };
}

Deno.test("report: JSON shape and figures from stubbed runs", () => {
  const inputs: CompareInputs = {
    precision: "bf16",
    arch: "qwen3_moe",
    machine: { dram_gbps: 20, odirect_gbps: 1, threads: 2, cpu: "x", ram_bytes: 1 },
    in_ram_active_bytes: 1e9,
    in_ram: {
      model_bytes: 5e8,
      sluice: run("sluice", 16, 100),
      llamacpp: run("llama.cpp", 8, 400),
      skipped: null,
    },
    over_cap: {
      model_bytes: 1.5e9,
      cap_bytes: 5e8,
      budget_bytes: 3e8,
      sluice: run("sluice", 4, 50),
      llamacpp: run("llama.cpp", 0.5, 10),
      skipped: null,
    },
  };
  const r = buildReport(inputs);
  // Figures worked by hand: DRAM roofline 20e9/1e9 = 20 tok/s; disk roofline 1e9/2e8 = 5 tok/s.
  assert.equal(r.in_ram.sluice_tok_s, 16);
  assert.equal(r.in_ram.llamacpp_tok_s, 8);
  assert.equal(r.in_ram.ratio, 2);
  assert.equal(r.in_ram.dram_roofline_tok_s, 20);
  assert.equal(r.in_ram.dram_roofline_ratio, 0.8);
  assert.equal(r.in_ram.same_ids, true);
  assert.equal(r.in_ram.ids_compared, 5);
  assert.equal(r.in_ram.first_divergence, null);
  assert.equal(r.over_cap.sluice_tok_s, 4);
  assert.equal(r.over_cap.llamacpp_tok_s, 0.5);
  assert.equal(r.over_cap.ratio, 8);
  assert.equal(r.over_cap.disk_roofline_tok_s, 5);
  assert.equal(r.over_cap.disk_roofline_ratio, 0.8);
  // 16 steps at 4 tok/s = 4000 ms, of which 1000 ms waited on I/O.
  assert.equal(r.over_cap.sluice_io_wait_share, 0.25);
  assert.equal(r.prefill.sluice_tok_s, 100);
  assert.equal(r.prefill.llamacpp_tok_s, 400);
  assert.equal(r.prefill.ratio, 0.25);
  const json = JSON.parse(JSON.stringify(r));
  for (const key of ["sluice_tok_s", "llamacpp_tok_s", "dram_roofline_ratio"]) {
    assert.ok(key in json.in_ram, `in_ram.${key}`);
  }
  for (const key of ["sluice_tok_s", "llamacpp_tok_s", "disk_roofline_ratio"]) {
    assert.ok(key in json.over_cap, `over_cap.${key}`);
  }
  for (const key of ["sluice_tok_s", "llamacpp_tok_s"]) assert.ok(key in json.prefill);
  const table = formatTable(r);
  assert.match(table, /prefill .* missed \(25% of target\)/);
  assert.match(table, /in RAM decode tok\/s vs llama\.cpp .* met/);
  assert.match(table, /in RAM greedy ids: all 5 the same/);
  // The last of five ids differs: reported with its position, both ids and sluice's logit gap.
  const late = { ...run("llama.cpp", 8, 400), ids: [5, 6, 7, 8, 4] };
  const parted = buildReport({
    ...inputs,
    in_ram: { ...inputs.in_ram, llamacpp: late },
    in_ram_logit_gaps: { sluice: 0.0125, llamacpp: 0.031 },
  });
  assert.equal(parted.in_ram.same_ids, false);
  assert.deepEqual(parted.in_ram.first_divergence, {
    position: 4,
    sluice_id: 9,
    llamacpp_id: 4,
    sluice_logit_gap: 0.0125,
    llamacpp_logit_gap: 0.031,
  });
  assert.match(
    formatTable(parted),
    /ids: first differ at generated position 4 of 5 \(sluice 9, llama\.cpp 4, sluice logit gap 0\.0125, llama\.cpp logit gap 0\.0310\)/,
  );
});

Deno.test("report: a roofline ratio above 1 is not judged (the probe read less than the engine)", () => {
  const machine = { dram_gbps: 10, odirect_gbps: 0.5, threads: 2, cpu: "x", ram_bytes: 1 };
  const r = buildReport({
    precision: "bf16",
    arch: "qwen3_moe",
    machine,
    in_ram_active_bytes: 1e9,
    in_ram: { model_bytes: 5e8, sluice: run("sluice", 16, 100), llamacpp: null, skipped: null },
    over_cap: {
      model_bytes: 1.5e9,
      cap_bytes: 5e8,
      budget_bytes: 3e8,
      sluice: run("sluice", 4, 50),
      llamacpp: null,
      skipped: null,
    },
  });
  // DRAM roofline 10e9 / 1e9 = 10 tok/s against 16; disk 0.5e9 / 2e8 = 2.5 tok/s against 4.
  assert.equal(r.in_ram.dram_roofline_ratio, 1.6);
  assert.equal(r.over_cap.disk_roofline_ratio, 1.6);
  const table = formatTable(r);
  assert.match(table, /vs DRAM roofline .* not judged: the probe read less than sluice streamed/);
  assert.match(table, /vs disk roofline .* not judged: the probe read less than sluice streamed/);
});

Deno.test("report: skipped regimes give nulls and say why", () => {
  const r = buildReport({
    precision: "bf16",
    arch: "mixtral",
    machine: { dram_gbps: null, odirect_gbps: null, threads: 1, cpu: "x", ram_bytes: 1 },
    in_ram_active_bytes: 1,
    in_ram: { model_bytes: 1, sluice: run("sluice", 1, 1), llamacpp: null, skipped: "no npm" },
    over_cap: {
      model_bytes: 3,
      cap_bytes: 1,
      budget_bytes: 1,
      sluice: null,
      llamacpp: null,
      skipped: "not root",
    },
  });
  assert.equal(r.in_ram.llamacpp_tok_s, null);
  assert.equal(r.in_ram.ratio, null);
  assert.equal(r.in_ram.dram_roofline_ratio, null);
  assert.equal(r.over_cap.disk_roofline_ratio, null);
  assert.match(formatTable(r), /over cap: not root/);
});

Deno.test("bar chart: one rect per non-null value plus legend swatches", () => {
  const svg = renderBarChart({
    title: "t",
    yLabel: "y",
    groups: ["a", "b"],
    series: [{ name: "s", color: "#000", values: [1, null] }, {
      name: "u",
      color: "#111",
      values: [2, 3],
    }],
  });
  // 1 background + 3 bars + 2 legend swatches.
  assert.equal(svg.match(/<rect /g)?.length, 6);
  assert.ok(svg.startsWith("<svg"));
});

Deno.test({
  name:
    "bench compare: sluice's logit gap where ids part is its logits' difference after the prefix",
  ignore: !HAVE_FIXTURES,
  fn: async () => {
    const path = await packedFixture("stories260k-moe");
    // Longer than one prefill chunk, so the gap's pass runs in several.
    const ids = Array.from({ length: 150 }, (_, i) => (i * 37 + 11) % 500);
    const m = await Model.open(path, { quiet: true, ctx: 160, prefillChunk: 1 });
    let logits: Float32Array = new Float32Array(0);
    try {
      ids.forEach((t, pos) => logits = m.forward([t], pos));
    } finally {
      m.close();
    }
    const best = argmax(logits), other = (best + 1) % logits.length;
    const gap = await logitGap(path, ids, best, other, 1);
    assert.equal(gap, logits[best] - logits[other]);
    assert.ok(gap >= 0);
  },
});
