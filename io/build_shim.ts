/**
 * Builds the C I/O shim (io/shim.c) into io/build/libsluice_io.so (.dylib on macOS) with the
 * system C compiler. Run alone (`deno task build:shim`, `--force` to rebuild) or call
 * {@link ensureShim}, which builds on first use.
 *
 * @module
 */

import { existsSync, mkdirSync, renameSync, rmSync, statSync } from "node:fs";
import { fileURLToPath } from "node:url";

const SOURCE = fileURLToPath(new URL("./shim.c", import.meta.url));
const BUILD_DIR = fileURLToPath(new URL("./build/", import.meta.url));

/** Compilers tried in order; the first one that runs is used. */
const COMPILERS = ["cc", "gcc", "clang"];

let lastFailure: string | null = null;

/** Absolute path of the shared library for this OS (it may not exist yet). */
export function shimLibraryPath(): string {
  const ext = Deno.build.os === "darwin" ? "dylib" : Deno.build.os === "windows" ? "dll" : "so";
  return `${BUILD_DIR}libsluice_io.${ext}`;
}

/** Why the last {@link ensureShim} call returned null, or null when it succeeded. */
export function shimBuildFailure(): string | null {
  return lastFailure;
}

/**
 * Name of the first C compiler on PATH that answers `--version` (`cc`, `gcc`, then `clang`), or
 * null when none does.
 */
export function findCompiler(): string | null {
  for (const cc of COMPILERS) {
    try {
      if (
        new Deno.Command(cc, { args: ["--version"], stdout: "null", stderr: "null" }).outputSync()
          .success
      ) return cc;
    } catch {
      // Not installed (NotFound) or not permitted: try the next one.
    }
  }
  return null;
}

function isFresh(lib: string): boolean {
  if (!existsSync(lib)) return false;
  return statSync(lib).mtimeMs >= statSync(SOURCE).mtimeMs;
}

function compile(lib: string): string | null {
  if (Deno.build.os === "windows") return "the C I/O shim supports Linux and macOS only";
  const cc = findCompiler();
  if (cc === null) return `no C compiler found (tried ${COMPILERS.join(", ")})`;
  mkdirSync(BUILD_DIR, { recursive: true });
  // A per-process temp name, then rename: parallel test processes may build at the same time.
  const tmp = `${lib}.tmp-${Deno.pid}-${Math.random().toString(36).slice(2)}`;
  const args = ["-O2", "-fPIC", "-shared", "-pthread", "-Wall", "-o", tmp, SOURCE];
  try {
    const out = new Deno.Command(cc, { args, stdout: "piped", stderr: "piped" }).outputSync();
    if (!out.success) {
      const msg = new TextDecoder().decode(out.stderr).trim().split("\n").slice(0, 5).join(" | ");
      return `${cc} ${args.join(" ")} failed (exit ${out.code}): ${msg}`;
    }
    renameSync(tmp, lib);
    return null;
  } catch (e) {
    return `building ${lib} with ${cc} failed: ${(e as Error).message}`;
  } finally {
    rmSync(tmp, { force: true });
  }
}

/**
 * Returns the path of an up-to-date shim library, building it when missing or older than shim.c
 * (or always with `force`). Returns null when there is no compiler or the build fails; the reason
 * is then available from {@link shimBuildFailure}.
 */
export function ensureShim(force = false): string | null {
  const lib = shimLibraryPath();
  let failure: string | null = null;
  try {
    if (force || !isFresh(lib)) failure = compile(lib);
  } catch (e) {
    failure = `cannot build the I/O shim: ${(e as Error).message}`;
  }
  lastFailure = failure;
  return failure === null ? lib : null;
}

if (import.meta.main) {
  const lib = ensureShim(Deno.args.includes("--force"));
  if (lib === null) {
    console.error(`build_shim: ${shimBuildFailure()}`);
    Deno.exit(1);
  }
  console.log(lib);
}
