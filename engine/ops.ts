/**
 * The kernel calls the forward passes are written in: arena byte offsets in, arena byte offsets
 * out. Matmuls and attention are split by rows over the pool; the cheap vector ops run on the
 * main thread, where a dispatch would cost more than the work.
 *
 * @module
 */
import type { Arena } from "./arena.ts";
import type { Job, Pool } from "./pool.ts";
import { chunkRows, MAX_JOBS } from "./pool_protocol.ts";
import { exactBatchJob, inputFormOf, matmulJobs, type TensorRef } from "./tensor.ts";

type Fn = (...a: (number | bigint)[]) => number;

/** One matmul of a batch: Y = W · X for `nb` vectors. */
export interface Matmul {
  w: TensorRef;
  x: number;
  y: number;
  nb: number;
  /** Prepared inputs (engine/quant_matmul.ts), one per vector, for formats that read them. */
  prep?: readonly number[];
  /**
   * Arena offset of room for `batchDecodeBytes(w)` bytes, where exact weights that multiply a
   * batch through a decoded copy (shipped MXFP4, INT4) put it; without it they run per vector.
   */
  scratch?: number;
}

/** One gated MLP of {@link Ops.gatedMlps}: y = down(silu(gate · x) · (up · x)), through g and u. */
export interface GatedMlp {
  gate: TensorRef;
  up: TensorRef;
  down: TensorRef;
  /** The input vector, and room for gate's and up's outputs (gate.rows floats each). */
  x: number;
  g: number;
  u: number;
  /** The prepared form of x that gate and up read, when their format reads one (Q8). */
  xq?: number;
  /** Room for the Q8 form of the activation, when down reads Q8: made in the same dispatch. */
  gq?: number;
  /** The output, down.rows floats. */
  y: number;
}

/** Attention geometry shared by every token of a call. */
export interface AttentionShape {
  nHeads: number;
  nKvHeads: number;
  headDim: number;
  vHeadDim: number;
  kStride: number;
  vStride: number;
  scale: number;
}

/** One attention call over consecutive tokens of one sequence (see {@link Ops.attention}). */
export interface AttentionCall {
  shape: AttentionShape;
  q: number;
  qStride: number;
  k: number;
  v: number;
  out: number;
  outStride: number;
  /** Arena offset of `attentionScratchBytes(shape.nHeads, tokens)` bytes (parts/scratch.ts). */
  scratch: number;
  /** Position of the first token; token i, at pos + i, attends to its own key and earlier ones. */
  pos: number;
  tokens: number;
  /** A sliding window: position p sees p − window + 1 .. p. Absent or 0: every earlier position. */
  window?: number;
  /** A ring cache of `slots` positions: position x's key is in slot x mod slots. Absent: slot x. */
  slots?: number;
  /** Arena offset of one sink logit per query head (gpt-oss), or absent. */
  sinks?: number;
}

/**
 * Key positions per attention tile: tiles start at multiples of this, and a query's result
 * depends on it (kernels/attention.c), so every call uses the same.
 */
export const ATTENTION_TILE = 64;

/** Query tokens one attention job takes. */
export const ATTENTION_TOKENS = 16;

/** Attention jobs one dispatch runs at once, each on its own slice of the scratch. */
export const ATTENTION_JOBS = 8;

/**
 * Query heads per row the pool splits an attention job into: the fewest for which every claim
 * (chunkRows rows) holds whole kv heads and every thread gets one, so a kv head's keys and values
 * are read once by one thread, not once by each claim of part of its heads (32 / 4 heads, 8k
 * context, one thread: claims of 4 heads → 8 took decode's attention from 8.8–9.3 to 6.3–6.5 ms and a
 * 16-token job's from 72.6–73.4 to 68.2–69.4). 1 when no such split exists (a single kv head).
 */
export function attentionRowHeads(nHeads: number, nKvHeads: number, threads: number): number {
  const group = nHeads / nKvHeads;
  for (let u = 1; u <= group; u++) {
    if (group % u !== 0) continue;
    const rows = nHeads / u, chunk = chunkRows(rows, threads);
    if ((chunk * u) % group === 0 && Math.ceil(rows / chunk) >= threads) return u;
  }
  return 1;
}

