/**
 * `deno task bench spec [--budget-fraction 0.25] [--tokens 200] [--repeat 3] [--cap SIZE]
 * [--target X.sluice --draft Y.sluice] [--mtp-target Z.sluice] [--json]`: speculative decoding
 * on ÷ off over a memory budget, both sides in one run.
 *
 * Two workloads on a trained MoE (default stories260k-moe64, packed from ../shared/models):
 * - a real draft model (default stories260k: same tokenizer) from a story opening;
 * - prompt lookup (`--spec ngram`) on a prompt that repeats its input: the target's own greedy
 *   story, then its first words again, so the continuation copies what the context holds.
 * And the model's own MTP layer (`--spec mtp`) on `--mtp-target` (default tiny-glm4-moe, whose
 * MTP weights are random: nearly nothing is accepted, so this row measures what MTP drafting
 * costs and whether the gate keeps it at ≥ 0.95; its held-open row is reported, not judged),
 * under a budget `--budget-fraction` of the way from its floor to the whole model.
 * Each workload runs plain, with speculation (its gate on: the product's default) and with the
 * gate held open (`--spec-always`). Every run is `mod.ts generate --json` in its own process
 * (inside a memory cgroup of `--cap` when given, as root), greedy with `--ignore-eos`, under a
 * budget of `--budget-fraction` × the whole-model arena, after the page cache is dropped (root);
 * repeats are interleaved (each starting one configuration later) and the median decode tok/s is
 * kept. All runs of a workload must give
 * the same ids. Targets: on ÷ off ≥ 1.3 where tokens per pass ≥ 2, never below 0.95.
 *
 * @module
 */
