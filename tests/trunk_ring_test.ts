/**
 * The trunk ring on its own: over several passes through the layers in the forward pass's cyclic
 * order, every acquired layer holds its run's bytes from trunk.bin, whatever the pinned prefix,
 * the number of slots and the read-ahead; pinned layers are hits and the rest are reads, so the
 * hit rate is pinned / layers by construction; the read-ahead count is of visits it served.
 */
import assert from "node:assert/strict";
import { Arena } from "../engine/arena.ts";
import { TrunkRing } from "../engine/stream/trunk_ring.ts";
import type { LayerRun } from "../io/manifest_schema.ts";
import { openReader } from "../io/reader.ts";
import { tempDir } from "./fixtures.ts";

/** Layer runs of different sizes (multiples of 4 KiB), each one f32 tensor filling its run. */
const SIZES = [3, 1, 4, 1, 5].map((n) => n * 4096);

function trunkFile(): { path: string; runs: LayerRun[]; bytes: Uint8Array } {
  const bytes = new Uint8Array(SIZES.reduce((a, b) => a + b, 0));
  for (let i = 0; i < bytes.length; i++) bytes[i] = (i * 2654435761) >>> 24;
  let offset = 0;
  const runs = SIZES.map((size) => {
    const run: LayerRun = {
      offset,
      bytes: size,
      crc32: 0,
      tensors: { attn_norm: { dtype: "f32", shape: [size / 4], offset: 0, bytes: size } },
    };
    offset += size;
    return run;
  });
  const path = `${tempDir()}/trunk-ring-test.bin`;
  Deno.writeFileSync(path, bytes);
  return { path, runs, bytes };
}

const PLANS = [
  { pinned: 0, slots: 1, readahead: false },
  { pinned: 0, slots: 2, readahead: true },
  { pinned: 2, slots: 2, readahead: true },
  { pinned: 2, slots: 3, readahead: false },
  { pinned: 2, slots: 3, readahead: true },
  { pinned: 4, slots: 1, readahead: true },
  { pinned: 5, slots: 0, readahead: true },
];

for (const plan of PLANS) {
  Deno.test(`trunk ring ${JSON.stringify(plan)}: every layer lands whole, hits = pinned`, () => {
    const { path, runs, bytes } = trunkFile();
    const arena = new Arena(4 << 20);
    const reader = openReader(arena.memory, { direct: false, quiet: true });
    try {
      const ring = new TrunkRing(arena, reader, reader.open(path), runs, plan);
      const passes = 3;
      for (let p = 0; p < passes; p++) {
        for (let l = 0; l < runs.length; l++) {
          const t = ring.acquire(l).get("attn_norm");
          const want = bytes.subarray(runs[l].offset, runs[l].offset + runs[l].bytes);
          assert.deepEqual(arena.u8(t.ptr, runs[l].bytes), want, `pass ${p} layer ${l}`);
          ring.release(l);
        }
      }
      assert.equal(ring.stats.hits, plan.pinned * passes);
      assert.equal(ring.stats.reads, (runs.length - plan.pinned) * passes);
      // A layer still in its slot from the last pass is not read again.
      const unpinned = SIZES.slice(plan.pinned).reduce((a, b) => a + b, 0);
      const pinned = SIZES.slice(0, plan.pinned).reduce((a, b) => a + b, 0);
      const again = plan.slots >= runs.length - plan.pinned ? 0 : (passes - 1) * unpinned;
      // The read-ahead after the last layer has already started the next pass's first.
      const ahead = plan.readahead && plan.slots >= 2 && again > 0 ? SIZES[plan.pinned] : 0;
      assert.equal(ring.stats.bytes, pinned + unpinned + again + ahead);
      // Visits served by the read-ahead: all but the first, unless the slots hold every unpinned
      // layer, when only the first pass reads (later visits find their layer still there).
      const n = runs.length - plan.pinned;
      const readahead = !plan.readahead || plan.slots < 2
        ? 0
        : plan.slots >= n
        ? n - 1
        : passes * n - 1;
      assert.equal(ring.stats.readahead, readahead);
      ring.abandon();
    } finally {
      reader.close();
    }
  });
}

Deno.test("trunk ring: unpinned layers without a slot are refused", () => {
  const { path, runs } = trunkFile();
  const arena = new Arena(4 << 20);
  const reader = openReader(arena.memory, { direct: false, quiet: true });
  try {
    assert.throws(
      () =>
        new TrunkRing(arena, reader, reader.open(path), runs, {
          pinned: 3,
          slots: 0,
          readahead: true,
        }),
      /2 unpinned layers need ring slots/,
    );
  } finally {
    reader.close();
  }
});
