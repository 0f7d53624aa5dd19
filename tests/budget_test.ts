/**
 * The warning when an arena and what the process needs beyond it would pass a memory limit, and
 * the tokenizer estimate behind it, measured in a process of its own.
 *
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { beyondArenaBytes, memoryLimitWarning } from "../tools/cli/budget.ts";
import { writeSynthTokenizer } from "../tools/synth/tokenizer.ts";
import { openContainer } from "../engine/container.ts";
import { formatBytes } from "../engine/units.ts";
import { demoModelPath } from "../tools/demo_model.ts";
import { denoEval, runSluice, tempDir } from "./fixtures.ts";

const MiB = 2 ** 20, GiB = 2 ** 30;

Deno.test("memory limit: warns when arena + runtime + tokenizer pass it, naming a budget that fits", () => {
  // Gemma 4's case: a 1.75 GiB arena, 262,144 vocabulary entries, a 1.98 GiB cgroup.
  const w = memoryLimitWarning(1.75 * GiB, 262144, 1.98 * GiB);
  assert.ok(w !== null);
  assert.match(w, /tokenizer of 262144 entries/);
  const m = w.match(/--budget (\d+)M or less/);
  assert.ok(m, w);
  const { runtime, tokenizer } = beyondArenaBytes(262144);
  const budget = Number(m[1]) * MiB;
  assert.ok(budget + runtime + tokenizer <= 1.98 * GiB);
  assert.ok(budget + MiB + runtime + tokenizer > 1.98 * GiB);
  assert.equal(memoryLimitWarning(budget, 262144, 1.98 * GiB), null);
  assert.equal(memoryLimitWarning(1.75 * GiB, 262144, null), null);
  assert.match(memoryLimitWarning(GiB, 262144, 200 * MiB)!, /leaves no room for an arena/);
});

Deno.test("memory limit: the tokenizer estimate covers what loading one takes", async () => {
  const dir = join(tempDir(), "tok");
  Deno.mkdirSync(dir, { recursive: true });
  const entries = 65536;
  writeSynthTokenizer(dir, entries);
  const tokenizerUrl = new URL("../engine/tokenizer.ts", import.meta.url).href;
  const r = await denoEval(
    `import { loadTokenizer } from "${tokenizerUrl}";
     const before = Deno.memoryUsage().rss;
     const t = await loadTokenizer(${JSON.stringify(dir)});
     t.encode("once upon a time");
     console.log(Deno.memoryUsage().rss - before);`,
  );
  assert.equal(r.code, 0, r.stderr);
  const grew = Number(r.stdout.trim());
  const { tokenizer } = beyondArenaBytes(entries);
  // It must take something (else the measure is broken) and no more than the estimate.
  assert.ok(grew > tokenizer / 4 && grew <= tokenizer, `grew ${grew}, estimate ${tokenizer}`);
});

Deno.test("plan names what the process needs beyond the arena, and the least a cgroup must hold", async () => {
  const model = await demoModelPath(true);
  const r = await runSluice(["plan", "-m", model, "--budget", "16M"]);
  assert.equal(r.code, 0, r.stderr);
  const vocab = openContainer(model).config.vocabSize;
  const { runtime, tokenizer } = beyondArenaBytes(vocab);
  const arena = JSON.parse(
    (await runSluice(["plan", "-m", model, "--budget", "16M", "--json"])).stdout,
  ).arenaBytes;
  const line = r.stdout.split("\n").find((l) => l.startsWith("beyond arena"));
  assert.ok(line, r.stdout);
  assert.ok(line.includes(`about ${formatBytes(runtime + tokenizer)}`), line);
  assert.ok(line.includes(`tokenizer of ${vocab} entries`), line);
  assert.ok(line.endsWith(`at least ${formatBytes(arena + runtime + tokenizer)}`), line);
});
