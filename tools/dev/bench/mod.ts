/**
 * The bench dispatcher: `deno task bench <name> [--json] [...]`. Each bench is a module with a
 * `main(args)`; it is loaded only when chosen, so one bench's imports never slow another.
 * To add a bench, add one row to {@link BENCHES}.
 *
 * @module
 */

/** A bench module: runs with the arguments after its name. */
export interface BenchModule {
  main(args: string[]): Promise<void>;
}

/** One registered bench. */
export interface BenchEntry {
  /** One line for the list of benches. */
  summary: string;
  /** Loads the bench's module. */
  load: () => Promise<BenchModule>;
}

/** Every bench, by the name given on the command line. */
export const BENCHES: Record<string, BenchEntry> = {
  kernels: {
    summary: "DRAM bandwidth, GEMV and quantised matvec GB/s per thread count, pool dispatch " +
      "latency, O_DIRECT vs buffered disk reads, with targets",
    load: () => import("./kernels.ts"),
  },
  stream: {
    summary: "decode under a memory budget on a synthetic 2 GiB Qwen3-MoE: tok/s against the " +
      "O_DIRECT roofline, read-ahead and lookahead on/off, overlap of I/O and compute",
    load: () => import("./stream.ts"),
  },
  compare: {
    summary: "sluice vs llama.cpp (node-llama-cpp, installed on demand) in RAM, over a cgroup " +
      "memory cap and in prefill, against the DRAM and O_DIRECT rooflines, with targets",
    load: () => import("./compare.ts"),
  },
};

/** The usage text listing every registered bench. */
export function usage(): string {
  const width = Math.max(...Object.keys(BENCHES).map((n) => n.length));
  const lines = Object.entries(BENCHES).map(([name, b]) => `  ${name.padEnd(width)}  ${b.summary}`);
  return ["usage: deno task bench <name> [--json] [options]", "benches:", ...lines].join("\n");
}

/** Runs the bench named by `args[0]` with the rest; returns the process exit code. */
export async function runBench(args: string[]): Promise<number> {
  const [name, ...rest] = args;
  if (name === "--help" || name === "-h" || name === "help") {
    console.log(usage());
    return 0;
  }
  const entry = name === undefined ? undefined : BENCHES[name];
  if (entry === undefined) {
    console.error(name === undefined ? "bench: no bench named" : `bench: unknown bench "${name}"`);
    console.error(usage());
    return 2;
  }
  try {
    await (await entry.load()).main(rest);
  } catch (e) {
    if (Deno.env.get("SLUICE_DEBUG")) console.error(e);
    console.error(`bench ${name}: ${e instanceof Error ? e.message : String(e)}`);
    return 1;
  }
  return 0;
}

if (import.meta.main) {
  Deno.exit(await runBench(Deno.args));
}
