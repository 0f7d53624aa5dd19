/**
 * Kimi K3: the config normaliser refuses what it cannot run, the packer copies the release's
 * MXFP4 expert bytes into records unchanged, and the float64 reference reproduces the known
 * continuation of kimi-k3-in-c's oracle model (../shared/models/README.md, tiny-kimi-k3); the
 * prompt cache and saved sessions carry its recurrent state.
 */
import assert from "node:assert/strict";
import { normalizeConfig } from "../engine/config.ts";
import {
  referenceWeightsFromCheckpoint,
  referenceWeightsFromContainer,
} from "../engine/float_weights.ts";
import { ReferenceModel } from "../engine/reference/forward.ts";
import { hfExpertName } from "../engine/tensor_names.ts";
import { openContainer } from "../engine/container.ts";
import { readExpertRecord } from "../io/container.ts";
import { openCheckpoint } from "../io/safetensors.ts";
import { Model } from "../engine/model.ts";
import { argmax } from "../engine/sampler.ts";
import { packCheckpoint } from "../tools/pack.ts";
import { type SynthOverrides, synthShape, synthTensors } from "../tools/synth.ts";
import {
  assertNearReference,
  checkPromptCache,
  engineGreedy,
  fixtureConfig,
  fixtureDir,
  hasFixture,
  logitsOfRun,
  packedFixture,
  referenceOf,
  synthVsReference,
  tempDir,
} from "./fixtures.ts";

const K3 = "tiny-kimi-k3";
const K3_MXFP4 = "tiny-kimi-k3-mxfp4";
/** kimi-k3-in-c's oracle prompt and its first 20 greedy tokens (tests/fixtures/ref_k3.json). */
const ORACLE_PROMPT = [203, 34, 2, 239, 195, 71, 163, 54, 121, 104, 16, 16];
const ORACLE_CONTINUATION = [
  219,
  63,
  4,
  31,
  48,
  193,
  57,
  231,
  219,
  205,
  145,
  117,
  79,
  208,
  18,
  1,
  74,
  125,
  66,
  121,
];

Deno.test({
  name: "K3 config: every field the forward pass needs is required, by name",
  ignore: !hasFixture(K3),
  fn() {
    const base = fixtureConfig(K3);
    const cfg = normalizeConfig(base);
    assert.equal(cfg.family, "kimi_k3");
    assert.deepEqual(
      cfg.kda!.layers.flatMap((kda, l) => kda ? [] : [l]),
      [3, 7, 11, 12],
      "full_attn_layers is 1-based",
    );
    assert.equal(cfg.layerKinds[0], "dense");
    assert.equal(cfg.moe!.sharedIntermediate, 96);
    const text = [
      "activation_situ_beta",
      "activation_situ_linear_beta",
      "attn_res_block_size",
      "routed_expert_hidden_size",
      "num_shared_experts",
      "moe_renormalize",
      "first_k_dense_replace",
      "q_lora_rank",
      "rms_norm_eps",
      "mla_use_output_gate",
    ];
    for (const key of text) {
      const c = structuredClone(base);
      delete (c.text_config as Record<string, unknown>)[key];
      assert.throws(() => normalizeConfig(c), new RegExp(`required field ${key} is missing`), key);
    }
    for (const key of ["gate_lower_bound", "short_conv_kernel_size", "full_attn_layers"]) {
      const c = structuredClone(base);
      const t = c.text_config as Record<string, Record<string, unknown>>;
      delete t.linear_attn_config[key];
      assert.throws(
        () => normalizeConfig(c),
        new RegExp(`linear_attn_config: required field ${key} is missing`),
        key,
      );
    }
    const silu = structuredClone(base);
    (silu.text_config as Record<string, unknown>).hidden_act = "silu";
    assert.throws(() => normalizeConfig(silu), /hidden_act is "silu"; only "situ" is supported/);
  },
});

Deno.test({
  name: "K3 reference: kimi-k3-in-c's oracle prompt gives its known continuation",
  ignore: !hasFixture(K3),
  fn() {
    const { cfg, weight } = referenceWeightsFromCheckpoint(fixtureDir(K3));
    const ref = new ReferenceModel(cfg, weight);
    const tokens = [...ORACLE_PROMPT];
    const out: number[] = [];
    for (let pos = 0; out.length < ORACLE_CONTINUATION.length; pos++) {
      const logits = ref.forward64(tokens[pos], pos);
      if (pos >= ORACLE_PROMPT.length - 1) {
        out.push(argmax(logits));
        tokens.push(out.at(-1)!);
      }
    }
    assert.deepEqual(out, ORACLE_CONTINUATION);
  },
});

