/**
 * GLM-4.5 / 4.6 / 4.7 / 5 tool calls: `<tool_call>NAME` then one `<arg_key>K</arg_key>` and
 * `<arg_value>V</arg_value>` pair per argument, then `</tool_call>`. GLM-4.5 puts newlines between
 * the parts, GLM-4.7 and 5 none; string values are raw text, others JSON.
 *
 * @module
 */
import {
  argumentValue,
  blocks,
  callId,
  requiredParams,
  type ToolCall,
  type ToolCallFormat,
  toolNamed,
  type ToolSpec,
  valueGrammar,
} from "./call.ts";

const PAIR = /^\s*<arg_key>([\s\S]*?)<\/arg_key>\s*<arg_value>([\s\S]*?)<\/arg_value>/;

function parse(section: string, tools: readonly ToolSpec[]): ToolCall[] | null {
  const bodies = blocks(section, "<tool_call>", "</tool_call>");
  if (bodies === null || bodies.length === 0) return null;
  const calls: ToolCall[] = [];
  for (const body of bodies) {
    const k = body.indexOf("<arg_key>");
    const name = (k < 0 ? body : body.slice(0, k)).trim();
    const tool = toolNamed(tools, name);
    if (!tool) return null;
    const args: Record<string, unknown> = {};
    let rest = k < 0 ? "" : body.slice(k);
    while (rest.trim().length > 0) {
      const m = PAIR.exec(rest);
      if (!m) return null;
      const key = m[1].trim();
      args[key] = argumentValue(tool, key, m[2]);
      rest = rest.slice(m[0].length);
    }
    calls.push({ id: callId(), name, arguments: JSON.stringify(args) });
  }
  return calls;
}

/** The `<arg_key>`/`<arg_value>` format. */
export const GLM: ToolCallFormat = {
  name: "glm",
  detect: (t) => t.includes("<arg_key>"),
  opens: ["<tool_call>"],
  parse,
  argumentsAs: "object",
  section: { begin: "", sep: "", end: "" },
  callGrammar: (tool) => ({
    type: "sequence",
    elements: [
      { type: "const_string", value: `<tool_call>${tool.name}` },
      ...requiredParams(tool).flatMap((key) => [
        { type: "const_string" as const, value: `<arg_key>${key}</arg_key><arg_value>` },
        valueGrammar(tool, key, "<"),
        { type: "const_string" as const, value: "</arg_value>" },
      ]),
      { type: "const_string", value: "</tool_call>" },
    ],
  }),
};
