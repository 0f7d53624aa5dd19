/**
 * sluice: run Mixture-of-Experts language models larger than RAM on one CPU machine, streaming
 * from NVMe only the expert weights each token needs.
 *
 * ```ts
 * import { open } from "./mod.ts";
 * const session = await open("story.sluice", { budget: 512 * 2 ** 20 });
 * for await (const t of session.generate("Once upon a time", { maxTokens: 50 })) {
 *   await Deno.stdout.write(new TextEncoder().encode(t.text));
 * }
 * session.close();
 * ```
 *
 * Run as a program, it is the command line: `deno run -A mod.ts <command>` (`--help` lists them:
 * generate, plan, pack, inspect, split-banks).
 *
 * @module
 */
import type { SessionOptions } from "./engine/session.ts";
import { Session } from "./engine/session.ts";

export type { RunOptions } from "./engine/model.ts";
export { Model } from "./engine/model.ts";
export type { MemoryPlan } from "./engine/planner.ts";
export type { ModelConfig } from "./io/model_config.ts";
export { Session } from "./engine/session.ts";
export { Batch } from "./engine/batch.ts";
export type { BatchTotals } from "./engine/batch.ts";
export type { GeneratedToken, GenerateOptions, SessionOptions } from "./engine/session.ts";
export type { SpecOptions } from "./engine/speculate.ts";
export { loadSession, saveSession } from "./engine/session_state.ts";
export type { SessionHeader } from "./engine/session_state.ts";
export type { RunStats } from "./engine/stats.ts";
export { formatStats } from "./engine/stats.ts";
export type { Tokenizer } from "./engine/tokenizer.ts";
export { renderChat } from "./engine/chat.ts";
export type { ChatMessage } from "./engine/chat.ts";
export { packCheckpoint } from "./tools/pack.ts";
export type { PackOptions, PackResult } from "./tools/pack.ts";

/** Opens a `.sluice` container with its tokenizer, ready to generate. Call `close()` when done. */
export function open(path: string, opts: SessionOptions = {}): Promise<Session> {
  return Session.open(path, opts);
}

if (import.meta.main) {
  const { main } = await import("./tools/cli/mod.ts");
  Deno.exit(await main(Deno.args));
}
