import assert from "node:assert/strict";
import { loadModelConfig } from "../engine/config.ts";
import { EXPERT_MATRICES, type GlobalTensor } from "../io/model_config.ts";
import { hfExpertName, hfGlobalName, hfLayerName, layerTensorsOf } from "../engine/tensor_names.ts";
import { readF32 } from "../io/checkpoint_weights.ts";
import {
  type Container,
  readExpertRecord,
  readTrunkTensor,
  verifyContainer,
} from "../io/container.ts";
import { openContainer } from "../engine/container.ts";
import { crc32 } from "../io/crc32.ts";
import { decodeRecordHeader, encodeRecordHeader, type RecordHeader } from "../io/format.ts";
import { type Checkpoint, openCheckpoint } from "../io/safetensors.ts";
import { packCheckpoint, type PackOptions } from "../tools/pack.ts";
import { inspectContainer } from "../tools/inspect.ts";
import { Progress } from "../tools/progress.ts";
import { CHECKPOINT_FIXTURES, fixtureDir, HAVE_FIXTURES } from "./fixtures.ts";

const QUIET: PackOptions = { progress: "off", log: () => {} };

function throwsMentioning(fn: () => unknown, ...parts: string[]): void {
  assert.throws(fn, (e: Error) => {
    for (const p of parts) assert.ok(e.message.includes(p), `"${e.message}" lacks "${p}"`);
    return true;
  });
}

async function rejectsMentioning(p: Promise<unknown>, ...parts: string[]): Promise<void> {
  await assert.rejects(p, (e: Error) => {
    for (const s of parts) assert.ok(e.message.includes(s), `"${e.message}" lacks "${s}"`);
    return true;
  });
}

function withTempDir(fn: (dir: string) => Promise<void>): () => Promise<void> {
  return async () => {
    const dir = Deno.makeTempDirSync();
    try {
      await fn(dir);
    } finally {
      Deno.removeSync(dir, { recursive: true });
    }
  };
}

/** Bit-by-bit CRC-32 (IEEE), the reference the table-driven one is checked against. */
function crcReference(bytes: Uint8Array): number {
  let c = 0xffffffff;
  for (const b of bytes) {
    c ^= b;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0xedb88320 : c >>> 1;
  }
  return (c ^ 0xffffffff) >>> 0;
}

function f32Bytes(x: Float32Array): Uint8Array {
  return new Uint8Array(x.buffer, x.byteOffset, x.byteLength);
}

/** Expected container bytes of a tensor: the checkpoint's bytes, or f32 for vectors/routers. */
function expectedBytes(ck: Checkpoint, name: string, asF32: boolean): Uint8Array {
  return asF32 ? f32Bytes(readF32(ck, name)) : ck.read(name);
}

/** Compares every canonical tensor of a container with the checkpoint it came from. */
function checkRoundTrip(c: Container, ck: Checkpoint, dir: string): void {
  const cfg = c.config;
  for (const g of ["embed", "final_norm", "lm_head"] as GlobalTensor[]) {
    const name = hfGlobalName(cfg, g);
    if (name === null) {
      assert.equal(c.manifest.trunk.globals.tensors[g], undefined);
      continue;
    }
    const { data } = readTrunkTensor(c, "globals", g);
    assert.deepEqual(data, expectedBytes(ck, name, g === "final_norm"), `${dir} ${g}`);
  }
  for (let l = 0; l < cfg.numLayers; l++) {
    for (const t of layerTensorsOf(cfg, l)) {
      const name = hfLayerName(cfg, l, t)!;
      const src = ck.tensors.get(name)!;
      const { entry, data, scale } = readTrunkTensor(c, l, t);
      const vector = src.shape.length === 1 || t === "router";
      assert.deepEqual(data, expectedBytes(ck, name, vector), `${dir} layer ${l} ${t}`);
      assert.equal(entry.dtype, vector ? "f32" : src.dtype.toLowerCase());
      if (src.dtype === "F8_E4M3") assert.deepEqual(scale, ck.read(name + "_scale_inv"));
    }
    const bank = c.manifest.experts[l];
    assert.equal(bank === null, cfg.layerKinds[l] === "dense");
    if (!bank) continue;
    assert.equal(bank.stride % 4096, 0);
    for (let e = 0; e < bank.count; e++) {
      const { record, header } = readExpertRecord(c, l, e);
      assert.equal(header.layer, l);
      assert.equal(header.expert, e);
      for (const m of EXPERT_MATRICES) {
        const name = hfExpertName(cfg, l, e, m);
        const at = header.matrices[m];
        assert.equal(at.offset % 64, 0);
        assert.deepEqual(record.subarray(at.offset, at.offset + at.bytes), ck.read(name), name);
        if (ck.tensors.get(name)!.dtype === "F8_E4M3") {
          const s = record.subarray(at.scaleOffset, at.scaleOffset + at.scaleBytes);
          assert.deepEqual(s, ck.read(name + "_scale_inv"), `${name} scale`);
        } else {
          assert.equal(at.scaleBytes, 0);
        }
      }
    }
  }
}

