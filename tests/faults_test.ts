/**
 * Fault injection in the I/O shim (SLUICE_FAULTS, io/shim.c): an EIO, an ENOSPC or a short read
 * on a chosen file and offset surfaces as one error line naming the layer or expert, the file and
 * the offset — never as different tokens — and a slow disk changes only the speed.
 */
import assert from "node:assert/strict";
import { sharedMemory64 } from "../wasm/mod.ts";
import { openContainer } from "../engine/container.ts";
import { shimUnavailable } from "../io/shim.ts";
import { budgetAboveFloor, HAVE_FIXTURES, packedFixture } from "./fixtures.ts";

const MOD = new URL("../mod.ts", import.meta.url).pathname;
const shimWhy = HAVE_FIXTURES ? shimUnavailable(sharedMemory64(1 << 16)) : "no ../shared";
/** A budget under which stories260k-moe streams some trunk layers and most experts. */
const BUDGET_OVER_FLOOR = 0.05 * 2 ** 20;

async function generate(model: string, faults: string | null) {
  const env: Record<string, string> = { NO_COLOR: "1" };
  if (faults !== null) env.SLUICE_FAULTS = faults;
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      MOD,
      "generate",
      "--model",
      model,
      "--prompt",
      "Once upon a time",
      "-n",
      "16",
      "--json",
      "--budget",
      String(await budgetAboveFloor(model, BUDGET_OVER_FLOOR)),
      "--io",
      "direct",
      "--no-hot-list",
    ],
    env,
    stdin: "null",
  }).output();
  const dec = new TextDecoder();
  const stdout = dec.decode(out.stdout).trim();
  return {
    code: out.code,
    stderr: dec.decode(out.stderr),
    ids: out.code === 0 ? JSON.parse(stdout).generated_ids as number[] : null,
    stdout,
  };
}

Deno.test({
  name: "injected EIO, ENOSPC and short reads name the layer or expert, file and offset",
  ignore: shimWhy !== null,
  fn: async () => {
    const model = await packedFixture("stories260k-moe");
    const c = openContainer(model);
    const base = await generate(model, null);
    assert.equal(base.code, 0, base.stderr);
    assert.ok(base.ids!.length > 0);
    const layer3 = c.manifest.trunk.layers[3].offset;
    const stride = c.manifest.experts[2]!.stride;
    const cases: [string, RegExp][] = [
      [
        "eio@experts-L2.bin",
        /expert \d+ of layer 2: read of .*experts-L2\.bin at offset \d+, length \d+ failed: errno 5/,
      ],
      [
        `enospc@trunk.bin:${layer3 + 8192}`,
        new RegExp(`trunk layer 3: read of .*trunk\\.bin at offset ${layer3}, .*errno 28`),
      ],
      [`short@experts-L1.bin:${3 * stride}`, /experts-L1\.bin/],
      ["eio@trunk.bin:0", /globals region: read of .*trunk\.bin at offset 0, .*errno 5/],
    ];
    for (const [faults, says] of cases) {
      const r = await generate(model, faults);
      assert.equal(r.code, 1, `${faults}: exit ${r.code}\n${r.stderr}`);
      assert.match(r.stderr, says, faults);
      assert.equal(r.stdout, "", `${faults}: no tokens may be printed on a failed read`);
      assert.equal(
        r.stderr.trim().split("\n").filter((l) => l.startsWith("sluice generate:")).length,
        1,
      );
    }
  },
});

Deno.test({
  name: "a slow disk (injected delays) changes the speed only, never the tokens",
  ignore: shimWhy !== null,
  fn: async () => {
    const model = await packedFixture("stories260k-moe");
    const base = await generate(model, null);
    const slow = await generate(model, "delay=3@experts-L;delay=5@trunk.bin");
    assert.equal(slow.code, 0, slow.stderr);
    assert.deepEqual(slow.ids, base.ids);
  },
});
