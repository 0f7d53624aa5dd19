/**
 * Qwen / Hermes tool calls: each call a JSON object `{"name": …, "arguments": {…}}` between
 * `<tool_call>` and `</tool_call>` (Qwen2.5, Qwen3 and the Hermes models; also the format of the
 * built-in template). The registry tries it after GLM's and Qwen3-Coder's, which open their calls
 * with the same tag. The last closing tag may be missing when the model stopped.
 *
 * @module
 */
import {
  blocks,
  callId,
  jsonObjectText,
  type ToolCall,
  type ToolCallFormat,
  toolNamed,
  type ToolSpec,
} from "./call.ts";

const OPEN = "<tool_call>";
const CLOSE = "</tool_call>";

function parse(section: string, tools: readonly ToolSpec[]): ToolCall[] | null {
  const bodies = blocks(section, OPEN, CLOSE);
  if (bodies === null || bodies.length === 0) return null;
  const calls: ToolCall[] = [];
  for (const body of bodies) {
    let v: unknown;
    try {
      v = JSON.parse(body);
    } catch {
      return null;
    }
    const o = v as { name?: unknown; arguments?: unknown; parameters?: unknown };
    if (typeof o !== "object" || o === null || typeof o.name !== "string") return null;
    if (!toolNamed(tools, o.name)) return null;
    const args = o.arguments ?? o.parameters ?? {};
    const text = typeof args === "string"
      ? jsonObjectText(args)
      : jsonObjectText(JSON.stringify(args));
    if (text === null) return null;
    calls.push({ id: callId(), name: o.name, arguments: text });
  }
  return calls;
}

/** The `<tool_call>` JSON format. */
export const HERMES: ToolCallFormat = {
  name: "hermes",
  detect: (t) => t.includes(OPEN),
  opens: [OPEN],
  parse,
  argumentsAs: "object",
  section: { begin: "", sep: "\n", end: "" },
  callGrammar: (tool) => ({
    type: "sequence",
    elements: [
      {
        type: "const_string",
        value: `${OPEN}\n{"name": ${JSON.stringify(tool.name)}, "arguments": `,
      },
      { type: "json_schema", json_schema: tool.parameters },
      { type: "const_string", value: `}\n${CLOSE}` },
    ],
  }),
};