/** Floats of one attention job's scratch: per query head a tile of scores, a max and a sum per token. */
export function attentionJobFloats(nHeads: number): number {
  return nHeads * (Math.ceil(ATTENTION_TILE / 4) * 4 + 2 * ATTENTION_TOKENS);
}

/**
 * One delta-rule call over consecutive tokens (see {@link Ops.kda}): KDA's, or Gated DeltaNet's
 * with `ratio` value heads per key head and one log-decay per value head.
 */
export interface KdaCall {
  /** State of every value head: heads × ratio × dk × dv floats, key rows. */
  state: number;
  /** Token t's q/k of key head h at q/k + (t·qkStride + h·dk) floats; rewritten (normalised). */
  q: number;
  k: number;
  /** Token t's v of value head j at v + (t·vStride + j·dv) floats. */
  v: number;
  /**
   * Log-decays of value head j at g + (t·gStride + j·gChannels) floats: dk of them (KDA, one per
   * key channel) or 1 (Gated DeltaNet); rewritten (e^g).
   */
  g: number;
  gChannels: number;
  /** Per token and head, already a sigmoid. */
  beta: number;
  out: number;
  tokens: number;
  /** Key heads: the unit the pool splits. */
  heads: number;
  /** Value heads per key head (1 for KDA). */
  ratio: number;
  dk: number;
  dv: number;
  qkStride: number;
  vStride: number;
  gStride: number;
  betaStride: number;
  outStride: number;
}

/** One causal short conv over consecutive tokens (see {@link Ops.shortConv}). */
export interface ShortConvCall {
  x: number;
  /** The last K−1 inputs, [K−1][channels]; advanced by the call. */
  state: number;
  /** Taps, [channels][K] (PyTorch's depthwise Conv1d [C, 1, K]). */
  w: number;
  y: number;
  tokens: number;
  channels: number;
  kernel: number;
  xStride: number;
  yStride: number;
  /** Channels per head: the unit the pool splits. */
  group: number;
}

/** Typed kernel calls on one pool. */
export class Ops {
  readonly arena: Arena;
  readonly pool: Pool;
  #k: Record<string, Fn>;

  constructor(arena: Arena, pool: Pool) {
    this.arena = arena;
    this.pool = pool;
    this.#k = pool.exports as Record<string, Fn>;
  }

  /** Runs the given matmuls; they must not read each other's outputs. */
  matmul(...list: Matmul[]): void {
    const jobs: Job[] = [];
    let work = 0;
    for (const m of list) {
      const batch = exactBatchJob(m.w, m.x, m.y, m.nb, m.scratch);
      jobs.push(...(batch ? [batch] : matmulJobs(m.w, m.x, m.y, m.nb, m.prep)));
      work += m.w.rows * m.w.cols * m.nb;
    }
    this.#dispatch(jobs, work);
  }

  /**
   * Gated SiLU MLPs of one vector each in one dispatch: every gate and up, then every g = silu(g) ·
   * u (and its Q8 form for a down that reads one), then every down, each group starting once the
   * one before it is computed, with no return to the main thread in between (the same kernels, so
   * the same bits, as {@link matmul}, {@link siluMul} and quantize_act_q8 one after another).
   */
  gatedMlps(list: readonly GatedMlp[]): void {
    const up: Job[] = [], act: Job[] = [], down: Job[] = [];
    let work = 0;
    for (const m of list) {
      const xq = m.xq === undefined ? undefined : [m.xq];
      up.push(...matmulJobs(m.gate, m.x, m.g, 1, xq), ...matmulJobs(m.up, m.x, m.u, 1, xq));
      const n = m.gate.rows, form = inputFormOf(m.down);
      if (form !== (m.gq === undefined ? "f32" : "q8")) {
        throw new Error(`gatedMlps: a down of ${m.down.dtype} reads ${form} input`);
      }
      const [g, u] = [BigInt(m.g), BigInt(m.u)];
      act.push(
        m.gq === undefined
          ? { kernel: "silu_mul_range_f32", args: [g, u, n], rows: n }
          : { kernel: "silu_mul_q8_range", args: [g, u, BigInt(m.gq), n], rows: n / 32 },
      );
      down.push(...matmulJobs(m.down, m.g, m.y, 1, m.gq === undefined ? undefined : [m.gq]));
      work += (m.gate.rows + m.up.rows) * m.gate.cols + m.down.rows * m.down.cols;
    }
    if (list.length === 0) return;
    act[0] = { ...act[0], after: true };
    down[0] = { ...down[0], after: true };
    const jobs = [...up, ...act, ...down];
    if (jobs.length > MAX_JOBS) {
      throw new Error(`gatedMlps: ${list.length} MLPs need more than ${MAX_JOBS} jobs`);
    }
    this.pool.run(jobs, work);
  }

