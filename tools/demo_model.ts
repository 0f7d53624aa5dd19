/**
 * The demo model the CLI runs when no `--model` is given: a tiny synthetic Mixtral-like model with
 * random weights (so its text is gibberish), written by tools/synth.ts and packed once into the
 * user's cache, `$SLUICE_CACHE` or `$XDG_CACHE_HOME/sluice` or `~/.cache/sluice`.
 *
 * @module
 */

import { existsSync, mkdirSync, renameSync, rmSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { CONTAINER_VERSION } from "../io/container.ts";
import { packCheckpoint } from "./pack.ts";
import { synthCheckpoint, type SynthDims } from "./synth.ts";

/** Sizes of the demo model: about 26 MiB of bf16 weights, 93% of them experts. */
export const DEMO_DIMS: Partial<SynthDims> = {
  hidden: 256,
  layers: 4,
  experts: 16,
  topK: 2,
  expertInter: 256,
  heads: 8,
  kvHeads: 2,
  headDim: 32,
  vocab: 2048,
  maxPositions: 2048,
};

/** Seed of the demo weights. */
const DEMO_SEED = 2026;

/**
 * Names the demo container; changes with the recipe (bump the first part when DEMO_DIMS, the seed
 * or the synthesis change) and with the container format, so a stale cache is never reused.
 */
export const DEMO_VERSION = `1-c${CONTAINER_VERSION}`;

/** The cache directory of sluice. */
export function cacheDir(): string {
  const own = Deno.env.get("SLUICE_CACHE");
  if (own) return own;
  const xdg = Deno.env.get("XDG_CACHE_HOME");
  return join(xdg || join(homedir(), ".cache"), "sluice");
}

/**
 * The path of the demo container, creating it on first use. Safe when several processes start at
 * once: each builds in its own temporary directory and renames the result into place; a process
 * that loses the race uses the winner's container. Unless `quiet`, prints one line to stderr
 * saying what the model is. `dir` is the cache it lives in (default {@link cacheDir}).
 */
export async function demoModelPath(quiet: boolean, dir: string = cacheDir()): Promise<string> {
  const path = join(dir, `demo-${DEMO_VERSION}.sluice`);
  const ready = () => existsSync(join(path, "manifest.json"));
  const created = !ready();
  if (created) {
    mkdirSync(dir, { recursive: true });
    const work = Deno.makeTempDirSync({ dir, prefix: `demo-${DEMO_VERSION}.build-` });
    try {
      const ckpt = join(work, "checkpoint");
      const packed = join(work, "demo.sluice");
      const silent = { progress: "off" as const, log: () => {} };
      await synthCheckpoint({
        arch: "mixtral",
        out: ckpt,
        size: 25 * 1024 * 1024,
        overrides: DEMO_DIMS,
        seed: DEMO_SEED,
        ...silent,
      });
      await packCheckpoint(ckpt, packed, silent);
      try {
        renameSync(packed, path);
      } catch (e) {
        if (!ready()) {
          throw new Error(`cannot create the demo model ${path}: ${(e as Error).message}`);
        }
      }
    } finally {
      rmSync(work, { recursive: true, force: true });
    }
  }
  if (!quiet) {
    console.error(
      `sluice: no --model given, using the demo model ${path}${
        created ? " (just created)" : ""
      }: ` +
        `a tiny synthetic Mixtral-like model with random weights, so its text is gibberish`,
    );
  }
  return path;
}
