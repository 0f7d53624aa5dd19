/**
 * The deepseek4 GGUF export (tools/dev/gguf/deepseek4.ts) without llama.cpp: names, shapes,
 * types and hyper-parameters llama.cpp v0.4.0's loader asks for, the FP4 experts repacked into
 * ggml MXFP4 bit for bit, and the refusal of what llama.cpp's deepseek4 cannot run. llama.cpp's
 * own run of the export is in tests/gguf_llamacpp_test.ts.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { checkpointWeights } from "../engine/float_weights.ts";
import { openCheckpoint } from "../io/safetensors.ts";
import { exportGguf } from "../tools/dev/export_gguf.ts";
import { mxfp4ToGgml } from "../tools/dev/gguf/deepseek4.ts";
import type { GgufValue } from "../tools/dev/gguf/format.ts";
import { decodeGgmlToF32, type GgufFile, readGguf } from "../tools/dev/gguf/read.ts";
import { packCheckpoint } from "../tools/pack.ts";
import { deepseek4GgufCheckpoint } from "./deepseek4_synth.ts";
import { fixtureDir, hasFixture, tempDir } from "./fixtures.ts";

const value = (f: GgufFile, k: string) => {
  const v = f.metadata.get(k) as GgufValue | undefined;
  assert.ok(v, `metadata ${k} is missing`);
  return v.type === "array" ? Array.from(v.value as ArrayLike<unknown>) : v.value;
};

const tensor = (f: GgufFile, name: string) => {
  const t = f.tensors.find((x) => x.name === name);
  assert.ok(t, `tensor ${name} is missing`);
  return t;
};

Deno.test("deepseek4 f32 export: llama.cpp's names, dims, types and hyper-parameters", async () => {
  const dir = await deepseek4GgufCheckpoint();
  const out = join(tempDir(), "ds4-f32.gguf");
  exportGguf(dir, out, { progress: "off", force: true });
  const f = readGguf(out), w = checkpointWeights(dir);
  try {
    const want: Record<string, unknown> = {
      "general.architecture": "deepseek4",
      "deepseek4.block_count": 6,
      "deepseek4.attention.compress_ratios": [0, 0, 4, 128, 4, 128],
      "deepseek4.attention.compress_rope_freq_base": 160000,
      "deepseek4.rope.freq_base": 10000,
      "deepseek4.rope.dimension_count": 8,
      "deepseek4.rope.scaling.type": "yarn",
      "deepseek4.rope.scaling.factor": 16,
      "deepseek4.rope.scaling.original_context_length": 65536,
      "deepseek4.expert_gating_func": 4,
      "deepseek4.hash_layer_count": 3,
      "deepseek4.hyper_connection.count": 4,
      "deepseek4.hyper_connection.sinkhorn_iterations": 20,
      "deepseek4.embedding_length_out": 256,
      "deepseek4.attention.indexer.key_length": 64,
      "deepseek4.attention.indexer.head_count": 32,
      "deepseek4.attention.indexer.top_k": 4,
      "deepseek4.attention.output_group_count": 2,
      "deepseek4.attention.output_lora_rank": 16,
      "deepseek4.attention.q_lora_rank": 32,
      "deepseek4.attention.sliding_window": 16,
      "deepseek4.expert_shared_count": 1,
      "deepseek4.expert_weights_scale": 1.5,
      "deepseek4.expert_weights_norm": true,
      "deepseek4.swiglu_clamp_exp": [10, 10, 10, 10, 10, 10],
      "deepseek4.attention.key_length": 32,
    };
    for (const [k, v] of Object.entries(want)) assert.deepEqual(value(f, k), v, k);
    const dims = (name: string) => tensor(f, name).dims;
    // ggml order (fastest first): the reverse of the checkpoint's [out, in].
    assert.deepEqual(dims("output_hc_fn.weight"), [256, 4]);
    assert.deepEqual(dims("blk.0.hc_attn_fn.weight"), [256, 24]);
    assert.deepEqual(dims("blk.0.attn_output_a.weight"), [64, 32]);
    assert.deepEqual(dims("blk.2.attn_compressor_ape.weight"), [64, 4]);
    assert.deepEqual(dims("blk.3.attn_compressor_ape.weight"), [32, 128]);
    assert.deepEqual(dims("blk.2.indexer.attn_q_b.weight"), [32, 32 * 64]);
    assert.deepEqual(dims("blk.4.ffn_down_exps.weight"), [32, 64, 16]);
    // Hash layers have a table and no selection bias; the others the reverse; HCA no indexer.
    const names = new Set(f.tensors.map((t) => t.name));
    for (let l = 0; l < 6; l++) {
      assert.equal(names.has(`blk.${l}.ffn_gate_tid2eid.weight`), l < 3);
      assert.equal(names.has(`blk.${l}.exp_probs_b.bias`), l >= 3);
      assert.equal(names.has(`blk.${l}.indexer.proj.weight`), l === 2 || l === 4);
    }
    const t = tensor(f, "blk.1.ffn_gate_tid2eid.weight");
    assert.equal(t.type, "I32");
    assert.deepEqual(t.dims, [4, 512]);
    const ids = new Int32Array(f.readTensor(t.name).slice().buffer);
    assert.deepEqual(Array.from(ids), Array.from(w.layer(1, "router_tid2eid")));
    // Values go through unchanged (the FP8 and FP4 storage dequantised exactly to f32).
    const same = (name: string, v: Float32Array) =>
      assert.deepEqual(decodeGgmlToF32("F32", f.readTensor(name), name), v, name);
    same("blk.4.attn_kv.weight", w.layer(4, "wkv"));
    same("blk.2.indexer_compressor_gate.weight", w.layer(2, "idx_wgate"));
    same("output_hc_base.weight", w.global("hc_head_base"));
    const up = Array.from({ length: 16 }, (_, e) => [...w.expert(5, e, "up")]).flat();
    same("blk.5.ffn_up_exps.weight", Float32Array.from(up));
  } finally {
    f.close();
    w.close();
  }
});

Deno.test(
  "deepseek4 mxfp4 export: FP4 experts repacked bit for bit, FP8 matrices Q8_0, checkpoint = container",
  async () => {
    const dir = await deepseek4GgufCheckpoint();
    const fromCkpt = join(tempDir(), "ds4-mx.gguf"), fromPack = join(tempDir(), "ds4-mx-c.gguf");
    const packed = join(tempDir(), "ds4.sluice");
    await packCheckpoint(dir, packed, { progress: "off", log: () => {}, force: true });
    const opts = { type: "mxfp4", name: "ds4", progress: "off", force: true } as const;
    exportGguf(dir, fromCkpt, opts);
    exportGguf(packed, fromPack, opts);
    assert.deepEqual(Deno.readFileSync(fromPack), Deno.readFileSync(fromCkpt));
    const f = readGguf(fromCkpt), w = checkpointWeights(dir), ckpt = openCheckpoint(dir);
    try {
      assert.equal(value(f, "general.file_type"), 38);
      for (let l = 0; l < 6; l++) {
        for (const [m, hf] of [["gate", "w1"], ["up", "w3"], ["down", "w2"]] as const) {
          const name = `blk.${l}.ffn_${m}_exps.weight`, t = tensor(f, name);
          assert.equal(t.type, "MXFP4");
          const bytes = f.readTensor(name), per = bytes.length / 16;
          for (let e = 0; e < 16; e++) {
            const mine = bytes.subarray(e * per, (e + 1) * per);
            // E2M1 code 8 is −0, which ggml's table holds as +0: the same number.
            const plusZero = (v: Float32Array) => v.map((x) => x + 0);
            assert.deepEqual(
              plusZero(decodeGgmlToF32("MXFP4", mine, name)),
              plusZero(w.expert(l, e, m)),
            );
            // The shipped E8M0 bytes, one per block of 32 inputs, in order.
            const scale = ckpt.read(`layers.${l}.ffn.experts.${e}.${hf}.scale`);
            assert.deepEqual(mine.filter((_, i) => i % 17 === 0), scale);
          }
        }
      }
      // llama.cpp's converter's recipe for the rest: FP8 → Q8_0, BF16 stays BF16, F32 stays F32.
      assert.equal(ckpt.tensors.get("layers.0.attn.wq_a.weight")!.dtype, "F8_E4M3");
      assert.equal(tensor(f, "blk.0.attn_q_a.weight").type, "Q8_0");
      // …but attn_output_a, which llama.cpp cannot multiply as Q8_0 here (deepseek4.ts).
      assert.equal(ckpt.tensors.get("layers.0.attn.wo_a.weight")!.dtype, "F8_E4M3");
      assert.equal(tensor(f, "blk.0.attn_output_a.weight").type, "BF16");
      assert.equal(ckpt.tensors.get("layers.2.attn.compressor.wkv.weight")!.dtype, "BF16");
      assert.equal(tensor(f, "blk.2.attn_compressor_kv.weight").type, "BF16");
      assert.equal(tensor(f, "blk.0.hc_ffn_fn.weight").type, "F32");
      assert.equal(tensor(f, "blk.3.ffn_gate_inp.weight").type, "F32");
    } finally {
      f.close();
      w.close();
      ckpt.close();
    }
  },
);

Deno.test("mxfp4ToGgml moves the nibbles of each block and keeps codes and scales", () => {
  // E2M1 by code (code 8, negative zero, as +0: ggml's table holds 0 there).
  const e2m1 = [0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6];
  let seed = 7;
  const rand = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) % 256;
  for (const blocks of [1, 3, 17]) {
    const data = Uint8Array.from({ length: blocks * 16 }, rand);
    const scale = Uint8Array.from({ length: blocks }, () => 118 + (rand() % 16));
    // DeepSeek's order: element k of a row in byte k / 2, the even one in the low nibble.
    const want = Float32Array.from(
      { length: blocks * 32 },
      (_, k) => e2m1[(data[k >> 1] >> ((k & 1) * 4)) & 15] * 2 ** (scale[k >> 5] - 127),
    );
    const got = mxfp4ToGgml(data, scale, "t");
    assert.equal(got.length, blocks * 17);
    assert.deepEqual(decodeGgmlToF32("MXFP4", got, "t"), want);
  }
  assert.throws(() => mxfp4ToGgml(new Uint8Array(15), new Uint8Array(1), "w"), /w: 15 FP4 bytes/);
});

Deno.test({
  name: "tiny-deepseek-v4 is refused naming index_head_dim (llama.cpp's Hadamard is 64 wide)",
  ignore: !hasFixture("tiny-deepseek-v4"),
  fn() {
    const out = join(tempDir(), "refused.gguf");
    assert.throws(
      () => exportGguf(fixtureDir("tiny-deepseek-v4"), out, { progress: "off" }),
      /index_head_dim a multiple of 64 \(it is 16/,
    );
    assert.throws(() => Deno.statSync(out), Deno.errors.NotFound);
  },
});