Deno.test("crc32 matches the known answer and a bitwise reference", () => {
  assert.equal(crc32(new TextEncoder().encode("123456789")), 0xcbf43926);
  assert.equal(crc32(new Uint8Array(0)), 0);
  const data = new Uint8Array(1037);
  for (let i = 0; i < data.length; i++) data[i] = (i * 7919 + 13) & 0xff;
  assert.equal(crc32(data), crcReference(data));
  assert.equal(crc32(data.subarray(501), crc32(data.subarray(0, 501))), crcReference(data));
});

Deno.test("record headers round-trip and reject corruption with the record's place", () => {
  const h: RecordHeader = {
    layer: 3,
    expert: 17,
    formatId: 4,
    payloadOffset: 128,
    payloadBytes: 6276,
    payloadCrc: 0xdeadbeef,
    matrices: {
      gate: { offset: 128, bytes: 2048, scaleOffset: 2176, scaleBytes: 4 },
      up: { offset: 2240, bytes: 2048, scaleOffset: 4288, scaleBytes: 4 },
      down: { offset: 4352, bytes: 2048, scaleOffset: 6400, scaleBytes: 4 },
    },
  };
  const bytes = encodeRecordHeader(h);
  assert.equal(bytes.length, 128);
  assert.equal(new TextDecoder().decode(bytes.subarray(0, 4)), "SLXR");
  const place = { file: "experts-L3.bin", layer: 3, expert: 17, offset: 139264 };
  assert.deepEqual(decodeRecordHeader(bytes, place, 8192), h);
  throwsMentioning(() => decodeRecordHeader(bytes, { ...place, expert: 18 }, 8192), "expert 17");
  throwsMentioning(() => decodeRecordHeader(bytes, place, 4096), "stride 4096");
  const bad = bytes.slice();
  bad[0] ^= 1;
  throwsMentioning(
    () => decodeRecordHeader(bad, place, 8192),
    "experts-L3.bin",
    "layer 3",
    "expert 17",
    "139264",
    "magic",
  );
  const flipped = bytes.slice();
  flipped[40] ^= 1;
  throwsMentioning(() => decodeRecordHeader(flipped, place, 8192), "header CRC");
  const overlap = encodeRecordHeader({
    ...h,
    matrices: { ...h.matrices, up: { ...h.matrices.up, offset: 1024 } },
  });
  throwsMentioning(() => decodeRecordHeader(overlap, place, 8192), "overlaps");
  const unaligned = encodeRecordHeader({
    ...h,
    matrices: { ...h.matrices, gate: { ...h.matrices.gate, offset: 130 } },
  });
  throwsMentioning(() => decodeRecordHeader(unaligned, place, 8192), "gate", "aligned");
});

