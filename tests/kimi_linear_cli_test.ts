/**
 * tiny-kimi-linear through the command line: `generate --prompt-ids --json` reproduces the
 * README's known answer in RAM and streaming under a budget near the floor, `plan` prints each
 * layer's recurrent state or latent cache, and a bad `--prompt-ids` is one clear line.
 */
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { fixtureDir, KIMI_LINEAR_KNOWN, packedFixture } from "./fixtures.ts";

const MOD = new URL("../mod.ts", import.meta.url).pathname;
const ignore = !existsSync(fixtureDir("tiny-kimi-linear"));

async function sluice(
  ...args: string[]
): Promise<{ code: number; stdout: string; stderr: string }> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", MOD, ...args],
    stdin: "null",
    env: { NO_COLOR: "1" },
  }).output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

const KNOWN = KIMI_LINEAR_KNOWN.ids;

Deno.test({
  name: "generate --prompt-ids --json gives the known answer in RAM and streaming",
  ignore,
  async fn() {
    const model = await packedFixture("tiny-kimi-linear");
    const args = [
      "generate",
      "--model",
      model,
      "--prompt-ids",
      KIMI_LINEAR_KNOWN.prompt.join(","),
      "-n",
      "20",
    ];
    for (const extra of [[], ["--budget", "4M", "--lookahead", "2", "--threads", "1"]]) {
      const r = await sluice(...args, "--ignore-eos", "--json", ...extra);
      assert.equal(r.code, 0, r.stderr);
      const out = JSON.parse(r.stdout);
      assert.deepEqual(out.prompt_ids, KIMI_LINEAR_KNOWN.prompt);
      assert.deepEqual(out.generated_ids, KNOWN, `with ${extra.join(" ")}`);
      assert.ok(out.stats.generate_tok_s > 0);
      if (extra.length) {
        assert.ok(out.stats.expert_misses > 0 && out.stats.arena_bytes <= 4 * 2 ** 20);
      }
    }
    // Without --ignore-eos the sampled BOS at generated position 10 ends the run.
    const stop = JSON.parse((await sluice(...args, "--json")).stdout);
    assert.deepEqual(stop.generated_ids, KNOWN.slice(0, 10));
  },
});

Deno.test({
  name: "plan prints each layer's recurrent state or latent cache",
  ignore,
  async fn() {
    const model = await packedFixture("tiny-kimi-linear");
    const r = await sluice("plan", "--model", model, "--ctx", "256");
    assert.equal(r.code, 0, r.stderr);
    // 4 heads × 16 × 16 floats of state; 3 × 3 × 64 floats of conv window; 40 floats per position.
    for (const l of [0, 1, 3, 4]) {
      assert.match(
        r.stdout,
        new RegExp(`layer ${l} +KDA +state 6\\.25 KiB \\(any context\\)`),
      );
    }
    for (const l of [2, 5]) {
      assert.match(r.stdout, new RegExp(`layer ${l} +MLA +state 40\\.0 KiB at ctx 256`));
    }
    const json = JSON.parse(
      (await sluice("plan", "--model", model, "--ctx", "256", "--json")).stdout,
    );
    assert.deepEqual(json.layerStateBytes, [6400, 6400, 40960, 6400, 6400, 40960]);
  },
});

Deno.test({
  name: "a bad --prompt-ids is one clear line and exit code 1",
  ignore,
  async fn() {
    const model = await packedFixture("tiny-kimi-linear");
    for (
      const [ids, want] of [["1,403,x", /separated by commas, got "x"/], [
        "1,512",
        /token id 512 is outside the vocabulary of 512/,
      ]] as const
    ) {
      const r = await sluice("generate", "--model", model, "--prompt-ids", ids);
      assert.equal(r.code, 1);
      assert.match(r.stderr, want);
      assert.ok(!r.stderr.includes("    at "), r.stderr);
    }
    const both = await sluice("generate", "--model", model, "--prompt-ids", "1", "--prompt", "x");
    assert.equal(both.code, 1);
    assert.match(both.stderr, /not both/);
  },
});
