/**
 * The benches' memory cgroups are each run's own. Two `bench stream --cap` runs once shared the
 * cgroup `sluice-bench-stream`: both engines were charged to one limit (and the later bench
 * rewrote the earlier one's), so a Gemma-width engine whose own charge fitted its cap was
 * OOM-killed (docs/LEARNED.md). Needs root and a memory controller; skipped cleanly without.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import {
  cgroupCommand,
  createCgroup,
  limitFile,
  type MemoryCgroup,
  removeCgroup,
} from "../tools/dev/bench/cgroup.ts";
import { denoEval } from "./fixtures.ts";

const MiB = 2 ** 20;
const PREFIX = "sluice-cgroup-test";
const mine = createCgroup(PREFIX, 64 * MiB);
const skip = typeof mine === "string";
if (skip) console.warn(`cgroup test skipped: ${mine}`);

const limitOf = (cg: MemoryCgroup) =>
  Number(readFileSync(join(cg.dir, limitFile(cg.version)), "utf8").trim());

Deno.test({
  name: "cgroup: another process asking for the same prefix gets its own cgroup and limit",
  ignore: skip,
  fn: async () => {
    const cg = mine as MemoryCgroup;
    const url = new URL("../tools/dev/bench/cgroup.ts", import.meta.url).href;
    const code = `import { createCgroup, removeCgroup } from "${url}";
      const cg = createCgroup("${PREFIX}", ${128 * MiB});
      console.log(JSON.stringify(cg));
      if (typeof cg !== "string") removeCgroup(cg);`;
    const out = await denoEval(code);
    assert.equal(out.code, 0, out.stderr);
    const other = JSON.parse(out.stdout) as MemoryCgroup | string;
    assert.notEqual(typeof other, "string", String(other));
    assert.notEqual((other as MemoryCgroup).dir, cg.dir);
    // The other bench's limit did not land on this one.
    assert.equal(limitOf(cg), 64 * MiB);
  },
});

Deno.test({
  name: "cgroup: a cgroup that already holds a process is refused, not shared",
  ignore: skip,
  fn: async () => {
    const cg = mine as MemoryCgroup;
    const [cmd, args] = cgroupCommand(cg, "sleep", ["30"]);
    const sleeper = new Deno.Command(cmd, { args, stdout: "null", stderr: "null" }).spawn();
    try {
      // Wait until the shell has joined the cgroup.
      const procs = join(cg.dir, "cgroup.procs");
      for (let i = 0; i < 200 && readFileSync(procs, "utf8").trim() === ""; i++) {
        await new Promise((r) => setTimeout(r, 10));
      }
      const again = createCgroup(PREFIX, 32 * MiB);
      assert.equal(typeof again, "string");
      assert.match(again as string, /already holds processes/);
      assert.equal(limitOf(cg), 64 * MiB);
    } finally {
      sleeper.kill("SIGKILL");
      await sleeper.status;
      removeCgroup(cg);
    }
  },
});