Deno.test({
  name: "K3 pack: MXFP4 weight_packed/weight_scale land in the records byte for byte",
  ignore: !hasFixture(K3_MXFP4),
  async fn() {
    const c = openContainer(await packedFixture(K3_MXFP4));
    const ckpt = openCheckpoint(fixtureDir(K3_MXFP4));
    try {
      const cfg = c.config;
      for (const [layer, expert] of [[1, 0], [7, 5], [12, 7]]) {
        const bank = c.manifest.experts[layer]!;
        assert.equal(bank.format, "mxfp4");
        assert.equal(bank.activations, "f32", "shipped MXFP4 multiplies f32 activations");
        const { record } = readExpertRecord(c, layer, expert);
        for (const m of ["gate", "up", "down"] as const) {
          const name = hfExpertName(cfg, layer, expert, m);
          const e = bank.matrices[m];
          assert.deepEqual(
            record.subarray(e.offset, e.offset + e.bytes),
            ckpt.read(`${name}_packed`),
            `${name}_packed`,
          );
          assert.deepEqual(
            record.subarray(e.scale!.offset, e.scale!.offset + e.scale!.bytes),
            ckpt.read(`${name}_scale`),
            `${name}_scale`,
          );
        }
      }
    } finally {
      ckpt.close();
    }
  },
});

/** A K3-shaped model at awkward sizes (nothing a multiple of 4 or 32 where it can be avoided). */
const AWKWARD: SynthOverrides = {
  hidden: 72,
  layers: 5,
  experts: 12,
  topK: 3,
  latent: 36,
  expertInter: 28,
  denseInter: 84,
  heads: 3,
  qLoraRank: 40,
  kvLoraRank: 20,
  nopeDim: 14,
  ropeDim: 6,
  vDim: 10,
  vocab: 300,
  attnResBlock: 2,
  sharedExperts: 2,
  mxfp4Experts: 0,
};

/** A K3 checkpoint at the awkward sizes with `overrides` on top, against the reference. */
function awkwardVsReference(name: string, seed: number, overrides: SynthOverrides) {
  return synthVsReference("kimi_k3", name, seed, { ...AWKWARD, ...overrides });
}

Deno.test("K3 engine: gated NoPE MLA, latent MoE, SiTU and AttnRes at awkward sizes", async () => {
  // Every layer MLA (mlaEvery 1): the K3 pieces apart from KDA, against the float64 reference.
  await awkwardVsReference("k3-mla-awkward", 5, { mlaEvery: 1 });
});

Deno.test({
  name: "K3 engine: tiny-kimi-k3 continues the oracle prompt exactly, in any prefill chunking",
  ignore: !hasFixture(K3),
  async fn() {
    const dir = await packedFixture(K3);
    for (const chunk of [64, 1, 5]) {
      const got = await engineGreedy(dir, ORACLE_PROMPT, ORACLE_CONTINUATION.length, {
        prefillChunk: chunk,
      });
      assert.deepEqual(got, ORACLE_CONTINUATION, `prefill chunk ${chunk}`);
    }
  },
});

Deno.test({
  name: "K3 engine: tiny-kimi-k3 and -mxfp4 match the float64 reference (40 greedy tokens)",
  ignore: !hasFixture(K3) || !hasFixture(K3_MXFP4),
  async fn() {
    // The shipped MXFP4 experts multiply f32 activations exactly (measured 1.1e-5; through the Q8
    // copy of the input, 6.3e-3), so both stay within float32's own 2.5e-5 of the reference.
    const bound = 3e-5;
    for (const name of [K3, K3_MXFP4]) {
      const steps = ORACLE_PROMPT.length + 39;
      const run = { ctx: 64, prompt: ORACLE_PROMPT, steps, bound, name };
      await assertNearReference(await packedFixture(name), referenceOf(name), run);
    }
  },
});

Deno.test("K3 engine: KDA with the bounded decay and full-rank gate at awkward sizes", async () => {
  // The release's pattern (every 4th layer and the last MLA): KDA layers 0, 1, 2, 4, 5.
  await awkwardVsReference("k3-kda-awkward", 6, {
    layers: 7,
    kdaHeads: 3,
    kdaHeadDim: 12,
    mlaEvery: 4,
  });
});

Deno.test({
  name: "K3 engine: re-quantised expert formats match the reference on the container's weights",
  ignore: !hasFixture(K3_MXFP4),
  async fn() {
    // int4 reads Q8 copies of its inputs (as re-quantised mxfp4 would); the others read f32 (vq3r
    // via tables).
    for (const [experts, bound] of [["int4", 2e-2], ["int8", 1e-4], ["vq3r", 1e-4]] as const) {
      const out = `${tempDir()}/k3-${experts}.sluice`;
      await packCheckpoint(fixtureDir(K3_MXFP4), out, {
        experts,
        vq3r: { sampleSize: 4096, iterations: 3 },
        progress: "off",
        log: () => {},
      });
      const { cfg, weight } = referenceWeightsFromContainer(out);
      const down = openContainer(out).manifest.experts[1]!.matrices.down;
      assert.equal(down.dtype, EXPERT_DTYPE[experts]);
      const run = { ctx: 64, prompt: ORACLE_PROMPT, steps: 30, bound, name: experts };
      await assertNearReference(out, new ReferenceModel(cfg, weight), run);
    }
  },
});

