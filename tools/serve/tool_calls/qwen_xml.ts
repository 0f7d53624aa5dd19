/**
 * Qwen3-Coder and Qwen3.5 tool calls: `<tool_call>`, `<function=NAME>`, then one
 * `<parameter=KEY>` … `</parameter>` per argument (the value on its own lines: raw text for a
 * string parameter, else JSON), `</function>`, `</tool_call>`.
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

const OPEN = "<tool_call>";
const CLOSE = "</tool_call>";
const FUNCTION = /^\s*<function=([^>\s]+)>([\s\S]*?)(?:<\/function>|$)/;
const PARAM = /^\s*<parameter=([^>\s]+)>([\s\S]*?)<\/parameter>/;

function parse(section: string, tools: readonly ToolSpec[]): ToolCall[] | null {
  const bodies = blocks(section, OPEN, CLOSE);
  if (bodies === null || bodies.length === 0) return null;
  const calls: ToolCall[] = [];
  for (const body of bodies) {
    // One function per block: the template writes a block per call.
    const some = parseInvokes(
      body,
      tools,
      FUNCTION,
      PARAM,
      (tool, p) => argumentValue(tool, p[1], p[2].replace(/^\n/, "").replace(/\n$/, "")),
    );
    if (some === null || some.length !== 1) return null;
    calls.push(some[0]);
  }
  return calls;
}

/** The `<function=…>` / `<parameter=…>` format. */
export const QWEN_XML: ToolCallFormat = {
  name: "qwen3-coder",
  detect: (t) => t.includes("<function=") && t.includes("<parameter="),
  opens: [OPEN],
  parse,
  argumentsAs: "object",
  section: { begin: "", sep: "\n", end: "" },
  callGrammar: (tool) => ({
    type: "sequence",
    elements: [
      { type: "const_string", value: `${OPEN}\n<function=${tool.name}>\n` },
      ...requiredParams(tool).flatMap((key) => [
        { type: "const_string" as const, value: `<parameter=${key}>\n` },
        valueGrammar(tool, key, "<"),
        { type: "const_string" as const, value: "\n</parameter>\n" },
      ]),
      { type: "const_string", value: `</function>\n${CLOSE}` },
    ],
  }),
};