Deno.test(
  "every fixture packs and round-trips exactly",
  withTempDir(async (tmp) => {
    for (const dir of CHECKPOINT_FIXTURES) {
      const out = `${tmp}/${dir}.sluice`;
      const res = await packCheckpoint(fixtureDir(dir), out, QUIET);
      assert.deepEqual(res.layersResumed, []);
      assert.ok(!Deno.statSync(out).isFile && !exists(`${out}.tmp`));
      const c = openContainer(out);
      assert.deepEqual(c.config, loadModelConfig(fixtureDir(dir)));
      verifyContainer(c);
      const ck = openCheckpoint(fixtureDir(dir));
      checkRoundTrip(c, ck, dir);
      ck.close();
      for (const r of [c.manifest.trunk.globals.region, ...c.manifest.trunk.layers]) {
        assert.equal(r.offset % 4096, 0);
        assert.equal(r.bytes % 4096, 0);
      }
      assert.deepEqual(c.manifest.tokenizer.files, [
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
      ]);
      assert.deepEqual(
        Deno.readFileSync(`${out}/tokenizer.json`),
        Deno.readFileSync(`${fixtureDir(dir)}/tokenizer.json`),
      );
    }
    // Parameter counts the README states, from the packed manifests.
    assert.equal(inspectContainer(`${tmp}/stories260k.sluice`).params.total, 260032);
    assert.equal(inspectContainer(`${tmp}/tiny-deepseek-v3-fp8.sluice`).params.total, 479344);
    assert.equal(inspectContainer(`${tmp}/tiny-kimi-linear.sluice`).params.total, 738592);
    assert.equal(inspectContainer(`${tmp}/tiny-glm5-next.sluice`).params.total, 802924);
    const moe64 = inspectContainer(`${tmp}/stories260k-moe64.sluice`);
    assert.equal(moe64.banks[0].recordBytes, 128 + 132096);
    assert.equal(moe64.banks[0].stride, 135168);
  }),
);

function exists(p: string): boolean {
  try {
    Deno.statSync(p);
    return true;
  } catch {
    return false;
  }
}

Deno.test(
  "--convert f32 of the FP8 fixture equals the F32 fixture",
  withTempDir(async (tmp) => {
    await packCheckpoint(fixtureDir("tiny-deepseek-v3-fp8"), `${tmp}/a.sluice`, {
      ...QUIET,
      convert: "f32",
      // Tiny chunks: one row each, so FP8 block rows are dequantised across chunk borders.
      chunkBytes: 100,
    });
    const c = openContainer(`${tmp}/a.sluice`);
    verifyContainer(c);
    const ck = openCheckpoint(fixtureDir("tiny-deepseek-v3"));
    checkRoundTrip(c, ck, "fp8 → f32");
    ck.close();
  }),
);

/** bf16 nearest-even rounding by comparing the two neighbouring bf16 values (test reference). */
function bf16Reference(x: Float32Array): Uint16Array {
  const bits = new Uint32Array(x.buffer, x.byteOffset, x.length);
  const out = new Uint16Array(x.length);
  const asF = (b: number) => new Float32Array(new Uint32Array([b >>> 0]).buffer)[0];
  for (let i = 0; i < x.length; i++) {
    const down = bits[i] & 0xffff0000;
    const up = down + 0x10000;
    const dd = Math.abs(x[i] - asF(down)), du = Math.abs(asF(up) - x[i]);
    out[i] = (dd < du || (dd === du && ((down >>> 16) & 1) === 0) ? down : up) >>> 16;
  }
  return out;
}

Deno.test(
  "--convert bf16 rounds weights to nearest-even and keeps vectors f32",
  { ignore: !HAVE_FIXTURES },
  withTempDir(async (tmp) => {
    await packCheckpoint(fixtureDir("stories260k-moe"), `${tmp}/b.sluice`, {
      ...QUIET,
      convert: "bf16",
      chunkBytes: 1000,
    });
    const c = openContainer(`${tmp}/b.sluice`);
    verifyContainer(c);
    const ck = openCheckpoint(fixtureDir("stories260k-moe"));
    const cfg = c.config;
    const wq = readTrunkTensor(c, 1, "wq");
    assert.equal(wq.entry.dtype, "bf16");
    const want = bf16Reference(readF32(ck, hfLayerName(cfg, 1, "wq")!));
    assert.deepEqual(new Uint16Array(wq.data.slice().buffer), want);
    const norm = readTrunkTensor(c, 1, "attn_norm");
    assert.deepEqual(norm.data, ck.read(hfLayerName(cfg, 1, "attn_norm")!));
    assert.equal(readTrunkTensor(c, 1, "router").entry.dtype, "f32");
    const { record, header } = readExpertRecord(c, 2, 5);
    const down = header.matrices.down;
    assert.deepEqual(
      new Uint16Array(record.slice(down.offset, down.offset + down.bytes).buffer),
      bf16Reference(readF32(ck, hfExpertName(cfg, 2, 5, "down"))),
    );
    assert.equal(c.manifest.experts[2]!.format, "bf16");
    ck.close();
  }),
);

