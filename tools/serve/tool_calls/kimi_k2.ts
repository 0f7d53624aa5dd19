/**
 * Kimi-K2 tool calls: `<|tool_calls_section_begin|>`, then per call `<|tool_call_begin|>`, the
 * call id `functions.NAME:INDEX`, `<|tool_call_argument_begin|>`, the JSON arguments and
 * `<|tool_call_end|>`; then `<|tool_calls_section_end|>`. The id is the model's own: its template
 * writes it back in front of the tool's answer.
 *
 * @module
 */
import {
  argumentsGrammar,
  jsonObjectText,
  sectionBodies,
  type ToolCall,
  type ToolCallFormat,
  toolNamed,
  type ToolSpec,
} from "./call.ts";

const SECTION_BEGIN = "<|tool_calls_section_begin|>";
const SECTION_END = "<|tool_calls_section_end|>";
const CALL_BEGIN = "<|tool_call_begin|>";
const CALL_END = "<|tool_call_end|>";
const ARGS = "<|tool_call_argument_begin|>";

function parse(section: string, tools: readonly ToolSpec[]): ToolCall[] | null {
  const bodies = sectionBodies(section, {
    begin: SECTION_BEGIN,
    end: SECTION_END,
    callBegin: CALL_BEGIN,
    callEnd: CALL_END,
  });
  if (bodies === null) return null;
  const calls: ToolCall[] = [];
  for (const body of bodies) {
    const a = body.indexOf(ARGS);
    if (a < 0) return null;
    const id = body.slice(0, a).trim();
    const m = /^(?:functions\.)?([^:\s]+)(?::\d+)?$/.exec(id);
    const text = jsonObjectText(body.slice(a + ARGS.length));
    if (!m || text === null || !toolNamed(tools, m[1])) return null;
    calls.push({ id, name: m[1], arguments: text });
  }
  return calls;
}

/** The Kimi-K2 tool-call section. */
export const KIMI_K2: ToolCallFormat = {
  name: "kimi-k2",
  detect: (t) => t.includes("tool_calls_section_begin") || t.includes("tool_call_argument_begin"),
  opens: [SECTION_BEGIN],
  parse,
  argumentsAs: "string",
  section: { begin: SECTION_BEGIN, sep: "", end: SECTION_END },
  callGrammar: (tool, index) => ({
    type: "sequence",
    elements: [
      { type: "const_string", value: `${CALL_BEGIN}functions.${tool.name}:${index}${ARGS}` },
      argumentsGrammar(tool),
      { type: "const_string", value: CALL_END },
    ],
  }),
};
