/**
 * OpenAI's answers to `/v1/chat/completions` and `/v1/completions`: `n` choices run one after
 * another, as one JSON body or as SSE chunks — content, `reasoning_content`, `tool_calls` and
 * log probabilities per choice, then the finish reason, then usage when asked for.
 *
 * @module
 */
import type { Session } from "../../engine/session.ts";
import { type ChatPlan, planChat } from "./chat_plan.ts";
import {
  type ChoiceDelta,
  type ChoiceResult,
  type EngineExtras,
  type GenerationEnd,
  type LogprobEntry,
  planGrammar,
  runChoice,
} from "./chat_run.ts";
import type { MaskStats } from "./grammar.ts";
import { ApiError, type CompletionRequest } from "./openai.ts";
import type { ToolCall } from "./tool_calls/mod.ts";

/** What an answer is built from. */
export interface CompletionInput {
  session: Session;
  r: CompletionRequest;
  /** The model id. */
  id: string;
  /** Checks (and for text prompts, makes) the prompt ids. */
  promptIds: (r: CompletionRequest, planned?: number[]) => number[];
  /** The server's generate loop; `index` is the choice (it offsets the seed). */
  generate: (
    ids: number[],
    signal: AbortSignal,
    send: (text: string) => void,
    extras: EngineExtras,
    index: number,
  ) => Promise<GenerationEnd>;
  maskStats?: MaskStats;
  /** The client's cached prefixes, which a chat prompt may continue (see planChat). */
  caches?: readonly (readonly number[])[];
}

/** A prepared answer: run it whole, or streamed. */
export interface CompletionAnswer {
  whole(signal: AbortSignal): Promise<unknown>;
  stream(signal: AbortSignal, write: (s: string) => void): Promise<void>;
}

/** OpenAI's `tool_calls` entries. */
export function openaiToolCalls(calls: readonly ToolCall[], from = 0) {
  return calls.map((c, i) => ({
    index: from + i,
    id: c.id,
    type: "function" as const,
    function: { name: c.name, arguments: c.arguments },
  }));
}

/** Usage of n choices that share one prompt. */
function totalUsage(ends: GenerationEnd[]): GenerationEnd["usage"] {
  const u = structuredClone(ends[0].usage);
  u.completion_tokens = ends.reduce((a, e) => a + e.usage.completion_tokens, 0);
  u.total_tokens = u.prompt_tokens + u.completion_tokens;
  return u;
}

/** The legacy completions `logprobs` object. */
function textLogprobs(entries: LogprobEntry[]) {
  let offset = 0;
  const text_offset = entries.map((e) => {
    const at = offset;
    offset += e.token.length;
    return at;
  });
  return {
    tokens: entries.map((e) => e.token),
    token_logprobs: entries.map((e) => e.logprob),
    top_logprobs: entries.map((e) =>
      Object.fromEntries(e.top_logprobs.map((t) => [t.token, t.logprob]))
    ),
    text_offset,
  };
}

/** Prepares the answer of a (chat) completion request: renders, checks, compiles the grammar. */
export async function completionResponse(input: CompletionInput): Promise<CompletionAnswer> {
  const { session, r, id } = input;
  const chat = r.messages !== null;
  const plan: ChatPlan = chat ? planChat(session, r, input.caches) : {
    ids: [],
    output: { format: null, tools: [], thinkTags: false, startsInReasoning: false, harmony: false },
    keepSpecial: false,
    grammar: null,
    stops: [],
  };
  plan.ids = input.promptIds(r, chat ? plan.ids : undefined);
  const vocab = session.model.cfg.vocabSize;
  for (const id of r.logitBias.keys()) {
    if (id >= vocab) {
      throw new ApiError(
        400,
        `logit_bias: token id ${id} is outside the vocabulary [0, ${vocab})`,
        {
          param: "logit_bias",
        },
      );
    }
  }
  const compiled = await planGrammar(session, plan);
  const cid = `${chat ? "chatcmpl" : "cmpl"}-${crypto.randomUUID()}`;
  const created = Math.floor(Date.now() / 1000);
  const head = { id: cid, created, model: id };
  const run = (index: number, signal: AbortSignal, onDelta: (d: ChoiceDelta) => void) =>
    runChoice({
      session,
      generate: (ids, sig, send, extras) => input.generate(ids, sig, send, extras, index),
      plan,
      compiled,
      parallelToolCalls: r.parallelToolCalls,
      logprobs: r.logprobs,
      logitBias: r.logitBias,
      signal,
      maskStats: input.maskStats,
    }, onDelta);
  const wantLogprobs = r.logprobs !== undefined;

  const wholeChoice = (res: ChoiceResult, index: number) =>
    chat
      ? {
        index,
        message: {
          role: "assistant",
          content: res.toolCalls.length > 0 && !res.content ? null : res.content,
          ...(res.reasoning ? { reasoning_content: res.reasoning } : {}),
          ...(res.toolCalls.length > 0 ? { tool_calls: openaiToolCalls(res.toolCalls) } : {}),
        },
        logprobs: wantLogprobs ? { content: res.logprobs } : null,
        finish_reason: res.reason,
      }
      : {
        index,
        text: res.content,
        logprobs: wantLogprobs ? textLogprobs(res.logprobs) : null,
        finish_reason: res.finish,
      };

  return {
    whole: async (signal) => {
      const results: ChoiceResult[] = [];
      for (let i = 0; i < r.n && !signal.aborted; i++) results.push(await run(i, signal, () => {}));
      return {
        ...head,
        object: chat ? "chat.completion" : "text_completion",
        choices: results.map(wholeChoice),
        usage: totalUsage(results),
      };
    },
    stream: async (signal, write) => {
      const object = chat ? "chat.completion.chunk" : "text_completion";
      const chunk = (choices: unknown[], usage?: unknown) =>
        write(
          `data: ${JSON.stringify({ ...head, object, choices, ...(usage ? { usage } : {}) })}\n\n`,
        );
      const results: ChoiceResult[] = [];
      for (let index = 0; index < r.n && !signal.aborted; index++) {
        let first = true;
        let calls = 0;
        const send = (d: ChoiceDelta) => {
          const logprobs = wantLogprobs
            ? chat ? { content: d.logprobs } : textLogprobs(d.logprobs)
            : null;
          if (!chat) {
            chunk([{ index, text: d.content, logprobs, finish_reason: null }]);
            return;
          }
          const delta: Record<string, unknown> = first ? { role: "assistant" } : {};
          if (d.content || first) delta.content = d.content;
          if (d.reasoning) delta.reasoning_content = d.reasoning;
          if (d.toolCalls.length > 0) {
            delta.tool_calls = openaiToolCalls(d.toolCalls, calls);
            calls += d.toolCalls.length;
          }
          first = false;
          chunk([{ index, delta, logprobs, finish_reason: null }]);
        };
        const res = await run(index, signal, send);
        results.push(res);
        if (first && chat) send({ content: "", reasoning: "", toolCalls: [], logprobs: [] });
        const finish = chat ? res.reason : res.finish;
        chunk([
          chat
            ? { index, delta: {}, logprobs: null, finish_reason: finish }
            : { index, text: "", logprobs: null, finish_reason: finish },
        ]);
      }
      if (r.includeUsage && results.length > 0) chunk([], totalUsage(results));
      write("data: [DONE]\n\n");
    },
  };
}
