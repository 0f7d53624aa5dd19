/**
 * The shim's priority classes under control: a read that has not started can be moved to a more
 * urgent class (a guess the engine now waits for) or withdrawn (a guess its layer did not use),
 * and the disk accounting counts the time an urgent read waited behind a speculative one.
 * (Their sharing of the disk while both run needs two threads and is not timed here.) Reads
 * are slowed with SLUICE_FAULTS delays so their order is certain on one reader thread; the shim
 * reads that variable once per process, so the checks run in a child process.
 */
import assert from "node:assert/strict";
import { sharedMemory64 } from "../wasm/mod.ts";
import { shimUnavailable } from "../io/shim.ts";

const shimWhy = shimUnavailable(sharedMemory64(1 << 16));
const READER = new URL("../io/reader.ts", import.meta.url).href;
const WASM = new URL("../wasm/mod.ts", import.meta.url).href;

/** The child: one reader thread, each read of the slow file delayed by DELAY ms. */
const CHILD = `
import { openReader, ReadPriority } from "${READER}";
import { sharedMemory64 } from "${WASM}";
const dir = Deno.makeTempDirSync();
const file = dir + "/slow.bin";
Deno.writeFileSync(file, new Uint8Array(16 * 4096).map((_, i) => i % 251));
const reader = openReader(sharedMemory64(1 << 20), { threads: 1, quiet: true, direct: false });
const h = reader.open(file);
const done = [];
const at = (name, t) => ({ name, t });
const read = (i, prio) => reader.submit(h, i * 4096, 4096, i * 4096, prio);
const t0 = reader.diskStats();
// One thread: the speculative read starts at once, the demand read queues behind it.
const spec = at("spec", read(0, ReadPriority.SPECULATIVE));
// Wait until the thread has taken it (busy time starts to count; it sleeps its delay inside).
while (!(reader.diskStats().busyMs > t0.busyMs));
const demand = at("demand", read(1, ReadPriority.DEMAND));
const late = at("late", read(2, ReadPriority.SPECULATIVE));
const promoted = at("promoted", read(3, ReadPriority.SPECULATIVE));
const dropped = at("dropped", read(4, ReadPriority.SPECULATIVE));
const out = {
  cancelRunning: reader.cancel(spec.t),
  reprioritize: reader.reprioritize(promoted.t, ReadPriority.DEMAND),
  cancel: reader.cancel(dropped.t),
  cancelTwice: reader.cancel(dropped.t),
};
let waitCancelled = "";
try { reader.wait(dropped.t); } catch (e) { waitCancelled = e.message; }
const pending = [spec, demand, late, promoted];
while (pending.length) {
  for (let i = 0; i < pending.length; i++) {
    if (reader.poll(pending[i].t)) done.push(pending.splice(i--, 1)[0].name);
  }
}
const t1 = reader.diskStats();
reader.close();
Deno.removeSync(dir, { recursive: true });
console.log(JSON.stringify({
  ...out, waitCancelled, order: done,
  busyMs: t1.busyMs - t0.busyMs, blockedMs: t1.blockedMs - t0.blockedMs, bytes: t1.bytes - t0.bytes,
}));
Deno.exit(0);
`;

const DELAY = 150;

Deno.test({
  name: "shim: reprioritize and cancel reads that have not started; blocked time is counted",
  ignore: shimWhy !== null,
  fn: async () => {
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["eval", CHILD],
      env: { SLUICE_FAULTS: `delay=${DELAY}@slow.bin`, NO_COLOR: "1" },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const err = new TextDecoder().decode(out.stderr);
    assert.equal(out.code, 0, err);
    const r = JSON.parse(new TextDecoder().decode(out.stdout).trim().split("\n").pop()!);
    assert.equal(r.cancelRunning, false, "a running read cannot be withdrawn");
    assert.equal(r.reprioritize, true);
    assert.equal(r.cancel, true);
    assert.equal(r.cancelTwice, false, "a withdrawn ticket is spent");
    assert.match(r.waitCancelled, /cancelled/);
    // The promoted guess now goes after the demand read queued before it, and before the
    // speculative read submitted before it.
    assert.deepEqual(r.order, ["spec", "demand", "promoted", "late"]);
    // Four reads of DELAY ms ran back to back. Urgent reads waited behind a speculative one from
    // the demand read's submission (just after the first read started) to the first read's end,
    // and never after.
    assert.ok(r.busyMs >= 4 * DELAY * 0.95, `busy ${r.busyMs} ms`);
    assert.ok(r.blockedMs >= DELAY / 3 && r.blockedMs <= 1.2 * DELAY, `blocked ${r.blockedMs} ms`);
    assert.equal(r.bytes, 4 * 4096);
  },
});
