/**
 * Validation from one schema (issue 15): every tensor's shape and role comes from the normalised
 * config, and both the packer and the container reader refuse what disagrees — transposed or
 * reshaped projections, short norms, a wrong head_dim, manifest sizes that do not match the
 * tensors — as well as config values that would make NaN (eps ≤ 0, NaN weights).
 */
import assert from "node:assert/strict";
import { normalizeConfig } from "../engine/config.ts";
import { openContainer } from "../engine/container.ts";
import { packCheckpoint, type PackOptions } from "../tools/pack.ts";
import { fixtureDir, hasFixture, HAVE_FIXTURES } from "./fixtures.ts";

const QUIET: PackOptions = { progress: "off", log: () => {} };
const ignore = !HAVE_FIXTURES;

async function rejectsWith(p: Promise<unknown>, ...parts: string[]): Promise<void> {
  await assert.rejects(p, (e: Error) => {
    for (const s of parts) assert.ok(e.message.includes(s), `"${e.message}" lacks "${s}"`);
    return true;
  });
}

function throwsWith(fn: () => unknown, ...parts: string[]): void {
  assert.throws(fn, (e: Error) => {
    for (const s of parts) assert.ok(e.message.includes(s), `"${e.message}" lacks "${s}"`);
    return true;
  });
}

type Header = Record<string, { dtype: string; shape: number[]; data_offsets: [number, number] }>;

/** Copies fixture `name` to `dir`, letting `edit` change the safetensors header and the config. */
function mutatedCopy(
  name: string,
  dir: string,
  edit: { header?: (h: Header) => void; config?: (c: Record<string, unknown>) => void },
): string {
  Deno.mkdirSync(dir, { recursive: true });
  for (const f of Deno.readDirSync(fixtureDir(name))) {
    if (f.isFile) Deno.copyFileSync(`${fixtureDir(name)}/${f.name}`, `${dir}/${f.name}`);
  }
  if (edit.header) {
    const bytes = Deno.readFileSync(`${dir}/model.safetensors`);
    const len = Number(new DataView(bytes.buffer).getBigUint64(0, true));
    const h = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + len)));
    edit.header(h);
    const text = new TextEncoder().encode(JSON.stringify(h));
    assert.ok(text.length <= len, "edited header must not grow");
    const padded = new Uint8Array(len).fill(0x20);
    padded.set(text);
    bytes.set(padded, 8);
    Deno.writeFileSync(`${dir}/model.safetensors`, bytes);
  }
  if (edit.config) {
    const c = JSON.parse(Deno.readTextFileSync(`${dir}/config.json`));
    edit.config(c);
    Deno.writeTextFileSync(`${dir}/config.json`, JSON.stringify(c));
  }
  return dir;
}

const L0 = "model.layers.0.";

Deno.test({
  name: "pack refuses tensors whose shape disagrees with the config, naming tensor and shapes",
  ignore,
  fn: async () => {
    const tmp = Deno.makeTempDirSync({ prefix: "sluice-schema-" });
    try {
      let n = 0;
      const bad = async (
        name: string,
        edit: Parameters<typeof mutatedCopy>[2],
        ...parts: string[]
      ) => {
        const src = mutatedCopy(name, `${tmp}/src${n}`, edit);
        const out = `${tmp}/out${n++}.sluice`;
        await rejectsWith(packCheckpoint(src, out, QUIET), ...parts);
        assert.ok(![...Deno.readDirSync(tmp)].some((e) => e.name.startsWith(`out${n - 1}`)));
      };
      const reshape = (t: string, shape: number[]) => (h: Header) => {
        h[t].shape = shape;
      };
      await bad(
        "stories260k",
        { header: reshape(`${L0}self_attn.k_proj.weight`, [64, 32]) },
        "k_proj",
        "[64,32]",
        "[32,64]",
      );
      await bad(
        "stories260k",
        { header: reshape(`${L0}self_attn.o_proj.weight`, [32, 128]) },
        "o_proj",
        "[64,64]",
      );
      await bad(
        "stories260k",
        {
          header: (h) => {
            const t = h[`${L0}input_layernorm.weight`];
            t.shape = [32];
            t.data_offsets[1] = t.data_offsets[0] + 128;
          },
        },
        "input_layernorm",
        "[64]",
      );
      await bad("stories260k", { config: (c) => c.head_dim = 16 }, "q_proj", "[128,64]");
      await bad(
        "stories260k-moe",
        {
          header: reshape("model.layers.1.block_sparse_moe.gate.weight", [64, 8]),
        },
        "gate.weight",
        "[8,64]",
      );
      await bad("stories260k", { config: (c) => c.rms_norm_eps = -1 }, "rms_norm_eps", "(0, 1)");
      await bad("stories260k", { config: (c) => c.rms_norm_eps = 0 }, "rms_norm_eps");
    } finally {
      Deno.removeSync(tmp, { recursive: true });
    }
  },
});

