/**
 * `bench stream` runs each configuration in a child process (tools/dev/bench/stream_child.ts) so
 * that a memory cgroup holds one engine at a time: the parent reads the child's one JSON line, and
 * a child that died (the cgroup's OOM kill, an error) is reported by configuration and cause.
 */
import assert from "node:assert/strict";
import { median } from "../tools/dev/bench/alternate.ts";
import { runChild, tokenSplit } from "../tools/dev/bench/stream.ts";
import { parseChildOutput, runJob, type StreamJob } from "../tools/dev/bench/stream_child.ts";
import { HAVE_FIXTURES, packedFixture } from "./fixtures.ts";

const RUN = {
  label: "budget, defaults",
  tok_s: 12.5,
  ms_per_token: 80,
  bytes_per_token: 1 << 20,
  expert_bytes_per_token: 1 << 20,
  expert_hit_rate: 0.25,
  trunk_bytes_per_token: 0,
  trunk_hit_rate: 1,
  io_wait_ms_per_token: 40,
  io_share: 0.5,
  speculative_reads: 3,
  speculative_used: 2,
  speculative_cancelled: 1,
  speculative_skipped: 0,
  lookahead_recall: 0.5,
  trunk_pinned: 2,
  expert_slots: 10,
  peak_rss_bytes: 1 << 28,
  ids: [5, 6, 7],
};

Deno.test("bench stream: the child's last JSON line is its runs", () => {
  const out = `notice: something\n${JSON.stringify({ runs: [RUN, { ...RUN, tok_s: 13 }] })}\n`;
  const runs = parseChildOutput("budget, defaults", { code: 0, signal: null }, out, "");
  assert.deepEqual(runs.map((r) => r.tok_s), [12.5, 13]);
  assert.deepEqual(runs[0], RUN);
});

Deno.test("bench stream: a child that died is named with its configuration and cause", () => {
  const fail = (status: { code: number; signal: string | null }, out: string, err: string) =>
    assert.throws(() => parseChildOutput("budget, lookahead off", status, out, err), (e) => {
      assert.match((e as Error).message, /run "budget, lookahead off"/);
      return true;
    });
  fail({ code: 137, signal: "SIGKILL" }, "", "");
  assert.throws(
    () => parseChildOutput("x", { code: 137, signal: "SIGKILL" }, "", ""),
    /killed by SIGKILL \(out of memory\?\)/,
  );
  assert.throws(
    () => parseChildOutput("x", { code: 1, signal: null }, "", "a\nb\nerror: budget too small\n"),
    /exited with code 1: a \| b \| error: budget too small/,
  );
  assert.throws(() => parseChildOutput("x", { code: 0, signal: null }, "{not json", ""), /no runs/);
  assert.throws(
    () => parseChildOutput("x", { code: 0, signal: null }, JSON.stringify({ runs: [] }), ""),
    /printed no runs/,
  );
  fail({ code: 0, signal: null }, "", "");
});

Deno.test({
  name: "bench stream: a child process decodes what the same job decodes in process",
  ignore: !HAVE_FIXTURES,
  fn: async () => {
    const path = await packedFixture("stories260k-moe");
    const job: StreamJob = {
      path,
      label: "budget, defaults",
      opts: { ctx: 64, budget: Math.round(3.1 * 2 ** 20) },
      prompt: [1, 403, 407, 261],
      tokens: 6,
      passes: 2,
      warm: false,
    };
    const child = await runChild(job, null);
    const here = await runJob(job);
    assert.equal(child.length, 2);
    assert.deepEqual(child.map((r) => r.ids), here.map((r) => r.ids));
    assert.equal(child[0].ids.length, 6);
    assert.ok(child[0].bytes_per_token > 0, "the budget streams");
    // What was read is the experts' records and the trunk ring's layers.
    for (const r of child) {
      assert.equal(r.bytes_per_token, r.expert_bytes_per_token + r.trunk_bytes_per_token);
      assert.ok(r.trunk_hit_rate >= 0 && r.trunk_hit_rate <= 1, `${r.trunk_hit_rate}`);
      if (r.trunk_pinned === 0) assert.equal(r.trunk_hit_rate, 0);
    }
    assert.equal(child[0].cgroup_peak_bytes, null);
    assert.ok(child[0].peak_rss_bytes > 0);
  },
});

Deno.test("bench stream: the median of the repeats", () => {
  assert.equal(median([3, 1, 2]), 2);
  assert.equal(median([4, 1, 2, 3]), 2.5);
  assert.equal(median([7]), 7);
  assert.ok(Number.isNaN(median([])));
});

Deno.test("bench stream: a run's time per token splits into compute, disk and their overlap", () => {
  const run = { ms_per_token: 50, io_wait_ms_per_token: 10, bytes_per_token: 40e6 } as Parameters<
    typeof tokenSplit
  >[0];
  // 40 MB at 1 GB/s is 40 ms of disk, of which 10 were waited for: 75% hidden behind 40 ms of compute.
  const s = tokenSplit(run, 1);
  assert.equal(s.disk_ms, 40);
  assert.equal(s.compute_ms, 40);
  assert.equal(s.overlap, 0.75);
  assert.equal(s.limit, "compute");
  const slow = tokenSplit({ ...run, io_wait_ms_per_token: 45 }, 1);
  assert.equal(slow.overlap, 0);
  assert.equal(slow.limit, "disk");
  assert.equal(tokenSplit({ ...run, bytes_per_token: 0, io_wait_ms_per_token: 0 }, 1).overlap, 1);
});
