/**
 * Peak RSS stays within the budget plus a stated overhead while a synthetic MoE model several
 * times larger than the budget streams from disk. The overhead is the Deno runtime, V8 heaps,
 * the compiled kernels, the tokenizer and the pool worker: about 90 MiB measured on a 4 MiB model.
 */
import assert from "node:assert/strict";
import { packCheckpoint } from "../tools/pack.ts";
import { synthCheckpoint } from "../tools/synth.ts";
import { tempDir } from "./fixtures.ts";

const MiB = 2 ** 20;
const BUDGET = 48 * MiB;
const OVERHEAD = 128 * MiB;

Deno.test("peak RSS stays within budget + overhead on a model 5x the budget", async () => {
  const dir = `${tempDir()}/synth-qwen3`;
  const ckpt = await synthCheckpoint({
    arch: "qwen3_moe",
    out: dir,
    size: 256 * MiB,
    progress: "off",
    log: () => {},
    overrides: { hidden: 512, layers: 8 },
  });
  const model = `${dir}.sluice`;
  await packCheckpoint(ckpt.dir, model, { progress: "off", log: () => {} });
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      new URL("../mod.ts", import.meta.url).pathname,
      "generate",
      "--model",
      model,
      "--prompt",
      "hello world",
      "-n",
      "16",
      "--ignore-eos",
      "--budget",
      `${BUDGET}`,
      "--ctx",
      "256",
      "--json",
    ],
    stdin: "null",
  }).output();
  assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
  const { stats } = JSON.parse(new TextDecoder().decode(out.stdout));
  assert.ok(ckpt.totalBytes >= 5 * BUDGET, `model ${ckpt.totalBytes} B is not 5× the budget`);
  assert.ok(stats.expert_misses > 0 && stats.bytes_read > BUDGET, "the run did not stream");
  assert.ok(stats.arena_bytes <= BUDGET);
  assert.ok(
    stats.peak_rss_bytes <= BUDGET + OVERHEAD,
    `peak RSS ${(stats.peak_rss_bytes / MiB).toFixed(0)} MiB > budget + ${OVERHEAD / MiB} MiB`,
  );
});
