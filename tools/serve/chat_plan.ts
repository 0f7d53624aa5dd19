/**
 * Turns a chat request into what one generation needs: the prompt ids rendered by the chat
 * template (with the tools, the `tool` results and earlier calls in the template's own form), how
 * to split the output (reasoning, tool-call format), whether to keep special tokens in the text,
 * and the grammar that structured output or a required tool call puts on the sampling.
 *
 * A template that does not render tools still gets them: their signatures go into the system
 * message, and calls are read in the Hermes `<tool_call>` format, as llama.cpp does for such
 * templates.
 *
 * @module
 */
import { type ChatMessage, MAX_TOKEN_BYTES } from "../../engine/chat.ts";
import type { Session } from "../../engine/session.ts";
import type { StructuralTagFormat } from "@mlc-ai/web-xgrammar";
import type { OutputGrammar } from "./grammar.ts";
import type { OutputOptions } from "./chat_output.ts";
import { ApiError, type CompletionRequest } from "./openai.ts";
import { detectToolFormat, type ToolCallFormat, type ToolSpec } from "./tool_calls/mod.ts";
import { HERMES } from "./tool_calls/hermes.ts";
import { HARMONY } from "./tool_calls/harmony.ts";

/** Everything one chat generation needs besides the sampling settings. */
export interface ChatPlan {
  ids: number[];
  output: OutputOptions;
  keepSpecial: boolean;
  grammar: OutputGrammar | null;
  /** Stop strings of the template (a built-in template's end of turn). */
  stops: string[];
}

type Json = Record<string, unknown>;

/**
 * Refuses, before the template and the tokenizer run, a conversation that cannot fit a context of
 * `ctx` tokens: more messages than tokens, or more text (tools included) than
 * {@link MAX_TOKEN_BYTES} per token.
 */
function boundConversation(r: CompletionRequest, ctx: number): void {
  const messages = r.messages ?? [];
  const chars = JSON.stringify(messages).length + JSON.stringify(r.tools ?? []).length;
  const refuse = (what: string) =>
    new ApiError(400, `messages: the conversation ${what}`, {
      param: "messages",
      code: "context_length_exceeded",
    });
  if (messages.length > ctx) {
    throw refuse(
      `has ${messages.length} messages; the context holds ${ctx} tokens, so at most ${ctx} can fit`,
    );
  }
  if (chars > ctx * MAX_TOKEN_BYTES) {
    throw refuse(
      `has ${chars} characters of text, which cannot fit the context of ${ctx} tokens (at most ` +
        `${ctx * MAX_TOKEN_BYTES}, ${MAX_TOKEN_BYTES} per token)`,
    );
  }
}

/** Whether a template does anything with a `tools` variable. */
function rendersTools(template: string): boolean {
  return /\btools\b/.test(template);
}

/** The tools in a system message, for a template that does not render them itself. */
export function toolsSystemText(tools: readonly ToolSpec[]): string {
  const lines = tools.map((t) => JSON.stringify({ type: "function", function: t }));
  return "You may call functions. Their signatures, one JSON object per line:\n<tools>\n" +
    `${lines.join("\n")}\n</tools>\n` +
    'To call one, write {"name": <function name>, "arguments": <arguments object>} between ' +
    "<tool_call> and </tool_call>, one block per call.";
}

/** An earlier assistant turn's calls, checked, with arguments as the template expects them. */
function toolCallsOf(m: Json, i: number, format: ToolCallFormat | null): unknown[] | undefined {
  const calls = m.tool_calls;
  if (calls === undefined || calls === null) return undefined;
  const bad = (p: string, msg: string) =>
    new ApiError(400, `${p}: ${msg}`, { param: p, code: "invalid_value" });
  if (!Array.isArray(calls)) throw bad(`messages[${i}].tool_calls`, "expected an array");
  return calls.map((c, j) => {
    const p = `messages[${i}].tool_calls[${j}]`;
    const f = (c as Json)?.function as Json | undefined;
    if (typeof f?.name !== "string") throw bad(`${p}.function.name`, "expected a string");
    let args: unknown = f.arguments ?? "{}";
    if (typeof args === "string") {
      try {
        args = JSON.parse(args);
      } catch {
        throw bad(`${p}.function.arguments`, "expected a JSON object in a string");
      }
    }
    if (typeof args !== "object" || args === null || Array.isArray(args)) {
      throw bad(`${p}.function.arguments`, "expected a JSON object");
    }
    const asText = (format ?? HERMES).argumentsAs === "string";
    return {
      ...(c as Json),
      type: "function",
      function: { ...f, arguments: asText ? JSON.stringify(args) : args },
    };
  });
}

