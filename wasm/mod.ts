/**
 * Loader of the compute kernels (wasm/kernels.wasm, built from kernels/*.c by wasm/build.ts) and
 * the shared wasm64 arena memory they run on. Pointers are byte offsets into the arena passed as
 * bigint (wasm i64); counts and indices are numbers (i32); scalars are numbers (f32).
 *
 * Row-split kernels end with a range [r0, r1) (or [h0, h1) for attention); a row's value never
 * depends on the range, so any split across workers gives bit-identical results.
 *
 * @module
 */

/** Byte offset into the arena memory (wasm64 pointer). */
export type Ptr = bigint;

/**
 * Bytes at the bottom of the arena that belong to the kernels module (its static data and heap
 * base); the arena allocator must start at or above this offset.
 */
export const KERNEL_RESERVED_BYTES = 1 << 20;

/** Largest memory64 V8 allows (262144 pages of 64 KiB). */
export const MAX_ARENA_BYTES = 16 * 1024 ** 3;

const PAGE_BYTES = 65536;

/** Every kernel the module exports, with the wasm signature as TypeScript sees it. */
export interface Kernels {
  /** y[r] = Σ_c W[r·cols + c]·x[c] for r in [r0, r1); W f32. */
  gemv_f32(W: Ptr, x: Ptr, y: Ptr, rows: number, cols: number, r0: number, r1: number): void;
  /** As gemv_f32 with W in bf16 (uint16 holding the top half of an f32). */
  gemv_bf16(W: Ptr, x: Ptr, y: Ptr, rows: number, cols: number, r0: number, r1: number): void;
  /** As gemv_f32 with W in IEEE binary16. */
  gemv_f16(W: Ptr, x: Ptr, y: Ptr, rows: number, cols: number, r0: number, r1: number): void;
  /** Y[b·rows + r] = Σ_c W[r,c]·X[b·cols + c] for b < nb; column b equals gemv_f32 bit for bit. */
  gemm_f32(
    W: Ptr,
    X: Ptr,
    Y: Ptr,
    rows: number,
    cols: number,
    nb: number,
    r0: number,
    r1: number,
  ): void;
  /** As gemm_f32 with W in bf16; column b equals gemv_bf16 bit for bit. */
  gemm_bf16(
    W: Ptr,
    X: Ptr,
    Y: Ptr,
    rows: number,
    cols: number,
    nb: number,
    r0: number,
    r1: number,
  ): void;
  /** y = x / sqrt(mean(x²) + eps) · w over n floats; y may equal x. */
  rmsnorm_f32(x: Ptr, w: Ptr, y: Ptr, n: number, eps: number): void;
  /**
   * rmsnorm_f32 on nrows consecutive rows of n floats, all with the same w; `unit` 1 scales by
   * (1 + w) instead (Qwen3-Next, Qwen3.5).
   */
  rmsnorm_rows_f32(
    x: Ptr,
    w: Ptr,
    y: Ptr,
    n: number,
    nrows: number,
    eps: number,
    unit: number,
  ): void;
  /**
   * Rotates in place the first rotDim floats of each of nheads heads at x + h·headStride
   * (floats) with cos/sin tables of rotDim/2 floats. interleaved 0 pairs (i, i + rotDim/2),
   * 1 pairs (2i, 2i + 1).
   */
  rope_f32(
    x: Ptr,
    nheads: number,
    headStride: number,
    rotDim: number,
    cos: Ptr,
    sin: Ptr,
    interleaved: number,
  ): void;
  /** Softmax in place. NaN or +Inf in → all NaN; all −Inf → uniform 1/n. */
  softmax_f32(x: Ptr, n: number): void;
  /** g[i] = silu(g[i])·u[i]. */
  silu_mul_f32(g: Ptr, u: Ptr, n: number): void;
  /** silu_mul_f32 on elements [r0, r1) of n (a pool job). */
  silu_mul_range_f32(g: Ptr, u: Ptr, n: number, r0: number, r1: number): void;
  /** g[i] = gelu_tanh(g[i])·u[i] (PyTorch's tanh-approximated GELU; Gemma's GeGLU). */
  gelu_tanh_mul_f32(g: Ptr, u: Ptr, n: number): void;
  /** x[i] = cap·tanh(x[i]/cap) in place (a logit soft cap). */
  softcap_f32(x: Ptr, n: number, cap: number): void;
  /** x[i] = 1 / (1 + e^−x[i]) in place. */
  sigmoid_f32(x: Ptr, n: number): void;
  /** x[i] = e^x[i] in place (within 2 ulp; overflow → +Inf, underflow → 0, NaN → NaN). */
  exp_f32(x: Ptr, n: number): void;
  /** g[i] = [β·tanh(g/β)·σ(g)]·[β₂·tanh(u/β₂)] (Kimi K3's SiTU-GLU; σ takes the uncapped g). */
  situ_mul_f32(g: Ptr, u: Ptr, n: number, beta: number, linearBeta: number): void;
  /**
   * One token's Attention Residual: sources i < n−1 at blocks + i·stride floats, source n−1 at
   * last; score_i = V_i·(wn ⊙ wp) / sqrt(mean(V_i²) + eps); out = Σ softmax(score)_i·V_i in
   * source order. scores is n floats of scratch; out must not alias a source.
   */
  attn_res_f32(
    blocks: Ptr,
    n: number,
    stride: number,
    last: Ptr,
    wn: Ptr,
    wp: Ptr,
    out: Ptr,
    scores: Ptr,
    d: number,
    eps: number,
  ): void;
  /**
   * Hyper-connections before a sublayer, for `tokens` tokens of n streams of d floats at x:
   * m = fn · rms(X) ((2+n)·n rows), pre = σ(m·scale[0] + base) + hcEps collapses X into
   * collapsed (d per token), post = 2σ(m·scale[1] + base) (n per token), comb = Sinkhorn of
   * softmax_rows(m·scale[2] + base) + hcEps over `iters` iterations (n×n per token, [j][k]).
   * mix is (2+n)·n floats of scratch.
   */
  hc_pre_f32(
    x: Ptr,
    tokens: number,
    n: number,
    d: number,
    fn: Ptr,
    base: Ptr,
    scale: Ptr,
    iters: number,
    normEps: number,
    hcEps: number,
    mix: Ptr,
    collapsed: Ptr,
    post: Ptr,
    comb: Ptr,
  ): void;
  /** After a sublayer: out_k = post_k·y + Σ_j comb[j][k]·x_j per token; out must not alias x. */
  hc_post_f32(
    x: Ptr,
    y: Ptr,
    post: Ptr,
    comb: Ptr,
    out: Ptr,
    tokens: number,
    n: number,
    d: number,
  ): void;
  /** The hyper head: out = Σ_j (σ(m_j·scale + base_j) + hcEps)·X_j, m = fn · rms(X) (n rows). */
  hc_head_f32(
    x: Ptr,
    tokens: number,
    n: number,
    d: number,
    fn: Ptr,
    base: Ptr,
    scale: number,
    normEps: number,
    hcEps: number,
    mix: Ptr,
    out: Ptr,
  ): void;
  /**
   * Entry w of a DeepSeek-V4 compressor from per-position rows (row_floats apart; kv projection at
   * cOff, gate at zOff): per channel, Σ softmax(z + ape)·c over window w's slots (indexed: the
   * previous window's first halves too). See kernels/csa.c.
   */
  csa_compress_f32(
    rows: Ptr,
    rowFloats: number,
    cOff: number,
    zOff: number,
    ape: Ptr,
    ratio: number,
    width: number,
    indexed: number,
    w: number,
    out: Ptr,
  ): void;
  /** scores[w] = Σ_h weights[h]·max(0, q_h · key_w) for `count` keys `keyStride` floats apart. */
  csa_index_scores_f32(
    q: Ptr,
    heads: number,
    dim: number,
    weights: Ptr,
    keys: Ptr,
    keyStride: number,
    count: number,
    scores: Ptr,
  ): void;
  /** g[i] = silu(min(g[i], limit))·clamp(u[i], ±limit). */
  swiglu_limit_f32(g: Ptr, u: Ptr, n: number, limit: number): void;
  /** y[i] += x[i]. */
  add_f32(y: Ptr, x: Ptr, n: number): void;
  /** y[i] += a·x[i] (product rounded, then sum; never fused). */
  axpy_f32(y: Ptr, x: Ptr, a: number, n: number): void;
  /** y[i] *= a. */
  scale_f32(y: Ptr, a: number, n: number): void;
  /** dst[i] = src[i]; overlapping regions are fine. */
  copy_f32(dst: Ptr, src: Ptr, n: number): void;
  /** Index of the first maximum; the first NaN if any (NaN ranks highest); −1 when n ≤ 0. */
  argmax_f32(x: Ptr, n: number): number;
  /**
   * Index of the first of the n values of w bytes (1, 2 or 4, little-endian) at p whose bits
   * under mask are all set (a NaN or an infinity when mask is the exponent); n when none is.
   */
  find_all_ones(p: Ptr, n: number, w: number, mask: number): number;
  /**
   * Writes the indices of the k largest values to idxOut (int32), best first; ties and NaNs
   * ordered as argmax_f32 (NaN highest, then lower index first); entries beyond n are −1.
   */
  topk_f32(x: Ptr, n: number, k: number, idxOut: Ptr): void;
  /**
   * Causal attention in key tiles with an online softmax, for heads [h0, h1) of `nTok` tokens:
   * token i at position pos0 + i (query at q + i·qStride floats, heads headDim apart; output at
   * out + i·outStride, heads vHeadDim apart) attends to positions max(0, p − window + 1) .. p
   * (window 0: from 0). Position x's key is in slot x, or x mod slots (slots > 0, a ring); key of
   * kv head g at kcache + (slot·kStride + g·headDim) floats, value at vcache + (slot·vStride +
   * g·vHeadDim), g = h / (nHeads / nKvHeads). Tiles start at multiples of `tile` positions; a
   * query's result depends only on its position, window and the tile. `sinks` (0 for none) holds
   * one logit per query head that joins the denominator only (gpt-oss). `scratch` holds
   * nHeads·(⌈tile/4⌉·4 + 2·nTok) floats. [h0, h1) counts rows of `rowHeads` query heads (1: heads),
   * so a pool that splits rows never cuts a kv head's heads apart when rowHeads divides them.
   */
  attention_f32(
    q: Ptr,
    qStride: number,
    kcache: Ptr,
    vcache: Ptr,
    out: Ptr,
    outStride: number,
    nTok: number,
    pos0: number,
    window: number,
    slots: number,
    nHeads: number,
    nKvHeads: number,
    headDim: number,
    vHeadDim: number,
    kStride: number,
    vStride: number,
    scale: number,
    sinks: Ptr,
    tile: number,
    scratch: Ptr,
    rowHeads: number,
    h0: number,
    h1: number,
  ): void;
  /**
   * gpt-oss's clamped SwiGLU in place: gate = min(g, limit), up = clamp(u, ±limit),
   * g = (up + 1)·gate·σ(alpha·gate).
   */
  swiglu_clamped_f32(g: Ptr, u: Ptr, n: number, limit: number, alpha: number): void;
  /** y[i] *= x[i] over n floats. */
  mul_f32(y: Ptr, x: Ptr, n: number): void;
  /**
   * The gated delta rule of KDA and Gated DeltaNet for key heads [h0, h1) over T tokens
   * (kernels/kda.c): each of a key head's `ratio` value heads has a state S_h (dk × dv, key rows)
   * that decays by e^g (`gChannels` log-decays a head: dk per key channel, or 1 for the head),
   * takes the delta-rule update with beta, and is read by q. q, k (L2-normalised in place, q
   * also scaled by dk^−½) and g (e^g in place) are scratch.
   */
  kda_recurrent_f32(
    S: Ptr,
    q: Ptr,
    k: Ptr,
    v: Ptr,
    g: Ptr,
    beta: Ptr,
    out: Ptr,
    T: number,
    nHeads: number,
    dk: number,
    dv: number,
    qkStride: number,
    vStride: number,
    gStride: number,
    betaStride: number,
    outStride: number,
    ratio: number,
    gChannels: number,
    h0: number,
    h1: number,
  ): void;
  /**
   * Causal depthwise conv of width K + SiLU for the channels of heads [r0, r1) of `group`
   * channels, with the last K−1 inputs in `state` ([K−1][channels], advanced by T tokens).
   */
  short_conv_f32(
    x: Ptr,
    state: Ptr,
    w: Ptr,
    y: Ptr,
    T: number,
    channels: number,
    K: number,
    xStride: number,
    yStride: number,
    group: number,
    r0: number,
    r1: number,
  ): void;
}

