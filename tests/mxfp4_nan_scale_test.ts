/**
 * An MXFP4 E8M0 scale byte of 0xFF is NaN in the OCP MX spec: pack refuses it, in K3's packed and
 * gpt-oss's fused experts alike, naming the file, tensor, expert and block, and leaves no
 * container behind (the partial pack stays resumable, as for any NaN weight).
 */
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { openContainer } from "../engine/container.ts";
import { verifyContainer } from "../io/container.ts";
import { packCheckpoint, type PackOptions } from "../tools/pack.ts";
import { fixtureDir, hasFixture, runSluice } from "./fixtures.ts";

const QUIET: PackOptions = { progress: "off", log: () => {} };

/** A private copy of fixture `name` in `dir`. */
function copyFixture(name: string, dir: string): string {
  Deno.mkdirSync(dir, { recursive: true });
  for (const f of Deno.readDirSync(fixtureDir(name))) {
    if (f.isFile) Deno.copyFileSync(join(fixtureDir(name), f.name), join(dir, f.name));
  }
  return dir;
}

/** Sets byte `index` of tensor `tensor` in safetensors file `path`; returns the old byte. */
function pokeByte(path: string, tensor: string, index: number, value: number): number {
  const bytes = Deno.readFileSync(path);
  const len = Number(new DataView(bytes.buffer).getBigUint64(0, true));
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + len)));
  const t = header[tensor] as { dtype: string; data_offsets: [number, number] };
  assert.equal(t.dtype, "U8", tensor);
  const at = 8 + len + t.data_offsets[0] + index;
  assert.ok(at < 8 + len + t.data_offsets[1], `${tensor} has no byte ${index}`);
  const old = bytes[at];
  bytes[at] = value;
  Deno.writeFileSync(path, bytes);
  return old;
}

/** The error pack gives for scale byte 0xFF at `row`, `block` of that expert matrix. */
function nanScaleError(file: string, tensor: string, what: string, row: number, block: number) {
  return `${file}: tensor ${tensor} (${what}): row ${row} block ${block} (columns ` +
    `${block * 32}–${
      block * 32 + 31
    }) has E8M0 scale 0xFF, which the OCP MX spec defines as NaN; ` +
    `sluice refuses weights that would make every output NaN`;
}

async function rejectsExactly(p: Promise<unknown>, message: string): Promise<void> {
  await assert.rejects(p, (e: Error) => {
    assert.equal(e.message, message);
    return true;
  });
}

function withTemp(fn: (dir: string) => Promise<void>): () => Promise<void> {
  return async () => {
    const dir = Deno.makeTempDirSync({ prefix: "sluice-nan-scale-" });
    try {
      await fn(dir);
    } finally {
      Deno.removeSync(dir, { recursive: true });
    }
  };
}

Deno.test({
  name: "pack refuses a K3 MXFP4 scale of 0xFF, copied or re-quantised, and resumes once fixed",
  ignore: !hasFixture("tiny-kimi-k3-mxfp4"),
  fn: withTemp(async (tmp) => {
    const src = copyFixture("tiny-kimi-k3-mxfp4", `${tmp}/src`);
    const shard = join(src, "model-00002-of-00002.safetensors");
    const tensor = "language_model.model.layers.7.block_sparse_moe.experts.5.w2.weight_scale";
    // w2 is [64, 64]: two scale bytes a row, so byte 7 is row 3, block 1.
    const old = pokeByte(shard, tensor, 7, 0xff);
    assert.notEqual(old, 0xff);
    const want = nanScaleError(shard, tensor, "layer 7 expert 5 down", 3, 1);
    const out = `${tmp}/k3.sluice`;
    await rejectsExactly(packCheckpoint(src, out, QUIET), want);
    assert.ok(!existsSync(out), "no container is left behind");
    assert.ok(!existsSync(`${out}.tmp/experts-L7.bin`), "layer 7's bank is not completed");
    // Decoded for re-quantisation, the same block is refused the same way.
    await rejectsExactly(
      packCheckpoint(src, `${tmp}/int8.sluice`, { ...QUIET, experts: "int8" }),
      want,
    );
    assert.ok(!existsSync(`${tmp}/int8.sluice`));
    // The command line ends on the one error line after its progress lines, no stack trace.
    const run = await runSluice(["pack", src, `${tmp}/cli.sluice`]);
    assert.equal(run.code, 1);
    assert.equal(
      run.stderr.trim().split("\n").at(-1),
      `pack: ${want} (the checkpoint itself holds these values, so a rerun fails the same ` +
        `way: fix or replace the checkpoint; partial pack kept in ${tmp}/cli.sluice.tmp for then)`,
    );
    assert.ok(!/\n\s+at /.test(run.stderr), run.stderr);
    assert.ok(!existsSync(`${tmp}/cli.sluice`));
    // Fixed, the refused pack resumes into a whole container.
    pokeByte(shard, tensor, 7, old);
    await packCheckpoint(src, out, QUIET);
    const c = openContainer(out);
    verifyContainer(c);
    assert.equal(c.manifest.experts[7]!.activations, "f32");
  }),
});

Deno.test({
  name: "pack refuses a gpt-oss fused MXFP4 scale of 0xFF, naming the expert and the matrix row",
  ignore: !hasFixture("tiny-gpt-oss"),
  fn: withTemp(async (tmp) => {
    const src = copyFixture("tiny-gpt-oss", `${tmp}/src`);
    const file = join(src, "model.safetensors");
    const tensor = "model.layers.1.mlp.experts.gate_up_proj_scales";
    // [16 experts, 128 fused rows, 2 blocks]: expert 2, fused row 5 (odd rows are up: up row 2),
    // block 1.
    pokeByte(file, tensor, (2 * 128 + 5) * 2 + 1, 0xff);
    const out = `${tmp}/oss.sluice`;
    await rejectsExactly(
      packCheckpoint(src, out, QUIET),
      nanScaleError(file, tensor, "layer 1 expert 2 up", 2, 1),
    );
    assert.ok(!existsSync(out), "no container is left behind");
  }),
});
