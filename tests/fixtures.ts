/**
 * Test helpers: paths of the shared model fixtures, and containers packed from them once per
 * test process into a temporary directory.
 *
 * @module
 */
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import type { Model } from "../engine/model.ts";
import type { ReferenceModel } from "../engine/reference/forward.ts";
import { argmax } from "../engine/sampler.ts";
import { packCheckpoint } from "../tools/pack.ts";
import "./shared_guard.ts";

/** Every Hugging Face checkpoint fixture in ../shared/models (all but gguf/). */
export const CHECKPOINT_FIXTURES: readonly string[] = [
  "stories260k",
  "stories260k-moe",
  "stories260k-moe64",
  "stories260k-qwen3moe",
  "tiny-deepseek-v3",
  "tiny-deepseek-v3-fp8",
  "tiny-glm4-moe",
  "tiny-kimi-linear",
];

/** Absolute path of a fixture (or a file below one) in ../shared/models. */
export function fixtureDir(name: string): string {
  return fileURLToPath(new URL(`../../shared/models/${name}`, import.meta.url));
}

/** Whether ../shared/models is there: tests that need it are ignored (skipped) when it is not. */
export const HAVE_FIXTURES: boolean = (() => {
  try {
    return Deno.statSync(fixtureDir("stories260k")).isDirectory;
  } catch {
    return false;
  }
})();

/** Why tests needing ../shared/models must skip (it is absent), or null when it is there. */
export function sharedMissing(): string | null {
  return existsSync(fixtureDir("README.md")) ? null : `${fixtureDir("")} is absent`;
}

/** What a finished `mod.ts` run printed. */
export interface SluiceRun {
  code: number;
  stdout: string;
  stderr: string;
}

/**
 * Runs `deno run -A mod.ts ...args` as a user would, with `stdin` as its input (else none); a
 * run that hangs is killed after `timeoutMs` (and fails on its exit code).
 */
export async function runSluice(
  args: string[],
  stdin?: string,
  timeoutMs = 120_000,
): Promise<SluiceRun> {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", fileURLToPath(new URL("../mod.ts", import.meta.url)), ...args],
    stdin: stdin === undefined ? "null" : "piped",
    stdout: "piped",
    stderr: "piped",
    env: { NO_COLOR: "1" },
  }).spawn();
  if (stdin !== undefined) {
    const w = child.stdin.getWriter();
    await w.write(new TextEncoder().encode(stdin));
    await w.close();
  }
  const watchdog = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
  const out = await child.output();
  clearTimeout(watchdog);
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

/** Whether fixture `name` is present (tests that need it are skipped when it is not). */
export function hasFixture(name: string): boolean {
  return existsSync(fixtureDir(name));
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