/** Names of the functions in {@link Kernels}; instantiation checks that each one is exported. */
export const KERNEL_NAMES: readonly (keyof Kernels)[] = [
  "gemv_f32",
  "gemv_bf16",
  "gemv_f16",
  "gemm_f32",
  "gemm_bf16",
  "rmsnorm_f32",
  "rmsnorm_rows_f32",
  "rope_f32",
  "softmax_f32",
  "silu_mul_f32",
  "silu_mul_range_f32",
  "gelu_tanh_mul_f32",
  "softcap_f32",
  "sigmoid_f32",
  "exp_f32",
  "situ_mul_f32",
  "attn_res_f32",
  "hc_pre_f32",
  "hc_post_f32",
  "hc_head_f32",
  "csa_compress_f32",
  "csa_index_scores_f32",
  "swiglu_limit_f32",
  "add_f32",
  "axpy_f32",
  "scale_f32",
  "copy_f32",
  "argmax_f32",
  "find_all_ones",
  "topk_f32",
  "attention_f32",
  "swiglu_clamped_f32",
  "mul_f32",
  "kda_recurrent_f32",
  "short_conv_f32",
];

const WASM_URL = new URL("./kernels.wasm", import.meta.url);
let cachedModule: Promise<WebAssembly.Module> | null = null;

