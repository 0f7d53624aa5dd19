/**
 * A model with its tokenizer, and the generate loop: chunked prefill of the prompt, then one
 * token at a time until a stop id or the token limit. This is what mod.ts hands to users.
 *
 * @module
 */
import { readJsonObjectIfExists } from "../io/json_file.ts";
import { type ChatMessage, checkChatMessages, renderChat } from "./chat.ts";
import { resolveChatTemplate, type ResolvedChatTemplate } from "./chat_templates.ts";
import { Model, type RunOptions } from "./model.ts";
import { createSampler, type SamplerOptions } from "./sampler.ts";
import {
  decode,
  type DecodedToken,
  type DecodeEnd,
  type SpecOptions,
  Speculation,
  type TokenConstraint,
} from "./speculate.ts";
import type { TokenLogprob } from "./logprobs.ts";

export type { TokenConstraint };
import { collectStats, ioWaitMs, type RunStats, type Timings } from "./stats.ts";
import { loadTokenizer, type Tokenizer } from "./tokenizer.ts";
import { PassInterrupted } from "./transformer.ts";

/** Options of one generation. */
export interface GenerateOptions extends SamplerOptions {
  /** Most new tokens (default 256). */
  maxTokens?: number;
  /** Keep going past end-of-sequence ids. */
  ignoreEos?: boolean;
  /** Extra ids that end the generation. */
  stopIds?: number[];
  /** Ends the generation quietly at the next prompt chunk or token once aborted. */
  signal?: AbortSignal;
  /** Awaited after each prompt chunk with the prompt tokens done so far (progress, keep-alives). */
  onPrefill?: (done: number, total: number) => void | Promise<void>;
  /** Keep special tokens in the yielded text (tool-call and channel markers are special). */
  keepSpecial?: boolean;
  /** Restricts each step to the tokens a grammar allows (structured output). */
  constraint?: TokenConstraint;
  /** Report each token's log probability with this many alternatives (0 for none). */
  logprobs?: number;
}

/** How to open a session: the model's run options, and speculative decoding. */
export interface SessionOptions extends RunOptions {
  /** Draft tokens and verify them in one batched pass (engine/speculate.ts); off when absent. */
  spec?: SpecOptions;
}

/**
 * The sequence a generation runs on: whose state (of the model's `parallel` sequences) its
 * caches are, where its timings go, and how its forward passes run (at once, or as rows of a
 * batched pass, engine/batch.ts).
 */
export interface Lane {
  readonly seq: number;
  readonly timings: Timings;
  /**
   * Logits of the last of `tokens` run at positions pos.. on this sequence (or of all). Once
   * `signal` is aborted the pass may end between two layers with PassInterrupted
   * (engine/transformer.ts).
   */
  forward(
    tokens: number[],
    pos: number,
    allLogits?: boolean,
    signal?: AbortSignal,
  ): Promise<Float32Array>;
  /** Whether the session's speculative decoding may run (its drafter keeps one cache). */
  speculate: boolean;
}

/** Fresh timings with nothing run yet. */
export function emptyTimings(loadMs = 0): Timings {
  return {
    loadMs,
    promptTokens: 0,
    cachedTokens: 0,
    promptMs: 0,
    generatedTokens: 0,
    generateMs: 0,
    decode: { passes: 0, drafted: 0, accepted: 0, gated: 0 },
    stopReason: null,
    ioWaitAtStart: 0,
  };
}

/** One generated token. */
export interface GeneratedToken {
  id: number;
  /** Text that became printable with this token (may be empty). */
  text: string;
  /** Its log probability, when asked for (GenerateOptions.logprobs). */
  logprob?: TokenLogprob;
}

