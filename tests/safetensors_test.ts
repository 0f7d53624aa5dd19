import assert from "node:assert/strict";
import { openCheckpoint } from "../io/safetensors.ts";
import { decodeDtypeToF32, f16ToF32, FP8_E4M3_TABLE, readF32 } from "../io/checkpoint_weights.ts";
import { fixtureDir } from "./fixtures.ts";

/** Writes a safetensors file from explicit header entries and a data blob (test-side writer). */
function writeSafetensors(path: string, header: Record<string, unknown>, data: Uint8Array): void {
  let json = JSON.stringify(header);
  while ((8 + json.length) % 8) json += " ";
  const hdr = new TextEncoder().encode(json);
  const out = new Uint8Array(8 + hdr.length + data.length);
  new DataView(out.buffer).setBigUint64(0, BigInt(hdr.length), true);
  out.set(hdr, 8);
  out.set(data, 8 + hdr.length);
  Deno.writeFileSync(path, out);
}

function f32Bytes(values: number[]): Uint8Array {
  return new Uint8Array(new Float32Array(values).buffer);
}

function throwsMentioning(fn: () => unknown, ...parts: string[]): void {
  assert.throws(fn, (e: Error) => {
    for (const p of parts) {
      assert.ok(e.message.includes(p), `message "${e.message}" should mention "${p}"`);
    }
    return true;
  });
}

Deno.test("fixtures open with the tensor counts the README states", () => {
  const counts: Record<string, number> = {
    "stories260k": 48,
    "stories260k-moe": 158,
    "stories260k-moe64": 998,
    "tiny-deepseek-v3": 201,
    "tiny-deepseek-v3-fp8": 201 + 176,
  };
  for (const [dir, n] of Object.entries(counts)) {
    const ck = openCheckpoint(fixtureDir(dir));
    assert.equal(ck.tensors.size, n, dir);
    ck.close();
  }
});

Deno.test("the embedding equals llama2.c's tok_embeddings in stories260K.bin", () => {
  const ck = openCheckpoint(fixtureDir("stories260k"));
  const emb = readF32(ck, "model.embed_tokens.weight");
  const bin = Deno.readFileSync(fixtureDir("stories260k/stories260K.bin"));
  // 7 int32 header fields, then tok_embeddings [512, 64] float32.
  const ref = new Float32Array(bin.buffer.slice(28, 28 + 512 * 64 * 4));
  assert.deepEqual(emb, ref);
  assert.equal(ck.tensors.get("model.norm.weight")!.bytes, 64 * 4);
  ck.close();
});

Deno.test("FP8 weights with block scales equal the F32 fixture bit for bit", () => {
  const f32 = openCheckpoint(fixtureDir("tiny-deepseek-v3"));
  const fp8 = openCheckpoint(fixtureDir("tiny-deepseek-v3-fp8"));
  let fp8Count = 0;
  for (const [name, info] of f32.tensors) {
    const q = fp8.tensors.get(name)!;
    if (q.dtype === "F8_E4M3") fp8Count++;
    const a = new Uint32Array(readF32(f32, name).buffer);
    const b = new Uint32Array(readF32(fp8, name).buffer);
    assert.equal(a.length, info.bytes / 4, name);
    assert.deepEqual(b, a, name);
  }
  assert.equal(fp8Count, 176);
  // A weight with 2 row blocks uses both scales.
  assert.deepEqual(fp8.tensors.get("model.layers.0.mlp.gate_proj.weight_scale_inv")!.shape, [2, 1]);
  f32.close();
  fp8.close();
});

