/**
 * The request fields of agents and structured output, checked one by one (a 400 names the
 * field): `tools`, `tool_choice`, `parallel_tool_calls`, `response_format`, `logprobs` /
 * `top_logprobs`, `logit_bias`, `n`, `user`, `chat_template_kwargs`, `enable_thinking`,
 * `reasoning_effort`.
 * Combinations the server cannot honour are refused, never silently dropped.
 *
 * @module
 */
import { got } from "./quote.ts";
import type { ToolSpec } from "./tool_calls/mod.ts";

type Json = Record<string, unknown>;

/** A 400 naming the field (the same shape as openai.ts's). */
export type BadField = (param: string, message: string) => Error;

/** Which tools the model may or must call. */
export type ToolChoice = "none" | "auto" | "required" | { name: string };

/** What the output must be. */
export type ResponseFormat =
  | { type: "text" }
  | { type: "json_object" }
  | { type: "json_schema"; name: string; schema: Record<string, unknown>; strict: boolean };

/** The fields this module reads. */
export interface ChatFields {
  tools: ToolSpec[];
  toolChoice: ToolChoice;
  parallelToolCalls: boolean;
  responseFormat: ResponseFormat;
  /** Report log probabilities with this many alternatives per token; undefined for none. */
  logprobs: number | undefined;
  /** Added to the logits of these token ids (OpenAI's `logit_bias`, −100 to 100). */
  logitBias: Map<number, number>;
  /** Completions per request (run one after another). */
  n: number;
  user: string | undefined;
  /** Extra chat template variables (`chat_template_kwargs`, `enable_thinking`, `reasoning_effort`). */
  templateKwargs: Record<string, unknown>;
}

/** Largest `n`: each completion is a whole generation, run one after another. */
export const MAX_N = 8;
const NAME = /^[A-Za-z0-9_.-]{1,64}$/;

function isObject(v: unknown): v is Json {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function tools(b: Json, bad: BadField): ToolSpec[] {
  const v = b.tools;
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v)) throw bad("tools", `expected an array, ${got(v)}`);
  if (v.length > 128) throw bad("tools", "at most 128 tools");
  const seen = new Set<string>();
  return v.map((t, i) => {
    const p = `tools[${i}]`;
    if (!isObject(t) || t.type !== "function") {
      throw bad(`${p}.type`, `expected "function", ${got(isObject(t) ? t.type : t)}`);
    }
    const f = t.function;
    if (!isObject(f)) throw bad(`${p}.function`, `expected an object, ${got(f)}`);
    if (typeof f.name !== "string" || !NAME.test(f.name)) {
      throw bad(
        `${p}.function.name`,
        `expected 1 to 64 letters, digits, '_', '-' or '.', ${got(f.name)}`,
      );
    }
    if (seen.has(f.name)) throw bad(`${p}.function.name`, `"${f.name}" is given twice`);
    seen.add(f.name);
    if (f.description !== undefined && typeof f.description !== "string") {
      throw bad(`${p}.function.description`, `expected a string, ${got(f.description)}`);
    }
    const params = f.parameters ?? { type: "object", properties: {} };
    if (!isObject(params)) {
      throw bad(`${p}.function.parameters`, `expected a JSON schema object, ${got(params)}`);
    }
    if (f.strict !== undefined && f.strict !== null && typeof f.strict !== "boolean") {
      throw bad(`${p}.function.strict`, `expected true or false, ${got(f.strict)}`);
    }
    return {
      name: f.name,
      ...(typeof f.description === "string" ? { description: f.description } : {}),
      parameters: params,
      strict: f.strict === true,
    };
  });
}

function toolChoice(b: Json, offered: ToolSpec[], bad: BadField): ToolChoice {
  const v = b.tool_choice;
  if (v === undefined || v === null) return offered.length > 0 ? "auto" : "none";
  if (v === "none" || v === "auto" || v === "required") {
    if (v !== "none" && offered.length === 0) {
      throw bad("tool_choice", `"${v}" needs tools`);
    }
    return v;
  }
  if (isObject(v) && v.type === "function" && isObject(v.function)) {
    const name = v.function.name;
    if (typeof name !== "string" || !offered.some((t) => t.name === name)) {
      throw bad("tool_choice.function.name", `expected the name of one of the tools, ${got(name)}`);
    }
    return { name };
  }
  throw bad(
    "tool_choice",
    `expected "none", "auto", "required" or {type: "function", function: {name}}, ${got(v)}`,
  );
}

function responseFormat(b: Json, bad: BadField): ResponseFormat {
  const v = b.response_format;
  if (v === undefined || v === null) return { type: "text" };
  if (!isObject(v)) throw bad("response_format", `expected an object with a type, ${got(v)}`);
  switch (v.type) {
    case "text":
    case "json_object":
      return { type: v.type };
    case "json_schema": {
      const s = v.json_schema;
      if (!isObject(s)) {
        throw bad("response_format.json_schema", `expected {name, schema}, ${got(s)}`);
      }
      if (typeof s.name !== "string" || !NAME.test(s.name)) {
        throw bad(
          "response_format.json_schema.name",
          `expected 1 to 64 letters, digits, '_', '-' or '.', ${got(s.name)}`,
        );
      }
      const schema = s.schema ?? {};
      if (!isObject(schema)) {
        throw bad("response_format.json_schema.schema", `expected an object, ${got(schema)}`);
      }
      if (s.strict !== undefined && s.strict !== null && typeof s.strict !== "boolean") {
        throw bad("response_format.json_schema.strict", `expected true or false, ${got(s.strict)}`);
      }
      return { type: "json_schema", name: s.name, schema, strict: s.strict === true };
    }
  }
  throw bad(
    "response_format.type",
    `expected "text", "json_object" or "json_schema", ${got(v.type)}`,
  );
}

