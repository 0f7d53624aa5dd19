/**
 * Anthropic's Messages API on the same engine: `POST /v1/messages` (JSON or SSE with its event
 * types) and `POST /v1/messages/count_tokens`. A request is checked field by field, turned into
 * the OpenAI-shaped chat the rest of the server plans (system text, `tool_use` blocks as tool
 * calls, `tool_result` blocks as `tool` messages, `thinking` blocks as reasoning), and the answer
 * is written back as content blocks: thinking, text, tool_use.
 *
 * @module
 */
import type { ChatMessage } from "../../engine/chat.ts";
import type { Session } from "../../engine/session.ts";
import { type ChatPlan, planChat } from "./chat_plan.ts";
import { type ChoiceResult, type GenerateFn, planGrammar, runChoice } from "./chat_run.ts";
import type { MaskStats } from "./grammar.ts";
import { ApiError, type CompletionRequest } from "./openai.ts";
import type { ToolChoice } from "./chat_request.ts";
import type { ToolSpec } from "./tool_calls/mod.ts";
import { got } from "./quote.ts";

type Json = Record<string, unknown>;

/** An error in Anthropic's shape: `{type: "error", error: {type, message}}`. */
export class AnthropicError extends ApiError {
  /** Anthropic's error body. */
  override body(): Record<string, unknown> {
    const type = this.status === 401
      ? "authentication_error"
      : this.status === 404
      ? "not_found_error"
      : this.status === 413
      ? "request_too_large"
      : this.status === 429
      ? "rate_limit_error"
      : this.status >= 500
      ? "api_error"
      : "invalid_request_error";
    return { type: "error", error: { type, message: this.message } };
  }
}

/** The same error in Anthropic's shape. */
export function anthropicError(e: ApiError): AnthropicError {
  return new AnthropicError(e.status, e.message, {
    param: e.param ?? undefined,
    code: e.code ?? undefined,
    headers: e.headers,
  });
}

const bad = (param: string, message: string) =>
  new AnthropicError(400, `${param}: ${message}`, { param });

function isObject(v: unknown): v is Json {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** The text of a `tool_result`'s content: a string or text blocks. */
function resultText(v: unknown, p: string): string {
  if (typeof v === "string") return v;
  if (v === undefined || v === null) return "";
  if (!Array.isArray(v)) throw bad(p, "expected a string or text blocks");
  return v.map((b, i) => {
    if (!isObject(b) || b.type !== "text" || typeof b.text !== "string") {
      throw bad(`${p}[${i}]`, 'only {type: "text", text} blocks are supported');
    }
    return b.text;
  }).join("");
}

/** One Anthropic message as OpenAI-shaped chat messages (tool results first, as tool turns). */
function chatMessages(m: unknown, i: number): ChatMessage[] {
  const p = `messages[${i}]`;
  if (!isObject(m) || (m.role !== "user" && m.role !== "assistant")) {
    throw bad(`${p}.role`, 'expected "user" or "assistant"');
  }
  if (typeof m.content === "string") return [{ role: m.role, content: m.content }];
  if (!Array.isArray(m.content)) throw bad(`${p}.content`, "expected a string or blocks");
  const out: ChatMessage[] = [];
  let text = "";
  let reasoning = "";
  const calls: unknown[] = [];
  m.content.forEach((b, j) => {
    const q = `${p}.content[${j}]`;
    if (!isObject(b)) throw bad(q, "expected a content block");
    switch (b.type) {
      case "text":
        if (typeof b.text !== "string") throw bad(`${q}.text`, "expected a string");
        text += b.text;
        return;
      case "thinking":
        if (typeof b.thinking !== "string") throw bad(`${q}.thinking`, "expected a string");
        reasoning += b.thinking;
        return;
      case "redacted_thinking":
        return;
      case "tool_use":
        if (m.role !== "assistant") throw bad(q, "tool_use blocks belong to assistant turns");
        if (typeof b.id !== "string" || typeof b.name !== "string" || !isObject(b.input)) {
          throw bad(q, "expected {id, name, input: object}");
        }
        calls.push({
          id: b.id,
          type: "function",
          function: { name: b.name, arguments: JSON.stringify(b.input) },
        });
        return;
      case "tool_result":
        if (m.role !== "user") throw bad(q, "tool_result blocks belong to user turns");
        if (typeof b.tool_use_id !== "string") throw bad(`${q}.tool_use_id`, "expected a string");
        out.push({
          role: "tool",
          tool_call_id: b.tool_use_id,
          content: (b.is_error === true ? "Error: " : "") + resultText(b.content, `${q}.content`),
        });
        return;
    }
    throw bad(
      `${q}.type`,
      'expected "text", "thinking", "redacted_thinking", "tool_use" or "tool_result", ' +
        got(b.type),
    );
  });
  if (text || calls.length > 0 || reasoning || out.length === 0) {
    out.push({
      role: m.role,
      content: text,
      ...(reasoning ? { reasoning_content: reasoning } : {}),
      ...(calls.length > 0 ? { tool_calls: calls } : {}),
    });
  }
  return out;
}

function tools(v: unknown): ToolSpec[] {
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v)) throw bad("tools", "expected an array");
  const seen = new Set<string>();
  return v.map((t, i) => {
    const p = `tools[${i}]`;
    if (!isObject(t) || typeof t.name !== "string" || !/^[A-Za-z0-9_-]{1,64}$/.test(t.name)) {
      throw bad(`${p}.name`, "expected 1 to 64 letters, digits, '_' or '-'");
    }
    if (seen.has(t.name)) throw bad(`${p}.name`, `"${t.name}" is given twice`);
    seen.add(t.name);
    if (t.type !== undefined && t.type !== "custom") {
      throw bad(`${p}.type`, "only custom (client) tools are supported");
    }
    if (!isObject(t.input_schema)) throw bad(`${p}.input_schema`, "expected a JSON schema object");
    if (t.description !== undefined && typeof t.description !== "string") {
      throw bad(`${p}.description`, "expected a string");
    }
    return {
      name: t.name,
      ...(typeof t.description === "string" ? { description: t.description } : {}),
      parameters: t.input_schema,
    };
  });
}