Deno.test({
  name: "pack refuses NaN and infinite weights, naming the tensor and the element",
  ignore,
  fn: async () => {
    const tmp = Deno.makeTempDirSync({ prefix: "sluice-nan-" });
    try {
      const src = mutatedCopy("stories260k-moe", `${tmp}/src`, {});
      const bytes = Deno.readFileSync(`${src}/model.safetensors`);
      const len = Number(new DataView(bytes.buffer).getBigUint64(0, true));
      const h = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + len))) as Header;
      const poke = (name: string, element: number, value: number) => {
        const at = 8 + len + h[name].data_offsets[0] + 4 * element;
        new DataView(bytes.buffer).setFloat32(at, value, true);
        Deno.writeFileSync(`${src}/model.safetensors`, bytes);
      };
      const wq = `${L0}self_attn.q_proj.weight`;
      poke(wq, 77, NaN);
      await rejectsWith(
        packCheckpoint(src, `${tmp}/a.sluice`, QUIET),
        "q_proj",
        "element 77",
        "NaN",
      );
      poke(wq, 77, 0.5);
      const expert = "model.layers.2.block_sparse_moe.experts.3.w2.weight";
      poke(expert, 5, -Infinity);
      // Through the quantiser too, not only the byte copy.
      await rejectsWith(
        packCheckpoint(src, `${tmp}/b.sluice`, { ...QUIET, experts: "int8" }),
        "experts.3.w2",
        "NaN or infinite",
      );
      poke(expert, 5, 0.25);
      await packCheckpoint(src, `${tmp}/c.sluice`, QUIET);
    } finally {
      Deno.removeSync(tmp, { recursive: true });
    }
  },
});

Deno.test({
  name: "open refuses a manifest whose config disagrees with its tensors or makes NaN",
  ignore,
  fn: async () => {
    const tmp = Deno.makeTempDirSync({ prefix: "sluice-open-" });
    try {
      for (const fixture of ["stories260k-moe", "tiny-deepseek-v3"]) {
        const out = `${tmp}/${fixture}.sluice`;
        await packCheckpoint(fixtureDir(fixture), out, QUIET);
        const path = `${out}/manifest.json`;
        const original = Deno.readTextFileSync(path);
        // deno-lint-ignore no-explicit-any
        const tamper = (edit: (m: any) => void, ...parts: string[]) => {
          const m = JSON.parse(original);
          edit(m);
          Deno.writeTextFileSync(path, JSON.stringify(m));
          throwsWith(() => openContainer(out), ...parts);
        };
        const mla = fixture === "tiny-deepseek-v3";
        // MLA's headDim and numKvHeads are derived from its section, and checked against it.
        tamper(
          (m) => m.config.headDim *= 2,
          mla ? "must be qkNopeHeadDim" : "but the config gives",
        );
        tamper((m) => m.config.vocabSize = 256, "embed", "but the config gives");
        tamper((m) => m.config.hiddenSize = 32, "but the config gives");
        tamper((m) => m.config.rmsNormEps = -1, "rms_norm_eps", "(0, 1)");
        tamper((m) => m.config.numKvHeads = 3, mla ? "numKvHeads 3" : "num_key_value_heads");
        tamper((m) => m.config.eosIds = [m.config.vocabSize], "outside the vocabulary");
        tamper((m) => {
          const t = m.trunk.layers[1].tensors.wkv_b ?? m.trunk.layers[1].tensors.wk;
          t.shape = [t.shape[1], t.shape[0]];
        }, "layers[1].tensors.w");
        tamper(
          (m) => {
            const t = m.trunk.layers[0].tensors.attn_norm;
            t.dtype = "bf16";
            t.bytes /= 2;
          },
          "attn_norm",
          "expected f32",
        );
        Deno.writeTextFileSync(path, original);
        openContainer(out);
      }
    } finally {
      Deno.removeSync(tmp, { recursive: true });
    }
  },
});

