/**
 * The decode loop, with exact speculative decoding. A drafter proposes up to k tokens after the
 * context — prompt lookup (the continuation of the latest earlier occurrence of the context's
 * last n tokens) or a small second model with the same tokenizer — and the target runs the
 * pending token and the drafts in one batched forward, so each routed expert is read once for
 * the whole batch (chunked prefill is bit-identical to token-by-token, so every row's logits are
 * those plain decoding would see). The longest prefix the target agrees with is kept, plus the
 * target's own token after it.
 *
 * Verification keeps the output distribution (Leviathan et al. 2023, "Fast Inference from
 * Transformers via Speculative Decoding"): draft x drawn from q is accepted with probability
 * min(1, p(x)/q(x)), a rejection draws from norm(max(0, p − q)). A deterministic draft (prompt
 * lookup, or any draft under greedy decoding) has a one-hot q: accept x with probability p(x),
 * else draw from p without x. That case is run by drawing the target's token with the plain
 * sampler's own uniform and comparing, which is that rule with the uniform shared, so the tokens
 * are exactly those of decoding without speculation at the same seed. A sampled model draft uses
 * the general rule with its own stream of uniforms: the same distribution, other tokens.
 *
 * Attention caches need no undo: rows of rejected drafts lie past the kept positions and are
 * overwritten before any query reads them (a sliding window's ring holds W + maxBatch − 1 rows,
 * enough for a batch). A recurrent state (KDA) cannot rewind: it is copied before a verify pass
 * and, when a draft was rejected, put back and the kept tokens are run again.
 *
 * A gate measures time per token with and without speculation and stops drafting while drafting
 * loses (acceptance below the measured break-even), probing again after a backoff.
 *
 * @module
 */
import { type TokenLogprob, tokenLogprob } from "./logprobs.ts";
import { Model, type RunOptions } from "./model.ts";
import {
  argmax,
  drawFrom,
  penalisedLogits,
  type Sampler,
  type SamplerOptions,
  samplingDistribution,
  seededUniform,
} from "./sampler.ts";
import { loadTokenizer, type Tokenizer } from "./tokenizer.ts";
import type { MtpMode } from "./transformer.ts";

/** How to speculate; absent fields take their defaults. */
export interface SpecOptions {
  /** Prompt lookup: longest n-gram of the context to match (`--spec ngram[:N]`, default 3). */
  ngram?: number;
  /** A draft container with the same tokenizer (`--draft MODEL`). */
  draft?: string;
  /** Draft with the container's multi-token-prediction layer (`--spec mtp`). */
  mtp?: boolean;
  /** Most drafted tokens per pass (default {@link DEFAULT_DRAFT_MAX}). */
  draftMax?: number;
  /** Stop drafting while it does not pay (default true). */
  adaptive?: boolean;
}

/** Drafted tokens per pass when none is asked for. */
export const DEFAULT_DRAFT_MAX = 5;
/** Longest n-gram prompt lookup matches when `--spec ngram` gives none. */
export const DEFAULT_NGRAM = 3;
const MAX_NGRAM = 64;

/** What `--spec ngram[:N]` or `--spec mtp` asks for, or an error naming the flag. */
export function parseSpec(value: string): Pick<SpecOptions, "ngram" | "mtp"> {
  if (value === "mtp") return { mtp: true };
  const m = /^ngram(?::(\d+))?$/.exec(value);
  const n = m ? Number(m[1] ?? DEFAULT_NGRAM) : NaN;
  if (!(n >= 1 && n <= MAX_NGRAM)) {
    throw new Error(
      `--spec: expected ngram or ngram:N with N in 1..${MAX_NGRAM}, or mtp, got "${value}"`,
    );
  }
  return { ngram: n };
}

/** Counters of the decode loop, for the stats block. */
export interface DecodeCounters {
  /** Target forward passes during decode (verify passes and recurrent-state re-runs included). */
  passes: number;
  /** Tokens drafted and verified. */
  drafted: number;
  /** Of those, the ones the target kept. */
  accepted: number;
  /** Decode steps run without drafts because the gate measured that drafting did not pay. */
  gated: number;
}

