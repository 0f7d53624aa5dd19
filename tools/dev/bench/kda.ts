/**
 * The KDA rows of `bench kernels`: the decode recurrence (kda_recurrent_f32, one token per call)
 * at the real head shape 128 × 128 and the causal short conv (short_conv_f32, width 4), each
 * cycling through as many layers' state as fit the bench region, so every call reads its state
 * from DRAM as decode does. The figure is state bytes per second, for the ratio against the DRAM
 * read of the same run. The recurrence also writes its state back, which the ratio does not
 * credit; the conv's taps are read with its window and counted with it (they are as cold).
 *
 * @module
 */
import type { Arena } from "../../../engine/arena.ts";
import type { Pool } from "../../../engine/pool.ts";

/** Throughput of one KDA kernel at one thread count. */
export interface KdaPoint {
  threads: number;
  /** State bytes streamed per second, GB/s. */
  gbps: number;
}

/** One KDA kernel over every thread count. */
export interface KdaRow {
  kernel: "kda_recurrent_f32" | "short_conv_f32";
  /** What one call streams, in words. */
  shape: string;
  /** Distinct layers' state cycled through. */
  layers: number;
  /** State bytes of one pass over those layers. */
  bytes_per_pass: number;
  by_threads: KdaPoint[];
}

/** Kimi-Linear-48B's KDA: 32 heads of 128, short conv of width 4 on q, k and v (3 × 4096). */
const HEADS = 32;
const DIM = 128;
const CONV_CHANNELS = 3 * HEADS * DIM;
const CONV_K = 4;

/** The conv's input and output, shared by every layer (it does not rewrite its input). */
interface ConvInputs {
  x: bigint;
  y: bigint;
}

/** Allocates the conv's per-token input and output in `arena`. */
export function kdaBenchInputs(arena: Arena): ConvInputs {
  const a = (what: string) => BigInt(arena.alloc(`kda bench ${what}`, CONV_CHANNELS * 4));
  const s = { x: a("conv x"), y: a("conv y") };
  arena.f32(Number(s.x), CONV_CHANNELS).fill(0.25);
  return s;
}

/** Floats of one token's q, k, v, g, beta (padded to a head's width) and output. */
const TOKEN_FLOATS = 6 * HEADS * DIM;

/**
 * Rewrites every layer's token inputs (the kernel normalises q and k and turns g into e^g in
 * place): q, k in [−1, 1), small v, a decay just below 1 so the states stay finite, beta ½.
 */
function refill(f: Float32Array, layers: number, layerFloats: number, stateFloats: number): void {
  const p = HEADS * DIM;
  for (let l = 0; l < layers; l++) {
    const o = l * layerFloats + stateFloats;
    for (let i = 0; i < p; i++) {
      const u = ((i * 2654435761) % 1000) / 1000;
      f[o + i] = 2 * u - 1;
      f[o + p + i] = 1 - 2 * u;
      f[o + 2 * p + i] = 0.01 * u;
      f[o + 3 * p + i] = -0.01 - 0.01 * u;
    }
    f.fill(0.5, o + 4 * p, o + 4 * p + HEADS);
  }
}

/** Best-of-`passes` seconds of `pass`, after one warm-up pass; `setup` runs untimed before each. */
function best(pass: () => void, passes: number, setup: () => void = () => {}): number {
  setup();
  pass();
  let t = Infinity;
  for (let i = 0; i < passes; i++) {
    setup();
    const t0 = performance.now();
    pass();
    t = Math.min(t, (performance.now() - t0) / 1000);
  }
  return t;
}

/**
 * Times both kernels on `pool` over `region` (its bytes are overwritten with finite floats
 * first by the caller). Returns one point per kernel.
 */
export function timeKdaKernels(
  arena: Arena,
  pool: Pool,
  region: { off: number; bytes: number },
  inputs: ConvInputs,
  passes: number,
): { recurrence: KdaRow; conv: KdaRow } {
  const p = HEADS * DIM;
  const stateFloats = HEADS * DIM * DIM;
  const stateBytes = stateFloats * 4;
  const layerFloats = stateFloats + Math.ceil(TOKEN_FLOATS / 16) * 16;
  const layers = Math.max(1, Math.floor(region.bytes / (layerFloats * 4)));
  const all = arena.f32(region.off, layers * layerFloats);
  // Small states: the bench's filler would otherwise grow through the updates.
  all.fill(0.001);
  const recurrence = () => {
    for (let l = 0; l < layers; l++) {
      const st = region.off + l * layerFloats * 4;
      const t = (i: number) => BigInt(st + stateBytes + i * p * 4);
      pool.run1(
        "kda_recurrent_f32",
        [
          BigInt(st),
          t(0),
          t(1),
          t(2),
          t(3),
          t(4),
          t(5),
          1,
          HEADS,
          DIM,
          DIM,
          p,
          p,
          p,
          HEADS,
          p,
          1,
          DIM,
        ],
        HEADS,
        4 * HEADS * DIM * DIM,
      );
    }
  };
  const tRec = best(recurrence, passes, () => refill(all, layers, layerFloats, stateFloats));
  const s = inputs;
  const windowBytes = (CONV_K - 1) * CONV_CHANNELS * 4;
  const tapsBytes = CONV_CHANNELS * CONV_K * 4;
  const convStride = windowBytes + tapsBytes;
  const convLayers = Math.max(1, Math.floor(region.bytes / convStride));
  arena.f32(region.off, (convLayers * convStride) / 4).fill(0.001);
  const conv = () => {
    for (let l = 0; l < convLayers; l++) {
      const base = region.off + l * convStride;
      pool.run1(
        "short_conv_f32",
        [
          s.x,
          BigInt(base),
          BigInt(base + windowBytes),
          s.y,
          1,
          CONV_CHANNELS,
          CONV_K,
          CONV_CHANNELS,
          CONV_CHANNELS,
          DIM,
        ],
        CONV_CHANNELS / DIM,
        CONV_CHANNELS * CONV_K * 8,
      );
    }
  };
  const tConv = best(conv, passes);
  return {
    recurrence: {
      kernel: "kda_recurrent_f32",
      shape: `${HEADS} heads × ${DIM}×${DIM} state, 1 token`,
      layers,
      bytes_per_pass: layers * stateBytes,
      by_threads: [{ threads: pool.threads, gbps: (layers * stateBytes) / tRec / 1e9 }],
    },
    conv: {
      kernel: "short_conv_f32",
      shape: `${CONV_CHANNELS} channels × (${CONV_K - 1} window + ${CONV_K} taps), 1 token`,
      layers: convLayers,
      bytes_per_pass: convLayers * convStride,
      by_threads: [{ threads: pool.threads, gbps: (convLayers * convStride) / tConv / 1e9 }],
    },
  };
}