Deno.test(
  "an interrupted pack resumes layer by layer",
  { ignore: !HAVE_FIXTURES },
  withTempDir(async (tmp) => {
    const src = fixtureDir("stories260k-moe");
    const out = `${tmp}/r.sluice`;
    await rejectsMentioning(packCheckpoint(src, out, { ...QUIET, stopAfterLayer: 2 }), "layer 2");
    assert.ok(!exists(out) && exists(`${out}.tmp/journal.json`));
    // A finished layer whose file went missing is redone; the others are kept.
    Deno.removeSync(`${out}.tmp/experts-L1.bin`);
    const res = await packCheckpoint(src, out, QUIET);
    assert.deepEqual(res.layersResumed, [0, 2]);
    assert.deepEqual(res.layersPacked, [1, 3, 4]);
    assert.ok(!exists(`${out}.tmp`));
    // The result is byte-identical to an uninterrupted pack.
    const fresh = `${tmp}/fresh.sluice`;
    await packCheckpoint(src, fresh, QUIET);
    for (
      const f of [
        "trunk.bin",
        "experts-L0.bin",
        "experts-L1.bin",
        "experts-L4.bin",
        "manifest.json",
      ]
    ) {
      assert.deepEqual(Deno.readFileSync(`${out}/${f}`), Deno.readFileSync(`${fresh}/${f}`), f);
    }
    // A partial pack made with other options is discarded, not mixed in.
    const other = `${tmp}/o.sluice`;
    await rejectsMentioning(packCheckpoint(src, other, { ...QUIET, stopAfterLayer: 0 }), "layer 0");
    const again = await packCheckpoint(src, other, { ...QUIET, convert: "bf16" });
    assert.deepEqual(again.layersResumed, []);
  }),
);

Deno.test(
  "existing output and bad inputs are errors that leave no container",
  { ignore: !HAVE_FIXTURES },
  withTempDir(async (tmp) => {
    const out = `${tmp}/x.sluice`;
    await packCheckpoint(fixtureDir("stories260k"), out, QUIET);
    await rejectsMentioning(
      packCheckpoint(fixtureDir("stories260k"), out, QUIET),
      out,
      "already exists",
      "--force",
    );
    const forced = await packCheckpoint(fixtureDir("tiny-deepseek-v3"), out, {
      ...QUIET,
      force: true,
    });
    assert.equal(openContainer(out).config.family, "deepseek_v3");
    assert.equal(forced.out, out);

    // A checkpoint copy with a broken config, then with a truncated weights file.
    const bad = `${tmp}/bad`;
    Deno.mkdirSync(bad);
    const cfg = JSON.parse(Deno.readTextFileSync(fixtureDir("stories260k/config.json")));
    delete cfg.num_hidden_layers;
    Deno.writeTextFileSync(`${bad}/config.json`, JSON.stringify(cfg));
    Deno.copyFileSync(fixtureDir("stories260k/model.safetensors"), `${bad}/model.safetensors`);
    const badOut = `${tmp}/bad.sluice`;
    await rejectsMentioning(packCheckpoint(bad, badOut, QUIET), "num_hidden_layers");
    assert.ok(!exists(badOut) && !exists(`${badOut}.tmp`));
    Deno.copyFileSync(fixtureDir("stories260k/config.json"), `${bad}/config.json`);
    Deno.truncateSync(`${bad}/model.safetensors`, 500000);
    await rejectsMentioning(packCheckpoint(bad, badOut, QUIET), "model.safetensors", "tensor");
    assert.ok(!exists(badOut) && !exists(`${badOut}.tmp`));
    // The CLI prints one line and exits 1.
    const cli = new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", new URL("../tools/pack.ts", import.meta.url).pathname, bad, badOut],
      stdout: "piped",
      stderr: "piped",
    }).outputSync();
    assert.equal(cli.code, 1);
    const err = new TextDecoder().decode(cli.stderr).trim();
    assert.equal(err.split("\n").length, 1, err);
    assert.match(err, /^pack: .*model\.safetensors/);
    assert.ok(!exists(badOut));
  }),
);

