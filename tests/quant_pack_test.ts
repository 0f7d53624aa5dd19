/**
 * Packing with compact formats: for each `--experts` format (and `--trunk int8`) the container's
 * matrices decode to exactly what the format's quantiser makes of the checkpoint's floats, with
 * the fallback and codebooks the manifest describes; a synthetic Kimi-style INT4
 * (compressed-tensors pack-quantized) checkpoint round-trips bit for bit; the reader rejects
 * malformed compact entries.
 */
import assert from "node:assert/strict";
import { copyFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { EXPERT_MATRICES, type ExpertMatrix } from "../io/model_config.ts";
import { dequantizeFp8b128, quantizeFp8b128 } from "../engine/quant/fp8.ts";
import { dequantizeInt4g32, quantizeInt4g32 } from "../engine/quant/int4.ts";
import { dequantizeInt8Row, quantizeInt8Row, relativeError } from "../engine/quant/int8.ts";
import { dequantizeMxfp4, quantizeMxfp4 } from "../engine/quant/mxfp4.ts";
import { dequantizeVq3r, encodeVq3r, VQ_DIM, VQ_ENTRIES, VQ_STAGES } from "../engine/quant/vq3r.ts";
import { containerExpertF32, containerTrunkF32 } from "../engine/float_weights.ts";
import { hfExpertName, hfLayerName } from "../engine/tensor_names.ts";
import { readF32 } from "../io/checkpoint_weights.ts";
import { readCodebooks, readExpertRecord, verifyContainer } from "../io/container.ts";
import { openContainer, parseManifest } from "../engine/container.ts";
import { openCheckpoint } from "../io/safetensors.ts";
import { type ExpertsOption, packCheckpoint } from "../tools/pack.ts";
import { fixtureDir, tempDir } from "./fixtures.ts";

const MOE = fixtureDir("stories260k-moe");
const VQ = { sampleSize: 4096, iterations: 3 };

const packs = new Map<string, Promise<{ out: string; lines: string[] }>>();

/** Packs `src` into a temporary container `name` once per process; returns it and its log. */
function pack(
  name: string,
  src: string,
  opts: { experts?: ExpertsOption; trunk?: "int8" },
): Promise<{ out: string; lines: string[] }> {
  let p = packs.get(name);
  if (!p) {
    const out = join(tempDir(), `${name}.sluice`);
    const lines: string[] = [];
    p = packCheckpoint(src, out, {
      ...opts,
      vq3r: VQ,
      force: true,
      progress: "off",
      log: (l) => lines.push(l),
    }).then(() => ({ out, lines }));
    packs.set(name, p);
  }
  return p;
}

/** The float32 array equality that treats -0 and 0 alike (decoded zeros may carry a sign). */
function sameValues(a: Float32Array, b: Float32Array, what: string): void {
  assert.equal(a.length, b.length, what);
  for (let i = 0; i < a.length; i++) {
    if (a[i] !== b[i]) assert.fail(`${what}: element ${i} is ${a[i]}, expected ${b[i]}`);
  }
}

/** [3][8][256] kernel-layout codebooks back to the quantiser's [3][256][8]. */
function trainingLayout(kernel: Float32Array): Float32Array {
  const out = new Float32Array(kernel.length);
  for (let s = 0; s < VQ_STAGES; s++) {
    for (let e = 0; e < VQ_ENTRIES; e++) {
      for (let d = 0; d < VQ_DIM; d++) {
        out[(s * VQ_ENTRIES + e) * VQ_DIM + d] = kernel[(s * VQ_DIM + d) * VQ_ENTRIES + e];
      }
    }
  }
  return out;
}

const ROUND_TRIP: Record<string, (w: Float32Array, r: number, c: number) => Float32Array> = {
  mxfp4: (w, r, c) => dequantizeMxfp4(quantizeMxfp4(w, r, c)),
  int4: (w, r, c) => dequantizeInt4g32(quantizeInt4g32(w, r, c)),
  int8: (w, r, c) => dequantizeInt8Row(quantizeInt8Row(w, r, c)),
  fp8: (w, r, c) => dequantizeFp8b128(quantizeFp8b128(w, r, c)),
};
/** Loose upper bounds of the relative weight error, from the formats' resolutions. */
const ERROR_BOUND: Record<string, number> = {
  mxfp4: 0.2,
  int4: 0.2,
  int8: 0.02,
  fp8: 0.05,
  vq3r: 0.3,
};

for (const f of ["mxfp4", "int4", "int8", "fp8", "vq3r"] as ExpertsOption[]) {
  Deno.test(`--experts ${f}: experts decode to the quantiser's values of the checkpoint`, async () => {
    const { out, lines } = await pack(`moe-${f}`, MOE, { experts: f });
    const c = openContainer(out);
    verifyContainer(c);
    const ckpt = openCheckpoint(MOE);
    try {
      const cfg = c.config;
      for (const l of [0, 4]) {
        const bank = c.manifest.experts[l]!;
        for (const m of EXPERT_MATRICES) {
          const entry = bank.matrices[m];
          const [rows, cols] = entry.shape;
          const fellBack = (f === "mxfp4" || f === "int4") && cols % 32 !== 0;
          assert.equal(bank.fallback?.[m] !== undefined, fellBack, `layer ${l} ${m} fallback`);
          if (fellBack) {
            assert.equal(entry.dtype, "f32");
            assert.ok(lines.some((s) => s.includes(`expert ${m} matrices stay f32`)), lines.join());
          }
          const books = entry.dtype === "vq3r" ? trainingLayout(readCodebooks(c, l, m)) : undefined;
          for (const e of [0, 5]) {
            const w = readF32(ckpt, hfExpertName(cfg, l, e, m));
            const got = containerExpertF32(c, l, e, m);
            const want = fellBack
              ? w
              : books
              ? dequantizeVq3r(encodeVq3r({ data: w, rows, cols }, books), books)
              : ROUND_TRIP[f](w, rows, cols);
            sameValues(got, want, `${f} layer ${l} expert ${e} ${m}`);
            if (!fellBack) {
              const err = relativeError(w, got);
              assert.ok(err > 0 && err < ERROR_BOUND[f], `${f} ${m}: error ${err}`);
            }
          }
        }
      }
    } finally {
      ckpt.close();
    }
  });
}

Deno.test("--experts vq3r: codebooks.bin holds one 4 KiB-aligned set per layer and kind", async () => {
  const { out, lines } = await pack("moe-vq3r", MOE, { experts: "vq3r" });
  const c = openContainer(out);
  const offsets = c.manifest.experts.flatMap((b) =>
    EXPERT_MATRICES.map((m) => b!.codebooks![m]!.offset)
  );
  assert.equal(new Set(offsets).size, 15);
  assert.ok(offsets.every((o) => o % 4096 === 0));
  assert.equal(c.manifest.codebooks?.bytes, 15 * 24576);
  const down = c.manifest.experts[0]!.matrices.down;
  assert.equal(down.paddedCols, 176); // 172 columns, zero-padded to a multiple of 8
  assert.equal(lines.filter((l) => l.includes("VQ3R codebooks")).length, 15);
});

Deno.test("--trunk int8 quantises attention weights per row, keeps norms and routers", async () => {
  const { out } = await pack("moe-trunk-int8", MOE, { trunk: "int8" });
  const c = openContainer(out);
  const ckpt = openCheckpoint(MOE);
  try {
    const run = c.manifest.trunk.layers[2].tensors;
    assert.equal(run.wq.dtype, "int8row");
    assert.equal(run.router.dtype, "f32");
    assert.equal(run.attn_norm.dtype, "f32");
    assert.equal(c.manifest.trunk.globals.tensors.embed!.dtype, "f32");
    assert.equal(c.manifest.pack?.trunk, "int8row");
    const w = readF32(ckpt, hfLayerName(c.config, 2, "wo")!);
    sameValues(containerTrunkF32(c, 2, "wo"), ROUND_TRIP.int8(w, 64, 64), "layer 2 wo");
  } finally {
    ckpt.close();
  }
});

/** Writes a safetensors file of raw tensors. */
function writeSafetensors(
  path: string,
  tensors: { name: string; dtype: string; shape: number[]; data: Uint8Array }[],
): void {
  const header: Record<string, unknown> = {};
  let at = 0;
  for (const t of tensors) {
    header[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [at, at + t.data.length] };
    at += t.data.length;
  }
  let json = JSON.stringify(header);
  json += " ".repeat((8 - (json.length % 8)) % 8);
  const out = new Uint8Array(8 + json.length + at);
  new DataView(out.buffer).setBigUint64(0, BigInt(json.length), true);
  out.set(new TextEncoder().encode(json), 8);
  let p = 8 + json.length;
  for (const t of tensors) {
    out.set(t.data, p);
    p += t.data.length;
  }
  writeFileSync(path, out);
}

/** Deterministic pseudo-random bytes. */
function randomBytes(n: number, seed: number): Uint8Array {
  const out = new Uint8Array(n);
  let s = seed >>> 0;
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    out[i] = s >>> 24;
  }
  return out;
}

