/**
 * `mod.ts plan`: how a budget splits between resident parts, the trunk ring and the expert
 * cache, without loading any weights.
 *
 * @module
 */
import { openContainer } from "../../engine/container.ts";
import { planInput, planMemory } from "../../engine/planner.ts";
import { formatBytes } from "../../engine/units.ts";
import { kdaLayerStateBytes } from "../../engine/kda.ts";
import { isKdaLayer } from "../../io/model_config.ts";
import { BUDGET_FLAGS, CTX_FLAG, HELP_FLAG, MODEL_FLAG, parseCommandArgs } from "./args.ts";
import { BUDGET_HELP, budgetFromArgs, recommendedBudget } from "./budget.ts";
import { resolveModel } from "./models.ts";

const HELP = `sluice plan — the memory plan of a container

Usage: deno run -A mod.ts plan -m X.sluice [--budget 6G | --preset auto] [-c 4096] [--json]

${BUDGET_HELP}
  -m, --model PATH  the container
  -c, --ctx N     context length for the KV cache (default min(model, 4096); also --ctx-size)
  --json          print the plan as JSON
`;

/** Runs the plan command; returns the exit code. */
export async function planCommand(args: string[]): Promise<number> {
  const a = parseCommandArgs("plan", args, {
    ...MODEL_FLAG,
    ...BUDGET_FLAGS,
    ...CTX_FLAG,
    json: { type: "boolean" },
    ...HELP_FLAG,
  });
  const model = a.str("model");
  if (a.bool("help") || !model) {
    console.log(HELP);
    return a.bool("help") ? 0 : 2;
  }
  const c = openContainer(await resolveModel(model));
  const cfg = c.config;
  const ctx = Math.min(a.int("ctx") ?? 4096, cfg.maxPositions);
  const input = planInput(c);

  const plan = planMemory(input, {
    budget: budgetFromArgs(a.str("budget"), a.str("preset")),
    ctx,
    maxBatch: 64,
  });
  const recommended = recommendedBudget(plan.wholeModelBytes);
  if (a.bool("json")) {
    console.log(JSON.stringify({ ...plan, ctx, recommendedBudget: recommended }));
    return 0;
  }
  const L = cfg.numLayers;
  console.log(`model          ${c.dir} (${cfg.modelType}, ${L} layers)
floor          ${formatBytes(plan.floor)}  (resident ${formatBytes(plan.fixedBytes)}: KV ${
    formatBytes(plan.kvBytes)
  } at ctx ${ctx}, scratch ${formatBytes(plan.scratchBytes)}; + one ring slot + ${
    Math.min(2 * (cfg.moe?.topK ?? 0), input.totalExperts)
  } expert records)
working set    ${formatBytes(plan.workingSetBytes)} per token
whole model    ${formatBytes(plan.wholeModelBytes)}
recommended    ${formatBytes(recommended)}
budget         ${formatBytes(plan.budget)}
trunk          ${plan.pinned}/${L} layers pinned, ${plan.ringSlots} ring slots × ${
    formatBytes(plan.ringSlotBytes)
  }  (trunk hit rate ${(100 * plan.trunkHitRate).toFixed(1)}%)
expert cache   ${plan.expertSlots} of ${input.totalExperts} records (${
    formatBytes(plan.expertBytes)
  })
arena          ${formatBytes(plan.arenaBytes)}`);
  if (cfg.kda) {
    // Hybrid models: what each layer keeps between tokens.
    const { state, conv } = kdaLayerStateBytes(cfg.kda);
    for (let l = 0; l < L; l++) {
      console.log(
        isKdaLayer(cfg, l)
          ? `layer ${String(l).padEnd(4)} KDA  recurrent state ${
            formatBytes(state)
          } + conv window ${formatBytes(conv)} (any context)`
          : `layer ${String(l).padEnd(4)} MLA  latent cache ${
            formatBytes(plan.layerStateBytes[l])
          } at ctx ${ctx}`,
      );
    }
  }
  return 0;
}