function toolChoice(v: unknown, offered: ToolSpec[]): { choice: ToolChoice; parallel: boolean } {
  if (v === undefined || v === null) {
    return { choice: offered.length > 0 ? "auto" : "none", parallel: true };
  }
  if (!isObject(v)) throw bad("tool_choice", "expected {type}");
  const dp = v.disable_parallel_tool_use;
  if (dp !== undefined && typeof dp !== "boolean") {
    throw bad("tool_choice.disable_parallel_tool_use", "expected true or false");
  }
  const parallel = dp !== true;
  if (v.type === "none") return { choice: "none", parallel };
  if (offered.length === 0) throw bad("tool_choice", "needs tools");
  if (v.type === "auto") return { choice: "auto", parallel };
  if (v.type === "any") return { choice: "required", parallel };
  if (v.type === "tool") {
    if (typeof v.name !== "string" || !offered.some((t) => t.name === v.name)) {
      throw bad("tool_choice.name", "expected the name of one of the tools");
    }
    return { choice: { name: v.name }, parallel };
  }
  throw bad("tool_choice.type", 'expected "auto", "any", "tool" or "none"');
}

function num(b: Json, key: string, lo: number, hi: number): number | undefined {
  const v = b[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "number" || !Number.isFinite(v) || v < lo || v > hi) {
    throw bad(key, `expected a number in [${lo}, ${hi}]`);
  }
  return v;
}

