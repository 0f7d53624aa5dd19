/**
 * MiniMax-M2 tool calls: a `<minimax:tool_call>` section holding one `<invoke name="F">` per
 * call, each with `<parameter name="K">V</parameter>` children; string values are raw text,
 * others JSON.
 *
 * @module
 */
import {
  argumentValue,
  blocks,
  parseInvokes,
  requiredParams,
  type ToolCall,
  type ToolCallFormat,
  type ToolSpec,
  valueGrammar,
} from "./call.ts";

const OPEN = "<minimax:tool_call>";
const CLOSE = "</minimax:tool_call>";
const INVOKE = /^\s*<invoke name="([^"]*)">([\s\S]*?)(?:<\/invoke>|$)/;
const PARAM = /^\s*<parameter name="([^"]*)">([\s\S]*?)<\/parameter>/;

function parse(section: string, tools: readonly ToolSpec[]): ToolCall[] | null {
  const sections = blocks(section, OPEN, CLOSE);
  if (sections === null || sections.length === 0) return null;
  const calls: ToolCall[] = [];
  for (const body of sections) {
    const some = parseInvokes(
      body,
      tools,
      INVOKE,
      PARAM,
      (tool, p) => argumentValue(tool, p[1], p[2].replace(/^\n|\n$/g, "")),
    );
    if (some === null) return null;
    calls.push(...some);
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
