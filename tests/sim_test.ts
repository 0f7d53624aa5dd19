import assert from "node:assert/strict";
import "./shared_guard.ts";
import {
  batchEvents,
  ENGINE_POLICY,
  jsonReport,
  SIM_POLICIES,
  type SimMode,
  type SimPolicy,
  simulate,
  simulateBatch,
  slotsPerLayer,
  uniformTwin,
} from "../tools/dev/sim.ts";
import { renderLineChart } from "../tools/dev/svg_chart.ts";
import { readTrace, readTraceMeta, type TraceEvent, traceShape, TraceWriter } from "../io/trace.ts";

const TRACES = new URL("../../shared/traces/", import.meta.url).pathname;

function rng(seed: number): (n: number) => number {
  let s = seed >>> 0;
  return (n) => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return Math.floor((s / 4294967296) * n);
  };
}

/** Random trace with skewed expert popularity, k distinct experts per (token, layer). */
function randomTrace(
  seed: number,
  tokens: number,
  layers: number,
  experts: number,
  k: number,
): TraceEvent[] {
  const r = rng(seed);
  const out: TraceEvent[] = [];
  for (let t = 0; t < tokens; t++) {
    for (let l = 0; l < layers; l++) {
      const set = new Set<number>();
      while (set.size < k) set.add(r(2) ? r(experts) : r(Math.max(k + 1, experts >> 2)));
      out.push({ token: t, layer: l, experts: [...set] });
    }
  }
  return out;
}

/**
 * Exhaustive optimum hits of a single cache over whole events: after each event the cache may
 * hold any subset (≤ cap) of what it held plus the event's keys; with `admit`, that subset must
 * contain the whole event (every routed expert is read into a slot).
 */
function bruteForceOptimum(events: number[][], cap: number, admit: boolean): number {
  const memo = new Map<string, number>();
  const best = (e: number, resident: number[]): number => {
    if (e === events.length) return 0;
    const id = `${e}:${resident.join(",")}`;
    const m = memo.get(id);
    if (m !== undefined) return m;
    const ev = events[e];
    const hits = ev.filter((k) => resident.includes(k)).length;
    const pool = [...new Set([...resident, ...ev])].sort((a, b) => a - b);
    let bestRest = 0;
    for (let mask = 0; mask < 1 << pool.length; mask++) {
      const next = pool.filter((_, i) => mask & (1 << i));
      if (next.length > cap) continue;
      if (admit && !ev.every((k) => next.includes(k))) continue;
      bestRest = Math.max(bestRest, best(e + 1, next));
    }
    memo.set(id, hits + bestRest);
    return hits + bestRest;
  };
  return best(0, []);
}

/** Reference LRU over events: hits refresh first, then misses evict the oldest non-event key. */
function referenceLruHits(events: TraceEvent[], cap: number): number {
  const lists = new Map<number, number[]>();
  let hits = 0;
  for (const ev of events) {
    const list = lists.get(ev.layer) ?? [];
    lists.set(ev.layer, list);
    const misses = ev.experts.filter((x) => !list.includes(x));
    for (const x of ev.experts) {
      if (!list.includes(x)) continue;
      hits++;
      list.splice(list.indexOf(x), 1);
      list.push(x);
    }
    for (const x of misses) {
      if (list.length >= cap) list.splice(list.findIndex((y) => !ev.experts.includes(y)), 1);
      list.push(x);
    }
  }
  return hits;
}

Deno.test("sim lru equals a reference event-level LRU per layer", () => {
  for (let seed = 1; seed <= 6; seed++) {
    const events = randomTrace(seed, 150, 3, 20, 1 + (seed % 3));
    for (const cap of [3, 5, 8]) {
      const res = simulate(events, "lru", cap, "per-layer");
      assert.equal(res.hits, referenceLruHits(events, cap), `seed ${seed} cap ${cap}`);
    }
  }
});

Deno.test("belady (bypass) never loses to any policy; belady-admit never loses to online ones", () => {
  const online: SimPolicy[] = ["lru", "lfu", "lfru", "decay"];
  for (let seed = 1; seed <= 8; seed++) {
    const k = 1 + (seed % 4);
    const events = randomTrace(seed, 120, 3, 24, k);
    for (const mode of ["per-layer", "global"] as SimMode[]) {
      for (const cap of [k, k + 2, 2 * k + 3, 12]) {
        const opt = simulate(events, "belady", cap, mode).hits;
        const admit = simulate(events, "belady-admit", cap, mode).hits;
        assert.ok(opt >= admit, `seed ${seed} ${mode} cap ${cap}: bypass ${opt} < admit ${admit}`);
        for (const p of online) {
          const h = simulate(events, p, cap, mode, { seed }).hits;
          assert.ok(
            admit >= h,
            `seed ${seed} ${mode} cap ${cap}: belady-admit ${admit} < ${p} ${h}`,
          );
        }
      }
    }
  }
});

