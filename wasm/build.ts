/**
 * Builds every kernels/*.c (sorted by name) into one wasm64 SIMD module, wasm/kernels.wasm:
 * clang-19 + lld-19 with the flags of PLATFORM.md, then binaryen's wasm-opt -O3. Functions marked
 * `export_name` in the C sources are the exports, so new kernel files need no change here.
 *
 * `deno task build:wasm` writes wasm/kernels.wasm (temp file + rename).
 * `deno task check:wasm` (`--check`) builds into a temp directory and exits 1 when the result
 * differs from the committed file. The build is byte-deterministic.
 *
 * Environment: CLANG overrides the compiler (default clang-19); wasm-opt comes from the npm
 * binaryen package in node_modules/.bin, which goes first on PATH because clang itself runs any
 * wasm-opt it finds there (Debian's old binaryen breaks wasm64 and relaxed-SIMD output).
 *
 * @module
 */

/** Filesystem path of a file: URL (the repository lives on a POSIX filesystem). */
function pathOf(url: URL): string {
  return decodeURIComponent(url.pathname);
}

const ROOT = pathOf(new URL("../", import.meta.url));
const KERNEL_DIR = "kernels";
const OUTPUT = pathOf(new URL("./kernels.wasm", import.meta.url));
const NODE_BIN = pathOf(new URL("../node_modules/.bin/", import.meta.url));

/** Largest memory the module accepts: V8's 16 GiB cap for memory64. */
const MAX_MEMORY_BYTES = 16 * 1024 ** 3;

const CLANG_FLAGS = [
  "--target=wasm64",
  "-O3",
  "-msimd128",
  "-mrelaxed-simd",
  "-matomics",
  "-mbulk-memory",
  // Products and sums stay separate operations unless a kernel asks for relaxed madd itself.
  "-ffp-contract=off",
  "-nostdlib",
  "-ffreestanding",
  "-Wall",
  "-Werror",
  "-Wl,--no-entry",
  "-Wl,--import-memory",
  "-Wl,--shared-memory",
  `-Wl,--max-memory=${MAX_MEMORY_BYTES}`,
  // Lets the loader check that the module's own data ends below KERNEL_RESERVED_BYTES.
  "-Wl,--export=__heap_base",
];

const WASM_OPT_FLAGS = [
  "-O3",
  "--enable-simd",
  "--enable-relaxed-simd",
  "--enable-threads",
  "--enable-bulk-memory",
  "--enable-memory64",
  "--enable-nontrapping-float-to-int",
  "--enable-sign-ext",
  "--enable-mutable-globals",
  // Tool versions must not leak into the committed bytes.
  "--strip-producers",
  "--strip-debug",
];

function run(cmd: string, args: string[]): string {
  const env = { PATH: `${NODE_BIN}:${Deno.env.get("PATH") ?? ""}` };
  let out: Deno.CommandOutput;
  try {
    out = new Deno.Command(cmd, { args, cwd: ROOT, env, stdout: "piped", stderr: "piped" })
      .outputSync();
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) {
      throw new Error(
        `${cmd} not found: install clang-19 and lld-19 (apt-get install -y clang-19 lld-19) ` +
          `and run npm install for binaryen's wasm-opt`,
      );
    }
    throw e;
  }
  const text = new TextDecoder();
  if (!out.success) {
    throw new Error(
      `${cmd} ${args.join(" ")} failed (exit ${out.code}):\n${text.decode(out.stderr)}`,
    );
  }
  return text.decode(out.stdout);
}

/** Kernel sources, relative to the repository root, sorted so link order is stable. */
export function kernelSources(): string[] {
  return [...Deno.readDirSync(`${ROOT}${KERNEL_DIR}`)]
    .filter((e) => e.isFile && e.name.endsWith(".c"))
    .map((e) => `${KERNEL_DIR}/${e.name}`)
    .sort();
}

/**
 * Rejects a module that could not run on a shared memory from several workers: any mutable
 * global (the shadow-stack pointer __stack_pointer, TLS) would be per instance yet point into
 * memory every instance shares; any import other than env.memory would be unresolvable.
 */
function verifyModule(path: string): void {
  const text = run(`${NODE_BIN}wasm-dis`, [path]);
  if (/\(global \S+ \(mut /.test(text)) {
    throw new Error(
      `${path}: a kernel uses the shadow stack (mutable global, e.g. __stack_pointer); ` +
        `kernels must keep their locals in registers (no local arrays, no address-taken locals)`,
    );
  }
  for (const line of text.split("\n").filter((l) => l.trimStart().startsWith("(import "))) {
    if (!line.includes('"env" "memory"')) {
      throw new Error(`${path}: unexpected import ${line.trim()}; only env.memory is allowed`);
    }
  }
}

/** Compiles and optimises all kernels into `outPath`. */
export function buildKernels(outPath: string): void {
  const tmpDir = Deno.makeTempDirSync({ prefix: "sluice-wasm-" });
  try {
    const linked = `${tmpDir}/linked.wasm`;
    const clang = Deno.env.get("CLANG") ?? "clang-19";
    run(clang, [...CLANG_FLAGS, ...kernelSources(), "-o", linked]);
    run(`${NODE_BIN}wasm-opt`, [...WASM_OPT_FLAGS, linked, "-o", outPath]);
    verifyModule(outPath);
  } finally {
    Deno.removeSync(tmpDir, { recursive: true });
  }
}

function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && a.every((v, i) => v === b[i]);
}

/** Builds into a temp directory and compares with the committed file; returns the problem. */
function checkCommitted(): string | null {
  const tmpDir = Deno.makeTempDirSync({ prefix: "sluice-wasm-check-" });
  try {
    const fresh = `${tmpDir}/kernels.wasm`;
    buildKernels(fresh);
    let committed: Uint8Array;
    try {
      committed = Deno.readFileSync(OUTPUT);
    } catch {
      return `${OUTPUT} is missing: run deno task build:wasm`;
    }
    if (!sameBytes(Deno.readFileSync(fresh), committed)) {
      return `${OUTPUT} is stale: it differs from a fresh build of ${KERNEL_DIR}/*.c; ` +
        `run deno task build:wasm and commit the result`;
    }
    return null;
  } finally {
    Deno.removeSync(tmpDir, { recursive: true });
  }
}

function main(): void {
  if (Deno.args.includes("--check")) {
    const problem = checkCommitted();
    if (problem !== null) {
      console.error(problem);
      Deno.exit(1);
    }
    console.log(`${OUTPUT} matches a fresh build of ${kernelSources().length} sources`);
    return;
  }
  const tmp = `${OUTPUT}.tmp-${Deno.pid}`;
  try {
    buildKernels(tmp);
    Deno.renameSync(tmp, OUTPUT);
  } catch (e) {
    try {
      Deno.removeSync(tmp);
    } catch {
      // The build failed before writing the temp file.
    }
    throw e;
  }
  console.log(`wrote ${OUTPUT} (${Deno.readFileSync(OUTPUT).length} bytes)`);
}

if (import.meta.main) main();
