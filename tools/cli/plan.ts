/**
 * `mod.ts plan`: how a budget splits between resident parts, the trunk ring and the expert
 * cache, without loading any weights.
 *
 * @module
 */
import { openContainer } from "../../engine/container.ts";
import { checkMtp, planRun, runFloor } from "../../engine/model.ts";
import { parseSpec } from "../../engine/speculate.ts";
import { mixerPartOf } from "../../engine/parts/mod.ts";
import { formatBytes } from "../../engine/units.ts";
import { GROWTH_ROWS } from "../../engine/kv_lending.ts";
import { mixerOf } from "../../io/model_config.ts";
import {
  BUDGET_FLAGS,
  CTX_FLAG,
  HELP_FLAG,
  MODEL_FLAG,
  PARALLEL_FLAG,
  parallelFromArgs,
  parseCommandArgs,
} from "./args.ts";
import {
  beyondArenaBytes,
  BUDGET_HELP,
  budgetFromArgs,
  memoryLimitWarning,
  recommendedBudget,
} from "./budget.ts";
import { resolveModel } from "./models.ts";

const HELP = `sluice plan — the memory plan of a container, as generate, chat and serve plan it

Usage: deno run -A mod.ts plan -m X.sluice [--budget 6G | --preset auto] [-c 4096] [-np N]
       [--spec mtp] [--no-kv-lend] [--json]

${BUDGET_HELP}
  -m, --model PATH      the container
  -c, --ctx N           context length for the KV cache (default min(model, 4096); also --ctx-size)
  --prefill-chunk N     prompt tokens per forward pass, 1..512 (default 128, 512 at -c 8192 or
                        more; also --batch-size)
  --parallel N|auto     sequences decoding together, each with its own KV cache, as serve
                        --parallel (default 1; auto: what serve picks for the budget; also -np)
  --spec mtp            plan the multi-token-prediction layer generate --spec mtp runs (its
                        experts; its KV cache, scratch and run in expert slots lent while it drafts)
  --no-kv-lend          plan no lending of the KV cache's unwritten rows to the expert cache
  --json                print the plan as JSON
`;