/** The grammar of a forced call: one call of one of `tools`, in its section. */
export function forcedCallGrammar(
  format: ToolCallFormat,
  tools: readonly ToolSpec[],
): StructuralTagFormat {
  const calls = tools.map((t) => format.callGrammar(t, 0));
  const call: StructuralTagFormat = calls.length === 1 ? calls[0] : { type: "or", elements: calls };
  const parts: StructuralTagFormat[] = [
    ...(format.section.begin
      ? [{ type: "const_string" as const, value: format.section.begin }]
      : []),
    call,
    ...(format.section.end ? [{ type: "const_string" as const, value: format.section.end }] : []),
  ];
  return parts.length === 1 ? parts[0] : { type: "sequence", elements: parts };
}

/**
 * Plans the generation of a chat request; `caches` are the cached token lists the prompt may
 * continue from (Session.continuationIds; default: the session's prompt cache).
 */
export function planChat(
  session: Session,
  r: CompletionRequest,
  caches?: readonly (readonly number[])[],
): ChatPlan {
  boundConversation(r, session.model.maxContext);
  const tpl = session.chatTemplate;
  const template = tpl.source.template;
  const harmony = HARMONY.detect(template);
  const useTools = r.toolChoice !== "none" && r.tools.length > 0;
  const own = rendersTools(template);
  const format = useTools
    ? (harmony ? HARMONY : own ? detectToolFormat(template) ?? HERMES : HERMES)
    : null;
  const messages: ChatMessage[] = (r.messages ?? []).map((m, i) => {
    const calls = toolCallsOf(m, i, format ?? detectToolFormat(template));
    return calls ? { ...m, tool_calls: calls } : m;
  });
  if (useTools && !own) {
    const text = toolsSystemText(r.tools);
    if (messages[0]?.role === "system") {
      messages[0] = { ...messages[0], content: `${messages[0].content}\n\n${text}` };
    } else messages.unshift({ role: "system", content: text });
  }
  const extra: Record<string, unknown> = { ...r.templateKwargs };
  if (useTools && own) {
    extra.tools = r.tools.map(({ strict: _, ...f }) => ({ type: "function", function: f }));
  }
  let prompt: string;
  try {
    prompt = session.chatPrompt(messages, extra);
  } catch (e) {
    throw new ApiError(400, `messages: ${(e as Error).message}`, { param: "messages" });
  }
  const thinkTags = template.includes("</think>");
  const startsInReasoning = thinkTags && prompt.trimEnd().endsWith("<think>");
  let grammar: OutputGrammar | null = null;
  if (r.responseFormat.type === "json_object") grammar = { kind: "json" };
  else if (r.responseFormat.type === "json_schema") {
    grammar = { kind: "schema", schema: r.responseFormat.schema };
  } else if (format && (r.toolChoice === "required" || typeof r.toolChoice === "object")) {
    const choice = r.toolChoice;
    const forced = typeof choice === "object"
      ? r.tools.filter((t) => t.name === choice.name)
      : r.tools;
    grammar = { kind: "tag", format: forcedCallGrammar(format, forced) };
  }
  // A prompt that opened the reasoning: a constrained answer closes it first.
  if (grammar && startsInReasoning) {
    const body: StructuralTagFormat = grammar.kind === "tag"
      ? grammar.format
      : { type: "json_schema", json_schema: grammar.kind === "schema" ? grammar.schema : {} };
    grammar = {
      kind: "tag",
      format: {
        type: "sequence",
        elements: [{ type: "const_string", value: "</think>\n\n" }, body],
      },
    };
  }
  return {
    ids: session.continuationIds(prompt, caches),
    output: { format, tools: r.tools, thinkTags, startsInReasoning, harmony },
    keepSpecial: harmony || format !== null || thinkTags,
    grammar,
    stops: tpl.stops,
  };
}