/** An open model and tokenizer, ready to generate. */
export class Session {
  readonly model: Model;
  readonly tokenizer: Tokenizer;
  /** Timings of the last generation (and the load). */
  readonly timings: Timings;
  /** Sampling defaults of the checkpoint (see {@link samplingDefaults}); generate options win. */
  readonly samplingDefaults: SamplerOptions;
  /**
   * Decode counters summed over every generation of this session (`/metrics`): passes count
   * each generation's last prompt pass too, so tokens ÷ passes is tokens per pass.
   */
  readonly decodeTotals = { tokens: 0, passes: 0, drafted: 0, accepted: 0, gated: 0 };
  /** The drafter of speculative decoding, or null when it is off. */
  readonly speculation: Speculation | null;
  /** Per sequence: the ids its caches hold (the prompt cache). */
  #cached: number[][] = [];
  #template: ResolvedChatTemplate | null = null;
  /** Per sequence: its write count when #cached was last true; other writes invalidate it. */
  #cachedAt: number[] = [];
  /** How {@link generate} runs: on sequence 0, one pass at a time. */
  #solo: Lane;

  private constructor(
    model: Model,
    tokenizer: Tokenizer,
    speculation: Speculation | null,
    loadMs: number,
  ) {
    this.model = model;
    this.tokenizer = tokenizer;
    this.speculation = speculation;
    this.samplingDefaults = samplingDefaults(model.container.dir);
    this.timings = emptyTimings(loadMs);
    this.#solo = {
      seq: 0,
      timings: this.timings,
      forward: (tokens, pos, allLogits, signal) =>
        Promise.resolve(
          model.forwardBatch(
            [{ seq: 0, tokens, pos, allLogits }],
            signal && (() => signal.aborted),
          )[0],
        ),
      speculate: true,
    };
  }

  /** Opens a container and its tokenizer (and the draft model `opts.spec` names). */
  static async open(path: string, opts: SessionOptions = {}): Promise<Session> {
    const t0 = performance.now();
    const { spec, ...run } = opts;
    // MTP drafts need the MTP layer running beside every pass, planned from the start.
    const model = await Model.open(path, spec?.mtp ? { ...run, mtp: true } : run);
    try {
      const tokenizer = await loadTokenizer(model.container.dir);
      const speculation = spec ? await Speculation.open(spec, model, tokenizer, run) : null;
      return new Session(model, tokenizer, speculation, performance.now() - t0);
    } catch (e) {
      model.close();
      throw e;
    }
  }

  /** Token ids of `text`, with BOS when the tokenizer adds it. */
  tokenize(text: string): number[] {
    return this.tokenizer.encode(text);
  }

  /**
   * Token ids of `messages` rendered by the checkpoint's chat template with the assistant header
   * appended (the template writes any BOS itself, as transformers does); `extra` holds further
   * template variables (llama.cpp's --chat-template-kwargs). Chat turns keep their tokens: where
   * the rendering starts with the text of the prompt cache's tokens (the last prompt and the
   * answer as sampled), those ids are kept and only the rest is tokenized, so the next turn runs
   * from the first token where the conversation differs rather than from wherever re-tokenizing
   * the answer splits it otherwise. `caches` are the token lists to continue from (default: the
   * prompt cache; a server passes the prefixes it keeps for the client, engine/prefix_cache.ts).
   */
  chatIds(
    messages: ChatMessage[],
    extra?: Record<string, unknown>,
    caches?: readonly (readonly number[])[],
  ): number[] {
    checkChatMessages(messages, this.model.maxContext);
    return this.continuationIds(this.chatPrompt(messages, extra), caches);
  }

  /**
   * Token ids of a rendered chat prompt `text` (special tokens as text, no BOS added): where it
   * starts with the text of the prompt cache's tokens (the last prompt and the answer as
   * sampled), those ids are kept and only the rest is tokenized. Of several `caches` (default:
   * the prompt cache), the one whose text covers most tokens of `text` is kept.
   */
  continuationIds(
    text: string,
    caches: readonly (readonly number[])[] = [this.cachedTokens],
  ): number[] {
    const fresh = this.tokenizer.encode(text, { addSpecial: false });
    let cached: readonly number[] = [];
    let keep = { tokens: 0, chars: 0 };
    for (const ids of caches) {
      const k = this.#textPrefix(ids, text);
      if (k.tokens > keep.tokens) [cached, keep] = [ids, k];
    }
    if (keep.tokens <= commonPrefix(cached, fresh, fresh.length)) return fresh;
    const rest = this.tokenizer.encode(text.slice(keep.chars), { addSpecial: false });
    return [...cached.slice(0, keep.tokens), ...rest];
  }

  /**
   * The most leading tokens of `ids` whose text (special tokens kept) starts `text`, and that
   * text's length. Binary search on prefixes; a prefix ending inside a UTF-8 sequence decodes to
   * a replacement character and simply fails.
   */
  #textPrefix(ids: readonly number[], text: string): { tokens: number; chars: number } {
    const textOf = (n: number) => this.tokenizer.decode(ids.slice(0, n));
    let lo = 0, hi = ids.length;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (text.startsWith(textOf(mid))) lo = mid;
      else hi = mid - 1;
    }
    return { tokens: lo, chars: textOf(lo).length };
  }

  /** The prompt text of `messages` (see {@link chatIds}). */
  chatPrompt(messages: ChatMessage[], extra?: Record<string, unknown>): string {
    return renderChat(this.chatTemplate.source, messages, { addGenerationPrompt: true, extra });
  }

  /** The chat template in use: the checkpoint's, else the built-in one (see its notice). */
  get chatTemplate(): ResolvedChatTemplate {
    this.#template ??= resolveChatTemplate(this.model.container.dir, this.tokenizer.specialTokens);
    return this.#template;
  }

  /** Renders chats with `override` (a Jinja file or a built-in name) instead. */
  useChatTemplate(override: string): void {
    this.#template = resolveChatTemplate(
      this.model.container.dir,
      this.tokenizer.specialTokens,
      override,
    );
  }

  /** Text of `ids`, special tokens skipped. */
  detokenize(ids: number[]): string {
    return this.tokenizer.decode(ids, { skipSpecial: true });
  }

  /** The ids that end a generation: the model's EOS ids and BOS (a new document starts). */
  stopIds(): Set<number> {
    const ids = new Set([...this.tokenizer.eosIds, ...this.model.cfg.eosIds]);
    if (this.model.cfg.bosId !== null) ids.add(this.model.cfg.bosId);
    return ids;
  }

  /** Token ids whose state the KV cache holds at positions 0..n−1: the prompt cache. */
  get cachedTokens(): readonly number[] {
    return this.cachedTokensOf(0);
  }

  /** Token ids whose state sequence `seq`'s caches hold at positions 0..n−1. */
  cachedTokensOf(seq: number): readonly number[] {
    // Forward calls made outside this session (model.forward) overwrote the KV cache.
    if (this.model.transformer.writes(seq) !== (this.#cachedAt[seq] ?? 0)) this.#cached[seq] = [];
    return this.#cached[seq] ??= [];
  }

  /** Forgets sequence `seq`'s prompt cache: its next generation runs its whole prompt. */
  resetCache(seq = 0): void {
    this.#cached[seq] = [];
  }

  /**
   * Declares that sequence `seq`'s KV cache now holds the state of `ids` (a saved session was
   * written back into it; see engine/session_state.ts).
   */
  adoptCache(ids: readonly number[], seq = 0): void {
    if (ids.length > this.model.maxContext) {
      throw new Error(`${ids.length} cached tokens; the context holds ${this.model.maxContext}`);
    }
    this.#cached[seq] = [...ids];
    this.#cachedAt[seq] = this.model.transformer.writes(seq);
  }

  /**
   * Generates from `prompt` (text, or ids used as they are) and yields each new token as it is
   * sampled. The longest prefix of the prompt that the KV cache already holds (from the previous
   * generation) is not run again; the tokens are the same as from an empty cache. An empty prompt
   * starts from BOS when the model has one (as llama.cpp does); a prompt that leaves no room in the
   * context, or an id outside the vocabulary, is refused with the numbers. The texts of the yielded
   * tokens add up to the decode of all generated ids: a token whose text the stream decoder still
   * holds back (part of a UTF-8 sequence) is yielded once its text is out, at the latest at the end.
   */
  generate(prompt: string | number[], opts: GenerateOptions = {}): AsyncGenerator<GeneratedToken> {
    return this.generateOn(this.#solo, prompt, opts);
  }

  /**
   * {@link generate} on `lane`: its sequence's caches, its timings, its way of running passes
   * (engine/batch.ts runs several lanes' passes together).
   */
  async *generateOn(
    lane: Lane,
    prompt: string | number[],
    opts: GenerateOptions = {},
  ): AsyncGenerator<GeneratedToken> {
    const seq = lane.seq;
    const ids = typeof prompt === "string" ? this.tokenize(prompt) : [...prompt];
    const bos = this.tokenizer.bosId ?? this.model.cfg.bosId;
    if (ids.length === 0 && bos !== null) ids.push(bos);
    if (ids.length === 0) {
      throw new Error("the prompt has no tokens and the model has no BOS token to start from");
    }
    const vocab = this.model.cfg.vocabSize;
    const bad = ids.findIndex((id) => !Number.isInteger(id) || id < 0 || id >= vocab);
    if (bad >= 0) {
      throw new Error(
        `prompt token ${bad} is id ${ids[bad]}, outside the vocabulary of ${vocab} (0..${
          vocab - 1
        })`,
      );
    }
    const ctx = this.model.maxContext;
    if (ids.length >= ctx) {
      throw new Error(
        `the prompt has ${ids.length} tokens but the context holds ${ctx}, leaving no room to ` +
          `generate: shorten the prompt or raise --ctx (this model allows up to ${this.model.cfg.maxPositions})`,
      );
    }
    const room = ctx - ids.length;
    const maxTokens = Math.min(opts.maxTokens ?? 256, room);
    const { signal, onPrefill, keepSpecial, constraint, logprobs, ...sampling } = opts;
    const given = Object.fromEntries(Object.entries(sampling).filter(([, x]) => x !== undefined));
    const resolved = { ...this.samplingDefaults, ...given };
    const sampler = createSampler(resolved);
    const stop = opts.ignoreEos
      ? new Set(opts.stopIds ?? [])
      : new Set([...this.stopIds(), ...(opts.stopIds ?? [])]);
    const t = lane.timings;
    const t0 = performance.now();
    // The last prompt token always runs: its logits pick the first new token. A recurrent state
    // (KDA) cannot rewind, nor a wrapped sliding-window ring past its spare rows: the cache is then
    // reused only when the prompt extends all it holds.
    const had = this.cachedTokensOf(seq);
    let reuse = commonPrefix(had, ids, ids.length - 1);
    if (!this.model.transformer.canResume(reuse, had.length, seq)) reuse = 0;
    const recurrent = this.model.transformer.stateRegions(seq).length > 0;
    const cached = this.#cached[seq] = had.slice(0, reuse);
    const mark = () => this.#cachedAt[seq] = this.model.transformer.writes(seq);
    t.promptTokens = ids.length;
    t.cachedTokens = reuse;
    t.generatedTokens = 0;
    t.generateMs = 0;
    t.stopReason = "aborted";
    t.ioWaitAtStart = ioWaitMs(this.model);
    let logits: Float32Array = new Float32Array(0);
    const chunk = this.model.prefillChunk;
    for (let p = reuse; p < ids.length; p += chunk) {
      if (signal?.aborted) return;
      const part = ids.slice(p, p + chunk);
      try {
        logits = await lane.forward(part, p, false, signal);
      } catch (e) {
        if (!(e instanceof PassInterrupted)) throw e;
        // Cancelled inside the chunk: the cache keeps the chunks before it (the chunk's
        // half-written rows lie beyond them), but a recurrent state ran part of it in some
        // layers and cannot rewind, so its sequence starts again from position 0.
        if (recurrent) cached.length = 0;
        mark();
        return;
      }
      cached.push(...part);
      mark();
      t.promptMs = performance.now() - t0;
      await onPrefill?.(p + part.length, ids.length);
    }
    t.promptMs = performance.now() - t0;
    t.decode = { passes: 0, drafted: 0, accepted: 0, gated: 0 };
    const steps = decode({
      model: this.model,
      sampler,
      sampling: resolved,
      history: [...ids],
      cached,
      logits,
      seq,
      forward: lane.forward,
      maxTokens,
      stop,
      // A grammar restricts every step: drafts sampled without it would only be rejected.
      spec: constraint || !lane.speculate ? null : this.speculation,
      constraint,
      logprobs,
      counters: t.decode,
    });
    try {
      const end = yield* this.#stream(steps, ids, keepSpecial ?? false, t, mark, signal);
      if (end === "stop") t.stopReason = "eos";
      else if (end === "length") {
        t.stopReason = t.generatedTokens === room ? "context" : "max_tokens";
      }
    } finally {
      // Ends the loop (and its lookahead setting) when the consumer stopped early.
      await steps.return("length");
      const d = this.decodeTotals;
      d.tokens += t.generatedTokens;
      d.passes += t.decode.passes + 1;
      d.drafted += t.decode.drafted;
      d.accepted += t.decode.accepted;
      d.gated += t.decode.gated;
    }
  }

  /**
   * Yields the ids of `steps` with their text, timing each step into `t` and marking the cache
   * true after each.
   */
  async *#stream(
    steps: AsyncGenerator<DecodedToken, DecodeEnd>,
    context: readonly number[],
    keepSpecial: boolean,
    t: Timings,
    mark: () => void,
    signal?: AbortSignal,
  ): AsyncGenerator<GeneratedToken, DecodeEnd | null> {
    // Decoded after the prompt, so the first token keeps its leading space ("The dog" + " was").
    const stream = this.tokenizer.decodeStream({ context, skipSpecial: !keepSpecial });
    // Tokens whose text the decoder holds back wait here, so the last one can carry the flush.
    let held: GeneratedToken[] = [];
    let end: DecodeEnd | null = null;
    while (!signal?.aborted) {
      const t1 = performance.now();
      const next = await steps.next();
      mark();
      t.generateMs += performance.now() - t1;
      if (next.done) {
        end = next.value;
        break;
      }
      const { id, logprob } = next.value;
      t.generatedTokens++;
      held.push({ id, text: stream.push(id), ...(logprob ? { logprob } : {}) });
      if (!stream.holding) {
        yield* held;
        held = [];
      }
    }
    if (held.length > 0) {
      held[held.length - 1].text += stream.flush();
      yield* held;
    }
    return end;
  }

  /** Counters and timings of the last generation (of the one `timings` are of). */
  stats(timings: Timings = this.timings): RunStats {
    return collectStats(this.model, timings, this.model.observers.lookahead?.recall ?? null);
  }

  /** Releases the workers, reader threads and files (the draft model's too). */
  close(): void {
    try {
      this.speculation?.close();
    } finally {
      this.model.close();
    }
  }
}

/** Length of the common prefix of `a` and `b`, at most `max`. */
export function commonPrefix(a: readonly number[], b: readonly number[], max: number): number {
  let n = 0;
  while (n < max && n < a.length && n < b.length && a[n] === b[n]) n++;
  return n;
}

/**
 * Sampling defaults from a container's generation_config.json: its temperature, top_k and top_p
 * when it asks for sampling (do_sample), else greedy (no options).
 */
export function samplingDefaults(dir: string): SamplerOptions {
  const path = `${dir}/generation_config.json`;
  const g = readJsonObjectIfExists(path);
  if (g.do_sample !== true) return {};
  const num = (v: unknown) => (typeof v === "number" && Number.isFinite(v) ? v : undefined);
  return { temperature: num(g.temperature) ?? 1, topK: num(g.top_k), topP: num(g.top_p) };
}
