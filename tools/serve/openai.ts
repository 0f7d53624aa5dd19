/**
 * The OpenAI wire format: request bodies checked field by field into one generation request,
 * errors in OpenAI's `{"error": {message, type, param, code}}` shape, and the stop-string matcher
 * that holds back text which might still become a stop string.
 *
 * @module
 */
import type { ChatMessage } from "../../engine/chat.ts";
import { type ChatFields, parseChatFields } from "./chat_request.ts";
import { shown } from "./quote.ts";

/** An error answered as OpenAI does: an HTTP status and `{"error": {...}}`. */
export class ApiError extends Error {
  readonly status: number;
  readonly type: string;
  readonly param: string | null;
  readonly code: string | null;
  readonly headers: Record<string, string>;

  constructor(
    status: number,
    message: string,
    opts: { type?: string; param?: string; code?: string; headers?: Record<string, string> } = {},
  ) {
    super(message);
    this.status = status;
    this.type = opts.type ?? (status >= 500 ? "server_error" : "invalid_request_error");
    this.param = opts.param ?? null;
    this.code = opts.code ?? null;
    this.headers = opts.headers ?? {};
  }

  /** The JSON body OpenAI sends with an error. */
  body(): Record<string, unknown> {
    return {
      error: { message: this.message, type: this.type, param: this.param, code: this.code },
    };
  }
}

/** A 400 naming the field. */
function bad(param: string, message: string): ApiError {
  return new ApiError(400, `${param}: ${message}`, { param, code: "invalid_value" });
}

/** What one completion request asks for, whatever endpoint it came through. */
export interface CompletionRequest extends ChatFields {
  /** Chat turns (chat completions) or null (text completions). */
  messages: ChatMessage[] | null;
  /** Prompt text or ids (text completions). */
  prompt: string | number[] | null;
  model: string | null;
  stream: boolean;
  includeUsage: boolean;
  maxTokens: number | undefined;
  temperature: number | undefined;
  topP: number | undefined;
  topK: number | undefined;
  minP: number | undefined;
  seed: number | undefined;
  frequencyPenalty: number | undefined;
  presencePenalty: number | undefined;
  repetitionPenalty: number | undefined;
  stop: string[];
  ignoreEos: boolean;
}

type Json = Record<string, unknown>;

function num(b: Json, key: string, lo: number, hi: number): number | undefined {
  const v = b[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "number" || !Number.isFinite(v) || v < lo || v > hi) {
    throw bad(key, `expected a number in [${lo}, ${hi}], got ${shown(v)}`);
  }
  return v;
}

function int(b: Json, key: string, lo: number, hi = Number.MAX_SAFE_INTEGER): number | undefined {
  const v = num(b, key, lo, hi);
  if (v !== undefined && !Number.isInteger(v)) {
    throw bad(key, `expected a whole number, got ${v}`);
  }
  return v;
}

function bool(b: Json, key: string, param = key): boolean {
  const v = b[key];
  if (v === undefined || v === null) return false;
  if (typeof v !== "boolean") throw bad(param, `expected true or false, got ${shown(v)}`);
  return v;
}

/** The text of a message's content: a string, or OpenAI's array of `{type: "text"}` parts. */
function contentText(v: unknown, param: string): string {
  if (typeof v === "string") return v;
  if (v === null || v === undefined) return "";
  if (Array.isArray(v)) {
    return v.map((part, i) => {
      const p = part as Json;
      if (p?.type !== "text" || typeof p.text !== "string") {
        throw bad(`${param}[${i}]`, 'only text parts ({type: "text", text}) are supported');
      }
      return p.text;
    }).join("");
  }
  throw bad(param, "expected a string or an array of text parts");
}

