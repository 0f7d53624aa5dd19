/**
 * How the expert store reads the lookahead's guesses, on a reader that starts nothing by itself
 * (a test starts requests the way the shim's threads would): a prediction's guesses are queued in
 * rank order, each in requests of at most GUESS_REQUEST_BYTES in the lowest class, behind the
 * demand reads queued before them; when their layer routes, every request of a wrong guess that
 * has not started is withdrawn and every one of a right guess is promoted to a demand read; and
 * the bytes counted are the bytes read.
 */
import assert from "node:assert/strict";
import { Arena } from "../engine/arena.ts";
import { ExpertCache } from "../engine/stream/expert_cache.ts";
import { ExpertStore, GUESS_REQUEST_BYTES, REQUEST_BYTES } from "../engine/stream/expert_store.ts";
import type { ExpertBank } from "../io/manifest_schema.ts";
import { type BlockReader, ReadPriority, type ReadTicket } from "../io/reader.ts";

/** One request as the reader saw it. */
interface Request {
  handle: number;
  fileOffset: number;
  length: number;
  priority: ReadPriority;
  state: "queued" | "running" | "done" | "withdrawn";
}

/** A reader whose requests start only when the test says (see {@link startNext}). */
class SteppedReader implements BlockReader {
  readonly kind = "fallback";
  readonly threads = 4;
  readonly requests: Request[] = [];
  open(): number {
    return 0;
  }
  size(): number {
    return 1 << 40;
  }
  submit(handle: number, _at: number, length: number, fileOffset: number, p = 0): ReadTicket {
    this.requests.push({
      handle,
      fileOffset,
      length,
      priority: p as ReadPriority,
      state: "queued",
    });
    return { id: this.requests.length - 1 };
  }
  /** Starts the next queued request as the shim would: most urgent class first, oldest first. */
  startNext(): Request {
    const queued = this.requests.filter((r) => r.state === "queued");
    const next = queued.sort((a, b) => a.priority - b.priority)[0];
    next.state = "running";
    return next;
  }
  wait(t: ReadTicket): void {
    const r = this.requests[t.id];
    assert.notEqual(r.state, "withdrawn", "a withdrawn request was waited on");
    r.state = "done";
  }
  poll(t: ReadTicket): boolean {
    return this.requests[t.id].state === "done";
  }
  reprioritize(t: ReadTicket, p: ReadPriority): boolean {
    const r = this.requests[t.id];
    if (r.state !== "queued") return false;
    r.priority = p;
    return true;
  }
  cancel(t: ReadTicket): boolean {
    const r = this.requests[t.id];
    if (r.state !== "queued") return false;
    r.state = "withdrawn";
    return true;
  }
  diskStats(): null {
    return null;
  }
  read(): void {}
  closeFile(): void {}
  close(): void {}
}

/** A record of 2 demand-sized requests (the last one short), or 5 guess-sized ones. */
const STRIDE = REQUEST_BYTES + GUESS_REQUEST_BYTES / 2;
const GUESS_REQUESTS = Math.ceil(STRIDE / GUESS_REQUEST_BYTES);

function store(): { store: ExpertStore; reader: SteppedReader } {
  const entry = { dtype: "bf16" as const, shape: [16, 16], offset: 0, bytes: 512 };
  const bank = (layer: number) =>
    ({
      layer,
      file: `experts-L${layer}.bin`,
      count: 16,
      stride: STRIDE,
      format: "bf16",
      matrices: { gate: entry, up: entry, down: entry },
    }) as unknown as ExpertBank;
  const slots = 12;
  // Arena pages are never touched: the reader writes nothing.
  const arena = new Arena(slots * STRIDE + (64 << 20));
  const reader = new SteppedReader();
  const banks = [0, 1].map((l) => ({ bank: bank(l), handles: [l], paths: [`experts-L${l}.bin`] }));
  const s = new ExpertStore(arena, reader, banks, new ExpertCache({ slots, policy: "lru" }), {
    readaheadDepth: 32,
    check: () => {},
  });
  return { store: s, reader };
}

