/**
 * The read log (io/read_log.ts): during a streaming decode it holds exactly the reads the run's
 * counters saw (bytes per file kind, one request per expert record), every read is submitted once
 * and reaped at most once after its submit; logging (and the reader's thread count) leaves the
 * logits bit-identical; and a replay puts the file's own bytes at every logged arena range, queued
 * at no more than the run's depth.
 */
import assert from "node:assert/strict";
import { closeSync, openSync, readSync } from "node:fs";
import { Model } from "../engine/model.ts";
import { REQUEST_BYTES } from "../engine/stream/expert_store.ts";
import { type BlockReader, openReader, type ReadTicket } from "../io/reader.ts";
import { ReadLog, readsIn, replayReads } from "../io/read_log.ts";
import { sharedMemory64 } from "../wasm/mod.ts";
import { packCheckpoint } from "../tools/pack.ts";
import { synthCheckpoint } from "../tools/synth.ts";
import { tempDir } from "./fixtures.ts";

const PROMPT = [1, 17, 250, 33, 101, 7];
const DECODE = 10;

let packed: Promise<string> | null = null;
/** A small synthetic qwen3_moe container (16 experts × 3 layers), made once per process. */
function model(): Promise<string> {
  packed ??= (async () => {
    const out = `${tempDir()}/read-log-qwen3`;
    const ckpt = await synthCheckpoint({
      arch: "qwen3_moe",
      out,
      size: 4e6,
      seed: 5,
      overrides: {
        hidden: 128,
        layers: 3,
        experts: 16,
        topK: 4,
        expertInter: 48,
        vocab: 320,
        heads: 4,
        kvHeads: 2,
        headDim: 32,
        maxPositions: 256,
      },
      progress: "off",
      log: () => {},
    });
    await packCheckpoint(ckpt.dir, `${out}.sluice`, { progress: "off", log: () => {} });
    return `${out}.sluice`;
  })();
  return packed;
}

interface Decoded {
  logits: Float32Array[];
  /** Expert and trunk bytes the counters saw during decode. */
  expertBytes: number;
  trunkBytes: number;
  stride: number;
  trunkPath: string;
}

/** Prefill, then greedy-free decode of fixed ids; 12 expert slots of 48 so experts stream. */
async function decode(path: string, readLog?: ReadLog, ioThreads?: number): Promise<Decoded> {
  const m = await Model.open(path, { quiet: true, ctx: 64, expertSlots: 12, readLog, ioThreads });
  try {
    const logits: Float32Array[] = [m.forward(PROMPT, 0).slice()];
    const e0 = m.experts!.stats.bytesRead, t0 = m.trunk.stats.bytes;
    for (let n = 0; n < DECODE; n++) {
      logits.push(m.forward([(n * 37 + 3) % 320], PROMPT.length + n).slice());
    }
    return {
      logits,
      expertBytes: m.experts!.stats.bytesRead - e0,
      trunkBytes: m.trunk.stats.bytes - t0,
      stride: m.container.manifest.experts.find((b) => b !== null)!.stride,
      trunkPath: m.container.trunkPath,
    };
  } finally {
    m.close();
  }
}

Deno.test("read log: the decode's reads are the counters' reads, each submitted once", async () => {
  const log = new ReadLog();
  const d = await decode(await model(), log);
  let expertBytes = 0, expertReads = 0, trunkBytes = 0;
  for (const r of log.reads) {
    // A withdrawn guess's requests never reached the disk, and the counters do not count them.
    if (r.position < PROMPT.length || r.cancelled) continue;
    if (log.files[r.file] === d.trunkPath) trunkBytes += r.length;
    else {
      expertBytes += r.length;
      expertReads++;
    }
  }
  assert.ok(d.expertBytes > 0, "the decode must stream experts for this test to mean anything");
  assert.equal(expertBytes, d.expertBytes);
  assert.equal(trunkBytes, d.trunkBytes);
  // Whole records take ceil(stride / REQUEST_BYTES) requests each (a withdrawn guess leaves part).
  if (!log.reads.some((r) => r.cancelled)) {
    assert.equal(expertReads, (d.expertBytes / d.stride) * Math.ceil(d.stride / REQUEST_BYTES));
  }
  const window = readsIn(log, PROMPT.length);
  assert.equal(window.bytes, d.expertBytes + d.trunkBytes);
  assert.equal(window.positions, DECODE);
  // Every read submitted exactly once, reaped at most once and only after its submit.
  const submitted = new Set<number>(), reaped = new Set<number>();
  for (const e of log.events) {
    if (e >= 0) {
      assert.ok(!submitted.has(e), `read ${e} submitted twice`);
      submitted.add(e);
    } else {
      assert.ok(submitted.has(~e) && !reaped.has(~e), `read ${~e} reaped out of order`);
      reaped.add(~e);
    }
  }
  assert.equal(submitted.size, log.reads.length);
  // Round trip through JSON (how a bench child process hands a log back).
  assert.deepEqual(ReadLog.from(JSON.parse(JSON.stringify(log))).toJSON(), log.toJSON());
});

