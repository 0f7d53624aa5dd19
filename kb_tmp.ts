import { Arena } from "./engine/arena.ts";
import { Pool } from "./engine/pool.ts";
import { loadKernelModule } from "./wasm/mod.ts";
import { kdaBenchInputs, timeKdaKernels } from "./tools/dev/bench/kda.ts";
import { measureDramNative } from "./tools/dev/bench/dram.ts";
const MiB = 2 ** 20;
const region = 512 * MiB;
const arena = new Arena(region + 8 * MiB);
const off = arena.alloc("r", region);
const inputs = kdaBenchInputs(arena);
const mod = await loadKernelModule();
for (const t of [1, 2]) {
  const pool = await Pool.create(arena, mod, t);
  const r = timeKdaKernels(arena, pool, { off, bytes: region }, inputs, 3);
  console.log(t, "rec", r.recurrence.by_threads[0].gbps.toFixed(2), "conv", r.conv.by_threads[0].gbps.toFixed(2));
  pool.close();
}
const d = await measureDramNative({ bytes: 512 * MiB, threads: [1, 2], passes: 3 });
console.log("dram", d?.points.map((p) => p.gbps.toFixed(2)));
