/**
 * Chat prompts: renders a checkpoint's Jinja chat template with `@huggingface/jinja`, passing
 * the same variables transformers' `apply_chat_template` does (messages, add_generation_prompt,
 * the named special tokens such as bos_token/eos_token, plus any extra keyword arguments).
 * A template is checkpoint data, so it is treated as hostile: it renders in a worker thread
 * (engine/chat_worker.ts) under a step budget, a time budget (the worker is terminated when it
 * runs out) and a cap on the size of what it makes, and every error names the template.
 *
 * @module
 */

import { readJsonObjectIfExists } from "../io/json_file.ts";
import { existsSync, statSync } from "node:fs";
import { join } from "node:path";
import { Worker } from "node:worker_threads";
import type { RenderJob } from "./chat_worker.ts";
import { readChatTemplate, readTokenizerConfig } from "./tokenizer.ts";

/** One chat turn; extra fields (tool_calls, name, …) are passed through to the template. */
export interface ChatMessage {
  role: string;
  content: string;
  [field: string]: unknown;
}

/** Rendering options. */
export interface ChatOptions {
  /** Append the assistant header so the model answers next (transformers' default is false). */
  addGenerationPrompt?: boolean;
  /** More template variables (tools, documents, enable_thinking, …). */
  extra?: Record<string, unknown>;
  /** Bounds on the rendering (default {@link CHAT_LIMITS}). */
  limits?: Partial<ChatLimits>;
}

/** What one rendering of a chat template may cost. */
export interface ChatLimits {
  /** Wall time in ms, after the worker has started (a template that loops is stopped). */
  timeMs: number;
  /** Evaluation steps of the template interpreter. */
  steps: number;
  /** Bytes of the output; also the longest string and list the template may make. */
  outputBytes: number;
}

/** The default bounds: far above what real templates need (a few ms, thousands of steps). */
export const CHAT_LIMITS: ChatLimits = { timeMs: 5_000, steps: 1_000_000, outputBytes: 4 << 20 };

/** A template with the special tokens it may refer to. */
export interface ChatTemplateSource {
  template: string;
  /** Named special tokens, e.g. `{bos_token: "<s>", eos_token: "</s>"}`. */
  specialTokens?: Record<string, string>;
  /** Where the template comes from, for messages (default "the chat template"). */
  name?: string;
}

/** Reads the template and special tokens of a tokenizer directory. */
export function chatTemplateFromDir(dir: string): ChatTemplateSource {
  const config = readTokenizerConfig(dir);
  const template = readChatTemplate(dir, config);
  if (template === null) {
    throw new Error(
      `${dir}: no chat template (tokenizer_config.json chat_template or chat_template.jinja)`,
    );
  }
  const specialTokens: Record<string, string> = {};
  for (const src of [readJsonObjectIfExists(join(dir, "special_tokens_map.json")), config]) {
    for (const [key, value] of Object.entries(src)) {
      if (!key.endsWith("_token")) continue;
      if (typeof value === "string") specialTokens[key] = value;
      else if (
        value && typeof value === "object" &&
        typeof (value as { content?: unknown }).content === "string"
      ) {
        specialTokens[key] = (value as { content: string }).content;
      }
    }
  }
  const jinja = join(dir, "chat_template.jinja");
  const name = `chat template ${
    existsSync(jinja) ? jinja : `${join(dir, "tokenizer_config.json")} chat_template`
  }`;
  return { template, specialTokens, name };
}

/**
 * Most UTF-8 bytes one token stands for (the longest vocabulary entries of real tokenizers are
 * far shorter): text longer than the context times this cannot fit, so it is refused before the
 * template and tokenizer see it.
 */
export const MAX_TOKEN_BYTES = 128;

/**
 * Throws unless `messages` is a list of `{role, content}` (strings) that could fit a context of
 * `context` tokens: at most one message per token, and at most {@link MAX_TOKEN_BYTES} per token
 * of text. `where` names the list in messages (a session file's conversation, say).
 */