import { parseArgs } from "node:util";
import { existsSync, mkdirSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { loadModelConfig } from "../../../engine/config.ts";
import { openContainer } from "../../../engine/container.ts";
import { planRun } from "../../../engine/model.ts";
import { dropPageCache } from "../../../io/disk_probe.ts";
import { packCheckpoint } from "../../pack.ts";
import { parseSize } from "../../synth.ts";
import { cgroupCommand, createCgroup, type MemoryCgroup, removeCgroup } from "./cgroup.ts";
import { median } from "./alternate.ts";

const MOD = fileURLToPath(new URL("../../../mod.ts", import.meta.url));
/** The shared fixtures folder (../shared/models beside the repo). */
export const SHARED = fileURLToPath(new URL("../../../../shared/models/", import.meta.url));

/** One configuration's median run. */
export interface SpecRun {
  workload: string;
  label: string;
  tok_s: number;
  tokens_per_pass: number;
  draft_tokens: number;
  draft_accepted: number;
  draft_gated_steps: number;
  io_wait_ms_per_token: number;
  bytes_per_token: number;
}

/** What one `generate --json` child reported. */
interface ChildStats {
  prompt: number[];
  ids: number[];
  stats: Record<string, number>;
}

/** A fixture of {@link SHARED} packed once under the bench cache `cacheDir`. */
export async function packed(
  cacheDir: string,
  name: string,
  log: (s: string) => void,
): Promise<string> {
  const out = `${cacheDir}/${name}.sluice`;
  // A cached container packed before MTP layers were kept is packed again.
  const stale = existsSync(`${out}/manifest.json`) &&
    loadModelConfig(`${SHARED}${name}`).mtp !== undefined && !openContainer(out).config.mtp;
  if (!existsSync(`${out}/manifest.json`) || stale) {
    log(`bench: packing ${name}`);
    mkdirSync(cacheDir, { recursive: true });
    await packCheckpoint(`${SHARED}${name}`, out, { progress: "off", force: true, log: () => {} });
  }
  return out;
}

/** Runs `mod.ts generate --json args` (in `cap` when given) and returns its ids and stats. */
async function generate(args: string[], cap: MemoryCgroup | null): Promise<ChildStats> {
  const all = ["run", "-A", MOD, "generate", "--json", "--quiet", ...args];
  const [cmd, argv] = cap ? cgroupCommand(cap, Deno.execPath(), all) : [Deno.execPath(), all];
  dropPageCache();
  const out = await new Deno.Command(cmd, { args: argv, stdout: "piped", stderr: "piped" })
    .output();
  const text = new TextDecoder().decode(out.stdout).trim();
  if (out.code !== 0) {
    throw new Error(
      `generate ${args.join(" ")} exited ${out.code}: ${new TextDecoder().decode(out.stderr)}`,
    );
  }
  const j = JSON.parse(text.split("\n").at(-1)!);
  return { prompt: j.prompt_ids, ids: j.generated_ids, stats: j.stats };
}

/** Runs the bench with command-line `args`. */
export async function main(args: string[]): Promise<void> {
  const { values: v } = parseArgs({
    args,
    options: {
      target: { type: "string" },
      draft: { type: "string" },
      "mtp-target": { type: "string" },
      "budget-fraction": { type: "string", default: "0.25" },
      tokens: { type: "string", default: "200" },
      repeat: { type: "string", default: "3" },
      cap: { type: "string" },
      json: { type: "boolean", default: false },
    },
  });
  const log = (s: string) => console.error(s);
  const cacheDir = Deno.env.get("SLUICE_CACHE") ?? "/tmp/sluice-bench";
  const target = v.target ?? await packed(cacheDir, "stories260k-moe64", log);
  const draft = v.draft ?? await packed(cacheDir, "stories260k", log);
  const mtpTarget = v["mtp-target"] ?? await packed(cacheDir, "tiny-glm4-moe", log);
  const tokens = Number(v.tokens), repeat = Number(v.repeat);
  const fraction = Number(v["budget-fraction"]);
  if (!(tokens >= 8 && repeat >= 1 && fraction > 0)) {
    throw new Error("--tokens ≥ 8, --repeat ≥ 1 and --budget-fraction > 0 expected");
  }
  const ctx = 1024;
  const whole = planRun(openContainer(target), { ctx }).plan.wholeModelBytes;
  const budget = Math.floor(fraction * whole);
  // The tiny MTP model's floor is most of it: its budget is `fraction` of the way from the floor.
  const mtpPlan = planRun(openContainer(mtpTarget), { ctx, mtp: true }).plan;
  const mtpBudget = mtpPlan.floor + fraction * (mtpPlan.wholeModelBytes - mtpPlan.floor);
  let cap: MemoryCgroup | null = null;
  if (v.cap) {
    const cg = createCgroup("sluice-bench-spec", parseSize(v.cap));
    if (typeof cg === "string") throw new Error(`--cap: ${cg}`);
    cap = cg;
  }
  const baseOf = (
    model: string,
    bytes: number,
  ) => ["--model", model, "--ignore-eos", "--ctx", String(ctx), "--budget", `${bytes}`];
  const base = baseOf(target, budget);
  const mtpBase = baseOf(mtpTarget, Math.floor(mtpBudget));
  try {
    // The repeating prompt: the target's own greedy story, then its first words again.
    const story = await generate([...base, "-p", "Once upon a time", "-n", "120"], cap);
    const repeating = [...story.prompt, ...story.ids, ...story.prompt];
    const workloads = [
      {
        name: "draft stories260k",
        args: [...base, "-p", "Once upon a time", "-n", String(tokens)],
        on: ["--draft", draft],
        trained: true,
      },
      {
        name: "ngram, repeating prompt",
        args: [...base, "--prompt-ids", repeating.join(","), "-n", String(tokens)],
        on: ["--spec", "ngram"],
        trained: true,
      },
      {
        name: "mtp, random MTP weights",
        args: [...mtpBase, "-p", "Once upon a time", "-n", String(tokens)],
        on: ["--spec", "mtp"],
        trained: false,
      },
    ];
    const configs = workloads.flatMap((w) => [
      { w, label: "off", extra: [] as string[] },
      { w, label: "on", extra: w.on },
      { w, label: "on, gate held open", extra: [...w.on, "--spec-always"] },
    ]);
    const results = new Map<string, ChildStats[]>();
    for (let r = 0; r < repeat; r++) {
      // Each repeat starts one configuration later, so no side always runs first.
      const order = configs.map((_, i) => configs[(i + r) % configs.length]);
      for (const c of order) {
        log(`bench spec: ${c.w.name}, ${c.label} (${r + 1}/${repeat})`);
        const run = await generate([...c.w.args, ...c.extra], cap);
        const key = `${c.w.name}|${c.label}`;
        results.set(key, [...(results.get(key) ?? []), run]);
      }
    }
    const rows: SpecRun[] = configs.map((c) => {
      const runs = results.get(`${c.w.name}|${c.label}`)!;
      const first = results.get(`${c.w.name}|off`)![0].ids.join(",");
      if (runs.some((x) => x.ids.join(",") !== first)) {
        throw new Error(`${c.w.name}, ${c.label}: the ids differ from plain decoding`);
      }
      const s = runs.map((x) => x.stats);
      const per = (k: string) => median(s.map((x) => x[k] / Math.max(1, x.generated_tokens)));
      return {
        workload: c.w.name,
        label: c.label,
        tok_s: median(s.map((x) => x.generate_tok_s)),
        tokens_per_pass: median(s.map((x) => x.tokens_per_pass)),
        draft_tokens: median(s.map((x) => x.draft_tokens)),
        draft_accepted: median(s.map((x) => x.draft_accepted)),
        draft_gated_steps: median(s.map((x) => x.draft_gated_steps)),
        io_wait_ms_per_token: per("io_wait_ms"),
        bytes_per_token: median(s.map((x) => x.bytes_read_per_token)),
      };
    });
    // Held open on an untrained MTP layer, drafting can only cost: reported, not judged.
    const judged = (r: SpecRun) =>
      r.label === "on" ||
      (r.label !== "off" && workloads.find((w) => w.name === r.workload)!.trained);
    const targets = rows.filter(judged).map((r) => {
      const off = rows.find((x) => x.workload === r.workload && x.label === "off")!;
      const ratio = r.tok_s / off.tok_s;
      const want = r.tokens_per_pass >= 2 ? 1.3 : 0.95;
      return { name: `${r.workload}, ${r.label} ÷ off`, ratio, want, pass: ratio >= want };
    });
    const report = {
      target,
      draft,
      mtp_target: mtpTarget,
      mtp_budget_bytes: Math.floor(mtpBudget),
      budget_bytes: budget,
      whole_model_bytes: whole,
      cap_bytes: cap?.limitBytes ?? null,
      tokens,
      repeat,
      load_average: Deno.loadavg(),
      rows,
      targets,
    };
    if (v.json) {
      console.log(JSON.stringify(report, null, 2));
      return;
    }
    console.log(
      `bench spec: ${target} under ${(budget / 2 ** 20).toFixed(1)} MiB ` +
        `(${(whole / 2 ** 20).toFixed(1)} MiB whole)${
          cap ? `, cap ${(cap.limitBytes / 2 ** 20).toFixed(0)} MiB` : ""
        }; MTP rows: ${mtpTarget} under ${(mtpBudget / 2 ** 20).toFixed(1)} MiB; ${tokens} ` +
        `tokens, median of ${repeat}; load ${Deno.loadavg().map((x) => x.toFixed(1)).join(" ")}`,
    );
    for (const r of rows) {
      console.log(
        `  ${`${r.workload}, ${r.label}`.padEnd(44)} ${r.tok_s.toFixed(1).padStart(7)} tok/s  ` +
          `${r.tokens_per_pass.toFixed(2)} tok/pass  ${r.draft_accepted}/${r.draft_tokens} ` +
          `accepted  ${r.draft_gated_steps} gated  io ${
            r.io_wait_ms_per_token.toFixed(2)
          } ms/tok  ` +
          `${(r.bytes_per_token / 2 ** 20).toFixed(2)} MiB/tok`,
      );
    }
    for (const t of targets) {
      console.log(
        `  ${t.name.padEnd(44)} ${t.ratio.toFixed(2)}x (target ≥ ${t.want}) ${
          t.pass ? "PASS" : "FAIL"
        }`,
      );
    }
  } finally {
    if (cap) removeCgroup(cap);
  }
}
