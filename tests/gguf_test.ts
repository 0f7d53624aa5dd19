import assert from "node:assert/strict";
import { join } from "node:path";
import { f16ToF32, readF32 } from "../io/checkpoint_weights.ts";
import { openCheckpoint } from "../io/safetensors.ts";
import { exportGguf, permuteToPairs } from "../tools/dev/export_gguf.ts";
import type { GgufValue } from "../tools/dev/gguf/format.ts";
import { encodeTensor, f32ToBf16Bits, f32ToF16Bits } from "../tools/dev/gguf/quant.ts";
import { bf16ToF32, decodeGgmlToF32, type GgufFile, readGguf } from "../tools/dev/gguf/read.ts";
import { spmVocabFromTokenizerJson, TOKEN_TYPE } from "../tools/dev/gguf/spm_vocab.ts";
import { writeGguf } from "../tools/dev/gguf/write.ts";
import { packCheckpoint } from "../tools/pack.ts";
import { referenceWeightsFromCheckpoint } from "../engine/float_weights.ts";
import { fixtureDir, hasFixture } from "./fixtures.ts";

const REF_GGUF = fixtureDir("gguf/");

/**
 * Metadata keys allowed to differ from llama.cpp's own conversion. None: general.name is the
 * directory name, as the converter derives it, and every other key is reproduced.
 */
const INTENDED_METADATA_DIFFERENCES: readonly string[] = [];

function tempDir(): string {
  return Deno.makeTempDirSync({ prefix: "sluice-gguf-" });
}

function throwsMentioning(fn: () => unknown, ...parts: string[]): void {
  assert.throws(fn, (e: Error) => {
    for (const p of parts) {
      assert.ok(e.message.includes(p), `message "${e.message}" should mention "${p}"`);
    }
    return true;
  });
}

/** Plain JSON-comparable form of a metadata value (bigints and -0 kept distinguishable). */
function plain(v: GgufValue): unknown {
  const one = (x: unknown) => typeof x === "bigint" ? `${x}n` : Object.is(x, -0) ? "-0" : x;
  return v.type === "array"
    ? { type: v.type, elem: v.elem, value: Array.from(v.value as ArrayLike<unknown>, one) }
    : { type: v.type, value: one(v.value) };
}

function assertSameGguf(got: GgufFile, want: GgufFile): void {
  const keys = (f: GgufFile) =>
    [...f.metadata.keys()].filter((k) => !INTENDED_METADATA_DIFFERENCES.includes(k));
  assert.deepEqual(keys(got), keys(want), "metadata keys and their order");
  for (const k of keys(want)) {
    assert.deepEqual(plain(got.metadata.get(k)!), plain(want.metadata.get(k)!), `metadata ${k}`);
  }
  const info = (f: GgufFile) => f.tensors.map((t) => [t.name, t.dims, t.type, t.offset]);
  assert.deepEqual(info(got), info(want), "tensor names, dims, types and offsets");
  for (const t of want.tensors) {
    assert.deepEqual(got.readTensor(t.name), want.readTensor(t.name), `tensor ${t.name} data`);
  }
}

for (const model of ["stories260k", "stories260k-moe"]) {
  Deno.test(`f32 export of ${model} reproduces llama.cpp's conversion`, () => {
    const dir = tempDir();
    try {
      const out = join(dir, "out.gguf");
      const r = exportGguf(fixtureDir(model), out, { progress: "off" });
      assert.equal(r.arch, "llama");
      const got = readGguf(out), want = readGguf(`${REF_GGUF}${model}-f32.gguf`);
      assertSameGguf(got, want);
      got.close();
      want.close();
      // With nothing intended to differ, the files are the same bytes.
      assert.deepEqual(Deno.readFileSync(out), Deno.readFileSync(`${REF_GGUF}${model}-f32.gguf`));
    } finally {
      Deno.removeSync(dir, { recursive: true });
    }
  });
}