/** A batch of drafted tokens; `q` holds each one's draft distribution (null: one-hot). */
interface Draft {
  tokens: number[];
  q: Float64Array[] | null;
}

/** Something that proposes tokens to follow `history`. */
interface Drafter {
  draft(history: readonly number[], k: number): Draft;
  /** Drafts of the first pass (default: the most); the length then adapts to what is kept. */
  readonly startLength?: number;
  /** The gate probes before it measures plain steps (see SpecGate). */
  readonly probeFirst?: boolean;
  /**
   * Told what the next pass wants of it: drafts ("run"), none while the gate measures plain steps
   * ("idle"), or none while the gate holds drafting off ("off"); null when the generation ends.
   */
  mode?(mode: MtpMode | null): void;
}

/** Prompt lookup: the tokens after the latest earlier occurrence of the context's last n-gram. */
export function ngramDraft(history: readonly number[], n: number, k: number): number[] {
  const len = history.length;
  for (let size = Math.min(n, len - 1); size >= 1; size--) {
    const tail = len - size;
    for (let s = tail - 1; s >= 0; s--) {
      let j = 0;
      while (j < size && history[s + j] === history[tail + j]) j++;
      if (j === size) return history.slice(s + size, Math.min(s + size + k, len));
    }
  }
  return [];
}

/** A second, smaller model drafting with the target's sampling settings. */
class ModelDrafter implements Drafter {
  readonly model: Model;
  /** The ids the draft's KV cache holds; kept by {@link Speculation} across generations. */
  #cached: number[];
  #opts: SamplerOptions;
  #uniform: () => number;

  constructor(model: Model, cached: number[], opts: SamplerOptions, seed: number) {
    this.model = model;
    this.#cached = cached;
    this.#opts = opts;
    this.#uniform = seededUniform((seed ^ 0x6a09e667) >>> 0);
  }

  draft(history: readonly number[], k: number): Draft {
    const m = this.model;
    k = Math.min(k, m.maxContext - history.length);
    if (k <= 0) return { tokens: [], q: null };
    // Its KV cache keeps what it ran; only the tokens it has not seen (at least the last) run.
    let p = 0;
    while (p < history.length - 1 && p < this.#cached.length && this.#cached[p] === history[p]) {
      p++;
    }
    this.#cached.length = p;
    let logits: Float32Array = new Float32Array(0);
    for (; p < history.length; p += m.prefillChunk) {
      const part = history.slice(p, p + m.prefillChunk);
      logits = m.forward(part, p);
      this.#cached.push(...part);
    }
    const o = this.#opts;
    const greedy = (o.temperature ?? 0) === 0;
    const hist = [...history];
    const tokens: number[] = [];
    const q: Float64Array[] = [];
    for (let i = 0; i < k; i++) {
      let d: number;
      if (greedy) {
        d = greedyDraft(logits, hist, o);
      } else {
        const dist = samplingDistribution(logits, hist, o);
        d = drawFrom(dist, this.#uniform());
        q.push(dist);
      }
      tokens.push(d);
      hist.push(d);
      if (i + 1 < k) {
        logits = m.forward([d], hist.length - 1);
        this.#cached.push(d);
      }
    }
    return { tokens, q: greedy ? null : q };
  }
}

/** The token greedy decoding with `o`'s penalties picks from `logits` after `hist`. */
function greedyDraft(logits: Float32Array, hist: readonly number[], o: SamplerOptions): number {
  return argmax(
    penalisedLogits(logits, hist, o.repetitionPenalty, o.frequencyPenalty, o.presencePenalty),
  );
}

/**
 * The model's multi-token-prediction layer as a drafter (engine/transformer.ts runs it beside
 * every pass, so its cache holds every settled position, except while the gate has drafting
 * shut): the first draft reads the main
 * hidden state of the position before the pending token and the pending token, each next one
 * the hidden state the step before returns and the draft before. Drafts are the (penalised)
 * argmax, a one-hot q even when sampling, so the target's tokens are those of plain decoding at
 * the same seed.
 */
class MtpDrafter implements Drafter {
  /**
   * One step is what the layer was trained for (DeepSeek-V3 §2.2; vLLM drafts one by default);
   * chained steps are earned by kept drafts. A first pass of one draft also makes a probe of a
   * layer that does not pay cheap: a verify pass of two rows, not draftMax + 1.
   */
  readonly startLength = 1;
  /**
   * Right after the prompt its rows are complete and its room is held: probing first uses both,
   * and a layer that does not pay gives the room back four steps in, not eight (plain steps
   * measured with the room lent are not plain decoding's anyway; the probe is judged again
   * against the plain steps after it).
   */
  readonly probeFirst = true;
  #model: Model;
  #seq: number;
  #opts: SamplerOptions;

