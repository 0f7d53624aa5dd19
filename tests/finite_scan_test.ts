/**
 * The packer's NaN / infinity scan (tools/pack/finite.ts): the wasm SIMD kernel over the staging
 * memory and the JS scan find the same first bad element as the value-by-value rule, decoded
 * independently (tests/scalar_kernels.ts, io/checkpoint_weights.ts), for every bf16, f16 and
 * E4M3 pattern at every position and byte alignment; and a pack of a bf16 checkpoint, whose
 * tensors are scanned in the staging slots, refuses a NaN or infinity naming tensor and element,
 * with the layers finished before it journaled for the resume.
 */
import assert from "node:assert/strict";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { FP8_E4M3_TABLE } from "../io/checkpoint_weights.ts";
import { packCheckpoint } from "../tools/pack.ts";
import { checkFinite, FiniteScan } from "../tools/pack/finite.ts";
import { synthCheckpoint } from "../tools/synth.ts";
import {
  createArenaMemory,
  instantiateKernels,
  KERNEL_RESERVED_BYTES,
  loadKernelModule,
} from "../wasm/mod.ts";
import { bf16ToF32, f16ToF32 } from "./scalar_kernels.ts";

const memory = createArenaMemory(4 << 20);
const scan = new FiniteScan(memory, await instantiateKernels(await loadKernelModule(), memory));

/** The element checkFinite names, or -1 when it accepts the bytes. */
function reported(bytes: Uint8Array, dtype: string, withScan: boolean): number {
  try {
    checkFinite(bytes, dtype, "t", 0, withScan ? scan : undefined);
    return -1;
  } catch (e) {
    const m = /element (\d+) is NaN or infinite/.exec((e as Error).message);
    assert.ok(m, (e as Error).message);
    return Number(m[1]);
  }
}

interface Case {
  dtype: string;
  width: 1 | 2 | 4;
  /** Every pattern to try. */
  patterns: number[];
  /** A finite background value. */
  one: number;
  finite: (p: number) => boolean;
}

const f32Bits = new DataView(new ArrayBuffer(4));
const CASES: Case[] = [
  {
    dtype: "BF16",
    width: 2,
    patterns: Array.from({ length: 1 << 16 }, (_, p) => p),
    one: 0x3f80,
    finite: (p) => Number.isFinite(bf16ToF32(p)),
  },
  {
    dtype: "F16",
    width: 2,
    patterns: Array.from({ length: 1 << 16 }, (_, p) => p),
    one: 0x3c00,
    finite: (p) => Number.isFinite(f16ToF32(p)),
  },
  {
    dtype: "F8_E4M3",
    width: 1,
    patterns: Array.from({ length: 256 }, (_, p) => p),
    one: 0x38,
    finite: (p) => !Number.isNaN(FP8_E4M3_TABLE[p]),
  },
  {
    // Every sign and exponent with the edge mantissas.
    dtype: "F32",
    width: 4,
    patterns: Array.from({ length: 512 }, (_, se) => se << 23).flatMap((b) =>
      [0, 1, 0x400000, 0x7fffff].map((m) => (b | m) >>> 0)
    ),
    one: 0x3f800000,
    finite: (p) => {
      f32Bits.setUint32(0, p, true);
      return Number.isFinite(f32Bits.getFloat32(0, true));
    },
  },
];

/** Values per case: past three 64-byte blocks of the kernel even at width 4, with a tail. */
const LEN = 203;

function put(bytes: Uint8Array, i: number, width: number, v: number): void {
  for (let b = 0; b < width; b++) bytes[i * width + b] = (v >>> (8 * b)) & 0xff;
}