/** Runs the plan command; returns the exit code. */
export async function planCommand(args: string[]): Promise<number> {
  const a = parseCommandArgs("plan", args, {
    ...MODEL_FLAG,
    ...BUDGET_FLAGS,
    ...CTX_FLAG,
    "prefill-chunk": { type: "string", aliases: ["batch-size"] },
    ...PARALLEL_FLAG,
    spec: { type: "string" },
    "no-kv-lend": { type: "boolean" },
    json: { type: "boolean" },
    ...HELP_FLAG,
  });
  const model = a.str("model");
  if (a.bool("help") || !model) {
    console.log(HELP);
    return a.bool("help") ? 0 : 2;
  }
  const spec = a.str("spec");
  // Only the MTP drafter changes the plan (prompt lookup holds nothing; a draft model has its own).
  if (spec !== undefined && spec !== "mtp") parseSpec(spec);
  const c = openContainer(await resolveModel(model));
  const cfg = c.config;
  if (spec === "mtp") checkMtp(model, c);
  const opts = {
    ctx: a.int("ctx"),
    prefillChunk: a.int("prefill-chunk"),
    parallel: parallelFromArgs(a),
    mtp: spec === "mtp",
    lendKv: !a.bool("no-kv-lend"),
  };
  const floor = runFloor(c, opts);
  const { plan, lookahead, ctx, lookaheadWeighing } = planRun(c, {
    ...opts,
    budget: budgetFromArgs(a.str("budget"), a.str("preset")),
  });
  const recommended = recommendedBudget(plan.wholeModelBytes);
  if (a.bool("json")) {
    console.log(
      JSON.stringify({
        ...plan,
        floor,
        ctx,
        lookahead,
        lookaheadWeighing,
        recommendedBudget: recommended,
      }),
    );
    return 0;
  }
  const L = cfg.numLayers;
  console.log(`model          ${c.dir} (${cfg.modelType}, ${L} layers)
floor          ${formatBytes(floor)}  (resident ${formatBytes(plan.fixedBytes)}: KV ${
    formatBytes(plan.kvBytes)
  } at ctx ${ctx}${plan.sequences > 1 ? ` for ${plan.sequences} sequences` : ""}, scratch ${
    formatBytes(plan.scratchBytes)
  }; + one ring slot + ${Math.min(2 * (cfg.moe?.topK ?? 0), plan.totalExperts)} expert records${
    plan.mtpLoanSlots > 0 ? ` + ${plan.mtpLoanSlots} to lend the MTP layer` : ""
  })
working set    ${formatBytes(plan.workingSetBytes)} per token
whole model    ${formatBytes(plan.wholeModelBytes)}
recommended    ${formatBytes(recommended)}
budget         ${formatBytes(plan.budget)}
trunk          ${plan.pinned}/${plan.trunkLayers} layers pinned, ${plan.ringSlots} ring slots × ${
    formatBytes(plan.ringSlotBytes)
  }  (trunk hit rate ${(100 * plan.trunkHitRate).toFixed(1)}%)
expert cache   ${plan.expertSlots} of ${plan.totalExperts} records (${
    formatBytes(plan.expertBytes)
  })${lookahead > 0 ? `; routers resident for the lookahead` : ""}${
    plan.lentSlots > 0
      ? `
lent by KV     ${plan.lentSlots} more records (${formatBytes(plan.lentBytes)} of the KV cache's ${
        formatBytes(plan.kvBytes)
      }) while the context is empty; taken back ${GROWTH_ROWS} rows at a time as it grows`
      : ""
  }
arena          ${formatBytes(plan.arenaBytes)}`);
  if (plan.mtpRoomBytes > 0) {
    // --spec mtp: the MTP layer's state, scratch and run, lent by the expert cache while it drafts.
    console.log(
      `mtp layer      ${formatBytes(plan.mtpRoomBytes)} (state, scratch, its run)${
        plan.mtpLoanSlots > 0
          ? `: the expert cache lends it ${plan.mtpLoanSlots} slots while it drafts, and takes ` +
            `them back while the gate holds drafting off`
          : ", resident"
      }`,
    );
  }
  const w = lookaheadWeighing;
  if (w) {
    // The default lookahead's routers against what they displace, per token (engine/planner.ts).
    console.log(
      `lookahead      ${w.on ? "on" : "off"}: ${w.guesses} guess per MoE layer would hide ≈ ${
        formatBytes(w.hiddenBytes)
      } of expert reads per token; its routers (${formatBytes(w.routerBytes)}) displace ${
        formatBytes(w.displacedBytes)
      } of reads per token`,
    );
  }
  const kinds = new Set(Array.from({ length: L }, (_, l) => mixerOf(cfg, l)));
  const grows = Array.from({ length: L }, (_, l) => {
    const part = mixerPartOf(cfg, l);
    return part.stateBytes(cfg, l, 2 * ctx, 1) !== part.stateBytes(cfg, l, ctx, 1);
  });
  if (kinds.size > 1 || new Set(grows).size > 1) {
    // Hybrid and sliding-window models: what each layer keeps between tokens.
    const windows = cfg.attention?.windows ?? [];
    for (let l = 0; l < L; l++) {
      const window = windows[l] ? `window ${windows[l]}, ` : "";
      console.log(
        `layer ${String(l).padEnd(4)} ${mixerOf(cfg, l).toUpperCase().padEnd(4)} state ${
          formatBytes(plan.layerStateBytes[l])
        } ${grows[l] ? `at ctx ${ctx}` : `(${window}any context)`}`,
      );
    }
  }
  const beyond = beyondArenaBytes(cfg.vocabSize);
  console.log(
    `beyond arena   about ${formatBytes(beyond.runtime + beyond.tokenizer)} (runtime, and the ` +
      `tokenizer of ${cfg.vocabSize} entries): a cgroup or container needs at least ` +
      formatBytes(plan.arenaBytes + beyond.runtime + beyond.tokenizer),
  );
  const warning = memoryLimitWarning(plan.arenaBytes, cfg.vocabSize);
  if (warning) console.log(`warning: ${warning}`);
  return 0;
}
