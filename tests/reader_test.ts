/**
 * Block readers (io/reader.ts): every kind reads random ranges, several in flight, into a shared
 * wasm64 arena and must reproduce the bytes written to a temp file; errors must name the path,
 * offset and cause. Shim kinds are skipped (visibly) when the shim cannot be built or loaded.
 */

import assert from "node:assert/strict";
import { join } from "node:path";
import { type BlockReader, openReader, type ReaderOptions, type ReadTicket } from "../io/reader.ts";
import { shimUnavailable } from "../io/shim.ts";
import { denoEval } from "./fixtures.ts";

const KiB = 1024;
const MiB = 1024 * KiB;
const ARENA_BYTES = 256 * 64 * KiB;
const FILE_BYTES = 6 * MiB + 1234; // the tail is deliberately not a whole 4 KiB block
const SLOT_BYTES = MiB; // each read in flight owns one arena slot
const IN_FLIGHT = 6;

// The override would change the reader kinds under test; the test of the override sets it itself.
Deno.env.delete("SLUICE_IO");

const memory = new WebAssembly.Memory(
  {
    initial: 256n,
    maximum: 256n,
    shared: true,
    address: "i64",
  } as unknown as WebAssembly.MemoryDescriptor,
);
const arena = new Uint8Array(memory.buffer);

const dir = Deno.makeTempDirSync({ prefix: "sluice-reader-test-" });
const path = join(dir, "random.bin");
const fileBytes = new Uint8Array(FILE_BYTES);
for (let i = 0; i < FILE_BYTES; i += 65536) {
  crypto.getRandomValues(fileBytes.subarray(i, Math.min(i + 65536, FILE_BYTES)));
}
Deno.writeFileSync(path, fileBytes);
globalThis.addEventListener("unload", () => Deno.removeSync(dir, { recursive: true }));

const shimWhy = shimUnavailable(memory);

/** Deterministic PRNG (mulberry32) so a failure can be replayed. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

interface Range {
  arenaOffset: number;
  length: number;
  fileOffset: number;
}

/** A random range inside the file, 4 KiB-aligned when `aligned`, fitting its arena slot. */
function randomRange(next: () => number, slot: number, aligned: boolean): Range {
  const unit = aligned ? 4096 : 1;
  const fileUnits = Math.floor(FILE_BYTES / unit);
  const length = unit * (1 + Math.floor(next() * Math.min(SLOT_BYTES / unit, fileUnits)));
  const fileOffset = unit * Math.floor(next() * (Math.floor((FILE_BYTES - length) / unit) + 1));
  const slack = Math.floor((SLOT_BYTES - length) / unit);
  const arenaOffset = slot * SLOT_BYTES + unit * Math.floor(next() * (slack + 1));
  return { arenaOffset, length, fileOffset };
}

function assertRangeMatches(r: Range, label: string): void {
  const got = arena.subarray(r.arenaOffset, r.arenaOffset + r.length);
  const want = fileBytes.subarray(r.fileOffset, r.fileOffset + r.length);
  // Compare without building huge assertion messages on success.
  const firstDiff = got.findIndex((b, i) => b !== want[i]);
  assert.equal(
    firstDiff,
    -1,
    `${label}: arena [${r.arenaOffset}, +${r.length}) differs from file offset ${r.fileOffset} ` +
      `at byte ${firstDiff}`,
  );
}

/** The shim's handle is its fd: check the kernel really opened it with O_DIRECT (0o40000). */
function assertODirect(fd: number): void {
  const info = Deno.readTextFileSync(`/proc/self/fdinfo/${fd}`);
  const flags = parseInt(/^flags:\s*([0-7]+)/m.exec(info)?.[1] ?? "0", 8);
  assert.ok(flags & 0o40000, `fd ${fd} of ${path} lacks O_DIRECT: ${info}`);
}

/** Runs `rounds` batches of IN_FLIGHT reads, completing them by wait in shuffled order or by
 * polling, and checks every byte. */
function readManyRanges(reader: BlockReader, aligned: boolean, seed: number, rounds: number) {
  const next = rng(seed);
  const h = reader.open(path);
  try {
    assert.equal(reader.size(h), FILE_BYTES);
    if (reader.kind === "shim-direct" && Deno.build.os === "linux") assertODirect(h);
    for (let round = 0; round < rounds; round++) {
      arena.fill(0xa5, 0, IN_FLIGHT * SLOT_BYTES);
      const batch: { r: Range; t: ReadTicket }[] = [];
      for (let slot = 0; slot < IN_FLIGHT; slot++) {
        const r = randomRange(next, slot, aligned);
        batch.push({ r, t: reader.submit(h, r.arenaOffset, r.length, r.fileOffset) });
      }
      if (round % 2 === 0) {
        for (let i = batch.length - 1; i > 0; i--) {
          const j = Math.floor(next() * (i + 1));
          [batch[i], batch[j]] = [batch[j], batch[i]];
        }
        for (const { t } of batch) reader.wait(t);
      } else {
        let pending = batch.map(({ t }) => t);
        while (pending.length > 0) pending = pending.filter((t) => !reader.poll(t));
        for (const { t } of batch) reader.wait(t); // completed tickets wait without error
      }
      for (const { r } of batch) assertRangeMatches(r, `${reader.kind} round ${round}`);
    }
    // The whole file in one read, up to exactly end of file where alignment allows it.
    const whole = aligned ? FILE_BYTES - (FILE_BYTES % 4096) : FILE_BYTES;
    reader.read(h, 0, whole, 0);
    assertRangeMatches({ arenaOffset: 0, length: whole, fileOffset: 0 }, `${reader.kind} whole`);
  } finally {
    reader.closeFile(h);
  }
}