/** Parses a Messages request (`counting` for count_tokens, which has no max_tokens). */
export function parseMessages(body: unknown, counting = false): CompletionRequest {
  if (!isObject(body)) throw new AnthropicError(400, "the request body must be a JSON object");
  const b = body;
  if (typeof b.model !== "string") throw bad("model", "expected a string");
  if (!Array.isArray(b.messages) || b.messages.length === 0) {
    throw bad("messages", "expected a non-empty array of {role, content}");
  }
  const messages: ChatMessage[] = [];
  if (typeof b.system === "string") {
    if (b.system) messages.push({ role: "system", content: b.system });
  } else if (b.system !== undefined && b.system !== null) {
    messages.push({ role: "system", content: resultText(b.system, "system") });
  }
  b.messages.forEach((m, i) => messages.push(...chatMessages(m, i)));
  const maxTokens = b.max_tokens;
  if (!counting && (!Number.isInteger(maxTokens) || (maxTokens as number) < 1)) {
    throw bad("max_tokens", "expected a whole number ≥ 1");
  }
  const stops = b.stop_sequences ?? [];
  if (!Array.isArray(stops) || !stops.every((s) => typeof s === "string") || stops.length > 16) {
    throw bad("stop_sequences", "expected at most 16 strings");
  }
  const offered = tools(b.tools);
  const { choice, parallel } = toolChoice(b.tool_choice, offered);
  if (isObject(b.output_config) && b.output_config.format && choice !== "none") {
    throw bad("output_config.format", 'cannot be combined with tools unless tool_choice is "none"');
  }
  const kwargs: Record<string, unknown> = {};
  const th = b.thinking;
  if (th !== undefined && th !== null) {
    if (!isObject(th) || !["enabled", "disabled", "adaptive"].includes(th.type as string)) {
      throw bad("thinking.type", 'expected "enabled", "disabled" or "adaptive"');
    }
    if (
      th.type === "enabled" &&
      (!Number.isInteger(th.budget_tokens) || (th.budget_tokens as number) < 1)
    ) {
      throw bad("thinking.budget_tokens", "expected a whole number ≥ 1");
    }
    // "adaptive" leaves it to the template's default.
    if (th.type !== "adaptive") kwargs.enable_thinking = th.type === "enabled";
  }
  const oc = b.output_config;
  let responseFormat: CompletionRequest["responseFormat"] = { type: "text" };
  if (oc !== undefined && oc !== null) {
    if (!isObject(oc)) throw bad("output_config", "expected an object");
    const effort = oc.effort;
    if (effort !== undefined && effort !== null) {
      if (!["low", "medium", "high", "xhigh", "max"].includes(effort as string)) {
        throw bad("output_config.effort", 'expected "low", "medium", "high", "xhigh" or "max"');
      }
      // Templates know low, medium and high (gpt-oss's reasoning_effort).
      kwargs.reasoning_effort = effort === "low" || effort === "medium" ? effort : "high";
    }
    const f = oc.format;
    if (f !== undefined && f !== null) {
      if (!isObject(f) || f.type !== "json_schema" || !isObject(f.schema)) {
        throw bad("output_config.format", 'expected {type: "json_schema", schema}');
      }
      responseFormat = { type: "json_schema", name: "output", schema: f.schema, strict: true };
    }
  }
  if (b.stream !== undefined && typeof b.stream !== "boolean") {
    throw bad("stream", "expected true or false");
  }
  if (b.metadata !== undefined && !isObject(b.metadata)) {
    throw bad("metadata", "expected an object");
  }
  const user = isObject(b.metadata) ? b.metadata.user_id : undefined;
  if (user !== undefined && user !== null && typeof user !== "string") {
    throw bad("metadata.user_id", "expected a string");
  }
  const topK = num(b, "top_k", 0, Number.MAX_SAFE_INTEGER);
  if (topK !== undefined && !Number.isInteger(topK)) throw bad("top_k", "expected a whole number");
  return {
    messages,
    prompt: null,
    model: b.model,
    stream: b.stream === true,
    includeUsage: false,
    maxTokens: maxTokens as number | undefined,
    temperature: num(b, "temperature", 0, 1),
    topP: num(b, "top_p", Number.MIN_VALUE, 1),
    topK,
    minP: undefined,
    seed: undefined,
    frequencyPenalty: undefined,
    presencePenalty: undefined,
    repetitionPenalty: undefined,
    stop: (stops as string[]).filter((s) => s.length > 0),
    ignoreEos: false,
    tools: offered,
    toolChoice: choice,
    parallelToolCalls: parallel,
    responseFormat,
    logprobs: undefined,
    logitBias: new Map(),
    n: 1,
    user: typeof user === "string" ? user : undefined,
    templateKwargs: kwargs,
  };
}

/** The prompt tokens of a request, as count_tokens answers (`caches`: see planChat). */
export function countTokens(
  session: Session,
  r: CompletionRequest,
  caches?: readonly (readonly number[])[],
): { input_tokens: number } {
  return { input_tokens: planChat(session, r, caches).ids.length };
}

/** Anthropic's usage: fresh input tokens apart from those read from the prompt cache. */
function usage(res: ChoiceResult) {
  const cached = res.usage.prompt_tokens_details.cached_tokens;
  return {
    input_tokens: res.usage.prompt_tokens - cached,
    output_tokens: res.usage.completion_tokens,
    cache_creation_input_tokens: 0,
    cache_read_input_tokens: cached,
  };
}

