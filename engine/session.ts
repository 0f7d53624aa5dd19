/**
 * A model with its tokenizer, and the generate loop: chunked prefill of the prompt, then one
 * token at a time until a stop id or the token limit. This is what mod.ts hands to users.
 *
 * @module
 */
import { readJsonObjectIfExists } from "../io/json_file.ts";
import { type ChatMessage, renderChat } from "./chat.ts";
import { resolveChatTemplate, type ResolvedChatTemplate } from "./chat_templates.ts";
import { type TokenLogprob, tokenLogprob } from "./logprobs.ts";
import { Model, type RunOptions } from "./model.ts";
import { createSampler, type SamplerOptions } from "./sampler.ts";
import { collectStats, type RunStats, type Timings } from "./stats.ts";
import { loadTokenizer, type Tokenizer } from "./tokenizer.ts";

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

/** A per-step restriction of the vocabulary (a grammar matcher). */
export interface TokenConstraint {
  /** Sets the logits of disallowed ids to −Infinity. */
  mask(logits: Float32Array): void | Promise<void>;
  /** Advances past the sampled `id`; false when the grammar is complete (generation ends). */
  accept(id: number): boolean;
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
  #cached: number[] = [];
  #template: ResolvedChatTemplate | null = null;
  /** The transformer's call count when #cached was last true: other calls invalidate it. */
  #cachedAt = 0;

  private constructor(model: Model, tokenizer: Tokenizer, loadMs: number) {
    this.model = model;
    this.tokenizer = tokenizer;
    this.samplingDefaults = samplingDefaults(model.container.dir);
    this.timings = {
      loadMs,
      promptTokens: 0,
      cachedTokens: 0,
      promptMs: 0,
      generatedTokens: 0,
      generateMs: 0,
    };
  }

  /** Opens a container and its tokenizer. */
  static async open(path: string, opts: RunOptions = {}): Promise<Session> {
    const t0 = performance.now();
    const model = await Model.open(path, opts);
    try {
      const tokenizer = await loadTokenizer(model.container.dir);
      return new Session(model, tokenizer, performance.now() - t0);
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
   * template variables (llama.cpp's --chat-template-kwargs).
   */
  chatIds(messages: ChatMessage[], extra?: Record<string, unknown>): number[] {
    return this.tokenizer.encode(this.chatPrompt(messages, extra), { addSpecial: false });
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
    // Forward calls made outside this session (model.forward) overwrote the KV cache.
    if (this.model.transformer.calls !== this.#cachedAt) this.#cached = [];
    return this.#cached;
  }

  /** Forgets the prompt cache: the next generation runs its whole prompt. */
  resetCache(): void {
    this.#cached = [];
  }

  /**
   * Declares that the KV cache now holds the state of `ids` (a saved session was written back
   * into it; see engine/session_state.ts).
   */
  adoptCache(ids: readonly number[]): void {
    if (ids.length > this.model.maxContext) {
      throw new Error(`${ids.length} cached tokens; the context holds ${this.model.maxContext}`);
    }
    this.#cached = [...ids];
    this.#cachedAt = this.model.transformer.calls;
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
  async *generate(
    prompt: string | number[],
    opts: GenerateOptions = {},
  ): AsyncGenerator<GeneratedToken> {
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
    const maxTokens = Math.min(opts.maxTokens ?? 256, ctx - ids.length);
    const { signal, onPrefill, keepSpecial, constraint, logprobs, ...sampling } = opts;
    const given = Object.fromEntries(Object.entries(sampling).filter(([, x]) => x !== undefined));
    const sampler = createSampler({ ...this.samplingDefaults, ...given });
    const stop = opts.ignoreEos
      ? new Set(opts.stopIds ?? [])
      : new Set([...this.stopIds(), ...(opts.stopIds ?? [])]);
    const t = this.timings;
    const t0 = performance.now();
    // The last prompt token always runs: its logits pick the first new token. A recurrent state
    // (KDA) cannot rewind, so it is reused only when the prompt extends all it holds.
    let reuse = commonPrefix(this.cachedTokens, ids, ids.length - 1);
    const recurrent = this.model.transformer.stateRegions().length > 0;
    if (recurrent && reuse !== this.#cached.length) reuse = 0;
    this.#cached = this.#cached.slice(0, reuse);
    t.promptTokens = ids.length;
    t.cachedTokens = reuse;
    t.generatedTokens = 0;
    t.generateMs = 0;
    let logits: Float32Array = new Float32Array(0);
    const chunk = this.model.prefillChunk;
    for (let p = reuse; p < ids.length; p += chunk) {
      if (signal?.aborted) return;
      const part = ids.slice(p, p + chunk);
      logits = this.model.forward(part, p);
      this.#cached.push(...part);
      this.#cachedAt = this.model.transformer.calls;
      t.promptMs = performance.now() - t0;
      await onPrefill?.(p + part.length, ids.length);
    }
    t.promptMs = performance.now() - t0;
    const history = [...ids];
    const stream = this.tokenizer.decodeStream({ skipSpecial: !keepSpecial });
    // Tokens whose text the decoder holds back wait here, so the last one can carry the flush.
    let held: GeneratedToken[] = [];
    for (let n = 0; n < maxTokens && !signal?.aborted; n++) {
      const t1 = performance.now();
      if (constraint) {
        // The mask writes −Infinity into the logits: on a copy, never into the model's buffer.
        logits = logits.slice();
        await constraint.mask(logits);
      }
      const id = sampler.sample(logits, history);
      if (stop.has(id)) break;
      const more = constraint ? constraint.accept(id) : true;
      const logprob = logprobs !== undefined ? tokenLogprob(logits, id, logprobs) : undefined;
      history.push(id);
      t.generatedTokens++;
      if (n + 1 < maxTokens && more) {
        logits = this.model.forward([id], history.length - 1);
        this.#cached.push(id);
        this.#cachedAt = this.model.transformer.calls;
      }
      t.generateMs += performance.now() - t1;
      held.push({ id, text: stream.push(id), ...(logprob ? { logprob } : {}) });
      if (!stream.holding) {
        yield* held;
        held = [];
      }
      if (!more) break;
    }
    if (held.length > 0) {
      held[held.length - 1].text += stream.flush();
      yield* held;
    }
  }

  /** Counters and timings of the last generation. */
  stats(): RunStats {
    return collectStats(this.model, this.timings, this.model.observers.lookahead?.recall ?? null);
  }

  /** Releases the workers, reader threads and files. */
  close(): void {
    this.model.close();
  }
}

/** Length of the common prefix of `a` and `b`, at most `max`. */
function commonPrefix(a: readonly number[], b: readonly number[], max: number): number {
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