function assertErrorCases(reader: BlockReader, direct: boolean): void {
  const missing = join(dir, "no-such-file.bin");
  assert.throws(() => reader.open(missing), (e: Error) => {
    assert.match(e.message, new RegExp(`${missing}.*(ENOENT|errno 2)`));
    return true;
  });
  const h = reader.open(path);
  try {
    const lastBlock = FILE_BYTES - (FILE_BYTES % 4096);
    // Crossing end of file: the container pads files, so a reader must refuse, not zero-fill.
    assert.throws(() => reader.read(h, 0, 8192, lastBlock), (e: Error) => {
      assert.match(e.message, new RegExp(`short read from ${path}: got ${FILE_BYTES % 4096} `));
      assert.match(e.message, new RegExp(`offset ${lastBlock}\\b`));
      return true;
    });
    assert.throws(() => reader.read(h, 0, 4096, 8 * MiB), /got 0 of 4096 bytes at offset 8388608/);
    assert.throws(() => reader.read(h, ARENA_BYTES - 4096, 8192, 0), /exceeds the arena/);
    assert.throws(() => reader.read(h, -4096, 4096, 0), /not a non-negative integer/);
    if (direct) {
      for (const [a, n, o] of [[1, 4096, 0], [0, 4095, 0], [0, 4096, 512]]) {
        assert.throws(() => reader.read(h, a, n, o), (e: Error) => {
          assert.match(e.message, new RegExp(`read of ${path}: direct I/O needs`));
          assert.match(e.message, /multiples of 4096/);
          return true;
        });
      }
    } else {
      reader.read(h, 1, 4095, 513);
      assertRangeMatches({ arenaOffset: 1, length: 4095, fileOffset: 513 }, "unaligned");
    }
    assert.throws(() => reader.size(h + 1000), /unknown file handle/);
  } finally {
    reader.closeFile(h);
  }
}

function withReader(opts: ReaderOptions, kind: BlockReader["kind"], fn: (r: BlockReader) => void) {
  const reader = openReader(memory, { quiet: true, ...opts });
  try {
    assert.equal(reader.kind, kind);
    fn(reader);
  } finally {
    reader.close();
  }
  reader.close(); // idempotent
  assert.throws(() => reader.open(path), /after close/);
}

Deno.test("fallback reader: random unaligned ranges match the file", () => {
  withReader({ forceFallback: true, direct: false }, "fallback", (r) => {
    readManyRanges(r, false, 1, 4);
    assertErrorCases(r, false);
  });
});

Deno.test("fallback reader with direct: random aligned ranges, alignment enforced", () => {
  withReader({ forceFallback: true, direct: true }, "fallback", (r) => {
    readManyRanges(r, true, 2, 4);
    assertErrorCases(r, true);
  });
});

Deno.test("SLUICE_IO=fallback overrides the options, and a bad value is an error naming it", async () => {
  // In a process of its own: the variable belongs to the whole process, where other test files
  // open readers at the same time.
  const code = `import { openReader } from "${new URL("../io/reader.ts", import.meta.url).href}";
const memory = new WebAssembly.Memory(
  { initial: 1n, maximum: 1n, shared: true, address: "i64" },
);
try {
  const r = openReader(memory, { direct: true, quiet: true });
  console.log(r.kind);
  r.close();
} catch (e) {
  console.log(e.message);
}`;
  const run = async (io: string) => {
    const out = await denoEval(code, { SLUICE_IO: io });
    return out.stdout.trim() + out.stderr;
  };
  assert.equal(await run("fallback"), "fallback");
  assert.match(await run("bogus"), /^SLUICE_IO=bogus: expected one of fallback, buffered, direct/);
});

const shimSkip = shimWhy === null ? "" : ` (skipped: ${shimWhy})`;

Deno.test({
  name: `shim direct reader: random aligned ranges, 6 in flight, 3 threads${shimSkip}`,
  ignore: shimWhy !== null,
  fn() {
    withReader({ direct: true, threads: 3 }, "shim-direct", (r) => {
      readManyRanges(r, true, 3, 8);
      assertErrorCases(r, true);
    });
  },
});

Deno.test({
  name: `shim buffered reader: random unaligned ranges, 6 in flight${shimSkip}`,
  ignore: shimWhy !== null,
  fn() {
    withReader({ direct: false, threads: 2 }, "shim-buffered", (r) => {
      readManyRanges(r, false, 4, 8);
      assertErrorCases(r, false);
    });
  },
});

Deno.test({
  name: `shim reader: bounded queue, foreign tickets, close with reads in flight${shimSkip}`,
  ignore: shimWhy !== null,
  fn() {
    const other = openReader(memory, { forceFallback: true, quiet: true });
    withReader({ direct: true, threads: 1 }, "shim-direct", (r) => {
      const h = r.open(path);
      const tickets: ReadTicket[] = [];
      for (let i = 0; i < 1024; i++) tickets.push(r.submit(h, i * 4096, 4096, (i % 1536) * 4096));
      assert.throws(() => r.submit(h, 0, 4096, 0), /1024 reads already in flight/);
      assert.throws(() => r.closeFile(h), new RegExp(`cannot close ${path}: \\d+ reads still`));
      assert.equal(new Set(tickets.map((t) => t.id)).size, tickets.length);
      for (const t of tickets) r.wait(t);
      for (let i = 0; i < 1024; i++) {
        assertRangeMatches(
          { arenaOffset: i * 4096, length: 4096, fileOffset: (i % 1536) * 4096 },
          "queue",
        );
      }
      const t = r.submit(h, 0, 4096, 0);
      assert.throws(() => other.wait(t), /not issued by this reader/);
      r.wait(t);
      // close() with a read still queued must finish it and join the threads.
      r.submit(h, 0, 4096, 0);
    });
    other.close();
  },
});