/** Compiles wasm/kernels.wasm once per process; later calls return the same module. */
export function loadKernelModule(): Promise<WebAssembly.Module> {
  if (cachedModule === null) {
    cachedModule = Deno.readFile(WASM_URL).then(
      (bytes) => WebAssembly.compile(bytes),
      (e) => {
        throw new Error(`cannot read ${WASM_URL.pathname} (run deno task build:wasm): ${e}`);
      },
    );
    cachedModule.catch(() => cachedModule = null);
  }
  return cachedModule;
}

/**
 * A shared wasm64 memory of exactly ceil(bytes / 64 KiB) pages (initial = maximum: the arena is
 * sized once, since a grow by one thread is not seen by wasm code already running in another).
 */
export function createArenaMemory(bytes: number): WebAssembly.Memory {
  if (!Number.isSafeInteger(bytes) || bytes <= KERNEL_RESERVED_BYTES) {
    throw new Error(
      `arena size ${bytes} bytes: expected an integer above KERNEL_RESERVED_BYTES ` +
        `(${KERNEL_RESERVED_BYTES})`,
    );
  }
  if (bytes > MAX_ARENA_BYTES) {
    throw new Error(
      `arena size ${bytes} bytes exceeds the 16 GiB (${MAX_ARENA_BYTES} bytes) that V8 allows ` +
        `for a wasm64 memory`,
    );
  }
  return sharedMemory64(bytes);
}