Deno.test(
  "the container reader rejects tampered manifests and data",
  { ignore: !HAVE_FIXTURES },
  withTempDir(async (tmp) => {
    const out = `${tmp}/t.sluice`;
    await packCheckpoint(fixtureDir("tiny-deepseek-v3-fp8"), out, QUIET);
    const manifestPath = `${out}/manifest.json`;
    const original = Deno.readTextFileSync(manifestPath);
    // deno-lint-ignore no-explicit-any
    const tamper = (edit: (m: Record<string, any>) => void, ...parts: string[]) => {
      const m = JSON.parse(original);
      edit(m);
      Deno.writeTextFileSync(manifestPath, JSON.stringify(m));
      throwsMentioning(() => openContainer(out), ...parts);
    };
    tamper((m) => m.version = 2, "version 2");
    tamper((m) => m.trunk.layers[1].tensors.wq_a.offset += 4, "layers[1]", "wq_a", "64-aligned");
    tamper((m) => m.trunk.layers[1].tensors.wq_a.bytes = 8, "wq_a", "needs");
    tamper((m) => m.trunk.layers[2].offset = m.trunk.layers[1].offset, "overlaps");
    tamper((m) => m.experts[1].stride = 4100, "experts[1].stride");
    tamper((m) => m.experts[2].matrices.up.scale.shape = [2, 1], "experts[2].matrices.up.scale");
    tamper((m) => m.config.numLayers = 5, "config.layerKinds", "5 entries");
    tamper((m) => delete m.trunk.layers[0].tensors.ffn_up, "layers[0].tensors", "ffn_up");
    tamper((m) => m.tokenizer.files = ["../etc/passwd"], "tokenizer.files[0]");
    Deno.writeTextFileSync(manifestPath, original);

    // A flipped payload byte in expert 5 of layer 2 is caught by the record CRC.
    const c = openContainer(out);
    const bank = c.manifest.experts[2]!;
    const f = await Deno.open(c.expertBankPath(2), { read: true, write: true });
    const pos = 5 * bank.stride + bank.matrices.up.offset + 3;
    const one = new Uint8Array(1);
    await f.seek(pos, Deno.SeekMode.Start);
    await f.read(one);
    one[0] ^= 0x10;
    await f.seek(pos, Deno.SeekMode.Start);
    await f.write(one);
    f.close();
    throwsMentioning(() => readExpertRecord(c, 2, 5), "layer 2 expert 5", "CRC");
    throwsMentioning(() => verifyContainer(c), "layer 2 expert 5");
  }),
);

Deno.test("progress reports percent, rate and ETA, as lines or a redrawn bar", () => {
  let now = 0;
  const lines: string[] = [];
  const p = new Progress({
    label: "x",
    total: 2_000_000,
    mode: "lines",
    write: (t) => lines.push(t),
    now: () => now,
  });
  now = 1000;
  p.add(1_000_000);
  assert.match(lines.at(-1)!, /^x {2}50\.0% .* 1\.0 MB\/s ETA 0:01\n$/);
  now = 1500;
  p.add(10);
  assert.equal(lines.length, 1, "no line before the next 10%");
  now = 2000;
  p.add(999_990);
  p.finish();
  assert.equal(lines.length, 2, "finish does not repeat the 100% line");
  assert.match(lines[1], /100\.0%/);
  const tty: string[] = [];
  const bar = new Progress({ label: "y", total: 100, mode: "tty", write: (t) => tty.push(t) });
  bar.add(50);
  bar.finish();
  assert.match(tty[0], /^\r\[#{14}-{14}\] y {2}50\.0%/);
  assert.ok(tty.at(-1)!.endsWith("\n"));
});

Deno.test("progress keeps a resume's head start out of the rate and the ETA", () => {
  let now = 0;
  const lines: string[] = [];
  const p = new Progress({
    label: "r",
    total: 4_000_000,
    mode: "lines",
    write: (t) => lines.push(t),
    now: () => now,
  });
  p.skip(2_000_000);
  now = 1000;
  p.add(1_000_000);
  // 1 MB in 1 s, not 3 MB/s; 1 MB left at that rate.
  assert.match(lines.at(-1)!, /^r {2}75\.0% .* 1\.0 MB\/s ETA 0:01\n$/);
});