for (const [model, arch] of [["tiny-qwen3.5-moe", "qwen35moe"], ["tiny-qwen3-next", "qwen3next"]]) {
  Deno.test({
    name: `${arch} export of ${model} is llama.cpp's conversion without the MTP block`,
    ignore: !hasFixture(model),
    fn() {
      const dir = tempDir();
      try {
        const out = join(dir, "out.gguf");
        assert.equal(exportGguf(fixtureDir(model), out, { progress: "off" }).arch, arch);
        const got = readGguf(out), want = readGguf(`${REF_GGUF}${model}-f32.gguf`);
        // The converter also writes the MTP block (blk.8, nextn_predict_layers 1); sluice does
        // not run it, so it is not exported. The name is the directory's, the size label counts
        // blocks, and Qwen3-Next's unused dense width (intermediate_size) is not kept.
        const differ = [
          "general.name",
          "general.size_label",
          `${arch}.block_count`,
          `${arch}.feed_forward_length`,
        ];
        const keys = (f: GgufFile) => [...f.metadata.keys()].filter((k) => !differ.includes(k));
        assert.deepEqual(keys(got), keys(want).filter((k) => k !== `${arch}.nextn_predict_layers`));
        for (const k of keys(got)) {
          assert.deepEqual(plain(got.metadata.get(k)!), plain(want.metadata.get(k)!), k);
        }
        assert.deepEqual(plain(got.metadata.get(`${arch}.block_count`)!), {
          type: "u32",
          value: 8,
        });
        const mine = new Set(got.tensors.map((t) => t.name));
        assert.deepEqual(
          want.tensors.filter((t) => !mine.has(t.name)).map((t) => t.name.split(".")[1]),
          new Array(20).fill("8"),
          "only the MTP block's tensors are left out",
        );
        for (const t of got.tensors) {
          const w = want.tensors.find((x) => x.name === t.name)!;
          assert.deepEqual([t.dims, t.type], [w.dims, w.type], t.name);
          const a = decodeGgmlToF32(t.type, got.readTensor(t.name), t.name);
          const b = decodeGgmlToF32(w.type, want.readTensor(w.name), w.name);
          // ssm_a = −exp(A_log): the converter's float32 exp and float64 rounded once may differ
          // in the last place; everything else is moved or offset exactly.
          const tol = t.name.endsWith("ssm_a") ? 1e-6 : 0;
          a.forEach((x, i) =>
            assert.ok(Math.abs(x - b[i]) <= tol * Math.abs(b[i]), `${t.name}[${i}]`)
          );
        }
        got.close();
        want.close();
      } finally {
        Deno.removeSync(dir, { recursive: true });
      }
    },
  });
}