/**
 * A shared wasm64 memory of `bytes` (rounded up to 64 KiB pages), initial = maximum: what the
 * arena is made of, and what reader-only tools (disk benches) read into.
 */
export function sharedMemory64(bytes: number): WebAssembly.Memory {
  const pages = BigInt(Math.ceil(bytes / PAGE_BYTES));
  // `address` is newer than the TypeScript DOM typings of WebAssembly.MemoryDescriptor.
  const descriptor = { initial: pages, maximum: pages, shared: true, address: "i64" };
  return new WebAssembly.Memory(descriptor as unknown as WebAssembly.MemoryDescriptor);
}

/**
 * Instantiates the kernels on `memory` (shared, wasm64, from {@link createArenaMemory}) and
 * returns them typed. Each worker calls this with the same module and memory.
 */
export async function instantiateKernels(
  module: WebAssembly.Module,
  memory: WebAssembly.Memory,
): Promise<Kernels> {
  if (memory.buffer.byteLength < KERNEL_RESERVED_BYTES) {
    throw new Error(
      `arena memory of ${memory.buffer.byteLength} bytes is smaller than ` +
        `KERNEL_RESERVED_BYTES (${KERNEL_RESERVED_BYTES})`,
    );
  }
  const instance = await WebAssembly.instantiate(module, { env: { memory } });
  const exports = instance.exports as Record<string, unknown>;
  const heapBase = exports.__heap_base;
  if (!(heapBase instanceof WebAssembly.Global) || BigInt(heapBase.value) > KERNEL_RESERVED_BYTES) {
    throw new Error(
      `kernels.wasm: __heap_base ${heapBase instanceof WebAssembly.Global ? heapBase.value : "?"}` +
        ` must be exported and at most KERNEL_RESERVED_BYTES (${KERNEL_RESERVED_BYTES})`,
    );
  }
  const kernels: Record<string, unknown> = {};
  for (const name of KERNEL_NAMES) {
    if (typeof exports[name] !== "function") {
      throw new Error(`kernels.wasm does not export ${name}: rebuild with deno task build:wasm`);
    }
    kernels[name] = exports[name];
  }
  return kernels as unknown as Kernels;
}
