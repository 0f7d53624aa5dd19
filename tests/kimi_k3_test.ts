/**
 * Kimi K3: the config normaliser refuses what it cannot run, the packer copies the release's
 * MXFP4 expert bytes into records unchanged, and the float64 reference reproduces the known
 * continuation of kimi-k3-in-c's oracle model (../shared/models/README.md, tiny-kimi-k3).
 */
import assert from "node:assert/strict";
import { normalizeConfig } from "../engine/config.ts";
import { referenceWeightsFromCheckpoint } from "../engine/reference/checkpoint.ts";
import { KimiK3Reference } from "../engine/reference/kimi_k3.ts";
import { hfExpertName } from "../engine/tensor_names.ts";
import { openContainer, readExpertRecord } from "../io/container.ts";
import { openCheckpoint } from "../io/safetensors.ts";
import { fixtureDir, hasFixture, packedFixture } from "./fixtures.ts";

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

function configOf(name: string): Record<string, unknown> {
  return JSON.parse(Deno.readTextFileSync(`${fixtureDir(name)}/config.json`));
}

function argmax(a: ArrayLike<number>): number {
  let best = 0;
  for (let i = 1; i < a.length; i++) if (a[i] > a[best]) best = i;
  return best;
}

Deno.test({
  name: "K3 config: every field the forward pass needs is required, by name",
  ignore: !hasFixture(K3),
  fn() {
    const base = configOf(K3);
    const cfg = normalizeConfig(base);
    assert.equal(cfg.family, "kimi_k3");
    assert.deepEqual(
      cfg.k3!.attention.flatMap((a, l) => a === "mla" ? [l] : []),
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
    const ref = new KimiK3Reference(cfg, weight);
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
