/**
 * A hint queues its misses' reads up to the read-ahead depth, but never more requests than the
 * store's bound once one record is queued: records of the largest models are tens of 2 MiB
 * requests, and the shim's queue holds 1024 reads in all. Every hinted expert still lands.
 */
import assert from "node:assert/strict";
import { Arena } from "../engine/arena.ts";
import { ExpertCache } from "../engine/stream/expert_cache.ts";
import { ExpertStore, REQUEST_BYTES } from "../engine/stream/expert_store.ts";
import type { ExpertBank } from "../io/manifest_schema.ts";
import { HeldReader } from "./held_reader.ts";

Deno.test("a hint queues at most the store's bound of requests, and every expert lands", () => {
  const perRecord = 32, experts = 12;
  const stride = perRecord * REQUEST_BYTES;
  const entry = { dtype: "bf16" as const, shape: [16, 16], offset: 0, bytes: 512 };
  const bank = {
    layer: 0,
    file: "experts-L0.bin",
    count: experts,
    stride,
    format: "bf16",
    matrices: { gate: entry, up: entry, down: entry },
  } as unknown as ExpertBank;
  // Arena pages are never touched: the reader writes nothing.
  const arena = new Arena(experts * stride + (64 << 20));
  const reader = new HeldReader();
  const cache = new ExpertCache({ slots: experts, policy: "lru" });
  const landed: number[] = [];
  const store = new ExpertStore(
    arena,
    reader,
    [{ bank, handles: [0], paths: ["experts-L0.bin"] }],
    cache,
    { readaheadDepth: 32, check: (_l, e) => landed.push(e) },
  );
  const ids = Array.from({ length: experts }, (_, e) => e);
  store.hint(0, ids);
  // 4 records of 32 requests reach the bound of 128; depth 32 alone would queue all 12 (384).
  assert.equal(reader.pending.size, 128);
  for (const e of ids) {
    store.acquire(0, e);
    store.release(0, e);
    assert.ok(reader.most <= 128 + perRecord, `${reader.most} requests queued at once`);
  }
  assert.deepEqual(landed, ids);
  assert.equal(reader.pending.size, 0);
});