/**
 * stories260k-moe with its routed experts replaced by Kimi-K2-Thinking-style INT4 triples. down
 * has 172 columns, which group-32 INT4 cannot hold, so down stays F32 (as a mixed checkpoint).
 */
function writeInt4Checkpoint(dir: string): Map<string, { packed: Uint8Array; scale: Uint8Array }> {
  Deno.mkdirSync(dir, { recursive: true });
  for (const f of ["config.json", "tokenizer.json", "tokenizer_config.json"]) {
    copyFileSync(join(MOE, f), join(dir, f));
  }
  const ckpt = openCheckpoint(MOE);
  const made = new Map<string, { packed: Uint8Array; scale: Uint8Array }>();
  try {
    const tensors = [];
    let seed = 1;
    for (const [name, t] of ckpt.tensors) {
      const isUpGate = /experts\.\d+\.w[13]\.weight$/.test(name);
      if (!isUpGate) {
        tensors.push({ name, dtype: t.dtype, shape: t.shape, data: ckpt.read(name) });
        continue;
      }
      const [rows, cols] = t.shape;
      const packed = randomBytes((rows * cols) / 2, seed++);
      // bf16 scales of moderate positive magnitude: exponent byte 0x3b..0x3c, random mantissa.
      const scale = randomBytes((rows * cols) / 32 * 2, seed++);
      for (let i = 1; i < scale.length; i += 2) scale[i] = 0x3b + (scale[i] & 1);
      const base = name.slice(0, -"weight".length);
      tensors.push(
        { name: `${base}weight_packed`, dtype: "I32", shape: [rows, cols / 8], data: packed },
        { name: `${base}weight_scale`, dtype: "BF16", shape: [rows, cols / 32], data: scale },
        {
          name: `${base}weight_shape`,
          dtype: "I32",
          shape: [2],
          data: new Uint8Array(new Int32Array([rows, cols]).buffer),
        },
      );
      made.set(name, { packed, scale });
    }
    tensors.sort((a, b) => (a.name < b.name ? -1 : 1));
    writeSafetensors(join(dir, "model.safetensors"), tensors);
  } finally {
    ckpt.close();
  }
  return made;
}