function stopReason(res: ChoiceResult): string {
  if (res.reason === "tool_calls") return "tool_use";
  if (res.reason === "length") return "max_tokens";
  return res.stopString !== null ? "stop_sequence" : "end_turn";
}

/** What a Messages answer runs on. */
export interface MessagesInput {
  session: Session;
  r: CompletionRequest;
  /** The model id the server answers as. */
  id: string;
  /** Checks the planned prompt ids against the context. */
  checkIds: (r: CompletionRequest, planned: number[]) => number[];
  generate: GenerateFn;
  maskStats?: MaskStats;
  /** The client's cached prefixes, which the prompt may continue (see planChat). */
  caches?: readonly (readonly number[])[];
}

/** A prepared Messages answer. */
export interface MessagesAnswer {
  whole(signal: AbortSignal): Promise<unknown>;
  stream(signal: AbortSignal, write: (s: string) => void): Promise<void>;
}

/** Plans a Messages request (render, check, compile) and returns its answer. */
export async function messagesResponse(input: MessagesInput): Promise<MessagesAnswer> {
  const { session, r, id } = input;
  const plan: ChatPlan = planChat(session, r, input.caches);
  plan.ids = input.checkIds(r, plan.ids);
  const compiled = await planGrammar(session, plan);
  const msgId = `msg_${crypto.randomUUID().replaceAll("-", "")}`;
  const run = (signal: AbortSignal, onDelta: Parameters<typeof runChoice>[1]) =>
    runChoice({
      session,
      generate: input.generate,
      plan,
      compiled,
      parallelToolCalls: r.parallelToolCalls,
      logprobs: undefined,
      logitBias: r.logitBias,
      signal,
      maskStats: input.maskStats,
    }, onDelta);
  const head = { id: msgId, type: "message", role: "assistant", model: id };
  return {
    whole: async (signal) => {
      const res = await run(signal, () => {});
      const content: unknown[] = [];
      if (res.reasoning) content.push({ type: "thinking", thinking: res.reasoning, signature: "" });
      if (res.content) content.push({ type: "text", text: res.content });
      for (const c of res.toolCalls) {
        content.push({ type: "tool_use", id: c.id, name: c.name, input: JSON.parse(c.arguments) });
      }
      return {
        ...head,
        content,
        stop_reason: stopReason(res),
        stop_sequence: res.stopString,
        usage: usage(res),
      };
    },
    stream: async (signal, write) => {
      const event = (type: string, data: Json) =>
        write(`event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`);
      event("message_start", {
        message: {
          ...head,
          content: [],
          stop_reason: null,
          stop_sequence: null,
          usage: { input_tokens: plan.ids.length, output_tokens: 0 },
        },
      });
      let index = -1;
      let open: "thinking" | "text" | null = null;
      const close = () => {
        if (open === "thinking") {
          event("content_block_delta", {
            index,
            delta: { type: "signature_delta", signature: "" },
          });
        }
        if (open) event("content_block_stop", { index });
        open = null;
      };
      const block = (kind: "thinking" | "text", text: string) => {
        if (!text) return;
        if (open !== kind) {
          close();
          index++;
          open = kind;
          event("content_block_start", {
            index,
            content_block: kind === "text"
              ? { type: "text", text: "" }
              : { type: "thinking", thinking: "" },
          });
        }
        event("content_block_delta", {
          index,
          delta: kind === "text"
            ? { type: "text_delta", text }
            : { type: "thinking_delta", thinking: text },
        });
      };
      const res = await run(signal, (d) => {
        block("thinking", d.reasoning);
        block("text", d.content);
        for (const c of d.toolCalls) {
          close();
          index++;
          event("content_block_start", {
            index,
            content_block: { type: "tool_use", id: c.id, name: c.name, input: {} },
          });
          event("content_block_delta", {
            index,
            delta: { type: "input_json_delta", partial_json: c.arguments },
          });
          event("content_block_stop", { index });
        }
      });
      close();
      const u = usage(res);
      event("message_delta", {
        delta: { stop_reason: stopReason(res), stop_sequence: res.stopString },
        usage: u,
      });
      event("message_stop", {});
    },
  };
}