for (const c of CASES) {
  Deno.test(`the ${c.dtype} scan (wasm and JS) names the first bad element at any place`, () => {
    // The staging memory above the kernels' own bytes, and a plain buffer for the JS scan.
    const inMemory = new Uint8Array(memory.buffer, KERNEL_RESERVED_BYTES, 16 + LEN * 4);
    const plain = new Uint8Array(16 + LEN * 4);
    for (const [k, p] of c.patterns.entries()) {
      // Positions and byte offsets (odd ones too) move with the pattern's index.
      const pos = (k * 7) % LEN;
      const off = (k >> 4) % 16;
      const expect = c.finite(p) ? -1 : pos;
      for (const area of [inMemory, plain]) {
        const bytes = area.subarray(off, off + LEN * c.width);
        for (let i = 0; i < LEN; i++) put(bytes, i, c.width, c.one);
        put(bytes, pos, c.width, p);
        // A NaN after it must not be the one named.
        if (pos + 5 < LEN) put(bytes, pos + 5, c.width, 0xffffffff);
        const later = pos + 5 < LEN ? pos + 5 : -1;
        const want = expect >= 0 ? expect : later;
        assert.equal(reported(bytes, c.dtype, area === inMemory), want, `pattern ${p}`);
      }
    }
  });
}

Deno.test("the scan of bytes outside its memory is the JS scan's", () => {
  const bytes = new Uint8Array(100);
  bytes[61] = 0x7f;
  bytes[60] = 0x80;
  assert.equal(scan.covers(bytes), false);
  assert.equal(reported(bytes, "BF16", true), 30);
  assert.equal(reported(bytes.subarray(1), "BF16", true), -1);
  assert.equal(reported(bytes, "I32", true), -1);
});

type Header = Record<string, { dtype: string; data_offsets: [number, number] }>;

Deno.test("pack refuses a bf16 NaN or infinity read into its staging slots, naming it", async () => {
  const tmp = Deno.makeTempDirSync({ prefix: "sluice-finite-" });
  try {
    const ckpt = await synthCheckpoint({
      arch: "qwen3_moe",
      out: join(tmp, "hf"),
      size: 4 << 20,
      overrides: { layers: 2 },
      dtype: "bf16",
      progress: "off",
      log: () => {},
    });
    const file = join(ckpt.dir, "model.safetensors");
    const clean = new Uint8Array(readFileSync(file));
    const len = Number(new DataView(clean.buffer).getBigUint64(0, true));
    const h = JSON.parse(new TextDecoder().decode(clean.subarray(8, 8 + len))) as Header;
    const poke = (name: string, element: number, bits: number) => {
      assert.equal(h[name].dtype, "BF16", name);
      const bytes = clean.slice();
      const at = 8 + len + h[name].data_offsets[0] + 2 * element;
      new DataView(bytes.buffer).setUint16(at, bits, true);
      writeFileSync(file, bytes);
    };
    const quiet = { progress: "off" as const, log: () => {} };
    const expert = "model.layers.1.mlp.experts.2.down_proj.weight";
    const trunk = "model.layers.0.self_attn.o_proj.weight";
    for (
      const [name, element, bits] of [
        [expert, 1001, 0x7fc0],
        [trunk, 77, 0xff80],
      ] as const
    ) {
      poke(name, element, bits);
      // A fresh output each time: a resume would keep the layers an earlier try finished.
      await assert.rejects(
        packCheckpoint(ckpt.dir, join(tmp, `${element}.sluice`), quiet),
        (e: Error) => {
          const want = `tensor ${name}: element ${element} is NaN or infinite`;
          assert.ok(e.message.includes(want), e.message);
          return true;
        },
      );
    }
    writeFileSync(file, clean);
    // The refused pack of layer 1 kept layer 0 journaled: the rerun resumes it, and its container
    // is a fresh pack's, file for file.
    const resumed = await packCheckpoint(ckpt.dir, join(tmp, "1001.sluice"), quiet);
    assert.deepEqual([resumed.layersResumed, resumed.layersPacked], [[0], [1]]);
    const fresh = await packCheckpoint(ckpt.dir, join(tmp, "fresh.sluice"), quiet);
    assert.deepEqual([fresh.layersResumed, fresh.layersPacked], [[], [0, 1]]);
    for (const f of Deno.readDirSync(fresh.out)) {
      assert.deepEqual(
        readFileSync(join(resumed.out, f.name)),
        readFileSync(join(fresh.out, f.name)),
        f.name,
      );
    }
  } finally {
    Deno.removeSync(tmp, { recursive: true });
  }
});
