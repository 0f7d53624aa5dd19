// `bench kernels --quick --skip-disk --json` run as a subprocess, the way a user runs it: the
// JSON must hold every documented key with positive finite figures. No timing assertions (the
// machine is shared); the checks are on shape and sanity, plus invariants between the numbers.
import assert from "node:assert/strict";

const MOD = new URL("../tools/dev/bench/mod.ts", import.meta.url).pathname;

async function bench(
  args: string[],
): Promise<{ code: number; stdout: string; stderr: string }> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", MOD, ...args],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

function positive(report: Record<string, unknown>, key: string): number {
  const v = report[key];
  assert.ok(typeof v === "number" && Number.isFinite(v) && v > 0, `${key} = ${v}`);
  return v as number;
}

Deno.test("bench kernels --quick --json reports every key with sane figures", async () => {
  const threads = Math.min(2, navigator.hardwareConcurrency || 1);
  const { code, stdout, stderr } = await bench([
    "kernels",
    "--quick",
    "--skip-disk",
    "--json",
    "--threads",
    String(threads),
  ]);
  assert.equal(code, 0, stderr);
  const r = JSON.parse(stdout) as Record<string, unknown>;
  for (
    const key of [
      "dram_read_gbps",
      "bf16_gemv_gbps",
      "f32_gemv_gbps",
      "bf16_gweights_per_s",
      "mxfp4_gweights_per_s",
      "vq3r_gweights_per_s",
      "vq4p_gweights_per_s",
      "int8_gweights_per_s",
      "dispatch_median_us",
      "dispatch_p99_us",
    ]
  ) positive(r, key);
  assert.ok("odirect_read_gbps" in r, "odirect_read_gbps key missing");
  assert.equal(r.odirect_read_gbps, null, "--skip-disk must leave the disk figures null");
  assert.ok(positive(r, "dispatch_p99_us") >= positive(r, "dispatch_median_us"));
  // bf16 weights are half the bytes of f32 ones: Gweights/s = GB/s / 2 for the same row.
  const gemv = r.gemv as {
    format: string;
    matrices: number;
    by_threads: { threads: number; gbps: number; gweights_per_s: number }[];
  }[];
  for (const row of gemv.filter((g) => g.format === "bf16")) {
    for (const p of row.by_threads) {
      assert.ok(Math.abs(p.gweights_per_s * 2 - p.gbps) < 1e-9 * p.gbps, JSON.stringify(p));
    }
  }
  for (const row of gemv) {
    assert.ok(row.matrices >= 2, `${row.format}: only ${row.matrices} matrices cycled`);
    assert.deepEqual(row.by_threads.map((p) => p.threads), r.threads);
  }
  assert.deepEqual(r.threads, Array.from({ length: threads }, (_, i) => i + 1));
  const machine = r.machine as { cpu: string; cores: number; ram_gib: number };
  assert.ok(machine.cores >= 1 && machine.ram_gib > 0 && machine.cpu.length > 0);
  const load = r.load_average as number[];
  assert.equal(load.length, 3);
  for (const l of load) assert.ok(Number.isFinite(l) && l >= 0);
  // KDA's decode recurrence and short conv: one row each, a positive figure per thread count.
  const kda = r.kda as { kernel: string; layers: number; by_threads: { gbps: number }[] }[];
  assert.deepEqual(kda.map((k) => k.kernel), ["kda_recurrent_f32", "short_conv_f32"]);
  for (const k of kda) {
    assert.ok(k.layers >= 2, `${k.kernel}: only ${k.layers} layers cycled`);
    assert.equal(k.by_threads.length, threads);
    for (const p of k.by_threads) assert.ok(p.gbps > 0 && Number.isFinite(p.gbps));
  }
  const ratios = r.ratios as { name: string; pass: boolean | null }[];
  assert.equal(ratios.length, 10);
  const paired = r.vs_bf16 as { format: string; threads: number; ratio: number }[];
  for (const name of ["vq4p", "mxfp4_exact", "int4_exact", "fp8"]) {
    assert.ok(ratios.some((c) => c.name.startsWith(`${name} / bf16 weights/s`)), name);
    const points = paired.filter((p) => p.format === name);
    assert.deepEqual(points.map((p) => p.threads), r.threads);
    for (const p of points) assert.ok(p.ratio > 0 && Number.isFinite(p.ratio));
  }
});

Deno.test("bench with an unknown name lists the benches and fails", async () => {
  const { code, stderr } = await bench(["no-such-bench"]);
  assert.equal(code, 2);
  assert.match(stderr, /unknown bench "no-such-bench"/);
  assert.match(stderr, /^\s+kernels\s/m);
});

Deno.test("bench pack --json reports pack_mb_s and disk_write_mb_s and removes what it made", async () => {
  const cache = Deno.makeTempDirSync({ prefix: "sluice-bench-pack-" });
  try {
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", MOD, "pack", "--size", "24M", "--repeat", "2", "--json"],
      env: { SLUICE_CACHE: cache },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const dec = new TextDecoder();
    assert.equal(out.code, 0, dec.decode(out.stderr));
    const r = JSON.parse(dec.decode(out.stdout)) as Record<string, unknown>;
    positive(r, "pack_mb_s");
    positive(r, "container_bytes");
    const disk = r.disk_write_mb_s;
    assert.ok(disk === null || (typeof disk === "number" && disk > 0), `disk_write_mb_s = ${disk}`);
    if (typeof disk === "number") assert.equal(r.ratio, (r.pack_mb_s as number) / disk);
    // The reported run is one of the two, each set against the dd runs around it.
    const runs = r.runs as Record<string, number | null>[];
    assert.equal(runs.length, 2);
    assert.ok(runs.some((x) => x.pack_mb_s === r.pack_mb_s && x.ratio === r.ratio));
    for (const x of runs) {
      if (typeof x.disk_write_mb_s === "number") {
        assert.equal(x.ratio, (x.pack_mb_s as number) / x.disk_write_mb_s);
      }
    }
    assert.deepEqual([...Deno.readDirSync(cache)], [], "the bench leaves nothing behind");
  } finally {
    Deno.removeSync(cache, { recursive: true });
  }
});

Deno.test("every bench answers --help with its usage and refuses an unknown option in one line", async () => {
  const { BENCHES } = await import("../tools/dev/bench/mod.ts");
  for (const name of Object.keys(BENCHES)) {
    const help = await bench([name, "--help"]);
    assert.equal(help.code, 0, `${name} --help: ${help.stderr}`);
    assert.match(help.stdout, new RegExp(`usage: deno task bench ${name}`), name);
    const bad = await bench([name, "--no-such-option"]);
    assert.notEqual(bad.code, 0, `${name} accepted --no-such-option`);
    assert.match(bad.stderr, /no-such-option/, name);
    assert.doesNotMatch(bad.stderr, /^\s+at /m, `${name}: a stack trace`);
  }
});