Deno.test("read log: logging and the reader's threads leave every logit bit-identical", async () => {
  const path = await model();
  const off = await decode(path);
  for (
    const [what, run] of [["logged", await decode(path, new ReadLog())], [
      "one reader thread",
      await decode(path, undefined, 1),
    ]] as const
  ) {
    assert.equal(run.logits.length, off.logits.length);
    for (let i = 0; i < off.logits.length; i++) {
      assert.deepEqual(run.logits[i], off.logits[i], `${what}: forward call ${i}`);
    }
  }
});

/** Compares each completed read's arena range with the file's bytes, read with node:fs. */
function checkingReader(memory: WebAssembly.Memory, checked: { n: number; bytes: number }) {
  const inner = openReader(memory, { quiet: true });
  const paths = new Map<number, string>();
  const pending = new Map<ReadTicket, [string, number, number, number]>();
  const check = (t: ReadTicket) => {
    const p = pending.get(t);
    if (!p) return;
    pending.delete(t);
    const [path, arenaOffset, length, offset] = p;
    const want = new Uint8Array(length);
    const fd = openSync(path, "r");
    try {
      readSync(fd, want, 0, length, offset);
    } finally {
      closeSync(fd);
    }
    const got = new Uint8Array(memory.buffer, arenaOffset, length);
    assert.ok(got.every((b, i) => b === want[i]), `${path} at ${offset}: arena bytes differ`);
    checked.n++;
    checked.bytes += length;
  };
  const reader: BlockReader = {
    kind: inner.kind,
    threads: inner.threads,
    open: (path) => {
      const h = inner.open(path);
      paths.set(h, path);
      return h;
    },
    size: (h) => inner.size(h),
    submit: (h, a, l, o, p) => {
      const t = inner.submit(h, a, l, o, p);
      pending.set(t, [paths.get(h)!, a, l, o]);
      return t;
    },
    wait: (t) => {
      inner.wait(t);
      check(t);
    },
    poll: (t) => inner.poll(t) && (check(t), true),
    reprioritize: (t, p) => inner.reprioritize(t, p),
    cancel: (t) => inner.cancel(t) && (pending.delete(t), true),
    diskStats: () => inner.diskStats(),
    read: (h, a, l, o) => reader.wait(reader.submit(h, a, l, o)),
    closeFile: (h) => inner.closeFile(h),
    close: () => inner.close(),
  };
  return reader;
}

Deno.test("read log: a replay reads the logged bytes into the logged arena ranges", async () => {
  const log = new ReadLog();
  await decode(await model(), log);
  const window = readsIn(log, PROMPT.length);
  const top = Math.max(...log.reads.map((r) => r.arenaOffset + r.length));
  const checked = { n: 0, bytes: 0 };
  const reader = checkingReader(sharedMemory64(top), checked);
  try {
    const r = replayReads(log, { from: PROMPT.length, reader });
    assert.equal(r.reads, window.reads);
    assert.equal(r.bytes, window.bytes);
    assert.equal(r.positions, DECODE);
    assert.equal(checked.n, window.reads);
    assert.equal(checked.bytes, window.bytes);
  } finally {
    reader.close();
  }
  // The default replay (its own reader of the logged kind) reads the same amount.
  const own = replayReads(log, { from: PROMPT.length });
  assert.equal(own.kind, log.kind);
  assert.equal(own.threads, log.threads);
  assert.equal(own.bytes, window.bytes);
  assert.ok(own.seconds > 0);
  // Queued: the same reads, never more in flight than the run had, and that many at some point.
  const queued = replayReads(log, { from: PROMPT.length, queued: true });
  assert.equal(queued.reads, window.reads);
  assert.equal(queued.bytes, window.bytes);
  assert.equal(queued.maxInFlight, own.maxInFlight);
});
