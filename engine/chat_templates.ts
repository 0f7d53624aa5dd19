/**
 * Which chat template a session renders with: a `--chat-template` override (a Jinja file or a
 * built-in name), else the checkpoint's own, else the built-in ChatML one with a notice, so every
 * model can chat. The built-in template writes earlier tool calls and tool results as Qwen/Hermes
 * do (`<tool_call>` JSON, `<tool_response>`); the server lists the tools in the system message.
 *
 * @module
 */
import { existsSync, readFileSync, statSync } from "node:fs";
import { chatTemplateFromDir, type ChatTemplateSource } from "./chat.ts";

/**
 * ChatML turns, each ended by the tokenizer's EOS token when it has one (every model can emit it,
 * so the answer ends there) else by `<|im_end|>`; earlier calls and tool results in Hermes's tags.
 */
const CHATML = `{%- if bos_token is defined and bos_token %}{{ bos_token }}{% endif %}
{%- set eot = eos_token if eos_token is defined and eos_token else '<|im_end|>' %}
{%- set sys = messages[0].content if messages and messages[0].role == 'system' else '' %}
{%- if sys %}<|im_start|>system
{{ sys }}{{ eot }}
{% endif %}
{%- for m in messages %}{% if not (loop.first and m.role == 'system') %}
{%- if m.role == 'tool' %}<|im_start|>tool
<tool_response>
{{ m.content }}
</tool_response>{{ eot }}
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}{% if m.tool_calls %}{% for c in m.tool_calls %}
<tool_call>
{"name": {{ c.function.name | tojson }}, "arguments": {{ c.function.arguments | tojson }}}
</tool_call>{% endfor %}{% endif %}{{ eot }}
{% endif %}{% endif %}{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}`;

/** Built-in templates by name (`--chat-template NAME`). */
export const BUILTIN_CHAT_TEMPLATES: Readonly<Record<string, string>> = { chatml: CHATML };

/**
 * Stop strings of a built-in template: the start of a next turn, and `<|im_end|>` (for tokenizers
 * without an EOS token), which a model that does not know the template may write as text.
 */
const BUILTIN_STOPS: Readonly<Record<string, string[]>> = {
  chatml: ["<|im_start|>", "<|im_end|>"],
};

/** The template a session renders with, where it came from, and what to tell the user. */
export interface ResolvedChatTemplate {
  source: ChatTemplateSource;
  /** "checkpoint", a file path, or "built-in NAME". */
  origin: string;
  /** Stop strings the template's turns end with when the model's vocabulary may lack them. */
  stops: string[];
  /** Said once at start-up when the checkpoint has no template of its own; else null. */
  notice: string | null;
}

/**
 * Resolves the template of the checkpoint in `dir`, whose tokenizer names `specialTokens`
 * (bos_token, …); `override` is a file path or a built-in name. A bad override throws naming it
 * and the built-in names.
 */
export function resolveChatTemplate(
  dir: string,
  specialTokens: Record<string, string>,
  override?: string,
): ResolvedChatTemplate {
  if (override !== undefined) {
    if (Object.hasOwn(BUILTIN_CHAT_TEMPLATES, override)) {
      return {
        source: {
          template: BUILTIN_CHAT_TEMPLATES[override],
          specialTokens,
          name: `the built-in ${override} chat template`,
        },
        origin: `built-in ${override}`,
        stops: BUILTIN_STOPS[override] ?? [],
        notice: null,
      };
    }
    if (!existsSync(override) || !statSync(override).isFile()) {
      throw new Error(
        `--chat-template ${override}: not a file nor a built-in template (built-in: ${
          Object.keys(BUILTIN_CHAT_TEMPLATES).join(", ")
        })`,
      );
    }
    if (statSync(override).size > 1 << 20) {
      throw new Error(`--chat-template ${override}: larger than 1 MiB; not a chat template`);
    }
    return {
      source: { template: readFileSync(override, "utf8"), specialTokens, name: override },
      origin: override,
      stops: [],
      notice: null,
    };
  }
  try {
    return { source: chatTemplateFromDir(dir), origin: "checkpoint", stops: [], notice: null };
  } catch (e) {
    if (!/no chat template/.test((e as Error).message)) throw e;
    return {
      ...resolveChatTemplate(dir, specialTokens, "chatml"),
      notice: `the checkpoint has no chat template; using the built-in ChatML one ` +
        `(--chat-template FILE|chatml to choose)`,
    };
  }
}