Deno.test({
  name: "config bounds: eps, heads, rotary width, ids name the right file",
  ignore,
  fn: () => {
    const base = JSON.parse(Deno.readTextFileSync(fixtureDir("stories260k/config.json")));
    throwsWith(() => normalizeConfig({ ...base, rms_norm_eps: -1 }), "config.json", "rms_norm_eps");
    throwsWith(() => normalizeConfig({ ...base, head_dim: 7 }), "rotary dimension 7");
    throwsWith(() => normalizeConfig({ ...base, vocab_size: 2 ** 30 }), "vocabSize");
    throwsWith(
      () => normalizeConfig(base, { eos_token_id: 9999 }),
      "generation_config.json",
      "9999",
    );
    throwsWith(() => normalizeConfig({ ...base, eos_token_id: 9999 }), "config.json", "9999");
    assert.throws(
      () => normalizeConfig({ ...base, eos_token_id: 9999 }),
      (e: Error) => !e.message.startsWith("generation_config.json"),
    );
  },
});

Deno.test({
  name:
    "K3 shapes: pack and open refuse latent-MoE, Attention Residual and gate tensors off the config",
  ignore: !hasFixture("tiny-kimi-k3"),
  fn: async () => {
    const tmp = Deno.makeTempDirSync({ prefix: "sluice-k3-schema-" });
    try {
      const P = "language_model.model.layers.";
      const transpose = (name: string) => (h: Header) => {
        const s = h[name].shape;
        h[name].shape = [s[1], s[0]];
      };
      for (
        const name of [
          `${P}1.block_sparse_moe.routed_expert_up_proj.weight`,
          `${P}3.self_attn.g_proj.weight`,
        ]
      ) {
        const src = mutatedCopy("tiny-kimi-k3", `${tmp}/src`, { header: transpose(name) });
        await rejectsWith(
          packCheckpoint(src, `${tmp}/bad.sluice`, QUIET),
          name,
          "config.json gives",
        );
      }
      const out = `${tmp}/k3.sluice`;
      await packCheckpoint(fixtureDir("tiny-kimi-k3"), out, QUIET);
      const path = `${out}/manifest.json`;
      const original = Deno.readTextFileSync(path);
      // deno-lint-ignore no-explicit-any
      const tamper = (edit: (m: any) => void, ...parts: string[]) => {
        const m = JSON.parse(original);
        edit(m);
        Deno.writeTextFileSync(path, JSON.stringify(m));
        throwsWith(() => openContainer(out), ...parts);
      };
      const swap = (t: { shape: number[] }) => t.shape = [t.shape[1], t.shape[0]];
      tamper((m) => swap(m.trunk.layers[1].tensors.latent_down), "layers[1].tensors.latent_down");
      // MLA layer 3's output gate, KDA layer 0's full-rank gate.
      tamper((m) => swap(m.trunk.layers[3].tensors.g_proj), "layers[3].tensors.g_proj");
      tamper((m) => swap(m.trunk.layers[0].tensors.g_proj), "layers[0].tensors.g_proj");
      tamper((m) => swap(m.trunk.globals.tensors.out_res_proj), "out_res_proj");
      tamper((m) => m.config.moe.latentDim = 32, "latent_down", "but the config gives");
      tamper((m) => m.config.glu.beta = 0, "activation_situ_beta");
      tamper((m) => m.config.residual.blockSize = 0, "residual.blockSize");
      // The section of containers packed before the layer parts is checked as strictly.
      tamper((m) => {
        const { glu, moe } = m.config;
        m.config.k3 = {
          latentDim: moe.latentDim,
          situBeta: glu.beta,
          situLinearBeta: glu.linearBeta,
          attnResBlockSize: 0,
        };
        delete m.config.residual;
        delete m.config.glu;
        delete m.config.moe.latentDim;
      }, "k3.attnResBlockSize");
      Deno.writeTextFileSync(path, original);
      openContainer(out);
    } finally {
      Deno.removeSync(tmp, { recursive: true });
    }
  },
});