Deno.test("dtype decoders match known encodings", () => {
  assert.equal(f16ToF32(0x3c00), 1);
  assert.equal(f16ToF32(0xc000), -2);
  assert.equal(f16ToF32(0x7bff), 65504);
  assert.equal(f16ToF32(0x0001), 2 ** -24);
  assert.equal(f16ToF32(0x7c00), Infinity);
  assert.equal(FP8_E4M3_TABLE[0x38], 1);
  assert.equal(FP8_E4M3_TABLE[0x7e], 448);
  assert.equal(FP8_E4M3_TABLE[0xfe], -448);
  assert.equal(FP8_E4M3_TABLE[0x08], 2 ** -6);
  assert.equal(FP8_E4M3_TABLE[0x01], 2 ** -9);
  assert.ok(Number.isNaN(FP8_E4M3_TABLE[0x7f]) && Number.isNaN(FP8_E4M3_TABLE[0xff]));
  // The full table agrees with an independent formula on every finite code.
  for (let c = 0; c < 256; c++) {
    if ((c & 0x7f) === 0x7f) continue;
    const e = (c >> 3) & 15, m = c & 7;
    const v = (e ? 2 ** (e - 7) * (8 + m) / 8 : 2 ** -6 * m / 8) * (c & 0x80 ? -1 : 1);
    assert.equal(FP8_E4M3_TABLE[c], v, `code ${c}`);
  }
  const bf = decodeDtypeToF32("BF16", new Uint8Array([0x80, 0x3f, 0x20, 0xc1]));
  assert.deepEqual([...bf], [1, -10]);
  const h = decodeDtypeToF32("F16", new Uint8Array([0x00, 0x3c, 0x00, 0xc0]));
  assert.deepEqual([...h], [1, -2]);
  // Unaligned F32 input still decodes.
  const raw = new Uint8Array(9);
  raw.set(f32Bytes([1.5, -3]), 1);
  assert.deepEqual([...decodeDtypeToF32("F32", raw.subarray(1))], [1.5, -3]);
  throwsMentioning(() => decodeDtypeToF32("I32", new Uint8Array(4), "t"), "I32", "t");
});

