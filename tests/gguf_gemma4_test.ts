/**
 * The gemma4 GGUF mapping without llama.cpp (tests/gguf_llamacpp_test.ts runs it): the tensors
 * and metadata written for tiny-gemma4-moe, the proportional RoPE's factors, and the configs
 * llama.cpp's gemma4 cannot compute refused by name.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { exportGguf } from "../tools/dev/export_gguf.ts";
import { readGguf } from "../tools/dev/gguf/read.ts";
import { gemma4RopeFreqs, gemma4Unsupported } from "../tools/dev/gguf/gemma4.ts";
import { loadModelConfig } from "../engine/config.ts";
import { fixtureDir, hasFixture, tempDir } from "./fixtures.ts";

const NAME = "tiny-gemma4-moe";
const ignore = !hasFixture(NAME);

Deno.test({
  name: "gemma4 GGUF: both geometries, the window pattern and the RoPE factors",
  ignore,
  fn: () => {
    const out = join(tempDir(), "gemma4-map.gguf");
    const r = exportGguf(fixtureDir(NAME), out, { progress: "off", force: true });
    assert.equal(r.arch, "gemma4");
    const g = readGguf(out);
    g.close();
    const meta = (k: string) => g.metadata.get(`gemma4.${k}`)?.value;
    assert.equal(meta("attention.key_length"), 32);
    assert.equal(meta("attention.key_length_swa"), 16);
    assert.deepEqual([...meta("attention.head_count_kv") as number[]], [2, 2, 1, 2, 2, 1]);
    assert.deepEqual(
      [...meta("attention.sliding_window_pattern") as boolean[]],
      [true, true, false, true, true, false],
    );
    assert.equal(meta("attention.sliding_window"), 32);
    assert.equal(meta("rope.freq_base"), 1e6);
    assert.equal(meta("rope.freq_base_swa"), 1e4);
    assert.equal(meta("feed_forward_length"), 96);
    assert.equal(meta("expert_feed_forward_length"), 32);
    assert.equal(meta("final_logit_softcapping"), 30);
    const dims = (n: string) => g.tensors.find((t) => t.name === n)?.dims;
    // Full layer 2: 4 heads of 32, one KV head, no attn_v (V is K); sliding layer 0 has one.
    assert.deepEqual(dims("blk.2.attn_q.weight"), [64, 128]);
    assert.deepEqual(dims("blk.2.attn_k.weight"), [64, 32]);
    assert.equal(dims("blk.2.attn_v.weight"), undefined);
    assert.deepEqual(dims("blk.0.attn_v.weight"), [64, 32]);
    assert.deepEqual(dims("blk.0.ffn_down_exps.scale"), [16]);
    assert.deepEqual(dims("blk.0.layer_output_scale.weight"), [1]);
    assert.deepEqual(dims("blk.0.ffn_gate_up_exps.weight"), undefined);
    assert.deepEqual(dims("blk.0.ffn_gate_exps.weight"), [64, 32, 16]);
    // Tied: no output tensor, llama.cpp reuses token_embd.
    assert.equal(dims("output.weight"), undefined);
    // int(0.25 · 32 / 2) = 4 rotated pairs of 16.
    const f = gemma4RopeFreqs(loadModelConfig(fixtureDir(NAME)));
    assert.deepEqual([...f.values.slice(0, 5)], [1, 1, 1, 1, 1e30].map(Math.fround));
    assert.equal(f.values.length, 16);
  },
});

Deno.test({
  name: "gemma4 GGUF: what llama.cpp's gemma4 cannot compute is refused by name",
  ignore,
  fn: () => {
    const cfg = loadModelConfig(fixtureDir(NAME));
    assert.equal(gemma4Unsupported(cfg), null);
    const a = cfg.attention!;
    const allSliding = { ...cfg, attention: { ...a, windows: a.windows.map(() => 32) } };
    assert.match(gemma4Unsupported(allSliding)!, /at least one full layer/);
    const twoWindows = { ...cfg, attention: { ...a, windows: [32, 16, 0, 32, 32, 0] } };
    assert.match(gemma4Unsupported(twoWindows)!, /one sliding window/);
    const silu = { ...cfg, glu: undefined };
    assert.match(gemma4Unsupported(silu)!, /GELU-tanh/);
  },
});