/** Parses the body of `POST /v1/chat/completions` or `/v1/completions`. */
export function parseCompletion(body: unknown, chat: boolean): CompletionRequest {
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    throw new ApiError(400, "the request body must be a JSON object");
  }
  const b = body as Json;
  let messages: ChatMessage[] | null = null;
  let prompt: string | number[] | null = null;
  if (chat) {
    if (!Array.isArray(b.messages) || b.messages.length === 0) {
      throw bad("messages", "expected a non-empty array of {role, content}");
    }
    messages = b.messages.map((m, i) => {
      const msg = m as Json;
      if (typeof msg !== "object" || msg === null || typeof msg.role !== "string") {
        throw bad(`messages[${i}].role`, "expected a string");
      }
      return {
        ...msg,
        role: msg.role,
        content: contentText(msg.content, `messages[${i}].content`),
      };
    });
  } else {
    const p = b.prompt;
    if (typeof p === "string") prompt = p;
    else if (Array.isArray(p) && p.length === 1 && typeof p[0] === "string") prompt = p[0];
    else if (Array.isArray(p) && p.length > 0 && p.every((x) => Number.isInteger(x) && x >= 0)) {
      prompt = p as number[];
    } else {
      throw bad("prompt", "expected a string, one string in an array, or an array of token ids");
    }
  }
  if (b.model !== undefined && typeof b.model !== "string") {
    throw bad("model", "expected a string");
  }
  // Asked-for features the engine does not have are refused, never silently dropped.
  if (bool(b, "echo")) throw bad("echo", "echoing the prompt is not supported");
  const fields = parseChatFields(b, chat, bad);
  let stop: string[] = [];
  if (typeof b.stop === "string") stop = [b.stop];
  else if (Array.isArray(b.stop) && b.stop.every((s) => typeof s === "string")) stop = b.stop;
  else if (b.stop !== undefined && b.stop !== null) {
    throw bad("stop", "expected a string or an array of strings");
  }
  if (stop.length > 4) throw bad("stop", "at most 4 stop strings");
  stop = stop.filter((s) => s.length > 0);
  const opts = b.stream_options;
  if (opts !== undefined && opts !== null && (typeof opts !== "object" || Array.isArray(opts))) {
    throw bad("stream_options", "expected an object");
  }
  const maxTokens = int(b, "max_completion_tokens", 0) ?? int(b, "max_tokens", 0);
  return {
    ...fields,
    messages,
    prompt,
    model: (b.model as string | undefined) ?? null,
    stream: bool(b, "stream"),
    includeUsage: opts
      ? bool(opts as Json, "include_usage", "stream_options.include_usage")
      : false,
    maxTokens,
    temperature: num(b, "temperature", 0, 2),
    topP: num(b, "top_p", Number.MIN_VALUE, 1),
    topK: int(b, "top_k", 0),
    minP: num(b, "min_p", 0, 0.999999),
    seed: int(b, "seed", 0, 0xffffffff),
    frequencyPenalty: num(b, "frequency_penalty", -2, 2),
    presencePenalty: num(b, "presence_penalty", -2, 2),
    repetitionPenalty: num(b, "repetition_penalty", Number.MIN_VALUE, 10),
    stop,
    ignoreEos: bool(b, "ignore_eos"),
  };
}

/**
 * Cuts generated text at the first stop string. Text that could still grow into a stop string
 * is held back until it either does (and is dropped) or cannot.
 */
export class StopMatcher {
  readonly #stops: string[];
  #held = "";
  /** A stop string was seen: the generation ends. */
  stopped = false;
  /** The stop string that ended it (the earliest in the text), once stopped. */
  matched: string | null = null;

  constructor(stops: string[]) {
    this.#stops = stops;
  }

  /** Adds generated text; returns the part that is safe to send now. */
  push(text: string): string {
    const buf = this.#held + text;
    let cut = -1;
    for (const s of this.#stops) {
      const i = buf.indexOf(s);
      if (i >= 0 && (cut < 0 || i < cut)) [cut, this.matched] = [i, s];
    }
    if (cut >= 0) {
      this.stopped = true;
      this.#held = "";
      return buf.slice(0, cut);
    }
    let keep = 0;
    for (const s of this.#stops) {
      for (let k = Math.min(s.length - 1, buf.length); k > keep; k--) {
        if (buf.endsWith(s.slice(0, k))) {
          keep = k;
          break;
        }
      }
    }
    this.#held = buf.slice(buf.length - keep);
    return buf.slice(0, buf.length - keep);
  }

  /** The held-back text once the generation ended without a stop string. */
  flush(): string {
    const rest = this.#held;
    this.#held = "";
    return rest;
  }
}