Deno.test("several files without an index, unsorted offsets, zero-size tensors", () => {
  const dir = Deno.makeTempDirSync();
  try {
    // b's data lies before a's: offsets need not follow header order.
    writeSafetensors(`${dir}/part-b.safetensors`, {
      a: { dtype: "F32", shape: [2], data_offsets: [8, 16] },
      b: { dtype: "F32", shape: [2], data_offsets: [0, 8] },
      empty: { dtype: "BF16", shape: [0, 4], data_offsets: [16, 16] },
    }, f32Bytes([3, 4, 1, 2]));
    writeSafetensors(`${dir}/part-a.safetensors`, {
      __metadata__: { format: "pt" },
      c: { dtype: "F32", shape: [1, 1], data_offsets: [0, 4] },
    }, f32Bytes([7]));
    const ck = openCheckpoint(dir);
    assert.deepEqual([...readF32(ck, "a")], [1, 2]);
    assert.deepEqual([...readF32(ck, "b")], [3, 4]);
    assert.deepEqual([...readF32(ck, "c")], [7]);
    assert.equal(ck.read("empty").length, 0);
    const dst = new Uint8Array(8);
    ck.readInto("b", dst);
    assert.deepEqual(dst, f32Bytes([3, 4]));
    throwsMentioning(() => ck.readInto("b", new Uint8Array(4)), "b", "8");
    throwsMentioning(() => ck.read("nope"), "nope");
    ck.close();
    // The same tensor in two files is an error naming both.
    writeSafetensors(`${dir}/part-c.safetensors`, {
      c: { dtype: "F32", shape: [1], data_offsets: [0, 4] },
    }, f32Bytes([7]));
    throwsMentioning(() => openCheckpoint(dir), "part-a", "part-c", "tensor c");
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test("bad headers are errors naming the file and the tensor", () => {
  const dir = Deno.makeTempDirSync();
  const p = `${dir}/model.safetensors`;
  const data = f32Bytes([1, 2, 3, 4]);
  const cases: [Record<string, unknown>, string[]][] = [
    [{ w: { dtype: "F32", shape: [4], data_offsets: [0, 20] } }, ["w", "data area"]],
    [{ w: { dtype: "F32", shape: [2], data_offsets: [8, 4] } }, ["w", "data area"]],
    [{
      w: { dtype: "F32", shape: [2], data_offsets: [0, 8] },
      v: { dtype: "F32", shape: [2], data_offsets: [4, 12] },
    }, ["overlaps", "w", "v"]],
    [{ w: { dtype: "F33", shape: [4], data_offsets: [0, 16] } }, ["w", "dtype", "F33"]],
    [{ w: { dtype: "F32", shape: [3], data_offsets: [0, 16] } }, ["w", "12", "16"]],
    [{ w: { dtype: "F32", shape: [-4], data_offsets: [0, 16] } }, ["w", "shape"]],
    [{ w: { dtype: "F32", shape: [2.5], data_offsets: [0, 16] } }, ["w", "shape"]],
    [{ w: { dtype: "F32", shape: [4] } }, ["w", "data_offsets"]],
    [{ w: "F32" }, ["w", "not an object"]],
  ];
  try {
    for (const [header, parts] of cases) {
      writeSafetensors(p, header, data);
      throwsMentioning(() => openCheckpoint(dir), p, ...parts);
    }
    // Header that is a JSON array, or not JSON at all.
    const arr = new TextEncoder().encode("[1,2,3] ");
    const buf = new Uint8Array(8 + arr.length);
    new DataView(buf.buffer).setBigUint64(0, BigInt(arr.length), true);
    buf.set(arr, 8);
    Deno.writeFileSync(p, buf);
    throwsMentioning(() => openCheckpoint(dir), p, "JSON object");
    buf.set(new TextEncoder().encode("{bad jso"), 8);
    Deno.writeFileSync(p, buf);
    throwsMentioning(() => openCheckpoint(dir), p, "JSON");
    // Header length beyond the file, and a huge one.
    new DataView(buf.buffer).setBigUint64(0, 1000n, true);
    Deno.writeFileSync(p, buf);
    throwsMentioning(() => openCheckpoint(dir), p, "header length");
    new DataView(buf.buffer).setBigUint64(0, 2n ** 62n, true);
    Deno.writeFileSync(p, buf);
    throwsMentioning(() => openCheckpoint(dir), p, "header length");
    Deno.writeFileSync(p, new Uint8Array(5));
    throwsMentioning(() => openCheckpoint(dir), p, "too short");
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test("a truncated fixture names the file and the first tensor past the end", () => {
  const dir = Deno.makeTempDirSync();
  try {
    const src = Deno.readFileSync(fixtureDir("stories260k/model.safetensors"));
    Deno.writeFileSync(`${dir}/model.safetensors`, src.subarray(0, src.length - 1000));
    // The last tensor in data order lies past the shortened data area.
    throwsMentioning(
      () => openCheckpoint(dir),
      `${dir}/model.safetensors`,
      "tensor model.",
      "data area",
    );
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test("sharded checkpoints: missing or inconsistent shards are errors naming them", () => {
  const src = fixtureDir("tiny-deepseek-v3-fp8/");
  const dir = Deno.makeTempDirSync();
  try {
    Deno.copyFileSync(src + "model.safetensors.index.json", `${dir}/model.safetensors.index.json`);
    Deno.copyFileSync(
      src + "model-00001-of-00002.safetensors",
      `${dir}/model-00001-of-00002.safetensors`,
    );
    throwsMentioning(
      () => openCheckpoint(dir),
      "model-00002-of-00002.safetensors",
      "does not exist",
    );
    // An index naming a tensor its shard lacks.
    Deno.copyFileSync(
      src + "model-00002-of-00002.safetensors",
      `${dir}/model-00002-of-00002.safetensors`,
    );
    const index = JSON.parse(Deno.readTextFileSync(src + "model.safetensors.index.json"));
    index.weight_map["model.ghost.weight"] = "model-00001-of-00002.safetensors";
    Deno.writeTextFileSync(`${dir}/model.safetensors.index.json`, JSON.stringify(index));
    throwsMentioning(() => openCheckpoint(dir), "model.ghost.weight", "model-00001-of-00002");
    index.weight_map["model.ghost.weight"] = "../escape.safetensors";
    Deno.writeTextFileSync(`${dir}/model.safetensors.index.json`, JSON.stringify(index));
    throwsMentioning(() => openCheckpoint(dir), "model.ghost.weight", "invalid shard name");
    // A weight without its scale cannot be dequantised.
    delete index.weight_map["model.ghost.weight"];
    Deno.writeTextFileSync(`${dir}/model.safetensors.index.json`, JSON.stringify(index));
    const ck = openCheckpoint(dir);
    ck.tensors.delete("model.layers.1.mlp.experts.3.up_proj.weight_scale_inv");
    throwsMentioning(
      () => readF32(ck, "model.layers.1.mlp.experts.3.up_proj.weight"),
      "model.layers.1.mlp.experts.3.up_proj.weight_scale_inv",
    );
    ck.close();
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});
