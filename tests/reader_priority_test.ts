/**
 * The shim's priority classes under control: a read that has not started can be moved to a more
 * urgent class (a guess the engine now waits for) or withdrawn (a guess its layer did not use),
 * and the disk accounting counts the time an urgent read waited behind a speculative one.
 * (Their sharing of the disk while both run needs two threads and is not checked here.) Reads
 * are slowed with SLUICE_FAULTS delays so their order is known on one reader thread; the shim
 * reads that variable once per process, so the checks run in a child process. Nothing is timed
 * against a fixed figure: the blocked time is bounded by readings of the shim's own clock taken
 * around the events that start and end it, so load widens the bounds but cannot break them.
 */
import assert from "node:assert/strict";
import { sharedMemory64 } from "../wasm/mod.ts";
import { shimUnavailable } from "../io/shim.ts";

const shimWhy = shimUnavailable(sharedMemory64(1 << 16));
const READER = new URL("../io/reader.ts", import.meta.url).href;
const WASM = new URL("../wasm/mod.ts", import.meta.url).href;

/** Reads per attempt, and attempts the child may make (see CHILD). */
const READS = 5, ATTEMPTS = 8;
/** Milliseconds each read of slow.bin sleeps before it reads. */
const DELAY = 150;

/**
 * The child: one reader thread, each read of slow.bin delayed by DELAY ms, reads of held.bin held
 * (a speculative one starts only when waited for). An attempt's order is under control only if its
 * first read is still running after every call that depends on that (a stall of the child longer
 * than DELAY on a loaded machine can let it finish first); such an attempt is redone.
 */
const CHILD = `
import { openReader, ReadPriority } from "${READER}";
import { sharedMemory64 } from "${WASM}";
const dir = Deno.makeTempDirSync();
const file = dir + "/slow.bin";
Deno.writeFileSync(file, new Uint8Array(${READS * ATTEMPTS} * 4096).map((_, i) => i % 251));
Deno.writeFileSync(dir + "/held.bin", new Uint8Array(2 * 4096).fill(7));
const mem = sharedMemory64(1 << 22);
const reader = openReader(mem, { threads: 1, quiet: true, direct: false });
const h = reader.open(file);
const clock = () => reader.diskStats();
let attempt = 0, out;
for (; attempt < ${ATTEMPTS} && !out?.controlled; attempt++) {
  const base = attempt * ${READS};
  const done = [];
  const at = (name, t) => ({ name, t });
  const read = (i, prio) => reader.submit(h, (base + i) * 4096, 4096, (base + i) * 4096, prio);
  const t0 = clock();
  // One thread: the speculative read starts at once, the demand read queues behind it.
  const spec = at("spec", read(0, ReadPriority.SPECULATIVE));
  // Wait until the thread has taken it (busy time starts to count; it sleeps its delay inside).
  let before = clock();
  while (!(before.busyMs > t0.busyMs)) before = clock();
  const demand = at("demand", read(1, ReadPriority.DEMAND));
  const after = clock();
  const late = at("late", read(2, ReadPriority.SPECULATIVE));
  const promoted = at("promoted", read(3, ReadPriority.SPECULATIVE));
  const dropped = at("dropped", read(4, ReadPriority.SPECULATIVE));
  out = {
    cancelRunning: reader.cancel(spec.t),
    reprioritize: reader.reprioritize(promoted.t, ReadPriority.DEMAND),
    cancel: reader.cancel(dropped.t),
    cancelTwice: reader.cancel(dropped.t),
  };
  out.controlled = !reader.poll(spec.t);
  let waitCancelled = "";
  try { reader.wait(dropped.t); } catch (e) { waitCancelled = e.message; }
  const pending = [spec, demand, late, promoted];
  let specEnd = null;
  while (pending.length) {
    for (let i = 0; i < pending.length; i++) {
      if (!reader.poll(pending[i].t)) continue;
      if (pending[i] === spec) specEnd = clock();
      done.push(pending.splice(i--, 1)[0].name);
    }
  }
  const t1 = clock();
  Object.assign(out, {
    waitCancelled, order: done,
    busyMs: t1.busyMs - t0.busyMs, blockedMs: t1.blockedMs - t0.blockedMs, bytes: t1.bytes - t0.bytes,
    // The first read started after t0 and slept DELAY ms; the demand read queued between before
    // and after and waited until the first read ended, which was seen at specEnd.
    blockedLow: t0.atMs + ${DELAY} - after.atMs,
    blockedHigh: specEnd.atMs - before.atMs,
  });
}
// A held speculative read does not start on an idle thread; waiting for it starts it.
const held = reader.open(dir + "/held.bin");
const guess = reader.submit(held, 0, 4096, 0, ReadPriority.SPECULATIVE);
reader.wait(reader.submit(held, 4096, 4096, 4096, ReadPriority.DEMAND));
const heldIdle = !reader.poll(guess);
new Uint8Array(mem.buffer, 0, 4096).fill(0);
reader.wait(guess);
const heldRead = new Uint8Array(mem.buffer, 0, 4096).every((b) => b === 7);
reader.close();
Deno.removeSync(dir, { recursive: true });
console.log(JSON.stringify({ ...out, attempts: attempt, heldIdle, heldRead }));
Deno.exit(0);
`;
Deno.test({
  name: "shim: reprioritize and cancel reads that have not started; blocked time is counted",
  ignore: shimWhy !== null,
  fn: async () => {
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["eval", CHILD],
      env: { SLUICE_FAULTS: `delay=${DELAY}@slow.bin;hold@held.bin`, NO_COLOR: "1" },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const err = new TextDecoder().decode(out.stderr);
    assert.equal(out.code, 0, err);
    const r = JSON.parse(new TextDecoder().decode(out.stdout).trim().split("\n").pop()!);
    assert.ok(r.controlled, `the first read ended before the calls in all ${r.attempts} attempts`);
    assert.equal(r.cancelRunning, false, "a running read cannot be withdrawn");
    assert.equal(r.reprioritize, true);
    assert.equal(r.cancel, true);
    assert.equal(r.cancelTwice, false, "a withdrawn ticket is spent");
    assert.match(r.waitCancelled, /cancelled/);
    // The promoted guess now goes after the demand read queued before it, and before the
    // speculative read submitted before it.
    assert.deepEqual(r.order, ["spec", "demand", "promoted", "late"]);
    // Four reads of at least DELAY ms ran back to back. Urgent reads waited behind a speculative
    // one from the demand read's submission to the first read's end, and never after: more than
    // nothing, and within the bounds the shim's clock put around those two events.
    assert.ok(r.busyMs >= 4 * DELAY * 0.95, `busy ${r.busyMs} ms`);
    const blocked = `blocked ${r.blockedMs} ms, bounds ${r.blockedLow}..${r.blockedHigh}`;
    assert.ok(r.blockedMs > 0, blocked);
    assert.ok(r.blockedMs >= r.blockedLow - 0.01 && r.blockedMs <= r.blockedHigh + 0.01, blocked);
    assert.equal(r.bytes, 4 * 4096);
    assert.ok(r.heldIdle, "a held speculative read started on an idle reader thread");
    assert.ok(r.heldRead, "waiting for a held read started it and it read its bytes");
  },
});
