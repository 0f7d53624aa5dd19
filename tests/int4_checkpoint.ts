/**
 * A synthetic Kimi-K2-Thinking-style INT4 checkpoint (compressed-tensors "pack-quantized" expert
 * triples), written from the stories260k-moe fixture for the pack and pull tests.
 *
 * @module
 */
import { copyFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { openCheckpoint } from "../io/safetensors.ts";

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
 * `moe` (the stories260k-moe fixture) with its routed experts replaced by Kimi-K2-Thinking-style INT4 triples. down
 * has 172 columns, which group-32 INT4 cannot hold, so down stays F32 (as a mixed checkpoint).
 */
export function writeInt4Checkpoint(
  dir: string,
  moe: string,
): Map<string, { packed: Uint8Array; scale: Uint8Array }> {
  Deno.mkdirSync(dir, { recursive: true });
  for (const f of ["config.json", "tokenizer.json", "tokenizer_config.json"]) {
    copyFileSync(join(moe, f), join(dir, f));
  }
  const ckpt = openCheckpoint(moe);
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