function logprobs(b: Json, chat: boolean, bad: BadField): number | undefined {
  const lp = b.logprobs;
  if (!chat) {
    // Text completions: `logprobs` is the number of alternatives (0 to 5).
    if (lp === undefined || lp === null) return undefined;
    if (!Number.isInteger(lp) || (lp as number) < 0 || (lp as number) > 5) {
      throw bad("logprobs", `expected a whole number in [0, 5], ${got(lp)}`);
    }
    return lp as number;
  }
  if (lp !== undefined && lp !== null && typeof lp !== "boolean") {
    throw bad("logprobs", `expected true or false, ${got(lp)}`);
  }
  const top = b.top_logprobs;
  if (top !== undefined && top !== null) {
    if (!Number.isInteger(top) || (top as number) < 0 || (top as number) > 20) {
      throw bad("top_logprobs", `expected a whole number in [0, 20], ${got(top)}`);
    }
    if (lp !== true) throw bad("top_logprobs", "needs logprobs: true");
    return top as number;
  }
  return lp === true ? 0 : undefined;
}

function logitBias(b: Json, bad: BadField): Map<number, number> {
  const v = b.logit_bias;
  const out = new Map<number, number>();
  if (v === undefined || v === null) return out;
  if (!isObject(v)) throw bad("logit_bias", `expected an object of token id → bias, ${got(v)}`);
  const entries = Object.entries(v);
  if (entries.length > 1024) throw bad("logit_bias", "at most 1024 token ids");
  for (const [key, bias] of entries) {
    const id = Number(key);
    if (!/^\d+$/.test(key) || !Number.isSafeInteger(id)) {
      throw bad("logit_bias", `keys are token ids, ${got(key)}`);
    }
    if (typeof bias !== "number" || !(bias >= -100 && bias <= 100)) {
      throw bad(`logit_bias.${key}`, `expected a number in [-100, 100], ${got(bias)}`);
    }
    out.set(id, bias);
  }
  return out;
}

function templateKwargs(b: Json, bad: BadField): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  const kw = b.chat_template_kwargs;
  if (kw !== undefined && kw !== null) {
    if (!isObject(kw)) throw bad("chat_template_kwargs", `expected an object, ${got(kw)}`);
    for (const key of ["messages", "add_generation_prompt", "tools"]) {
      if (key in kw) throw bad(`chat_template_kwargs.${key}`, "is set by the server");
    }
    Object.assign(out, kw);
  }
  if (b.enable_thinking !== undefined && b.enable_thinking !== null) {
    if (typeof b.enable_thinking !== "boolean") {
      throw bad("enable_thinking", `expected true or false, ${got(b.enable_thinking)}`);
    }
    out.enable_thinking = b.enable_thinking;
  }
  const effort = b.reasoning_effort;
  if (effort !== undefined && effort !== null) {
    if (!["minimal", "low", "medium", "high"].includes(effort as string)) {
      throw bad(
        "reasoning_effort",
        `expected "minimal", "low", "medium" or "high", ${got(effort)}`,
      );
    }
    out.reasoning_effort = effort;
  }
  return out;
}

/** Reads the fields of this module from a request body (`chat` for chat completions). */
export function parseChatFields(b: Json, chat: boolean, bad: BadField): ChatFields {
  const offered = chat ? tools(b, bad) : [];
  if (!chat) {
    for (const key of ["tools", "tool_choice", "response_format"]) {
      if (b[key] !== undefined && b[key] !== null) throw bad(key, "only for chat completions");
    }
  }
  const choice = toolChoice(b, offered, bad);
  const ptc = b.parallel_tool_calls;
  if (ptc !== undefined && ptc !== null && typeof ptc !== "boolean") {
    throw bad("parallel_tool_calls", `expected true or false, ${got(ptc)}`);
  }
  const format = responseFormat(b, bad);
  if (format.type !== "text" && choice !== "none") {
    throw bad("response_format", 'cannot be combined with tools unless tool_choice is "none"');
  }
  const n = b.n ?? 1;
  if (!Number.isInteger(n) || (n as number) < 1 || (n as number) > MAX_N) {
    throw bad("n", `expected a whole number in [1, ${MAX_N}], ${got(n)}`);
  }
  if (b.user !== undefined && b.user !== null && typeof b.user !== "string") {
    throw bad("user", `expected a string, ${got(b.user)}`);
  }
  const constrained = format.type !== "text" || choice === "required" || typeof choice === "object";
  if (constrained && b.ignore_eos === true) {
    throw bad("ignore_eos", "cannot be combined with structured output or a required tool call");
  }
  return {
    tools: offered,
    toolChoice: choice,
    parallelToolCalls: ptc !== false,
    responseFormat: format,
    logprobs: logprobs(b, chat, bad),
    logitBias: logitBias(b, bad),
    n: n as number,
    user: typeof b.user === "string" ? b.user : undefined,
    templateKwargs: chat ? templateKwargs(b, bad) : {},
  };
}
