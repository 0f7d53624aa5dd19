/**
 * Which checkpoint shards each pack step reads, and which shards to fetch and drop before each
 * step so that at most a bounded number are on disk at once: a shard is dropped once no later
 * step reads it, and when the bound is reached the one read again furthest in the future goes
 * (Belady's rule; it is fetched again when needed).
 *
 * @module
 */

import { basename } from "node:path";
import type { PackLayout } from "../pack/layout.ts";
import type { Checkpoint } from "../../io/safetensors.ts";

/** A pack step: the globals region, or a layer. */
export type Step = "globals" | number;

/** Matches the layer index of a tensor name (`model.layers.7.…`, `….layers.7.…`). */
const LAYER = /(?:^|\.)layers\.(\d+)\./;

/**
 * The shard files (base names) each step of the pack reads, in pack order: the globals' tensors
 * (with their scale tensors), then every tensor of each layer. Layers the model does not run
 * (e.g. DeepSeek's multi-token-prediction layer) are read by no step.
 */
export function stepShards(
  ckpt: Checkpoint,
  layout: PackLayout,
): { steps: Step[]; need: Set<string>[] } {
  const globals = new Set<string>();
  const layers = layout.layers.map(() => new Set<string>());
  const stems = [...layout.globals.items.values()].map((p) => p.src.name.replace(/weight$/, ""));
  for (const t of ckpt.tensors.values()) {
    const m = LAYER.exec(t.name);
    if (m) {
      layers[Number(m[1])]?.add(basename(t.file));
    } else if (stems.some((s) => t.name.startsWith(s))) {
      globals.add(basename(t.file));
    }
  }
  return { steps: ["globals", ...layers.map((_, l) => l)], need: [globals, ...layers] };
}

/** What to do before one step. */
export interface StepActions {
  evict: string[];
  fetch: string[];
}

/**
 * Decides, before step `i`, which of the shards in `live` to drop and which to fetch so that
 * step `i` has all it reads with at most `keep` shards on disk (more only when the step itself
 * reads more). Updates `live`.
 */
export function actionsBefore(
  i: number,
  need: Set<string>[],
  live: Set<string>,
  keep: number,
): StepActions {
  const now = need[i];
  const nextUse = (f: string) => {
    for (let j = i + 1; j < need.length; j++) if (need[j].has(f)) return j;
    return Infinity;
  };
  const evict: string[] = [];
  const drop = (f: string) => {
    live.delete(f);
    evict.push(f);
  };
  for (const f of [...live]) if (!now.has(f) && nextUse(f) === Infinity) drop(f);
  const fetch = [...now].filter((f) => !live.has(f)).sort();
  const spare = [...live].filter((f) => !now.has(f)).sort((a, b) => nextUse(b) - nextUse(a));
  while (live.size + fetch.length > keep && spare.length > 0) drop(spare.shift()!);
  for (const f of fetch) live.add(f);
  return { evict, fetch };
}

/**
 * After step `i` has what it reads: the next shard a later step reads that is not on disk, to
 * download in the background while step `i` is packed, when `live` has room under `keep`.
 * Adds it to `live`.
 */
export function prefetchAfter(
  i: number,
  need: Set<string>[],
  live: Set<string>,
  keep: number,
): string | null {
  if (live.size >= keep) return null;
  for (let j = i + 1; j < need.length; j++) {
    for (const f of [...need[j]].sort()) {
      if (!live.has(f)) {
        live.add(f);
        return f;
      }
    }
  }
  return null;
}

/** What a whole pull will hold on disk and fetch, simulated from `live` (shards already there). */
export interface ShardSchedule {
  /** Most shard bytes on disk at once. */
  peakBytes: number;
  /** Most shards on disk at once. */
  peakShards: number;
  /** Shard bytes to download (fetches counted each time). */
  fetchBytes: number;
  /** Shards fetched more than once. */
  refetched: string[];
}

/** Simulates {@link actionsBefore} and {@link prefetchAfter} over every step. */
export function simulate(
  need: Set<string>[],
  live: Set<string>,
  keep: number,
  sizes: Map<string, number>,
): ShardSchedule {
  const on = new Set(live);
  const fetched = new Map<string, number>();
  let peakBytes = 0, peakShards = 0, fetchBytes = 0;
  const bytes = () => [...on].reduce((n, f) => n + sizes.get(f)!, 0);
  for (let i = 0; i < need.length; i++) {
    const { fetch } = actionsBefore(i, need, on, keep);
    const ahead = prefetchAfter(i, need, on, keep);
    for (const f of ahead ? [...fetch, ahead] : fetch) {
      fetchBytes += sizes.get(f)!;
      fetched.set(f, (fetched.get(f) ?? 0) + 1);
    }
    peakBytes = Math.max(peakBytes, bytes());
    peakShards = Math.max(peakShards, on.size);
  }
  const refetched = [...fetched].filter(([, n]) => n > 1).map(([f]) => f);
  return { peakBytes, peakShards, fetchBytes, refetched };
}