  #dispatch(jobs: Job[], work: number): void {
    for (let i = 0; i < jobs.length; i += MAX_JOBS) {
      this.pool.run(jobs.slice(i, i + MAX_JOBS), work);
    }
  }

  /**
   * RMSNorm of `rows` consecutive vectors of `n` floats with one weight vector w, scaling by
   * (1 + w) when `unitOffset`.
   */
  rmsnorm(
    x: number,
    w: number,
    y: number,
    n: number,
    rows: number,
    eps: number,
    unitOffset = false,
  ): void {
    this.#k.rmsnorm_rows_f32(BigInt(x), BigInt(w), BigInt(y), n, rows, eps, unitOffset ? 1 : 0);
  }

  /** Rotates the first `dim` dims of `heads` heads spaced `stride` floats apart. */
  rope(
    x: number,
    heads: number,
    stride: number,
    dim: number,
    cos: number,
    sin: number,
    interleaved: boolean,
  ): void {
    this.#k.rope_f32(BigInt(x), heads, stride, dim, BigInt(cos), BigInt(sin), interleaved ? 1 : 0);
  }

  /** g = silu(g) · u over n floats. */
  siluMul(g: number, u: number, n: number): void {
    this.#k.silu_mul_f32(BigInt(g), BigInt(u), n);
  }

  /** g = gelu_tanh(g) · u over n floats (Gemma's GeGLU). */
  geluTanhMul(g: number, u: number, n: number): void {
    this.#k.gelu_tanh_mul_f32(BigInt(g), BigInt(u), n);
  }

  /** x = cap · tanh(x / cap) over n floats in place (a logit soft cap). */
  softcap(x: number, n: number, cap: number): void {
    this.#k.softcap_f32(BigInt(x), n, cap);
  }

  /** gpt-oss's clamped SwiGLU: g = (clamp(u) + 1) · min(g, limit) · σ(alpha · min(g, limit)). */
  swigluClamped(g: number, u: number, n: number, limit: number, alpha: number): void {
    this.#k.swiglu_clamped_f32(BigInt(g), BigInt(u), n, limit, alpha);
  }

  /** g = SiTU(g, u) over n floats (Kimi K3's gated activation, caps β and β₂). */
  situMul(g: number, u: number, n: number, beta: number, linearBeta: number): void {
    this.#k.situ_mul_f32(BigInt(g), BigInt(u), n, beta, linearBeta);
  }

  /**
   * One token's Attention Residual into `out` (d floats): the softmax-weighted sum of the `n − 1`
   * block snapshots at `blocks + i·stride` floats and `last`, scored with norm and projection
   * weights `wn`, `wp`; `scores` is n floats of scratch.
   */
  attnRes(
    a: {
      blocks: number;
      n: number;
      stride: number;
      last: number;
      wn: number;
      wp: number;
      out: number;
      scores: number;
      d: number;
      eps: number;
    },
  ): void {
    this.#k.attn_res_f32(
      BigInt(a.blocks),
      a.n,
      a.stride,
      BigInt(a.last),
      BigInt(a.wn),
      BigInt(a.wp),
      BigInt(a.out),
      BigInt(a.scores),
      a.d,
      a.eps,
    );
  }

  /**
   * Hyper-connection weights before a sublayer for `tokens` tokens of `n` streams (see
   * kernels/hyper.c): the collapsed input, post and the Sinkhorn-normalised comb.
   */
  hcPre(a: {
    x: number;
    tokens: number;
    n: number;
    d: number;
    fn: number;
    base: number;
    scale: number;
    iters: number;
    normEps: number;
    hcEps: number;
    mix: number;
    collapsed: number;
    post: number;
    comb: number;
  }): void {
    this.#k.hc_pre_f32(
      BigInt(a.x),
      a.tokens,
      a.n,
      a.d,
      BigInt(a.fn),
      BigInt(a.base),
      BigInt(a.scale),
      a.iters,
      a.normEps,
      a.hcEps,
      BigInt(a.mix),
      BigInt(a.collapsed),
      BigInt(a.post),
      BigInt(a.comb),
    );
  }

  /** out_k = post_k·y + Σ_j comb[j][k]·x_j for `tokens` tokens of `n` streams of `d` floats. */
  hcPost(
    x: number,
    y: number,
    post: number,
    comb: number,
    out: number,
    tokens: number,
    n: number,
    d: number,
  ): void {
    this.#k.hc_post_f32(
      BigInt(x),
      BigInt(y),
      BigInt(post),
      BigInt(comb),
      BigInt(out),
      tokens,
      n,
      d,
    );
  }

  /** The hyper head's collapse of `tokens` tokens of `n` streams into `out`. */
  hcHead(a: {
    x: number;
    tokens: number;
    n: number;
    d: number;
    fn: number;
    base: number;
    scale: number;
    normEps: number;
    hcEps: number;
    mix: number;
    out: number;
  }): void {
    this.#k.hc_head_f32(
      BigInt(a.x),
      a.tokens,
      a.n,
      a.d,
      BigInt(a.fn),
      BigInt(a.base),
      a.scale,
      a.normEps,
      a.hcEps,
      BigInt(a.mix),
      BigInt(a.out),
    );
  }

  /** Entry `w` of a compressor into `out` (kernels/csa.c `csa_compress_f32`). */
  csaCompress(a: {
    rows: number;
    rowFloats: number;
    cOff: number;
    zOff: number;
    ape: number;
    ratio: number;
    width: number;
    indexed: boolean;
    w: number;
    out: number;
  }): void {
    this.#k.csa_compress_f32(
      BigInt(a.rows),
      a.rowFloats,
      a.cOff,
      a.zOff,
      BigInt(a.ape),
      a.ratio,
      a.width,
      a.indexed ? 1 : 0,
      a.w,
      BigInt(a.out),
    );
  }

  /** The Lightning indexer's scores of `count` keys `keyStride` floats apart. */
  csaIndexScores(
    q: number,
    heads: number,
    dim: number,
    weights: number,
    keys: number,
    keyStride: number,
    count: number,
    scores: number,
  ): void {
    this.#k.csa_index_scores_f32(
      BigInt(q),
      heads,
      dim,
      BigInt(weights),
      BigInt(keys),
      keyStride,
      count,
      BigInt(scores),
    );
  }

  /** g = silu(min(g, limit)) · clamp(u, ±limit) over n floats (DeepSeek-V4). */
  swigluLimit(g: number, u: number, n: number, limit: number): void {
    this.#k.swiglu_limit_f32(BigInt(g), BigInt(u), n, limit);
  }

  /** y *= a over n floats. */
  scale(y: number, a: number, n: number): void {
    this.#k.scale_f32(BigInt(y), a, n);
  }

  /** y += x over n floats. */
  add(y: number, x: number, n: number): void {
    this.#k.add_f32(BigInt(y), BigInt(x), n);
  }

  /** y += a · x over n floats. */
  axpy(y: number, x: number, a: number, n: number): void {
    this.#k.axpy_f32(BigInt(y), BigInt(x), a, n);
  }

  /** dst = src over n floats. */
  copy(dst: number, src: number, n: number): void {
    this.#k.copy_f32(BigInt(dst), BigInt(src), n);
  }

  /**
   * Causal attention for consecutive tokens in key tiles (kernels/attention.c): token i's query at
   * `q + i·qStride` floats attends to the cached positions it sees and writes its heads to
   * `out + i·outStride`. Jobs of {@link ATTENTION_TOKENS} tokens, each split by heads over the
   * pool, run {@link ATTENTION_JOBS} to a dispatch, each on its own slice of `scratch`.
   */
  attention(a: AttentionCall): void {
    const s = a.shape, window = a.window ?? 0, slots = a.slots ?? 0;
    const seen = (p: number) => window > 0 ? Math.min(p + 1, window) : p + 1;
    if (slots > 0 && seen(a.pos + a.tokens - 1) > slots) {
      throw new Error(`attention: a ring of ${slots} slots cannot hold a query's keys`);
    }
    const jobBytes = attentionJobFloats(s.nHeads) * 4;
    const rowHeads = attentionRowHeads(s.nHeads, s.nKvHeads, this.pool.threads);
    let jobs: Job[] = [];
    let work = 0;
    for (let i = 0; i < a.tokens; i += ATTENTION_TOKENS) {
      const n = Math.min(ATTENTION_TOKENS, a.tokens - i);
      jobs.push({
        kernel: "attention_f32",
        args: [
          BigInt(a.q + i * a.qStride * 4),
          a.qStride,
          BigInt(a.k),
          BigInt(a.v),
          BigInt(a.out + i * a.outStride * 4),
          a.outStride,
          n,
          a.pos + i,
          window,
          slots,
          s.nHeads,
          s.nKvHeads,
          s.headDim,
          s.vHeadDim,
          s.kStride,
          s.vStride,
          s.scale,
          BigInt(a.sinks ?? 0),
          ATTENTION_TILE,
          BigInt(a.scratch + jobs.length * jobBytes),
          rowHeads,
        ],
        rows: s.nHeads / rowHeads,
      });
      work += s.nHeads * n * seen(a.pos + i + n - 1) * (s.headDim + s.vHeadDim);
      if (jobs.length === ATTENTION_JOBS || i + n >= a.tokens) {
        this.pool.run(jobs, work);
        jobs = [];
        work = 0;
      }
    }
  }

  /** y = y · x over n floats. */
  mul(y: number, x: number, n: number): void {
    this.#k.mul_f32(BigInt(y), BigInt(x), n);
  }

  /** x = sigmoid(x) over n floats. */
  sigmoid(x: number, n: number): void {
    this.#k.sigmoid_f32(BigInt(x), n);
  }

  /** The gated delta rule (kernels/kda.c, the recurrence), split over the pool by key head. */
  kda(c: KdaCall): void {
    const ptrs = [c.state, c.q, c.k, c.v, c.g, c.beta, c.out];
    this.pool.run([{
      kernel: "kda_recurrent_f32",
      args: [
        ...ptrs.map(BigInt),
        c.tokens,
        c.heads,
        c.dk,
        c.dv,
        c.qkStride,
        c.vStride,
        c.gStride,
        c.betaStride,
        c.outStride,
        c.ratio,
        c.gChannels,
      ],
      rows: c.heads,
    }], 4 * c.tokens * c.heads * c.ratio * c.dk * c.dv);
  }

  /** Causal depthwise convs + SiLU (kernels/kda.c), one job each, split by head. */
  shortConv(...list: ShortConvCall[]): void {
    const jobs: Job[] = [];
    let work = 0;
    for (const c of list) {
      jobs.push({
        kernel: "short_conv_f32",
        args: [
          BigInt(c.x),
          BigInt(c.state),
          BigInt(c.w),
          BigInt(c.y),
          c.tokens,
          c.channels,
          c.kernel,
          c.xStride,
          c.yStride,
          c.group,
        ],
        rows: Math.ceil(c.channels / c.group),
      });
      work += c.tokens * c.channels * c.kernel;
    }
    this.#dispatch(jobs, work);
  }

  /** A Float32Array view of the arena. */
  f32(off: number, n: number): Float32Array {
    return this.arena.f32(off, n);
  }
}