Deno.test("Kimi-style INT4 experts pack as int4g32 bit for bit, and convert to mxfp4", async () => {
  const dir = join(tempDir(), "int4-ckpt");
  const made = writeInt4Checkpoint(dir);
  const { out, lines } = await pack("int4-kept", dir, {});
  const c = openContainer(out);
  verifyContainer(c);
  const cfg = c.config;
  for (const l of [0, 3]) {
    const bank = c.manifest.experts[l]!;
    assert.equal(bank.format, "int4g32");
    assert.equal(bank.matrices.down.dtype, "f32");
    for (const e of [0, 7]) {
      const { record } = readExpertRecord(c, l, e);
      for (const m of ["gate", "up"] as ExpertMatrix[]) {
        const src = made.get(hfExpertName(cfg, l, e, m))!;
        const entry = bank.matrices[m];
        assert.deepEqual(record.subarray(entry.offset, entry.offset + entry.bytes), src.packed);
        const s = entry.scale!;
        assert.deepEqual(record.subarray(s.offset, s.offset + s.bytes), src.scale);
        // Element 8k+i sits in bits 4i.. of word k as q + 8; the scale is the row's group's bf16.
        const got = containerExpertF32(c, l, e, m);
        const words = new Int32Array(src.packed.slice().buffer);
        const scales = new Uint16Array(src.scale.slice().buffer);
        const [, cols] = entry.shape;
        for (const i of [0, 1, 7, 8, 33, got.length - 1]) {
          const q = ((words[i >> 3] >>> (4 * (i % 8))) & 15) - 8;
          const r = Math.floor(i / cols), g = Math.floor((i % cols) / 32);
          const sc =
            new Float32Array(new Uint32Array([scales[r * (cols / 32) + g] << 16]).buffer)[0];
          assert.equal(got[i], q * sc, `layer ${l} expert ${e} ${m} element ${i}`);
        }
      }
    }
  }
  assert.ok(
    lines.some((s) => s.includes("down matrices stay f32") && s.includes("ships it as F32")),
    lines.join("\n"),
  );
  assert.equal(c.manifest.experts[0]!.fallback?.gate, undefined);

  const { out: mx } = await pack("int4-to-mxfp4", dir, { experts: "mxfp4" });
  const cm = openContainer(mx);
  const w = containerExpertF32(c, 1, 2, "gate");
  const [rows, cols] = c.manifest.experts[1]!.matrices.gate.shape;
  sameValues(containerExpertF32(cm, 1, 2, "gate"), ROUND_TRIP.mxfp4(w, rows, cols), "mxfp4 gate");
});

Deno.test("the reader rejects malformed compact entries, naming the field", async () => {
  const { out } = await pack("moe-vq3r", MOE, { experts: "vq3r" });
  const raw = JSON.parse(Deno.readTextFileSync(join(out, "manifest.json")));
  const mutate = (f: (m: typeof raw) => void) => {
    const m = structuredClone(raw);
    f(m);
    return () => parseManifest(m, out);
  };
  assert.throws(
    mutate((m) => delete m.experts[1].matrices.down.paddedCols),
    /experts\[1\]\.matrices\.down\.paddedCols/,
  );
  assert.throws(
    mutate((m) => m.experts[1].matrices.gate.scale.shape = [3]),
    /experts\[1\]\.matrices\.gate\.scale/,
  );
  assert.throws(
    mutate((m) => m.experts[2].codebooks.up.offset = 100),
    /experts\[2\]\.codebooks\.up/,
  );
  assert.throws(
    mutate((m) => m.experts[0].fallback = { down: "why not" }),
    /experts\[0\]\.matrices\.down/,
  );
  assert.throws(mutate((m) => m.codebooks.bytes = 4096), /codebooks\.bytes/);
});