export function checkChatMessages(
  messages: unknown,
  context: number,
  where = "the conversation",
): asserts messages is ChatMessage[] {
  if (!Array.isArray(messages)) throw new Error(`${where}: expected a list of {role, content}`);
  if (messages.length > context) {
    throw new Error(
      `${where} has ${messages.length} messages; the context holds ${context} tokens, so at ` +
        `most ${context} can fit`,
    );
  }
  let chars = 0;
  for (const [i, m] of messages.entries()) {
    const ok = typeof m === "object" && m !== null && typeof m.role === "string" &&
      typeof m.content === "string";
    if (!ok) throw new Error(`message ${i} of ${where}: expected {role, content} with strings`);
    chars += m.role.length + m.content.length;
  }
  // UTF-16 units never outnumber UTF-8 bytes, so this bound never refuses text that could fit.
  const cap = context * MAX_TOKEN_BYTES;
  if (chars > cap) {
    throw new Error(
      `${where} has ${chars} characters of text, which cannot fit the context of ${context} ` +
        `tokens (at most ${cap}, ${MAX_TOKEN_BYTES} per token)`,
    );
  }
}

/**
 * Renders `messages` into the prompt text. `source` is a tokenizer directory or a template with
 * its special tokens. The result is text: encode it with `addSpecial: false` when the template
 * already writes the BOS token, as transformers does.
 */
export function renderChat(
  source: string | ChatTemplateSource,
  messages: ChatMessage[],
  opts: ChatOptions = {},
): string {
  const src = typeof source === "string" ? sourceFromPath(source) : source;
  return renderBounded(
    src.template,
    {
      ...src.specialTokens,
      ...opts.extra,
      messages,
      add_generation_prompt: opts.addGenerationPrompt ?? false,
    },
    { ...CHAT_LIMITS, ...opts.limits },
    src.name ?? "the chat template",
  );
}

/** The render worker, started on first use; unref'd, so it never keeps the process alive. */
let worker: Worker | null = null;
/** The buffer the worker answers in. */
let reply: SharedArrayBuffer | null = null;
/** Time a worker may take to start and load the template library. */
const STARTUP_MS = 60_000;

/**
 * Renders `template` with `vars` in the worker, blocking until it answers or the budget runs out
 * (then the worker is terminated and the next render starts a new one).
 */
function renderBounded(
  template: string,
  vars: Record<string, unknown>,
  limits: ChatLimits,
  name: string,
): string {
  if (!worker) {
    worker = new Worker(new URL("./chat_worker.ts", import.meta.url));
    worker.unref();
  }
  // Room for the output, and for an error message however small the output cap; reused while
  // it is large enough (no render is ever in flight when another starts).
  const size = 8 + Math.max(limits.outputBytes, 4096);
  if (!reply || reply.byteLength < size) reply = new SharedArrayBuffer(size);
  const sab = reply;
  const head = new Int32Array(sab, 0, 2);
  Atomics.store(head, 0, 0);
  const job: RenderJob = {
    sab,
    template,
    vars,
    steps: limits.steps,
    outputBytes: limits.outputBytes,
  };
  try {
    worker.postMessage(job);
  } catch (e) {
    throw new Error(`${name}: the template's variables cannot be passed: ${(e as Error).message}`);
  }
  Atomics.wait(head, 0, 0, STARTUP_MS);
  if (Atomics.load(head, 0) === 1) Atomics.wait(head, 0, 1, limits.timeMs);
  const state = Atomics.load(head, 0);
  if (state !== 2 && state !== 3) {
    worker.terminate();
    worker = null;
    // The stopped worker might still write into its buffer: the next render gets a new one.
    reply = null;
    throw new Error(
      state === 0
        ? `${name}: the template worker did not start within ${STARTUP_MS / 1000} s`
        : `${name}: rendering took longer than ${limits.timeMs} ms (a loop in the template?); stopped`,
    );
  }
  const text = new TextDecoder().decode(new Uint8Array(sab, 8, head[1]).slice());
  if (state === 3) throw new Error(`${name}: ${text}`);
  return text;
}

function sourceFromPath(dir: string): ChatTemplateSource {
  if (!existsSync(dir) || !statSync(dir).isDirectory()) {
    throw new Error(`${dir}: expected a tokenizer directory`);
  }
  return chatTemplateFromDir(dir);
}