  constructor(model: Model, seq: number, opts: SamplerOptions) {
    this.#model = model;
    this.#seq = seq;
    this.#opts = opts;
  }

  draft(history: readonly number[], k: number): Draft {
    const t = this.#model.transformer;
    // The pending token is at n − 1; the last pass ran n − 2.
    const pos = history.length - 2;
    let hidden = pos >= 0 ? t.mtpHidden(this.#seq, pos) : null;
    if (!hidden) return { tokens: [], q: null };
    const hist = [...history];
    const tokens: number[] = [];
    for (let i = 0; i < k; i++) {
      const step = t.mtpStep(this.#seq, hidden, hist[hist.length - 1], pos + i);
      const d = greedyDraft(step.logits, hist, this.#opts);
      tokens.push(d);
      hist.push(d);
      hidden = step.hidden;
    }
    return { tokens, q: null };
  }

  mode(mode: MtpMode | null): void {
    this.#model.transformer.mtpMode(this.#seq, mode);
  }
}

/** Prompt lookup as a drafter. */
class NgramDrafter implements Drafter {
  #n: number;
  constructor(n: number) {
    this.#n = n;
  }
  draft(history: readonly number[], k: number): Draft {
    return { tokens: ngramDraft(history, this.#n, k), q: null };
  }
}

/**
 * Decides per step whether to draft, from measured milliseconds per emitted token with and
 * without drafts: probe, measure plain steps, then keep drafting while it is faster or back off
 * (doubling) while it is not. A stretch of drafting steps that kept no draft at all cannot have
 * paid, whatever the clock says (a pass with drafts costs at least a plain one), so it backs off
 * at once: noisy timings on a loaded machine cannot keep a useless drafter going. A backoff is
 * long enough that the probe before it costs at most {@link SpecGate.PROBE_SHARE} of the time.
 */
export class SpecGate {
  static readonly PROBE = 4;
  static readonly MEASURE = 4;
  static readonly KEEP = 32;
  static readonly MIN_BACKOFF = 32;
  static readonly MAX_BACKOFF = 1024;
  /**
   * Most of the time a stretch of drafting that did not pay may have cost, as a share of the
   * plain steps of the backoff after it: a probe costing 20 plain steps' time is followed by
   * 1000 plain steps, so probing keeps a drafter that does not pay above 0.98× of plain decoding.
   */
  static readonly PROBE_SHARE = 0.02;
  readonly adaptive: boolean;
  #spec = NaN;
  #plain = NaN;
  // Plain steps are measured first: the cold start's first reads then weigh against plain
  // decoding, and the comparison after each kept stretch corrects a wrong start.
  #phase: SpecGate["phase"] = "measure";
  #left: number = SpecGate.MEASURE;
  #backoff: number = SpecGate.MIN_BACKOFF;
  /** Drafts kept in the current stretch (probe or keep), its time and its tokens. */
  #kept = 0;
  #stretchMs = 0;
  #stretchTokens = 0;
  /** The last stretch that did not pay (its time and tokens), and the steps it is off for. */
  #lost = { ms: 0, tokens: 0 };
  #offSteps = 0;

  /**
   * A gate that drafts always unless `adaptive`; with `probeFirst` it probes before measuring
   * plain steps (a drafter whose state is freshest, and whose room is held, right after the
   * prompt: the MTP layer).
   */
  constructor(adaptive: boolean, probeFirst = false) {
    this.adaptive = adaptive;
    if (probeFirst) this.#enter("probe", SpecGate.PROBE);
  }

  /** Whether the next step should draft. */
  get drafting(): boolean {
    return !this.adaptive || this.#phase === "probe" || this.#phase === "keep";
  }

  /** Records one step: whether it verified drafts, its time and the tokens it emitted. */
  record(drafted: boolean, ms: number, tokens: number): void {
    if (tokens <= 0) return;
    const ema = (old: number, x: number) => (Number.isNaN(old) ? x : 0.7 * old + 0.3 * x);
    if (drafted) this.#spec = ema(this.#spec, ms / tokens);
    else this.#plain = ema(this.#plain, ms / tokens);
    if (drafted) {
      // A drafting step emits its kept drafts and the target's token after them.
      this.#kept += tokens - 1;
      this.#stretchMs += ms;
      this.#stretchTokens += tokens;
    }
    if (!this.adaptive || drafted !== this.drafting || --this.#left > 0) return;
    // The stretch's cost judged again against plain steps measured since (the first ones, before
    // any probe, read a cold cache and make a probe look cheap): off longer if it was dearer.
    const owed = this.#phase === "off" ? this.#byCost(this.#lost) - this.#offSteps : 0;
    if (owed > 0) {
      this.#left = owed;
      this.#offSteps += owed;
    } else if (drafted && this.#kept === 0) {
      this.#off();
    } else if (
      this.#phase === "keep" || (this.#phase === "probe" && Number.isNaN(this.#plain))
    ) {
      this.#enter("measure", SpecGate.MEASURE);
    } else if (this.#phase === "off" || Number.isNaN(this.#spec)) {
      this.#enter("probe", SpecGate.PROBE);
    } else if (this.#spec < this.#plain) {
      this.#enter("keep", SpecGate.KEEP);
      this.#backoff = SpecGate.MIN_BACKOFF;
    } else {
      this.#off();
    }
  }

  /**
   * Drafting did not pay: off for the backoff (doubling each time), or longer where the stretch
   * cost more than plain steps would have: long enough that it costs at most PROBE_SHARE of the
   * time until the next probe (a drafter with a costly probe, such as an MTP layer whose room
   * the expert cache lends, is probed rarely).
   */
  #off(): void {
    this.#lost = { ms: this.#stretchMs, tokens: this.#stretchTokens };
    const steps = Math.max(this.#backoff, this.#byCost(this.#lost));
    this.#enter("off", steps);
    this.#offSteps = steps;
    this.#backoff = Math.min(2 * this.#backoff, SpecGate.MAX_BACKOFF);
  }

  /**
   * Plain steps after a stretch of `ms` for `tokens` for it to cost at most PROBE_SHARE of the
   * time, at the plain time per token measured now (at most MAX_BACKOFF).
   */
  #byCost(stretch: { ms: number; tokens: number }): number {
    const excess = stretch.ms - stretch.tokens * this.#plain;
    if (!(excess > 0)) return 0;
    return Math.min(
      Math.ceil(excess / (SpecGate.PROBE_SHARE * this.#plain)),
      SpecGate.MAX_BACKOFF,
    );
  }

  #enter(phase: SpecGate["phase"], steps: number): void {
    this.#phase = phase;
    this.#left = steps;
    this.#kept = 0;
    this.#stretchMs = 0;
    this.#stretchTokens = 0;
  }

  /** The gate's phase: plain steps measured, drafts probed, kept, or off for a backoff. */
  get phase(): "measure" | "probe" | "keep" | "off" {
    return this.#phase;
  }
}

/** An open speculation setup: the drafter and its settings, kept across generations. */
export class Speculation {
  readonly draftMax: number;
  readonly adaptive: boolean;
  readonly #ngram: number;
  readonly #draftModel: Model | null;
  readonly #draftCached: number[] = [];
  /** The target whose MTP layer drafts, or null. */
  readonly #mtp: Model | null;

  private constructor(
    ngram: number,
    draftModel: Model | null,
    mtp: Model | null,
    draftMax: number,
    adaptive: boolean,
  ) {
    this.#ngram = ngram;
    this.#mtp = mtp;
    this.#draftModel = draftModel;
    this.draftMax = draftMax;
    this.adaptive = adaptive;
  }

  /**
   * Opens what `spec` asks for against the target `model` and its `tokenizer`: a draft container
   * must share the tokenizer (every id decodes to the same text) and have no recurrent state;
   * MTP drafts need the model opened with its MTP layer running (RunOptions `mtp`).
   */
  static async open(
    spec: SpecOptions,
    model: Model,
    tokenizer: Tokenizer,
    run: RunOptions,
  ): Promise<Speculation | null> {
    const kinds = [spec.ngram !== undefined, spec.draft !== undefined, spec.mtp === true];
    if (!kinds.includes(true)) return null;
    if (kinds.filter((k) => k).length > 1) {
      throw new Error("give one of --spec ngram, --spec mtp or --draft MODEL");
    }
    if (spec.mtp && !model.transformer.mtp) {
      throw new Error(
        `${model.container.dir}: --spec mtp needs the model opened with its MTP layer running`,
      );
    }
    const draftMax = spec.draftMax ?? DEFAULT_DRAFT_MAX;
    if (!Number.isInteger(draftMax) || draftMax < 1 || draftMax > model.prefillChunk - 1) {
      throw new Error(
        `--draft-max: expected an integer in 1..${model.prefillChunk - 1} (the prefill chunk ` +
          `less one), got ${draftMax}`,
      );
    }
    if (spec.ngram !== undefined && !(spec.ngram >= 1 && spec.ngram <= MAX_NGRAM)) {
      throw new Error(`--spec ngram:N: N must be in 1..${MAX_NGRAM}, got ${spec.ngram}`);
    }
    let draft: Model | null = null;
    if (spec.draft !== undefined) {
      draft = await Model.open(spec.draft, {
        ctx: model.maxContext,
        threads: run.threads,
        io: run.io,
        quiet: true,
      });
      try {
        await checkDraft(spec.draft, draft, model, tokenizer);
      } catch (e) {
        draft.close();
        throw e;
      }
    }
    return new Speculation(
      spec.ngram ?? 0,
      draft,
      spec.mtp ? model : null,
      draftMax,
      spec.adaptive ?? true,
    );
  }

  /**
   * A drafter for one generation on sequence `seq` with the target's sampling settings and seed.
   */
  drafter(opts: SamplerOptions, seed: number, seq: number): Drafter {
    if (this.#mtp) return new MtpDrafter(this.#mtp, seq, opts);
    return this.#draftModel
      ? new ModelDrafter(this.#draftModel, this.#draftCached, opts, seed)
      : new NgramDrafter(this.#ngram);
  }

  /**
   * Whether each sequence of a batch can draft on its own: prompt lookup keeps nothing, and the
   * MTP layer keeps a cache per sequence; a draft model keeps one cache.
   */
  get perSequence(): boolean {
    return this.#draftModel === null;
  }

  /**
   * Forgets what the draft model's KV cache holds, so the next generation drafts from position 0
   * rather than after whatever prefix it shares with the last one (another user's, in a server).
   */
  forgetDraftCache(): void {
    this.#draftCached.length = 0;
  }

  /** Closes the draft model. */
  close(): void {
    this.#draftModel?.close();
  }
}

/** Refuses a draft model with another vocabulary or tokenizer, or a recurrent state. */
async function checkDraft(
  path: string,
  draft: Model,
  target: Model,
  tokenizer: Tokenizer,
): Promise<void> {
  if (draft.cfg.vocabSize !== target.cfg.vocabSize) {
    throw new Error(
      `--draft ${path}: its vocabulary has ${draft.cfg.vocabSize} ids, the model's ` +
        `${target.cfg.vocabSize}; a draft must share the tokenizer`,
    );
  }
  if (draft.transformer.stateRegions().length > 0) {
    throw new Error(`--draft ${path}: a recurrent-state (KDA) model cannot rewind to draft`);
  }
  const other = await loadTokenizer(draft.container.dir);
  for (let id = 0; id < target.cfg.vocabSize; id++) {
    const a = tokenizer.decode([id]), b = other.decode([id]);
    if (a !== b) {
      throw new Error(
        `--draft ${path}: its tokenizer differs from the model's (id ${id} is ` +
          `${JSON.stringify(b)} there, ${JSON.stringify(a)} here)`,
      );
    }
  }
}

/** A per-step restriction of the vocabulary (a grammar matcher: structured output). */
export interface TokenConstraint {
  /** Sets the logits of disallowed ids to −Infinity. */
  mask(logits: Float32Array): void | Promise<void>;
  /** Advances past the sampled `id`; false when the grammar is complete (generation ends). */
  accept(id: number): boolean;
}

/** One generated id, with its log probability when asked for. */
export interface DecodedToken {
  id: number;
  logprob?: TokenLogprob;
}

/** Why a decode loop ended: a stop id or the constraint's end, or `maxTokens`. */
export type DecodeEnd = "stop" | "length";

/** What one generation's decode loop works on. */
export interface DecodeSetup {
  model: Model;
  sampler: Sampler;
  /** The resolved sampling settings the sampler was built with. */
  sampling: SamplerOptions;
  /** Prompt ids; the generated ids are appended as they are kept. */
  history: number[];
  /** The ids the KV cache holds (the prompt cache): kept tokens are appended as they run. */
  cached: number[];
  /** Logits after the last prompt token. */
  logits: Float32Array;
  /** The sequence whose state the passes run on. */
  seq: number;
  /** Runs a pass on that sequence (see Session's Lane). */
  forward(tokens: number[], pos: number, allLogits?: boolean): Promise<Float32Array>;
  /** Most ids to generate. */
  maxTokens: number;
  /** Ids that end the generation (not yielded). */
  stop: Set<number>;
  /** The drafter's setup, or null for plain decoding (always null with a constraint). */
  spec: Speculation | null;
  /** Restricts every step's choice (structured output); drafting is off with one. */
  constraint?: TokenConstraint;
  /** Report each token's log probability with this many alternatives. */
  logprobs?: number;
  /** Where the loop counts its passes and drafts. */
  counters: DecodeCounters;
}

/**
 * Yields the generated ids one by one until a stop id (not yielded), `maxTokens`, or a
 * constraint's end; between yields `history` and `cached` are consistent with the KV cache.
 */
export async function* decode(s: DecodeSetup): AsyncGenerator<DecodedToken, DecodeEnd> {
  const { model, sampler, history, cached, stop, counters, constraint } = s;
  if (constraint && s.spec) throw new Error("decode: drafts cannot be verified under a constraint");
  if (s.maxTokens <= 0) return "length";
  /**
   * `row` as the sampler sees it without a draft: masked by the constraint, if any. The mask
   * writes −Infinity into the logits: on a copy, never into the model's buffer.
   */
  const restrict = async (row: Float32Array): Promise<Float32Array> => {
    if (!constraint) return row;
    const masked = row.slice();
    await constraint.mask(masked);
    return masked;
  };
  const withLogprob = (row: Float32Array, id: number): DecodedToken =>
    s.logprobs === undefined ? { id } : { id, logprob: tokenLogprob(row, id, s.logprobs) };
  const row0 = await restrict(s.logits);
  const first = sampler.sample(row0, history);
  if (stop.has(first)) return "stop";
  history.push(first);
  yield withLogprob(row0, first);
  if (constraint && !constraint.accept(first)) return "stop";
  let generated = 1;
  const vocab = model.cfg.vocabSize;
  const drafter = s.spec?.drafter(s.sampling, sampler.seed, s.seq) ?? null;
  const gate = new SpecGate(s.spec?.adaptive ?? true, drafter?.probeFirst);
  // A copy of each recurrent state (outside the arena) only when drafts will be verified.
  const states = drafter ? model.transformer.stateRegions(s.seq) : [];
  const saved = states.map((r) => new Uint8Array(r.bytes));
  const sampled = (s.sampling.temperature ?? 0) > 0;
  const uniform = seededUniform((sampler.seed ^ 0xbb67ae85) >>> 0);
  // Draft length: one more after a fully kept draft, the kept run plus one after a rejection,
  // so rejected drafts cost little where the drafter is often wrong.
  let length = Math.min(drafter?.startLength ?? Infinity, s.spec?.draftMax ?? 0);
  // The router lookahead predicts for every token of a verify pass while this loop runs.
  const lookahead = model.observers.lookahead;
  if (lookahead) lookahead.predictBatch = length + 1;
  try {
    return yield* rounds();
  } finally {
    if (lookahead) lookahead.predictBatch = 1;
    drafter?.mode?.(null);
  }
  async function* rounds(): AsyncGenerator<DecodedToken, DecodeEnd> {
    while (generated < s.maxTokens) {
      const t0 = performance.now();
      // The last kept token is pending: the KV cache holds everything before it.
      const pos = history.length - 1;
      const room = Math.min(
        length,
        s.maxTokens - generated - 1,
        model.prefillChunk - 1,
        model.maxContext - history.length,
      );
      const wants = drafter !== null && room > 0 && gate.drafting;
      if (drafter !== null && room > 0 && !wants) counters.gated++;
      drafter?.mode?.(wants ? "run" : gate.phase === "off" ? "off" : "idle");
      const draft = wants ? drafter.draft(history, room) : { tokens: [], q: null };
      const nd = draft.tokens.length;
      if (nd > 0) states.forEach((r, i) => saved[i].set(model.arena.u8(r.offset, r.bytes)));
      const rows = await s.forward([history[pos], ...draft.tokens], pos, nd > 0);
      counters.passes++;
      counters.drafted += nd;
      cached.push(history[pos]);
      const emitted: DecodedToken[] = [];
      let accepted = 0, stopped = false;
      for (let i = 0; i <= nd; i++) {
        // Only the token after the last draft can be constrained: with a constraint nd is 0.
        const row = await restrict(rows.subarray(i * vocab, (i + 1) * vocab));
        let tok: number;
        if (i < nd && draft.q && sampled) {
          const p = samplingDistribution(row, history, s.sampling);
          const x = draft.tokens[i], q = draft.q[i];
          if (uniform() * q[x] < p[x]) tok = x;
          else tok = drawFrom(residual(p, q), uniform());
        } else if (i === nd && draft.q && sampled) {
          tok = drawFrom(samplingDistribution(row, history, s.sampling), uniform());
        } else {
          tok = sampler.sample(row, history);
        }
        if (stop.has(tok)) {
          stopped = true;
          break;
        }
        history.push(tok);
        emitted.push(withLogprob(row, tok));
        if (constraint && !constraint.accept(tok)) {
          stopped = true;
          break;
        }
        if (i === nd || tok !== draft.tokens[i]) break;
        accepted++;
      }
      counters.accepted += accepted;
      if (nd > 0) length = accepted === nd ? Math.min(length + 1, s.spec!.draftMax) : accepted + 1;
      cached.push(...draft.tokens.slice(0, accepted));
      if (states.length > 0 && accepted < nd) {
        // The recurrent state ran rejected drafts: restore it and run the kept tokens again.
        states.forEach((r, i) => model.arena.u8(r.offset, r.bytes).set(saved[i]));
        model.transformer.resumeAt(pos, s.seq);
        await s.forward(history.slice(pos, pos + 1 + accepted), pos);
        counters.passes++;
      }
      gate.record(nd > 0, performance.now() - t0, emitted.length);
      generated += emitted.length;
      yield* emitted;
      if (stopped) return "stop";
    }
    return "length";
  }
}

/** norm(max(0, p − q)): where a rejected draft's replacement is drawn from. */
function residual(p: Float64Array, q: Float64Array): Float64Array {
  const r = new Float64Array(p.length);
  let sum = 0;
  for (let i = 0; i < p.length; i++) {
    r[i] = Math.max(0, p[i] - q[i]);
    sum += r[i];
  }
  // p = q leaves nothing: a rejection then has probability 0 but rounding may still draw it.
  if (sum === 0) return p;
  for (let i = 0; i < r.length; i++) r[i] /= sum;
  return r;
}
