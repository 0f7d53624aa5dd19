/**
 * MiniMax-M2 tool calls: a `<minimax:tool_call>` section holding one `<invoke name="F">` per
 * call, each with `<parameter name="K">V</parameter>` children; string values are raw text,
 * others JSON.
 *
 * @module
 */
import {
  argumentValue,
  callId,
  requiredParams,
  type ToolCall,
  type ToolCallFormat,
  toolNamed,
  type ToolSpec,
  valueGrammar,
} from "./call.ts";
import { blocks } from "./hermes.ts";

const OPEN = "<minimax:tool_call>";
const CLOSE = "</minimax:tool_call>";
const INVOKE = /^\s*<invoke name="([^"]*)">([\s\S]*?)(?:<\/invoke>|$)/;
const PARAM = /^\s*<parameter name="([^"]*)">([\s\S]*?)<\/parameter>/;

function parse(section: string, tools: readonly ToolSpec[]): ToolCall[] | null {
  const sections = blocks(section, OPEN, CLOSE);
  if (sections === null || sections.length === 0) return null;
  const calls: ToolCall[] = [];
  for (let rest of sections) {
    while (rest.trim().length > 0) {
      const m = INVOKE.exec(rest);
      if (!m) return null;
      const tool = toolNamed(tools, m[1]);
      if (!tool) return null;
      const args: Record<string, unknown> = {};
      let body = m[2];
      while (body.trim().length > 0) {
        const p = PARAM.exec(body);
        if (!p) return null;
        args[p[1]] = argumentValue(tool, p[1], p[2].replace(/^\n|\n$/g, ""));
        body = body.slice(p[0].length);
      }
      calls.push({ id: callId(), name: tool.name, arguments: JSON.stringify(args) });
      rest = rest.slice(m[0].length);
    }
  }
  return calls.length > 0 ? calls : null;
}

/** The `<minimax:tool_call>` XML format. */
export const MINIMAX: ToolCallFormat = {
  name: "minimax",
  detect: (t) => t.includes(OPEN),
  opens: [OPEN],
  parse,
  argumentsAs: "object",
  section: { begin: `${OPEN}\n`, sep: "\n", end: `\n${CLOSE}` },
  callGrammar: (tool) => ({
    type: "sequence",
    elements: [
      { type: "const_string", value: `<invoke name="${tool.name}">\n` },
      ...requiredParams(tool).flatMap((key) => [
        { type: "const_string" as const, value: `<parameter name="${key}">` },
        valueGrammar(tool, key, "<"),
        { type: "const_string" as const, value: "</parameter>\n" },
      ]),
      { type: "const_string", value: "</invoke>" },
    ],
  }),
};
