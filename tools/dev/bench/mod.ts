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
  /** Its options, one per line, for `bench <name> --help` (`bench compare` prints its own). */
  options?: string[];
  /** Loads the bench's module. */
  load: () => Promise<BenchModule>;
}

/** Every bench, by the name given on the command line. */
export const BENCHES: Record<string, BenchEntry> = {
  kernels: {
    summary: "DRAM bandwidth, GEMV and quantised matvec GB/s per thread count, pool dispatch " +
      "latency, O_DIRECT vs buffered disk reads, with targets",
    options: [
      "--threads N   largest thread count measured (default: all cores)",
      "--quick       smaller shapes and fewer passes",
      "--skip-disk   no O_DIRECT / buffered / dd disk rows",
      "--baseline W  also time bf16 and the paired formats with another build's kernels.wasm W,",
      "              in alternation (old against new in one run)",
      "--json        print the report as JSON",
    ],
    load: () => import("./kernels.ts"),
  },
  integrity: {
    summary: "cost of the run-time integrity checks (record header, sampled CRC, --verify) " +
      "during streaming decode",
    options: [
      "--size SIZE             synthetic model size (default 512M)",
      "--budget-fraction F     arena budget as a share of the model (default 0.3)",
      "--tokens N              decode tokens per run (default 32)",
      "--repeat N              interleaved repeats per mode (default 3)",
      "--json                  print the report as JSON",
    ],
    load: () => import("./integrity.ts"),
  },
  stream: {
    summary: "decode under a memory budget on a synthetic 2 GiB Qwen3-MoE: tok/s against the " +
      "O_DIRECT roofline, read-ahead and lookahead on/off, overlap of I/O and compute",
    options: [
      "--size SIZE            synthetic model size (default 2G)",
      "--model X.sluice       run this container instead of the synthetic model",
      "--budget-fraction F    arena budget as a share of the model (default 0.3)",
      "--tokens N             decode tokens per run (default 32)",
      "--lookahead N          guesses per layer of the extra lookahead run (default: top-k)",
      "--repeat N             interleaved cold repeats per run (default 3)",
      "--disk-gib N           size of the disk probe's test file (default 1)",
      "--no-resident          skip the whole-model-resident run",
      "--cap SIZE             run each budget configuration in a memory cgroup of SIZE (root)",
      "--ab                   only the defaults and lookahead off (more repeats per minute)",
      "--baseline TREE        also run the defaults with another source tree's engine",
      "                       (e.g. main exported), alternating, and report the ratio",
      "--json                 print the report as JSON",
    ],
    load: () => import("./stream.ts"),
  },
  pack: {
    summary: "pack MB/s of a synthetic checkpoint against the disk's own O_DIRECT sequential " +
      "write (dd), with the issue 16 target",
    options: [
      "--size SIZE   synthetic bf16 checkpoint size (default 1G)",
      "--repeat N    packs, each between two dd runs; the median is reported (default 3)",
      "--json        print the report as JSON (pack_mb_s, disk_write_mb_s)",
    ],
    load: () => import("./pack.ts"),
  },
  prefill: {
    summary: "where a long prompt's prefill spends its time, per kernel call kind (matmuls by " +
      "weight shape, attention, norms) and the rest",
    options: [
      "--model X.sluice  the container (resident)",
      "--prompt N        prompt tokens (default 8192)",
      "--chunk N         prefill chunk (default: the engine's)",
      "--at P,P,...      only the chunks starting at these positions",
      "--budget SIZE     arena budget (default: the whole model); over it experts stream",
      "--threads N       compute threads (default: all cores)",
      "--json            print the report as JSON",
    ],
    load: () => import("./prefill.ts"),
  },
  kvlend: {
    summary: "the KV cache's unwritten rows lent to the expert cache: records, hit rate and " +
      "bytes read per token with lending off and on, alternating, at a context short of its maximum",
    options: [
      "--model X.sluice  the container",
      "--budget SIZE     arena budget (over the model's size, so experts stream)",
      "--ctx N           context the KV cache is sized for (default 32768)",
      "--prompt N        prompt tokens (default 2048)",
      "--tokens N        greedy decode tokens (default 32)",
      "--repeat N        runs of each setting, alternating (default 2)",
      "--json            print the report as JSON",
    ],
    load: () => import("./kvlend.ts"),
  },
  compare: {
    summary: "sluice vs llama.cpp (node-llama-cpp, installed on demand) in RAM, over a cgroup " +
      "memory cap and in prefill, against the DRAM and O_DIRECT rooflines, with targets",
    load: () => import("./compare.ts"),
  },
  spec: {
    summary: "speculative decoding on ÷ off over a memory budget: a stories260k draft for " +
      "stories260k-moe64, prompt lookup on a repeating prompt and MTP drafts (tiny-glm4-moe's " +
      "random MTP layer: its cost), with targets",
    options: [
      "--budget-fraction F   arena budget as a share of the whole model (default 0.25)",
      "--tokens N            decode tokens per run (default 200)",
      "--repeat N            interleaved repeats; the median is kept (default 3)",
      "--cap SIZE            run every configuration in a memory cgroup of SIZE (root)",
      "--target X.sluice     target container (default: stories260k-moe64 from ../shared)",
      "--draft Y.sluice      draft container (default: stories260k from ../shared)",
      "--mtp-target Z.sluice container with MTP layers (default: tiny-glm4-moe from ../shared)",
      "--json                print the report as JSON",
    ],
    load: () => import("./spec.ts"),
  },
  grammar: {
    summary: "structured output's cost per token: XGrammar's mask over vocabularies of 2k to " +
      "201k ids, index and compile times, against a decode step of the demo model",
    options: [
      "--vocab N,N,...   vocabulary sizes (default 2048,32000,151936,201088)",
      "--steps N         masked steps per size (default 300)",
      "--json            print the report as JSON",
    ],
    load: () => import("./grammar.ts"),
  },
  doctor: {
    summary: "doctor's tok/s estimate against generate's measured decode tok/s at the same " +
      "budget (demo model, and the stories260k-moe fixture), with the 1.5× target",
    options: [
      "--repeat N   generate runs per case; the median is kept (default 3)",
      "--tokens N   decode tokens per generate run (default 100)",
      "--json       print the report as JSON",
    ],
    load: () => import("./doctor.ts"),
  },
  serve: {
    summary: "the HTTP server's decode (JSON and SSE) against Session.generate, and what the " +
      "prompt cache saves over a conversation, with targets",
    options: [
      "--model X.sluice   model to serve (default: the demo model)",
      "--tokens N         tokens per completion (default 512)",
      "--turns N          conversation turns for the prompt-cache figure (default 4)",
      "--repeat N         repeats (default 3)",
      "--threads N        compute threads (default: all cores)",
      "--json             print the report as JSON",
    ],
    load: () => import("./serve.ts"),
  },
  "serve-front": {
    summary: "/health latency during a long prefill, the in-process server against the worker " +
      "server (mod.ts serve), and what the worker costs in prefill and decode",
    options: [
      "--model X.sluice     model to serve (default: the demo model)",
      "--ctx N              context; the long prompt fills 90% of it (default 2048)",
      "--prefill-chunk N    prompt tokens per forward pass (default: the engine's)",
      "--tokens N           greedy tokens of the decode figure (default 256)",
      "--repeat N           repeats (default 3)",
      "--threads N          compute threads (default: all cores)",
      "--json               print the report as JSON",
    ],
    load: () => import("./serve_front.ts"),
  },
};

/** The usage text listing every registered bench. */
export function usage(): string {
  const width = Math.max(...Object.keys(BENCHES).map((n) => n.length));
  const lines = Object.entries(BENCHES).map(([name, b]) => `  ${name.padEnd(width)}  ${b.summary}`);
  return ["usage: deno task bench <name> [--json] [options]", "benches:", ...lines].join("\n");
}

/** The `--help` text of one bench. */
export function benchUsage(name: string, entry: BenchEntry): string {
  return [
    `usage: deno task bench ${name} [options]`,
    entry.summary,
    ...(entry.options ?? []).map((o) => `  ${o}`),
  ].join("\n");
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
  if (entry.options && (rest.includes("--help") || rest.includes("-h"))) {
    console.log(benchUsage(name, entry));
    return 0;
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
