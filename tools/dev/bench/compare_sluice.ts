/**
 * The sluice side of `deno task bench compare`, run as its own process so that the bench can put
 * it in a memory cgroup: `deno run -A tools/dev/bench/compare_sluice.ts JOB_JSON`. It opens the
 * container, optionally warms up, runs one greedy generation from the given prompt ids and prints
 * one {@link EngineRun} JSON line on stdout.
 *
 * @module
 */
import { Model } from "../../../engine/model.ts";
import { Session } from "../../../engine/session.ts";
import type { EngineJob, EngineRun } from "./compare_report.ts";

/** Runs `job` with sluice and returns the measured figures. */
export async function runSluice(job: EngineJob): Promise<EngineRun> {
  const t0 = performance.now();
  const session = await Session.open(job.model, {
    threads: job.threads,
    budget: job.budget ?? undefined,
    // The context llama.cpp's side is given: long prompts need more than the default.
    ctx: job.promptIds.length + job.decodeTokens + 16,
    quiet: true,
  });
  const loadMs = performance.now() - t0;
  try {
    if (job.warmup) {
      for await (const _ of session.generate(job.promptIds.slice(0, 8), { maxTokens: 4 })) {
        // Draining is the point: every weight is touched once before timing.
      }
    }
    const ids: number[] = [];
    let tFirst = 0, tLast = 0, bytesFirst = 0, waitFirst = 0;
    // The limit is on decode: a long prompt's prefill does not count against it.
    let deadline = Infinity;
    let stoppedEarly = false;
    for await (
      const tok of session.generate(job.promptIds, {
        maxTokens: job.decodeTokens + 1,
        ignoreEos: true,
        temperature: 0,
      })
    ) {
      tLast = performance.now();
      ids.push(tok.id);
      if (ids.length === 1) {
        tFirst = tLast;
        deadline = tFirst + job.maxSeconds * 1000;
        const s = session.stats();
        bytesFirst = s.bytes_read;
        waitFirst = s.io_wait_ms;
      }
      if (tLast > deadline && ids.length < job.decodeTokens + 1) {
        stoppedEarly = true;
        break;
      }
    }
    const s = session.stats();
    const steps = ids.length - 1;
    return {
      engine: "sluice",
      prompt_tokens: job.promptIds.length,
      prefill_tok_s: s.prompt_tok_s,
      decode_tokens: steps,
      decode_tok_s: steps > 0 ? (steps * 1000) / (tLast - tFirst) : 0,
      ids,
      load_ms: loadMs,
      decode_bytes_read_per_token: steps > 0 ? (s.bytes_read - bytesFirst) / steps : null,
      decode_io_wait_ms: s.io_wait_ms - waitFirst,
      peak_rss_bytes: s.peak_rss_bytes,
      threads: s.threads,
      stopped_early: stoppedEarly,
      notes: `reader ${s.reader}, budget ${s.budget_bytes}, arena ${s.arena_bytes}, ` +
        `expert hit rate ${s.expert_hit_rate.toFixed(3)}`,
    };
  } finally {
    session.close();
  }
}

/**
 * sluice's logit of token `a` less its logit of token `b` after `ids` (the prompt and the
 * generated ids both engines agreed on): how close the call was where the runs' ids part.
 * Untimed; the same logits as the run's, since no placement or chunking changes them.
 */
export async function logitGap(
  model: string,
  ids: readonly number[],
  a: number,
  b: number,
  threads: number,
): Promise<number> {
  const m = await Model.open(model, { quiet: true, threads, ctx: ids.length + 1 });
  try {
    let logits: Float32Array = new Float32Array(0);
    for (let pos = 0; pos < ids.length; pos += m.prefillChunk) {
      logits = m.forward(ids.slice(pos, pos + m.prefillChunk), pos);
    }
    return logits[a] - logits[b];
  } finally {
    m.close();
  }
}

if (import.meta.main) {
  const job = JSON.parse(Deno.args[0]) as EngineJob;
  console.log(JSON.stringify(await runSluice(job)));
  // Pool workers keep the event loop alive after close on some paths; the result is out.
  Deno.exit(0);
}
