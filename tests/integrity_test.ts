/**
 * Integrity at run time (issue 15): with --verify, a damaged trunk region is caught as it lands
 * (pinned layers at open, ring slots on every read), with an error naming trunk.bin, the layer and
 * the offsets; an undamaged container runs the same tokens with and without the checks.
 */
import assert from "node:assert/strict";
import { Model } from "../engine/model.ts";
import { argmax } from "../engine/sampler.ts";
import { openContainer } from "../engine/container.ts";
import { budgetAboveFloor, HAVE_FIXTURES, packedFixture, tempDir } from "./fixtures.ts";

const ignore = !HAVE_FIXTURES;

/** A private copy of a container. */
function copyContainer(src: string, dst: string): string {
  Deno.mkdirSync(dst, { recursive: true });
  for (const f of Deno.readDirSync(src)) Deno.copyFileSync(`${src}/${f.name}`, `${dst}/${f.name}`);
  return dst;
}

function flipByte(path: string, pos: number): void {
  const f = Deno.openSync(path, { read: true, write: true });
  try {
    const one = new Uint8Array(1);
    f.seekSync(pos, Deno.SeekMode.Start);
    f.readSync(one);
    one[0] ^= 0x08;
    f.seekSync(pos, Deno.SeekMode.Start);
    f.writeSync(one);
  } finally {
    f.close();
  }
}

function greedy(model: Model, steps: number): number[] {
  const ids = [1, 400, 300];
  for (let pos = 0; ids.length < steps; pos++) {
    const logits = model.forward([ids[pos]], pos);
    if (pos >= 2) ids.push(argmax(logits));
  }
  return ids;
}

/** Above the floor by this much, a budget pins no more than some layers; the rest stream. */
const RING_OVER_FLOOR = 0.05 * 2 ** 20;

Deno.test({
  name: "--verify catches a damaged trunk region in a pinned layer and in a ring slot",
  ignore,
  fn: async () => {
    const clean = await packedFixture("stories260k-moe");
    const dir = copyContainer(clean, `${tempDir()}/trunk-damage.sluice`);
    const c = openContainer(dir);
    const run = c.manifest.trunk.layers[3];
    flipByte(c.trunkPath, run.offset + 100);
    const quiet = { quiet: true };
    // All pinned: caught while opening.
    await assert.rejects(Model.open(dir, { ...quiet, verify: true }), (e: Error) => {
      assert.match(e.message, /trunk\.bin: layer 3 run \[\d+, \d+\) CRC mismatch/);
      return true;
    });
    // Streaming through the ring: caught when layer 3 lands, not before.
    const budget = await budgetAboveFloor(dir, RING_OVER_FLOOR);
    const m = await Model.open(dir, { ...quiet, verify: true, budget });
    try {
      assert.ok(m.plan.pinned <= 3, `pinned ${m.plan.pinned}: layer 3 must stream`);
      assert.throws(() => m.forward([1], 0), /trunk\.bin: layer 3 run .* CRC mismatch/);
    } finally {
      m.close();
    }
    // The globals region too.
    const dir2 = copyContainer(clean, `${tempDir()}/globals-damage.sluice`);
    flipByte(`${dir2}/trunk.bin`, 10);
    await assert.rejects(Model.open(dir2, { ...quiet, verify: true }), /globals region .* CRC/);
  },
});

Deno.test({
  name: "verified and unverified runs of an intact container give the same tokens",
  ignore,
  fn: async () => {
    const dir = await packedFixture("stories260k-moe");
    const out: number[][] = [];
    const budget = await budgetAboveFloor(dir, RING_OVER_FLOOR);
    for (const verify of [false, true]) {
      const m = await Model.open(dir, { quiet: true, verify, budget });
      try {
        out.push(greedy(m, 12));
      } finally {
        m.close();
      }
    }
    assert.deepEqual(out[1], out[0]);
  },
});

Deno.test({
  name:
    "sampled record CRCs: rate 1 catches a damaged payload like --verify, rate 0 is header-only",
  ignore,
  fn: async () => {
    const clean = await packedFixture("stories260k-moe");
    const dir = copyContainer(clean, `${tempDir()}/expert-damage.sluice`);
    const c = openContainer(dir);
    const bank = c.manifest.experts[2]!;
    for (let e = 0; e < bank.count; e++) {
      flipByte(c.expertBankPath(2), e * bank.stride + bank.matrices.gate.offset + 200);
    }
    const run = async (crcSample: number) => {
      const m = await Model.open(dir, { quiet: true, crcSample });
      try {
        greedy(m, 6);
      } finally {
        m.close();
      }
    };
    await assert.rejects(run(1), /layer 2: checksum mismatch \(.*experts-L2\.bin offset \d+\)/);
    await run(0);
    await assert.rejects(run(1.5), /--crc-sample must be in 0\.\.1/);
  },
});
