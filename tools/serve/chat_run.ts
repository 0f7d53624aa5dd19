/**
 * One chat choice from a plan (chat_plan.ts): the grammar constraint on, the output split into
 * content, reasoning and tool calls as it streams, the log probabilities gathered. The OpenAI and
 * Anthropic endpoints both answer from its deltas and result.
 *
 * @module
 */
import type {
  GeneratedToken,
  GenerateOptions,
  Session,
  TokenConstraint,
} from "../../engine/session.ts";
import type { ChatPlan } from "./chat_plan.ts";
import { outputSplitter } from "./chat_output.ts";
import { compileGrammar, grammarConstraint, type MaskStats } from "./grammar.ts";
import { ApiError } from "./openai.ts";
import type { ToolCall } from "./tool_calls/mod.ts";

/** OpenAI's per-token log probability entry. */
export interface LogprobEntry {
  token: string;
  logprob: number;
  bytes: number[];
  top_logprobs: { token: string; logprob: number; bytes: number[] }[];
}

/** New output of a choice. */
export interface ChoiceDelta {
  content: string;
  reasoning: string;
  toolCalls: ToolCall[];
  logprobs: LogprobEntry[];
}

/** Why a generation ended, with the token counts. */
export interface GenerationEnd {
  finish: "stop" | "length";
  /** The stop string that ended the text, or null. */
  stopString: string | null;
  usage: {
    prompt_tokens: number;
    completion_tokens: number;
    total_tokens: number;
    prompt_tokens_details: { cached_tokens: number };
  };
}

/** The engine extras a choice passes to the server's generate loop. */
export interface EngineExtras
  extends Pick<GenerateOptions, "keepSpecial" | "constraint" | "logprobs"> {
  /** Stop strings added to the request's (a built-in template's end of turn). */
  stops?: string[];
  /** Each generated token, before stop strings cut the text. */
  onToken?: (tok: GeneratedToken) => void;
}

/** The server's generate loop for one request: ids in, text out through `send`. */
export type GenerateFn = (
  ids: number[],
  signal: AbortSignal,
  send: (text: string) => void,
  extras: EngineExtras,
) => Promise<GenerationEnd>;

/** A finished choice. */
export interface ChoiceResult extends GenerationEnd {
  content: string;
  reasoning: string;
  toolCalls: ToolCall[];
  logprobs: LogprobEntry[];
  /** "tool_calls" when the model called tools. */
  reason: "stop" | "length" | "tool_calls";
}

/** OpenAI's entry for `id` (its text and UTF-8 bytes). */
function entry(session: Session, id: number, logprob: number) {
  const token = session.tokenizer.decode([id]);
  return { token, logprob, bytes: [...new TextEncoder().encode(token)] };
}

/**
 * The per-step constraint of a choice: the grammar's mask, then `bias` added to those ids' logits
 * (a disallowed token stays disallowed). Undefined when there is neither.
 */
function biased(
  grammar: TokenConstraint | undefined,
  bias: ReadonlyMap<number, number>,
): TokenConstraint | undefined {
  if (bias.size === 0) return grammar;
  return {
    async mask(logits) {
      await grammar?.mask(logits);
      for (const [id, b] of bias) logits[id] += b;
    },
    accept: (id) => grammar?.accept(id) ?? true,
  };
}

/** Compiles a plan's grammar; a schema the grammar engine refuses is the client's 400. */
export async function planGrammar(session: Session, plan: ChatPlan) {
  if (!plan.grammar) return null;
  try {
    return await compileGrammar(session, plan.grammar);
  } catch (e) {
    const param = plan.grammar.kind === "tag" ? "tools" : "response_format";
    throw new ApiError(400, `${param}: the grammar engine refused it: ${(e as Error).message}`, {
      param,
    });
  }
}

/** What one choice runs on. */
export interface ChoiceInput {
  session: Session;
  generate: GenerateFn;
  plan: ChatPlan;
  compiled: Awaited<ReturnType<typeof planGrammar>>;
  parallelToolCalls: boolean;
  /** Alternatives per token to report, or undefined for no log probabilities. */
  logprobs: number | undefined;
  /** Added to the logits of these ids (ids checked against the vocabulary by the caller). */
  logitBias: ReadonlyMap<number, number>;
  signal: AbortSignal;
  maskStats?: MaskStats;
}

/** Runs one choice; `onDelta` gets the output as it becomes final. */
export async function runChoice(
  input: ChoiceInput,
  onDelta: (d: ChoiceDelta) => void,
): Promise<ChoiceResult> {
  const { session, generate, plan, compiled, parallelToolCalls, signal, maskStats } = input;
  const splitter = outputSplitter(plan.output);
  const result = {
    content: "",
    reasoning: "",
    toolCalls: [] as ToolCall[],
    logprobs: [] as LogprobEntry[],
  };
  let pending: LogprobEntry[] = [];
  const deliver = (content: string, reasoning: string, toolCalls: ToolCall[]) => {
    if (!content && !reasoning && toolCalls.length === 0 && pending.length === 0) return;
    result.content += content;
    result.reasoning += reasoning;
    result.toolCalls.push(...toolCalls);
    result.logprobs.push(...pending);
    onDelta({ content, reasoning, toolCalls, logprobs: pending });
    pending = [];
  };
  const grammar = compiled ? await grammarConstraint(session, compiled, maskStats) : undefined;
  const constraint = biased(grammar, input.logitBias);
  let end: GenerationEnd;
  try {
    end = await generate(plan.ids, signal, (text) => {
      const d = splitter.push(text);
      deliver(d.content, d.reasoning, []);
    }, {
      keepSpecial: plan.keepSpecial,
      constraint,
      stops: plan.stops,
      logprobs: input.logprobs,
      onToken: (tok) => {
        if (!tok.logprob) return;
        pending.push({
          ...entry(session, tok.id, tok.logprob.logprob),
          top_logprobs: tok.logprob.top.map((t) => entry(session, t.id, t.logprob)),
        });
      },
    });
  } finally {
    grammar?.dispose();
  }
  const last = splitter.end();
  const calls = parallelToolCalls ? last.toolCalls : last.toolCalls.slice(0, 1);
  deliver(last.delta.content, last.delta.reasoning, calls);
  return { ...end, ...result, reason: calls.length > 0 ? "tool_calls" : end.finish };
}