Deno.test("belady and belady-admit equal a brute-force optimum on tiny traces", () => {
  for (let seed = 1; seed <= 40; seed++) {
    const r = rng(seed * 7);
    const k = 1 + r(2), cap = k + r(2), universe = cap + 1 + r(3);
    const events = randomTrace(seed, 7 + r(3), 1, universe, k);
    const keys = events.map((e) => e.experts);
    const shape = { nLayers: 1, nExperts: universe };
    for (const admit of [false, true]) {
      const policy = admit ? "belady-admit" : "belady";
      const got = simulate(events, policy, cap, "per-layer", { shape }).hits;
      assert.equal(got, bruteForceOptimum(keys, cap, admit), `seed ${seed} ${policy} cap ${cap}`);
    }
  }
});

/** Parses the per-layer baseline table of ../shared/traces/README.md. */
function readmeBaselines(): Map<string, { slots: number[]; rates: Map<string, number[]> }> {
  const text = Deno.readTextFileSync(`${TRACES}README.md`);
  const out = new Map<string, { slots: number[]; rates: Map<string, number[]> }>();
  const nums = (cell: string) => cell.split("/").map((s) => Number(s.trim()));
  for (const line of text.split("\n")) {
    const cells = line.split("|").slice(1, -1).map((c) => c.trim());
    if (cells.length !== 5 || !/^\d/.test(cells[1])) continue;
    const rates = new Map([
      ["lru", nums(cells[2])],
      ["lfu", nums(cells[3])],
      ["belady-admit", nums(cells[4])],
    ]);
    out.set(cells[0], { slots: nums(cells[1]), rates });
  }
  return out;
}

Deno.test("per-layer LRU / LFU / Belady match the traces README table (±0.01)", () => {
  const table = readmeBaselines();
  const folders: Record<string, string> = {
    "FLAME": "flame-moe-290m",
    "Mixtral HumanEval/0": "mixtral-8x7b-humaneval0",
  };
  assert.deepEqual([...table.keys()].sort(), Object.keys(folders).sort());
  for (const [name, folder] of Object.entries(folders)) {
    const path = `${TRACES}${folder}/trace.jsonl`;
    const events = readTrace(path);
    const shape = traceShape(events, readTraceMeta(path));
    const row = table.get(name)!;
    for (const [policy, rates] of row.rates) {
      row.slots.forEach((slots, i) => {
        const got = simulate(events, policy as SimPolicy, slots, "per-layer", { shape }).hitRate;
        assert.ok(
          Math.abs(got - rates[i]) <= 0.01,
          `${name} ${policy} ${slots} slots: ${got.toFixed(3)} vs README ${rates[i]}`,
        );
      });
    }
  }
});

Deno.test("--json rows: one per (mode, capacity), every policy plus engine and belady", () => {
  const events = randomTrace(4, 60, 3, 16, 2);
  const shape = traceShape(events);
  const results = (["per-layer", "global"] as SimMode[]).flatMap((mode) =>
    [3, 5].flatMap((cap) => SIM_POLICIES.map((p) => simulate(events, p, cap, mode, { shape })))
  );
  const { rows } = jsonReport("t.jsonl", shape, results);
  assert.deepEqual(rows.map((r) => `${r.mode}:${r.capacity}`), [
    "per-layer:3",
    "per-layer:5",
    "global:3",
    "global:5",
  ]);
  for (const row of rows) {
    assert.deepEqual(Object.keys(row.hit_rates).sort(), [...SIM_POLICIES, "engine"].sort());
    const own = simulate(events, ENGINE_POLICY, row.capacity, row.mode, { shape }).hitRate;
    assert.equal(row.hit_rates.engine, own);
    assert.ok(row.hit_rates.belady >= row.hit_rates.engine);
  }
});

Deno.test("batch: pass p holds token p of each stretch, one event per layer with the union", () => {
  const events = randomTrace(5, 30, 3, 16, 2);
  assert.deepEqual(batchEvents(events, 1), events);
  const merged = batchEvents(events, 3);
  assert.equal(merged.length, 10 * 3);
  for (const m of merged) {
    const union = new Set<number>();
    for (let s = 0; s < 3; s++) {
      const src = events.find((e) => e.token === s * 10 + m.token && e.layer === m.layer)!;
      for (const x of src.experts) union.add(x);
    }
    assert.deepEqual(new Set(m.experts), union);
    assert.equal(m.experts.length, union.size);
  }
  assert.throws(() => batchEvents(events, 31), /30 tokens cannot make 31 sequences/);
});

