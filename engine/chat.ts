/**
 * Chat prompts: renders a checkpoint's Jinja chat template with `@huggingface/jinja`, passing
 * the same variables transformers' `apply_chat_template` does (messages, add_generation_prompt,
 * the named special tokens such as bos_token/eos_token, plus any extra keyword arguments).
 *
 * @module
 */

import { readJsonObjectIfExists } from "../io/json_file.ts";
import { Template } from "@huggingface/jinja";
import { existsSync, statSync } from "node:fs";
import { join } from "node:path";
import { readChatTemplate } from "./tokenizer.ts";

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
}

/** A template with the special tokens it may refer to. */
export interface ChatTemplateSource {
  template: string;
  /** Named special tokens, e.g. `{bos_token: "<s>", eos_token: "</s>"}`. */
  specialTokens?: Record<string, string>;
}

/** Reads the template and special tokens of a tokenizer directory. */
export function chatTemplateFromDir(dir: string): ChatTemplateSource {
  const config = readJsonObjectIfExists(join(dir, "tokenizer_config.json"));
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
  return { template, specialTokens };
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
  let template: Template;
  try {
    template = new Template(src.template);
  } catch (e) {
    throw new Error(`chat template does not parse: ${(e as Error).message}`);
  }
  return template.render({
    ...src.specialTokens,
    ...opts.extra,
    messages,
    add_generation_prompt: opts.addGenerationPrompt ?? false,
  });
}

function sourceFromPath(dir: string): ChatTemplateSource {
  if (!existsSync(dir) || !statSync(dir).isDirectory()) {
    throw new Error(`${dir}: expected a tokenizer directory`);
  }
  return chatTemplateFromDir(dir);
}