/** The expert whose record holds `fileOffset` (one shard per bank). */
const expertAt = (r: Request) => Math.floor(r.fileOffset / STRIDE);

Deno.test("guesses queue in rank order behind the demand reads, in guess-sized requests", () => {
  const { store: s, reader } = store();
  s.hint(0, [2, 4]);
  const demand = reader.requests.length;
  assert.equal(demand, 2 * Math.ceil(STRIDE / REQUEST_BYTES));
  assert.equal(s.speculate(1, [9, 3, 7], 3), 3);
  const guesses = reader.requests.slice(demand);
  assert.ok(guesses.every((r) => r.priority === ReadPriority.SPECULATIVE));
  assert.ok(guesses.every((r) => r.length <= GUESS_REQUEST_BYTES));
  assert.equal(guesses.length, 3 * GUESS_REQUESTS);
  // Rank order, each record front to back: the order the shim starts them in.
  const order = guesses.map((r) => [expertAt(r), r.fileOffset % STRIDE]);
  const want = [9, 3, 7].flatMap((e) =>
    Array.from({ length: GUESS_REQUESTS }, (_, i) => [e, i * GUESS_REQUEST_BYTES])
  );
  assert.deepEqual(order, want);
  // The shim serves the demand reads first, then the guesses in that order.
  const started = reader.requests.map(() => reader.startNext());
  assert.deepEqual(started.slice(0, demand), reader.requests.slice(0, demand));
  assert.deepEqual(started.slice(demand), guesses);
});

Deno.test("a bounded prediction reads its best-ranked guesses not already held", () => {
  const { store: s, reader } = store();
  s.hint(1, [9]);
  s.acquire(1, 9);
  s.release(1, 9);
  const before = reader.requests.length;
  assert.equal(s.speculate(1, [9, 3, 7], 1), 1);
  const read = reader.requests.slice(before);
  assert.deepEqual([...new Set(read.map(expertAt))], [3], "9 is cached: the one read is 3");
});

Deno.test("when the layer routes, wrong guesses are withdrawn and right ones promoted", () => {
  const { store: s, reader } = store();
  s.hint(0, [2]);
  s.speculate(1, [9, 3, 7], 3);
  // The demand read and the first two requests of the top guess have started.
  const demand = Math.ceil(STRIDE / REQUEST_BYTES);
  for (let i = 0; i < demand + 2; i++) reader.startNext();
  s.acquire(0, 2);
  s.release(0, 2);
  s.hint(1, [3, 5]);
  const of = (e: number) => reader.requests.filter((r) => r.handle === 1 && expertAt(r) === e);
  // 9 was wrong: its started requests run on, the rest never reach the disk.
  assert.deepEqual(
    of(9).map((r) => r.state),
    ["running", "running", ...Array(GUESS_REQUESTS - 2).fill("withdrawn")],
  );
  // 7 was wrong and had not started: withdrawn whole.
  assert.ok(of(7).every((r) => r.state === "withdrawn"));
  // 3 was right: every request now waits in the demand class, before 5's miss.
  assert.ok(of(3).every((r) => r.state === "queued" && r.priority === ReadPriority.DEMAND));
  const queued = reader.requests.filter((r) => r.state === "queued");
  assert.ok(queued.every((r) => r.priority === ReadPriority.DEMAND), "no guess left queued");
  assert.deepEqual([...new Set(queued.map(expertAt))], [3, 5]);
  assert.equal(s.stats.speculativeUsed, 1);
  assert.equal(s.stats.speculativeCancelled, 2);
  // Counted bytes: the demand record, 9's two started requests, 3, and 5's miss.
  const read = reader.requests.filter((r) => r.state !== "withdrawn")
    .reduce((n, r) => n + r.length, 0);
  assert.equal(s.stats.bytesRead, read);
  assert.equal(read, 3 * STRIDE + 2 * GUESS_REQUEST_BYTES);
  for (const e of [3, 5]) {
    s.acquire(1, e);
    s.release(1, e);
  }
  assert.ok(s.holds(1, 3) && s.holds(1, 5));
  assert.ok(!s.holds(1, 7), "a withdrawn guess holds no slot");
});