Deno.test("batch: identical sequences share every read; uniform routing matches the closed form", () => {
  const same: TraceEvent[] = [];
  for (let s = 0; s < 4; s++) {
    for (let t = 0; t < 25; t++) {
      for (let l = 0; l < 2; l++) {
        same.push({ token: s * 25 + t, layer: l, experts: [t % 7, 7 + (t % 5)] });
      }
    }
  }
  const shape = { nLayers: 2, nExperts: 16 };
  const one = simulateBatch(same, 1, 1, "per-layer", { shape });
  const four = simulateBatch(same, 4, 1, "per-layer", { shape });
  assert.equal(four.distinct, 2);
  assert.equal(one.readsPerToken / four.readsPerToken, 4);
  // n sequences routing k of E uniformly reach E(1 - (1 - k/E)^n) distinct experts per layer.
  const twin = uniformTwin(randomTrace(6, 2048, 8, 64, 6), 64, 3);
  for (const n of [2, 4, 8]) {
    const d =
      simulateBatch(twin, n, 1, "per-layer", { shape: { nLayers: 8, nExperts: 64 } }).distinct;
    const expect = 64 * (1 - (1 - 6 / 64) ** n);
    assert.ok(Math.abs(d / expect - 1) < 0.02, `n=${n}: ${d} vs ${expect}`);
  }
});

Deno.test("capacities: fractions of a layer's experts, global = slots per layer × layers", () => {
  const events = randomTrace(3, 20, 8, 64, 6);
  assert.equal(slotsPerLayer(0.03, 64), 1.92);
  assert.equal(slotsPerLayer(12, 64), 12);
  const g = simulate(events, "lru", slotsPerLayer(0.03, 64), "global");
  assert.equal(g.slots, 15);
  const p = simulate(events, "lru", 12, "per-layer");
  assert.equal(p.slots, 12);
  assert.equal(p.fraction, (12 * 8) / (64 * 8));
  assert.equal(p.accesses, 20 * 8 * 6);
});

Deno.test("trace: TraceWriter round-trips through readTrace; bad lines name file and line", () => {
  const dir = Deno.makeTempDirSync();
  try {
    const path = `${dir}/trace.jsonl`;
    const w = new TraceWriter(path);
    const events = randomTrace(5, 30, 2, 16, 3);
    for (const e of events) w.write(e.token, e.layer, Int32Array.from(e.experts));
    w.close({ n_layers: 2, n_experts: 16, top_k: 3, n_tokens: 30 });
    assert.deepEqual(readTrace(path), events);
    assert.equal(readTraceMeta(path)!.top_k, 3);
    assert.deepEqual(traceShape(events, readTraceMeta(path)), { nLayers: 2, nExperts: 16 });
    Deno.writeTextFileSync(path, '{"token": 0, "layer": 0, "experts": [1]}\n{"token": 1}\n');
    assert.throws(() => readTrace(path), new RegExp(`${path}:2: expected`));
    Deno.writeTextFileSync(path, '{"token": 0, "layer": 0, "experts": [1, 1]}\n');
    assert.throws(() => readTrace(path), /repeats an expert/);
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test("mixtral meta: missing pairs are absent from the trace", () => {
  const path = `${TRACES}mixtral-8x7b-humaneval0/trace.jsonl`;
  const meta = readTraceMeta(path)!;
  const events = readTrace(path);
  const present = new Set(events.map((e) => `${e.token},${e.layer}`));
  assert.equal(events.length + meta.missing!.length, meta.n_tokens * meta.n_layers);
  for (const [t, l] of meta.missing!) assert.ok(!present.has(`${t},${l}`));
});

Deno.test("svg chart: one polyline and legend entry per series, escaped text", () => {
  const svg = renderLineChart({
    title: "a < b",
    xLabel: "x",
    yLabel: "y",
    series: [
      { name: "LRU & co", points: [[1, 0.1], [2, 0.3]] },
      { name: "Belady", points: [[1, 0.5], [2, 0.7]], dashed: true },
    ],
  });
  assert.equal(svg.match(/<polyline /g)?.length, 2);
  assert.equal(svg.match(/<circle /g)?.length, 4);
  assert.ok(svg.includes("a &lt; b") && svg.includes("LRU &amp; co"));
  assert.ok(svg.startsWith("<svg") && svg.trimEnd().endsWith("</svg>"));
});
