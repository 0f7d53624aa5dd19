/**
 * Lets the README's test command pass on a bare clone: when ../shared (the model fixtures and
 * routing traces) is absent, every test whose name or body refers to it is registered as ignored
 * (Deno's own skip, counted as such), so it is skipped, not failed. With ../shared present (as in
 * CI) nothing changes. Imported for its effect by every test module that reads ../shared.
 *
 * @module
 */
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { noteSkip } from "./skips.ts";

/** Whether ../shared is beside the repository. */
export const HAVE_SHARED: boolean = existsSync(
  fileURLToPath(new URL("../../shared/models/README.md", import.meta.url)),
);

/** The reason counted for the tests skipped here (tests/skips.ts). */
const SHARED_REASON = "need ../shared/models";

/** What marks a test as reading ../shared: its helpers, its paths, its fixtures' names. */
const NEEDS_SHARED =
  /fixtureDir|packedFixture|CHECKPOINT_FIXTURES|FIXTURES\b|assertNearReference|shared\/|\btraces?\b|TRACE|stories260k|tiny-|fixture|gguf_path|GGUF_DIR/;

type TestFn = (t: Deno.TestContext) => void | Promise<void>;

/**
 * Names declared at the top level of a test module whose definitions (transitively) read
 * ../shared, e.g. `const MOE = fixtureDir("stories260k-moe")` or a helper that packs a fixture.
 */
function sharedNames(src: string): RegExp | null {
  const decl = /^(?:export )?(?:async )?(?:const|let|function\*?|class) +([A-Za-z_$][\w$]*)/gm;
  const starts = [...src.matchAll(decl)].map((m) => ({ name: m[1], at: m.index! }));
  const parts = starts.map((d, i) => ({ name: d.name, text: src.slice(d.at, starts[i + 1]?.at) }));
  const names = new Set<string>();
  for (let grew = true; grew;) {
    grew = false;
    const known = names.size ? new RegExp(`\\b(${[...names].join("|")})\\b`) : null;
    for (const p of parts) {
      if (!names.has(p.name) && (NEEDS_SHARED.test(p.text) || known?.test(p.text))) {
        names.add(p.name);
        grew = true;
      }
    }
  }
  return names.size ? new RegExp(`\\b(${[...names].join("|")})\\b`) : null;
}

if (!HAVE_SHARED) {
  const register = Deno.test.bind(Deno);
  const perFile = new Map<string, RegExp | null>();
  // The module registering the test: the first stack frame outside this file.
  const callerNames = (): RegExp | null => {
    const frames = new Error().stack?.match(/file:\/\/[^\s)]+?\.ts/g) ?? [];
    const file = frames.find((f) => !f.endsWith("/shared_guard.ts"));
    if (!file) return null;
    if (!perFile.has(file)) {
      perFile.set(file, sharedNames(Deno.readTextFileSync(new URL(file))));
    }
    return perFile.get(file)!;
  };
  const needs = (name: string, fn: unknown) => {
    const body = typeof fn === "function" ? String(fn) : "";
    const yes = NEEDS_SHARED.test(name) || NEEDS_SHARED.test(body) || !!callerNames()?.test(body);
    if (yes) noteSkip(SHARED_REASON);
    return yes;
  };
  const guarded = (...args: unknown[]) => {
    if (typeof args[0] === "object" && args[0] !== null) {
      const def = args[0] as Deno.TestDefinition;
      return register({ ...def, ignore: needs(def.name, def.fn) || def.ignore });
    }
    const [name, a, b] = args as [string, TestFn | Omit<Deno.TestDefinition, "name">, TestFn?];
    const fn = (typeof a === "function" ? a : b) as TestFn;
    const opts: Omit<Deno.TestDefinition, "name" | "fn"> = typeof a === "function" ? {} : a;
    return register({ ...opts, name, fn, ignore: needs(name, fn) || opts.ignore });
  };
  Object.assign(guarded, { ignore: Deno.test.ignore, only: Deno.test.only });
  (Deno as { test: unknown }).test = guarded;
}