/** The container dtype of each `--experts` choice tested above. */
const EXPERT_DTYPE = { int4: "int4g32", int8: "int8row", vq3r: "vq3r" } as const;

Deno.test({
  name: "K3 engine: prefill in chunks of 32 and 7 gives the same bits as token-by-token prefill",
  ignore: !hasFixture(K3),
  async fn() {
    const dir = await packedFixture(K3);
    const tokens = [...ORACLE_PROMPT, ...ORACLE_CONTINUATION];
    // Every position's logits, all of them prefilled in chunks of `chunk`.
    const run = (chunk: number) =>
      logitsOfRun(dir, { prefillChunk: chunk }, tokens, tokens.length, 64);
    const one = await run(1);
    for (const chunk of [32, 7]) {
      const got = await run(chunk);
      assert.deepEqual(got, one, `prefill chunk ${chunk}: logits differ from chunk 1`);
    }
  },
});

Deno.test("K3 synth at the release's width: its shapes and expert bytes are the release's", () => {
  const s = synthShape("kimi_k3", 20 * 2 ** 30, { hidden: 7168, layers: 93, experts: 896 });
  const cfg = normalizeConfig(s.config);
  assert.equal(cfg.kda!.layers.filter((k) => !k).length, 24, "24 MLA layers");
  assert.deepEqual(
    cfg.kda!.layers.flatMap((k, l) => k ? [] : [l + 1]).slice(-3),
    [88, 92, 93],
    "1-based MLA layers end 88, 92, 93",
  );
  assert.deepEqual(
    [cfg.kda!.numHeads, cfg.kda!.headDim, cfg.numHeads, cfg.mla!.qLoraRank, cfg.mla!.kvLoraRank],
    [96, 128, 96, 1536, 512],
  );
  assert.deepEqual([cfg.mla!.qkNopeHeadDim, cfg.mla!.qkRopeHeadDim, cfg.mla!.vHeadDim], [
    128,
    64,
    128,
  ]);
  assert.deepEqual(
    [cfg.moe!.latentDim, cfg.moe!.expertIntermediate, cfg.moe!.sharedIntermediate, cfg.moe!.topK],
    [3584, 3072, 6144, 16],
  );
  assert.equal(cfg.intermediateSize, 33792);
  assert.deepEqual(cfg.residual, { kind: "attn_res", blockSize: 12 });
  const expert = synthTensors("kimi_k3", s.dims, "bf16").filter((t) =>
    t.name.includes("layers.1.block_sparse_moe.experts.0.")
  );
  // ../shared/K3.md: 17,547,264 bytes per expert in the release.
  assert.equal(expert.reduce((n, t) => n + t.shape.reduce((a, b) => a * b, 1), 0), 17547264);
});

Deno.test({
  name: "K3 prompt cache and saved sessions keep the KDA state: same tokens as cold runs",
  ignore: !hasFixture(K3),
  async fn() {
    const g1 = await checkPromptCache(await packedFixture(K3), ORACLE_PROMPT, {
      recurrent: true,
      extend: [40, 77],
      diverge: [9, 250],
      resume: [120],
    });
    assert.deepEqual(g1, ORACLE_CONTINUATION.slice(0, 8));
  },
});

Deno.test({
  name: "a K3 container packed before the layer parts (one `k3` config section) opens unchanged",
  ignore: !hasFixture(K3),
  async fn() {
    const src = await packedFixture(K3);
    const dir = `${tempDir()}/k3-legacy.sluice`;
    Deno.mkdirSync(dir);
    for (const e of Deno.readDirSync(src)) {
      Deno.copyFileSync(`${src}/${e.name}`, `${dir}/${e.name}`);
    }
    const m = JSON.parse(Deno.readTextFileSync(`${dir}/manifest.json`));
    const { residual, glu, moe, ...rest } = m.config;
    const { latentDim, ...moeRest } = moe;
    assert.ok(residual && glu && latentDim, "the packer writes the parts' fields");
    m.config = {
      ...rest,
      moe: moeRest,
      k3: {
        latentDim,
        situBeta: glu.beta,
        situLinearBeta: glu.linearBeta,
        attnResBlockSize: residual.blockSize,
      },
    };
    Deno.writeTextFileSync(`${dir}/manifest.json`, JSON.stringify(m));
    assert.deepEqual(openContainer(dir).config, openContainer(src).config);
    const logits = async (path: string) => {
      const model = await Model.open(path, { quiet: true, hotList: false });
      try {
        return model.forward(ORACLE_PROMPT, 0);
      } finally {
        model.close();
      }
    };
    assert.deepEqual(await logits(dir), await logits(src));
  },
});
