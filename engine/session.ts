/**
 * A model with its tokenizer, and the generate loop: chunked prefill of the prompt, then one
 * token at a time until a stop id or the token limit. This is what mod.ts hands to users.
 *
 * @module
 */
import { readJsonObjectIfExists } from "../io/json_file.ts";
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
}

/** One generated token. */
export interface GeneratedToken {
  id: number;
  /** Text that became printable with this token (may be empty). */
  text: string;
}

/** An open model and tokenizer, ready to generate. */
export class Session {
  readonly model: Model;
  readonly tokenizer: Tokenizer;
  /** Timings of the last generation (and the load). */
  readonly timings: Timings;
  /** Sampling defaults of the checkpoint (see {@link samplingDefaults}); generate options win. */
  readonly samplingDefaults: SamplerOptions;

  private constructor(model: Model, tokenizer: Tokenizer, loadMs: number) {
    this.model = model;
    this.tokenizer = tokenizer;
    this.samplingDefaults = samplingDefaults(model.container.dir);
    this.timings = { loadMs, promptTokens: 0, promptMs: 0, generatedTokens: 0, generateMs: 0 };
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

  /**
   * Generates from `prompt` (text, or ids used as they are) and yields each new token as it is
   * sampled. The KV cache starts empty on every call.
   */
  async *generate(
    prompt: string | number[],
    opts: GenerateOptions = {},
  ): AsyncGenerator<GeneratedToken> {
    const ids = typeof prompt === "string" ? this.tokenize(prompt) : [...prompt];
    if (ids.length === 0) throw new Error("generate: the prompt has no tokens");
    const ctx = this.model.maxContext;
    const maxTokens = Math.min(opts.maxTokens ?? 256, ctx - ids.length);
    if (maxTokens < 0) {
      throw new Error(`the prompt has ${ids.length} tokens; the context holds ${ctx}`);
    }
    const given = Object.fromEntries(Object.entries(opts).filter(([, x]) => x !== undefined));
    const sampler = createSampler({ ...this.samplingDefaults, ...given });
    const stop = opts.ignoreEos
      ? new Set(opts.stopIds ?? [])
      : new Set([...this.stopIds(), ...(opts.stopIds ?? [])]);
    const t = this.timings;
    const t0 = performance.now();
    let logits: Float32Array = new Float32Array(0);
    const chunk = this.model.prefillChunk;
    for (let p = 0; p < ids.length; p += chunk) {
      logits = this.model.forward(ids.slice(p, p + chunk), p);
    }
    t.promptTokens = ids.length;
    t.promptMs = performance.now() - t0;
    t.generatedTokens = 0;
    t.generateMs = 0;
    const history = [...ids];
    const stream = this.tokenizer.decodeStream();
    for (let n = 0; n < maxTokens; n++) {
      const t1 = performance.now();
      const id = sampler.sample(logits, history);
      if (stop.has(id)) break;
      history.push(id);
      t.generatedTokens++;
      if (n + 1 < maxTokens) logits = this.model.forward([id], history.length - 1);
      t.generateMs += performance.now() - t1;
      yield { id, text: stream.push(id) };
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