Deno.test("--name changes general.name and nothing else", () => {
  const dir = tempDir();
  try {
    const out = join(dir, "named.gguf");
    exportGguf(fixtureDir("stories260k"), out, { name: "tiny story model", progress: "off" });
    const got = readGguf(out), want = readGguf(REF_GGUF + "stories260k-f32.gguf");
    assert.deepEqual(got.metadata.get("general.name"), {
      type: "string",
      value: "tiny story model",
    });
    got.metadata.delete("general.name");
    want.metadata.delete("general.name");
    assert.deepEqual([...got.metadata.keys()], [...want.metadata.keys()]);
    assert.deepEqual(got.tensors.map((t) => t.name), want.tensors.map((t) => t.name));
    got.close();
    want.close();
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test("exported attn_q/attn_k are llama2.c's interleaved wq/wk from stories260K.bin", () => {
  const dir = tempDir();
  try {
    const out = join(dir, "out.gguf");
    exportGguf(fixtureDir("stories260k"), out, { progress: "off" });
    const g = readGguf(out);
    // llama2.c v0 layout: 7 int32, tok_embeddings [512,64], rms_att [5,64], wq [5,64,64], wk [5,32,64].
    const bin = Deno.readFileSync(fixtureDir("stories260k/stories260K.bin"));
    const f = new Float32Array(bin.buffer, 28);
    const wq = 512 * 64 + 5 * 64, wk = wq + 5 * 64 * 64;
    for (let l = 0; l < 5; l++) {
      const q = decodeGgmlToF32("F32", g.readTensor(`blk.${l}.attn_q.weight`), "q");
      const k = decodeGgmlToF32("F32", g.readTensor(`blk.${l}.attn_k.weight`), "k");
      assert.deepEqual(q, f.slice(wq + l * 4096, wq + (l + 1) * 4096), `layer ${l} wq`);
      assert.deepEqual(k, f.slice(wk + l * 2048, wk + (l + 1) * 2048), `layer ${l} wk`);
    }
    g.close();
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test("permuteToPairs moves row c·hd/2 + i of each head to row 2i + c (and back is distinct)", () => {
  const w = Float32Array.from({ length: 2 * 8 * 3 }, (_, i) => i);
  const p = permuteToPairs(w, 2, 8, 3);
  for (let h = 0; h < 2; h++) {
    for (let i = 0; i < 4; i++) {
      for (let c = 0; c < 2; c++) {
        for (let col = 0; col < 3; col++) {
          assert.equal(p[(h * 8 + 2 * i + c) * 3 + col], w[(h * 8 + c * 4 + i) * 3 + col]);
        }
      }
    }
  }
  throwsMentioning(() => permuteToPairs(w, 3, 8, 3), "q/k permutation");
});

Deno.test("qwen3moe export: names, dims, hyper-parameters and unpermuted data", () => {
  const dir = tempDir();
  const src = fixtureDir("stories260k-qwen3moe");
  try {
    const out = join(dir, "q3.gguf");
    const r = exportGguf(src, out, { progress: "off" });
    assert.equal(r.arch, "qwen3moe");
    const g = readGguf(out);
    const u32 = (k: string) => {
      const v = g.metadata.get(k);
      assert.equal(v?.type, "u32", k);
      return v!.value;
    };
    assert.equal(g.metadata.get("general.architecture")!.value, "qwen3moe");
    assert.equal(u32("qwen3moe.block_count"), 5);
    assert.equal(u32("qwen3moe.embedding_length"), 64);
    assert.equal(u32("qwen3moe.attention.head_count"), 8);
    assert.equal(u32("qwen3moe.attention.head_count_kv"), 4);
    assert.equal(u32("qwen3moe.attention.key_length"), 8);
    assert.equal(u32("qwen3moe.attention.value_length"), 8);
    assert.equal(u32("qwen3moe.expert_count"), 8);
    assert.equal(u32("qwen3moe.expert_used_count"), 2);
    assert.equal(u32("qwen3moe.expert_feed_forward_length"), 172);
    assert.equal(u32("qwen3moe.context_length"), 512);
    assert.equal(
      g.metadata.get("qwen3moe.attention.layer_norm_rms_epsilon")!.value,
      Math.fround(1e-5),
    );
    assert.equal(g.metadata.get("tokenizer.ggml.model")!.value, "llama");

    const dims = new Map(g.tensors.map((t) => [t.name, t.dims]));
    const perLayer: Record<string, number[]> = {
      "attn_norm.weight": [64],
      "attn_q.weight": [64, 64],
      "attn_k.weight": [64, 32],
      "attn_v.weight": [64, 32],
      "attn_output.weight": [64, 64],
      "attn_q_norm.weight": [8],
      "attn_k_norm.weight": [8],
      "ffn_norm.weight": [64],
      "ffn_gate_inp.weight": [64, 8],
      "ffn_gate_exps.weight": [64, 172, 8],
      "ffn_up_exps.weight": [64, 172, 8],
      "ffn_down_exps.weight": [172, 64, 8],
    };
    const want = new Map<string, number[]>([
      ["token_embd.weight", [64, 512]],
      ["output.weight", [64, 512]],
      ["output_norm.weight", [64]],
    ]);
    for (let l = 0; l < 5; l++) {
      for (const [n, d] of Object.entries(perLayer)) want.set(`blk.${l}.${n}`, d);
    }
    assert.deepEqual(new Map([...dims].sort()), new Map([...want].sort()));
    assert.ok(g.tensors.every((t) => t.type === "F32"));

    const ck = openCheckpoint(src);
    const t = (name: string) => decodeGgmlToF32("F32", g.readTensor(name), name);
    for (const l of [0, 4]) {
      const hf = `model.layers.${l}`;
      // Qwen3 uses NEOX rope in llama.cpp: q/k stay in Hugging Face row order.
      assert.deepEqual(t(`blk.${l}.attn_q.weight`), readF32(ck, `${hf}.self_attn.q_proj.weight`));
      assert.deepEqual(t(`blk.${l}.attn_k.weight`), readF32(ck, `${hf}.self_attn.k_proj.weight`));
      assert.deepEqual(
        t(`blk.${l}.attn_q_norm.weight`),
        readF32(ck, `${hf}.self_attn.q_norm.weight`),
      );
      assert.deepEqual(
        t(`blk.${l}.attn_k_norm.weight`),
        readF32(ck, `${hf}.self_attn.k_norm.weight`),
      );
      assert.deepEqual(t(`blk.${l}.ffn_gate_inp.weight`), readF32(ck, `${hf}.mlp.gate.weight`));
      for (const m of ["gate", "up", "down"]) {
        const stacked = t(`blk.${l}.ffn_${m}_exps.weight`);
        const per = stacked.length / 8;
        for (const e of [0, 3, 7]) {
          assert.deepEqual(
            stacked.slice(e * per, (e + 1) * per),
            readF32(ck, `${hf}.mlp.experts.${e}.${m}_proj.weight`),
            `layer ${l} expert ${e} ${m}`,
          );
        }
      }
    }
    ck.close();
    g.close();
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test("a .sluice container exports the same tensors (lm_head tied, so no output.weight)", async () => {
  const dir = tempDir();
  try {
    const sluice = join(dir, "moe.sluice");
    await packCheckpoint(fixtureDir("stories260k-moe"), sluice, { progress: "off", log: () => {} });
    const out = join(dir, "from-sluice.gguf");
    exportGguf(sluice, out, { progress: "off" });
    const got = readGguf(out), want = readGguf(REF_GGUF + "stories260k-moe-f32.gguf");
    assert.equal(got.metadata.get("general.name")!.value, "moe");
    const wantNames = want.tensors.map((t) => t.name).filter((n) => n !== "output.weight");
    assert.deepEqual(got.tensors.map((t) => t.name), wantNames);
    for (const n of wantNames) assert.deepEqual(got.readTensor(n), want.readTensor(n), n);
    for (const k of ["tokenizer.ggml.tokens", "tokenizer.ggml.scores", "llama.expert_count"]) {
      assert.deepEqual(plain(got.metadata.get(k)!), plain(want.metadata.get(k)!), k);
    }
    got.close();
    want.close();
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

/** Largest error a correctly rounded encoding of `x` may have, per type. */
function bound(type: string, x: number, blockMax: number): number {
  switch (type) {
    case "F32":
      return 0;
    case "F16":
      return Math.max(Math.abs(x) * 2 ** -11, 2 ** -25);
    case "BF16":
      return Math.abs(x) * 2 ** -8;
    default: // Q8_0: half a step of d = max/127, plus the f16 rounding of d times 127.
      return (blockMax / 127) * (0.5 + 127 * 2 ** -11) + 1e-12;
  }
}

Deno.test("f16, bf16 and q8_0 exports decode to the f32 weights within their rounding", () => {
  const dir = tempDir();
  try {
    const ref = readGguf(REF_GGUF + "stories260k-moe-f32.gguf");
    for (const type of ["f16", "bf16", "q8_0"] as const) {
      const out = join(dir, `${type}.gguf`);
      const r = exportGguf(fixtureDir("stories260k-moe"), out, { type, progress: "off" });
      const g = readGguf(out);
      const ftype = g.metadata.get("general.file_type")!.value;
      assert.equal(ftype, { f16: 1, bf16: 32, q8_0: 7 }[type]);
      for (const t of g.tensors) {
        const want = decodeGgmlToF32("F32", ref.readTensor(t.name), t.name);
        if (t.dims.length === 1 || t.name.includes("ffn_gate_inp")) {
          assert.equal(t.type, "F32", `${t.name} stays f32`);
        } else if (type === "q8_0" && t.dims[0] % 32) {
          assert.equal(t.type, "F16", `${t.name}: rows of ${t.dims[0]} fall back to f16`);
          assert.equal(r.fallbacks[t.name], "F16");
        } else {
          assert.equal(t.type, type.toUpperCase(), t.name);
        }
        const got = decodeGgmlToF32(t.type, g.readTensor(t.name), t.name);
        assert.equal(got.length, want.length);
        for (let b = 0; b < want.length; b += 32) {
          let max = 0;
          for (let j = b; j < b + 32 && j < want.length; j++) {
            max = Math.max(max, Math.abs(want[j]));
          }
          for (let j = b; j < b + 32 && j < want.length; j++) {
            const err = Math.abs(got[j] - want[j]);
            if (!(err <= bound(t.type, want[j], max))) {
              assert.fail(`${type} ${t.name}[${j}]: error ${err}`);
            }
          }
        }
      }
      g.close();
    }
    ref.close();
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test("f16 encoder: every code round-trips, midpoints round to even, overflow is inf", () => {
  for (let c = 0; c < 0x10000; c++) {
    const v = f16ToF32(c);
    if (Number.isNaN(v)) {
      assert.ok(Number.isNaN(f16ToF32(f32ToF16Bits(v))));
      continue;
    }
    assert.equal(f32ToF16Bits(v), c, `code 0x${c.toString(16)}`);
  }
  const next = (x: number, dir: 1 | -1) => {
    const b = new Float32Array([x]);
    const u = new Uint32Array(b.buffer);
    u[0] += dir;
    return b[0];
  };
  for (let c = 0; c < 0x7bff; c++) {
    const lo = f16ToF32(c), hi = f16ToF32(c + 1);
    const mid = (lo + hi) / 2;
    assert.equal(Math.fround(mid), mid);
    assert.equal(f32ToF16Bits(mid), c % 2 === 0 ? c : c + 1, `tie between 0x${c.toString(16)}`);
    assert.equal(f32ToF16Bits(next(mid, 1)), c + 1);
    if (mid > 0) assert.equal(f32ToF16Bits(next(mid, -1)), c);
    assert.equal(f32ToF16Bits(-mid), 0x8000 | f32ToF16Bits(mid));
  }
  assert.equal(f32ToF16Bits(65520), 0x7c00); // halfway to 2^16 rounds to even: infinity
  assert.equal(f32ToF16Bits(65519.99), 0x7bff);
  assert.equal(f32ToF16Bits(1e10), 0x7c00);
  assert.equal(f32ToF16Bits(-Infinity), 0xfc00);
  assert.equal(f32ToF16Bits(2 ** -26), 0);
  assert.equal(f32ToF16Bits(-0), 0x8000);
});

Deno.test("bf16 encoder rounds to nearest even against the scalar decoder", () => {
  let seed = 7;
  const rand = () => (seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32;
  const f = new Float32Array(1), u = new Uint32Array(f.buffer);
  for (let n = 0; n < 20000; n++) {
    u[0] = Math.floor(rand() * 2 ** 32);
    if (Number.isNaN(f[0])) {
      assert.ok(Number.isNaN(bf16ToF32(f32ToBf16Bits(f[0]))));
      continue;
    }
    const x = f[0], c = f32ToBf16Bits(x), v = bf16ToF32(c);
    const lower = bf16ToF32(u[0] >>> 16), upper = bf16ToF32((u[0] >>> 16) + 1);
    const dl = Math.abs(x - lower), du = Math.abs(upper - x);
    if (dl < du) assert.equal(v, lower);
    else if (du < dl) assert.ok(Object.is(v, upper) || (!Number.isFinite(upper) && v === upper));
    else assert.equal(c % 2, 0, "ties go to the even code");
  }
  assert.equal(f32ToBf16Bits(1), 0x3f80);
  assert.equal(f32ToBf16Bits(-2), 0xc000);
});

Deno.test("q8_0 encoder: scale is max/127, codes are x/d rounded, zero blocks stay zero", () => {
  let seed = 11;
  const rand = () => (seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32 - 0.5;
  const x = Float32Array.from({ length: 32 * 50 }, (_, i) => rand() * (1 + (i >> 5)));
  x.fill(0, 64, 96);
  x[100] = 0.5; // a tie at x/d = 0.5 for some scale is covered by the bound below
  const enc = encodeTensor(x, "Q8_0", "test");
  assert.equal(enc.length, 50 * 34);
  const dec = decodeGgmlToF32("Q8_0", enc, "test");
  const v = new DataView(enc.buffer, enc.byteOffset);
  for (let b = 0; b < 50; b++) {
    let max = 0;
    for (let j = 0; j < 32; j++) max = Math.max(max, Math.abs(x[b * 32 + j]));
    const d = f16ToF32(v.getUint16(b * 34, true));
    assert.equal(d, f16ToF32(f32ToF16Bits(max / 127)), `block ${b} scale`);
    let sawFull = max === 0;
    for (let j = 0; j < 32; j++) {
      const q = v.getInt8(b * 34 + 2 + j);
      const ideal = max === 0 ? 0 : (x[b * 32 + j] * 127) / max;
      assert.ok(Math.abs(ideal - q) <= 0.5 + 1e-5, `block ${b}[${j}]: ${q} vs ${ideal}`);
      if (Math.abs(q) === 127) sawFull = true;
      assert.equal(dec[b * 32 + j], d * q);
    }
    assert.ok(sawFull, `block ${b}: the largest value maps to ±127`);
  }
  throwsMentioning(
    () => encodeTensor(new Float32Array(33), "Q8_0", "odd tensor"),
    "odd tensor",
    "32",
  );
});

Deno.test("writer and reader round-trip every metadata type, arrays and alignment", () => {
  const dir = tempDir();
  try {
    const path = join(dir, "t.gguf");
    const meta = new Map<string, GgufValue>([
      ["a.u8", { type: "u8", value: 255 }],
      ["a.i8", { type: "i8", value: -128 }],
      ["a.u16", { type: "u16", value: 65535 }],
      ["a.i16", { type: "i16", value: -32768 }],
      ["a.u32", { type: "u32", value: 4294967295 }],
      ["a.i32", { type: "i32", value: -2147483648 }],
      ["a.f32", { type: "f32", value: Math.fround(0.1) }],
      ["a.f64", { type: "f64", value: 0.1 }],
      ["a.u64", { type: "u64", value: 2n ** 64n - 1n }],
      ["a.i64", { type: "i64", value: -(2n ** 63n) }],
      ["a.bool", { type: "bool", value: true }],
      ["a.str", { type: "string", value: "▁héllo 🙂" }],
      ["a.arr_s", { type: "array", elem: "string", value: ["", "x", "<0x0A>"] }],
      ["a.arr_f", { type: "array", elem: "f32", value: [-0, 1.5, -1000] }],
      ["a.arr_i", { type: "array", elem: "i32", value: [3, -6] }],
      ["a.arr_b", { type: "array", elem: "bool", value: [false, true] }],
      ["a.arr_u64", { type: "array", elem: "u64", value: [1n, 2n] }],
      ["a.arr_empty", { type: "array", elem: "u8", value: [] }],
    ]);
    const data = [Float32Array.from([1, 2, 3]), Float32Array.from({ length: 64 }, (_, i) => -i)];
    const specs = [
      { name: "v", dims: [3], type: "F32" as const },
      { name: "m", dims: [32, 2], type: "Q8_0" as const },
    ];
    const size = writeGguf(
      path,
      meta,
      specs,
      (s, i) => [encodeTensor(data[i], specs[i].type, s.name)],
      {
        alignment: 64,
      },
    );
    assert.equal(Deno.statSync(path).size, size);
    const g = readGguf(path);
    assert.equal(g.alignment, 64);
    assert.deepEqual(g.metadata.get("general.alignment"), { type: "u32", value: 64 });
    for (const [k, v] of meta) assert.deepEqual(plain(g.metadata.get(k)!), plain(v), k);
    assert.deepEqual(g.tensors.map((t) => [t.name, t.dims, t.type]), [
      ["v", [3], "F32"],
      ["m", [32, 2], "Q8_0"],
    ]);
    assert.ok(g.tensors.every((t) => (t.offset - g.dataOffset) % 64 === 0 && t.offset % 64 === 0));
    assert.deepEqual(decodeGgmlToF32("F32", g.readTensor("v"), "v"), data[0]);
    const m = decodeGgmlToF32("Q8_0", g.readTensor("m"), "m");
    // Row 1 holds -32..-63: half a Q8_0 step there is 63 / 127 / 2 < 0.25.
    m.forEach((y, i) => assert.ok(Math.abs(y - data[1][i]) <= 0.25, `m[${i}]`));
    g.close();
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test("writer refuses bad input and leaves no file behind", () => {
  const dir = tempDir();
  try {
    const path = join(dir, "bad.gguf");
    const one = [{ name: "w", dims: [4], type: "F32" as const }];
    throwsMentioning(
      () => writeGguf(path, new Map(), one, () => [new Uint8Array(12)]),
      "w",
      "12",
      "16",
    );
    throwsMentioning(
      () => writeGguf(path, new Map([["k", { type: "u8", value: 256 }]]), one, () => []),
      "k",
      "u8",
    );
    throwsMentioning(
      () => writeGguf(path, new Map(), [{ name: "q", dims: [48], type: "Q8_0" }], () => []),
      "q",
      "32",
    );
    assert.deepEqual([...Deno.readDirSync(dir)], []);
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test("reader rejects a bad magic, a wrong version and a truncated file", () => {
  const dir = tempDir();
  try {
    const good = Deno.readFileSync(REF_GGUF + "stories260k-f32.gguf");
    const write = (name: string, bytes: Uint8Array) => {
      const p = join(dir, name);
      Deno.writeFileSync(p, bytes);
      return p;
    };
    const magic = good.slice(0, 4096);
    magic[0] = 0x58;
    throwsMentioning(() => readGguf(write("magic.gguf", magic)), "magic.gguf", "not a GGUF");
    const v2 = good.slice(0, 4096);
    v2[4] = 2;
    throwsMentioning(() => readGguf(write("v2.gguf", v2)), "v2.gguf", "version 2");
    throwsMentioning(() => readGguf(write("short.gguf", good.slice(0, 9000))), "short.gguf");
    throwsMentioning(
      () => readGguf(write("cut.gguf", good.slice(0, good.length - 100))),
      "cut.gguf",
      "output_norm.weight",
      "past the end",
    );
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test("exporter names the problem for bad input", () => {
  const dir = tempDir();
  try {
    const out = join(dir, "x.gguf");
    throwsMentioning(() => exportGguf(join(dir, "missing"), out), "missing", "not a directory");
    throwsMentioning(
      () => exportGguf(fixtureDir("tiny-deepseek-v3"), out, { progress: "off" }),
      "tiny-deepseek-v3",
      "deepseek_v3",
    );
    throwsMentioning(
      () => exportGguf(fixtureDir("stories260k"), out, { type: "q4_0" as "f32" }),
      "--type",
      "q4_0",
    );
    Deno.writeFileSync(out, new Uint8Array(1));
    throwsMentioning(() => exportGguf(fixtureDir("stories260k"), out), "already exists");
    const noTok = join(dir, "no-tokenizer");
    Deno.mkdirSync(noTok);
    for (const f of ["config.json", "model.safetensors"]) {
      Deno.copyFileSync(join(fixtureDir("stories260k"), f), join(noTok, f));
    }
    throwsMentioning(
      () => exportGguf(noTok, join(dir, "y.gguf"), { progress: "off" }),
      "no-tokenizer",
      "tokenizer.json",
    );
    assert.ok(!Deno.readDirSync(dir).some((e) => e.name.startsWith("y.gguf")));
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test("SPM scores follow the merge ranks, not the ids", () => {
  const dir = tempDir();
  try {
    const tj = {
      added_tokens: [{ id: 0, content: "<unk>", special: true }],
      normalizer: null,
      model: {
        type: "BPE",
        byte_fallback: true,
        unk_token: "<unk>",
        vocab: { "<unk>": 0, "<0x41>": 1, a: 2, b: 3, ab: 4, ba: 5, aba: 6 },
        merges: [["b", "a"], "a b", ["ab", "a"], ["a", "ba"]],
      },
    };
    Deno.writeTextFileSync(join(dir, "tokenizer.json"), JSON.stringify(tj));
    const v = spmVocabFromTokenizerJson(dir, 9, { bosId: null, eosId: null });
    assert.deepEqual(v.tokens, [
      "<unk>",
      "<0x41>",
      "a",
      "b",
      "ab",
      "ba",
      "aba",
      "[PAD7]",
      "[PAD8]",
    ]);
    // ba (merge 0) outranks ab (merge 1), then aba; single characters after them in id order.
    assert.deepEqual(v.scores.map((s) => Object.is(s, -0) ? 0 : s), [
      -1000,
      0,
      -3,
      -4,
      -1,
      0,
      -2,
      -1000,
      -1000,
    ]);
    assert.deepEqual(v.types, [
      TOKEN_TYPE.control,
      TOKEN_TYPE.byte,
      TOKEN_TYPE.normal,
      TOKEN_TYPE.normal,
      TOKEN_TYPE.normal,
      TOKEN_TYPE.normal,
      TOKEN_TYPE.normal,
      TOKEN_TYPE.unused,
      TOKEN_TYPE.unused,
    ]);
    assert.equal(v.unkId, 0);
    assert.equal(v.addSpacePrefix, false);
    tj.model.type = "Unigram";
    Deno.writeTextFileSync(join(dir, "tokenizer.json"), JSON.stringify(tj));
    throwsMentioning(
      () => spmVocabFromTokenizerJson(dir, 9, { bosId: null, eosId: null }),
      "tokenizer.json",
      "Unigram",
    );
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test({
  name: "mxfp4 export of gpt-oss: MXFP4 experts that decode (ggml's rule) to the shipped values",
  ignore: !hasFixture("tiny-gpt-oss"),
  fn: () => {
    const dir = tempDir();
    try {
      const out = join(dir, "oss.gguf");
      const r = exportGguf(fixtureDir("tiny-gpt-oss"), out, { type: "mxfp4", progress: "off" });
      assert.equal(r.arch, "gpt-oss");
      assert.deepEqual(r.fallbacks, {});
      const g = readGguf(out);
      const { weight } = referenceWeightsFromCheckpoint(fixtureDir("tiny-gpt-oss"));
      for (const m of ["gate", "up", "down"]) {
        const t = g.tensors.find((x) => x.name === `blk.1.ffn_${m}_exps.weight`)!;
        assert.equal(t.type, "MXFP4");
        const got = decodeGgmlToF32("MXFP4", g.readTensor(t.name), t.name);
        const per = got.length / 16;
        for (const e of [0, 9, 15]) {
          const want = weight(`experts.1.${e}.${m}`);
          assert.deepEqual(Array.from(got.subarray(e * per, (e + 1) * per)), Array.from(want), m);
        }
      }
      const q = g.tensors.find((x) => x.name === "blk.0.attn_q.weight")!;
      assert.equal(q.type, "BF16");
      assert.equal(g.metadata.get("general.file_type")!.value, 38);
      g.close();
    } finally {
      Deno.removeSync(dir, { recursive: true });
    }
  },
});

Deno.test({
  name: "a bf16 qwen35moe export keeps the DeltaNet conv, routers and shared-expert gate f32",
  ignore: !hasFixture("tiny-qwen3.5-moe"),
  fn() {
    // llama.cpp's ssm_conv asserts f32 conv weights (ggml-cpu ops.cpp): a bf16 conv aborts it.
    const dir = tempDir();
    try {
      const out = join(dir, "q35-bf16.gguf");
      exportGguf(fixtureDir("tiny-qwen3.5-moe"), out, { progress: "off", type: "bf16" });
      const g = readGguf(out);
      const types = new Map(g.tensors.map((t) => [t.name, t.type]));
      g.close();
      const kept = [...types].filter(([n]) =>
        /\.(ssm_conv1d|ffn_gate_inp|ffn_gate_inp_shexp)\.weight$/.test(n)
      );
      assert.ok(kept.some(([n]) => n.endsWith("ssm_conv1d.weight")), "no conv tensor exported");
      for (const [n, t] of kept) assert.equal(t, "F32", n);
      assert.equal(types.get("blk.0.attn_qkv.weight"), "BF16");
    } finally {
      Deno.removeSync(dir, { recursive: true });
    }
  },
});
