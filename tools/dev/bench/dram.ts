/**
 * DRAM read bandwidth, the ceiling every weight-streaming kernel is judged against. The kernels
 * module has no plain sum kernel, so this compiles a tiny native C program (`cc -O3
 * -march=native`, pthreads, wide-vector sum) into a temp dir at bench time and runs it. Without
 * a C compiler it returns null and the caller falls back to the f32 GEMV as a lower bound.
 *
 * @module
 */

import { join } from "node:path";
import { findCompiler } from "../../../io/build_shim.ts";

/** Options of {@link measureDramNative}. */
export interface DramOptions {
  /** Bytes summed per pass (rounded down to 4 KiB); use ≥ 1 GiB so caches do not count. */
  bytes: number;
  /** Thread counts to measure, e.g. [1, 2]. */
  threads: number[];
  /** Timed passes per thread count; the best is kept. */
  passes: number;
}

/** One measured thread count. */
export interface DramPoint {
  threads: number;
  /** Bytes read per second, in GB/s (1e9). */
  gbps: number;
}

/** What {@link measureDramNative} measured and how. */
export interface DramResult {
  /** How the figure was obtained. */
  method: string;
  /** Bytes summed per pass. */
  bytes: number;
  points: DramPoint[];
}

/*
 * Sums a buffer with GCC/Clang generic vectors (64-byte lanes, four accumulators), so the
 * compiler emits the widest loads -march=native allows without intrinsics. Each thread sums a
 * contiguous slice; a pass is timed from thread start to the last join. Output: "threads gbps".
 */
const SUM_C = `
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef float v16 __attribute__((vector_size(64)));
typedef struct { const v16 *p; size_t n; float out; } slice_t;
static volatile float sink;

static void *sum_slice(void *arg) {
  slice_t *s = arg;
  v16 a = {0}, b = {0}, c = {0}, d = {0};
  size_t i = 0;
  for (; i + 4 <= s->n; i += 4) { a += s->p[i]; b += s->p[i + 1]; c += s->p[i + 2]; d += s->p[i + 3]; }
  for (; i < s->n; i++) a += s->p[i];
  a += b + c + d;
  float t = 0;
  for (int k = 0; k < 16; k++) t += a[k];
  s->out = t;
  return NULL;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  if (argc < 4) return 2;
  size_t bytes = strtoull(argv[1], NULL, 10) & ~(size_t)4095;
  int passes = atoi(argv[2]);
  v16 *buf = aligned_alloc(4096, bytes);
  if (!buf) { perror("aligned_alloc"); return 1; }
  memset(buf, 0x3f, bytes);
  size_t nvec = bytes / sizeof(v16);
  for (int a = 3; a < argc; a++) {
    int nt = atoi(argv[a]);
    pthread_t th[256];
    slice_t sl[256];
    if (nt < 1 || nt > 256) return 2;
    double best = 0;
    for (int p = 0; p < passes; p++) {
      double t0 = now();
      for (int t = 0; t < nt; t++) {
        size_t v0 = nvec * t / nt, v1 = nvec * (t + 1) / nt;
        sl[t] = (slice_t){buf + v0, v1 - v0, 0};
        pthread_create(&th[t], NULL, sum_slice, &sl[t]);
      }
      float total = 0;
      for (int t = 0; t < nt; t++) { pthread_join(th[t], NULL); total += sl[t].out; }
      double gbps = bytes / (now() - t0) / 1e9;
      sink = total;
      if (gbps > best) best = gbps;
    }
    printf("%d %.3f\\n", nt, best);
    fflush(stdout);
  }
  free(buf);
  return 0;
}
`;

/**
 * Measures streaming-read bandwidth with a native multi-threaded sum over `opts.bytes`, best of
 * `opts.passes` per thread count. Returns null when no C compiler is available; throws when the
 * compiler or program fails.
 */
export async function measureDramNative(opts: DramOptions): Promise<DramResult | null> {
  const cc = findCompiler();
  if (cc === null) return null;
  const dir = await Deno.makeTempDir({ prefix: "sluice-dram-" });
  try {
    const src = join(dir, "sum.c");
    const exe = join(dir, "sum");
    await Deno.writeTextFile(src, SUM_C);
    const flags = ["-O3", "-march=native", "-pthread", "-o", exe, src];
    const build = await new Deno.Command(cc, { args: flags, stderr: "piped" }).output();
    if (!build.success) {
      throw new Error(
        `bench dram: ${cc} ${flags.join(" ")} failed: ${new TextDecoder().decode(build.stderr)}`,
      );
    }
    const args = [String(opts.bytes), String(opts.passes), ...opts.threads.map(String)];
    const run = await new Deno.Command(exe, { args, stdout: "piped", stderr: "piped" }).output();
    if (!run.success) {
      throw new Error(
        `bench dram: ${exe} ${args.join(" ")} exited ${run.code}: ` +
          new TextDecoder().decode(run.stderr),
      );
    }
    const points = new TextDecoder().decode(run.stdout).trim().split("\n").map((line) => {
      const [t, g] = line.split(" ").map(Number);
      return { threads: t, gbps: g };
    });
    return {
      method: `native vector sum (${cc} -O3 -march=native, pthreads)`,
      bytes: Math.floor(opts.bytes / 4096) * 4096,
      points,
    };
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}
