/**
 * Test helpers: paths of the shared model fixtures, and containers packed from them once per
 * test process into a temporary directory.
 *
 * @module
 */
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import type { Model } from "../engine/model.ts";
import type { ReferenceModel } from "../engine/reference/forward.ts";
import { argmax } from "../engine/sampler.ts";
import { packCheckpoint } from "../tools/pack.ts";

/** Every Hugging Face checkpoint fixture in ../shared/models (all but gguf/). */
export const CHECKPOINT_FIXTURES: readonly string[] = [
  "stories260k",
  "stories260k-moe",
  "stories260k-moe64",
  "stories260k-qwen3moe",
  "tiny-deepseek-v3",
  "tiny-deepseek-v3-fp8",
  "tiny-kimi-linear",
];

/** Absolute path of a fixture (or a file below one) in ../shared/models. */
export function fixtureDir(name: string): string {
  return fileURLToPath(new URL(`../../shared/models/${name}`, import.meta.url));
}

/** Whether the fixture `name` is present (tests that need it are skipped when it is not). */
export function hasFixture(name: string): boolean {
  try {
    return Deno.statSync(fixtureDir(name)).isDirectory;
  } catch {
    return false;
  }
}

let tmp: string | undefined;
const packed = new Map<string, Promise<string>>();

/** A temporary directory removed when the process exits. */
export function tempDir(): string {
  if (!tmp) {
    tmp = Deno.makeTempDirSync({ prefix: "sluice-test-" });
    const dir = tmp;
    globalThis.addEventListener("unload", () => Deno.removeSync(dir, { recursive: true }));
  }
  return tmp;
}

/** The fixture `name` packed into a container (once per process). */
export function packedFixture(
  name: string,
  opts: { convert?: "f32" | "bf16" } = {},
): Promise<string> {
  const key = `${name}:${opts.convert ?? ""}`;
  let p = packed.get(key);
  if (!p) {
    const out = `${tempDir()}/${name}${opts.convert ? `-${opts.convert}` : ""}.sluice`;
    p = packCheckpoint(fixtureDir(name), out, { progress: "off", log: () => {}, ...opts }).then(
      () => out,
    );
    packed.set(key, p);
  }
  return p;
}

/** max |a − b| ÷ max |b| over two equally long arrays. */
export function maxRelDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let diff = 0, scale = 0;
  for (let i = 0; i < a.length; i++) {
    diff = Math.max(diff, Math.abs(a[i] - b[i]));
    scale = Math.max(scale, Math.abs(b[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

/**
 * Decodes `steps` positions with the engine and the float64 reference side by side: `prompt`
 * first, then the reference's greedy tokens, asserting the engine picks the same token at every
 * generated position. Returns the worst relative logit difference seen.
 */
export function decodeAgainstReference(
  model: Model,
  ref: ReferenceModel,
  prompt: number[],
  steps: number,
  name: string,
): number {
  const tokens = [...prompt];
  let worst = 0;
  for (let pos = 0; pos < steps; pos++) {
    const want = ref.forward64(tokens[pos], pos);
    const got = model.forward([tokens[pos]], pos);
    worst = Math.max(worst, maxRelDiff(got, want));
    if (pos >= tokens.length - 1) {
      const next = argmax(want);
      assert.equal(argmax(got), next, `${name}: greedy token differs at position ${pos}`);
      tokens.push(next);
    }
  }
  return worst;
}
