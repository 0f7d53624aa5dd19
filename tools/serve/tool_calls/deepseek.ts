/**
 * DeepSeek tool calls, three generations:
 * - V3 / R1 (0324, 0528): `<｜tool▁calls▁begin｜>`, then per call `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME`,
 *   the arguments in a ```json fence, `<｜tool▁call▁end｜>`; then `<｜tool▁calls▁end｜>`;
 * - V3.1: the same section with `NAME<｜tool▁sep｜>ARGUMENTS` and no fence;
 * - V3.2 and V4 ("DSML"): `<｜DSML｜function_calls>` (V3.2) or `<｜DSML｜tool_calls>` (V4) holding
 *   `<｜DSML｜invoke name="F">` elements with `<｜DSML｜parameter name="K" string="true|false">V`
 *   `</｜DSML｜parameter>` children (raw text when string="true", else JSON).
 * The parser of the first two accepts either body, and the DSML parser either wrapper, so a
 * fine-tune mixing them still parses.
 *
 * @module
 */
import {
  argumentsGrammar,
  argumentValue,
  BAD_VALUE,
  blocks,
  callId,
  jsonObjectText,
  parseInvokes,
  requiredParams,
  sectionBodies,
  type ToolCall,
  type ToolCallFormat,
  toolNamed,
  type ToolSpec,
  valueGrammar,
} from "./call.ts";

const CALLS_BEGIN = "<｜tool▁calls▁begin｜>";
const CALLS_END = "<｜tool▁calls▁end｜>";
const CALL_BEGIN = "<｜tool▁call▁begin｜>";
const CALL_END = "<｜tool▁call▁end｜>";
const SEP = "<｜tool▁sep｜>";
const FENCED = /^function\s*$/;

function parseSection(section: string, tools: readonly ToolSpec[]): ToolCall[] | null {
  const bodies = sectionBodies(section, {
    begin: CALLS_BEGIN,
    end: CALLS_END,
    callBegin: CALL_BEGIN,
    callEnd: CALL_END,
  });
  if (bodies === null) return null;
  const calls: ToolCall[] = [];
  for (const body of bodies) {
    const s = body.indexOf(SEP);
    if (s < 0) return null;
    const head = body.slice(0, s);
    let name: string;
    let args: string;
    if (FENCED.test(head)) {
      const rest = body.slice(s + SEP.length);
      const nl = rest.indexOf("\n");
      if (nl < 0) return null;
      name = rest.slice(0, nl).trim();
      const fence = /^\s*```(?:json)?\s*\n([\s\S]*?)\n?```\s*$/.exec(rest.slice(nl + 1));
      if (!fence) return null;
      args = fence[1];
    } else {
      name = head.trim();
      args = body.slice(s + SEP.length);
    }
    const text = jsonObjectText(args);
    if (text === null || !toolNamed(tools, name)) return null;
    calls.push({ id: callId(), name, arguments: text });
  }
  return calls;
}

/** DeepSeek-V3 / R1: `function<｜tool▁sep｜>NAME` and a ```json fence. */
export const DEEPSEEK_V3: ToolCallFormat = {
  name: "deepseek-v3",
  detect: (t) => t.includes("tool▁sep") && t.includes("```json"),
  opens: [CALLS_BEGIN],
  parse: parseSection,
  argumentsAs: "string",
  section: { begin: CALLS_BEGIN, sep: "\n", end: CALLS_END },
  callGrammar: (tool) => ({
    type: "sequence",
    elements: [
      { type: "const_string", value: `${CALL_BEGIN}function${SEP}${tool.name}\n\`\`\`json\n` },
      argumentsGrammar(tool),
      { type: "const_string", value: `\n\`\`\`${CALL_END}` },
    ],
  }),
};

/** DeepSeek-V3.1: `NAME<｜tool▁sep｜>ARGUMENTS`. */
export const DEEPSEEK_V31: ToolCallFormat = {
  name: "deepseek-v3.1",
  detect: (t) => t.includes("tool▁sep"),
  opens: [CALLS_BEGIN],
  parse: parseSection,
  argumentsAs: "string",
  section: { begin: CALLS_BEGIN, sep: "", end: CALLS_END },
  callGrammar: (tool) => ({
    type: "sequence",
    elements: [
      { type: "const_string", value: `${CALL_BEGIN}${tool.name}${SEP}` },
      argumentsGrammar(tool),
      { type: "const_string", value: CALL_END },
    ],
  }),
};

const DSML = "｜DSML｜";
/** The wrappers of a DSML section: V3.2's and V4's. */
const DSML_WRAPPERS = ["function_calls", "tool_calls"] as const;
const INVOKE = new RegExp(`^\\s*<${DSML}invoke name="([^"]*)">([\\s\\S]*?)(?:</${DSML}invoke>|$)`);
const PARAM = new RegExp(
  `^\\s*<${DSML}parameter name="([^"]*)"(?: string="(true|false)")?>([\\s\\S]*?)</${DSML}parameter>`,
);

function parseDsml(section: string, tools: readonly ToolSpec[]): ToolCall[] | null {
  const wrapper = DSML_WRAPPERS.find((w) => section.startsWith(`<${DSML}${w}>`));
  if (!wrapper) return null;
  const outer = blocks(section, `<${DSML}${wrapper}>`, `</${DSML}${wrapper}>`);
  if (outer === null || outer.length !== 1) return null;
  const calls = parseInvokes(outer[0], tools, INVOKE, PARAM, (tool, p) => {
    if (p[2] === "true") return p[3];
    if (p[2] === undefined) return argumentValue(tool, p[1], p[3]);
    try {
      return JSON.parse(p[3]);
    } catch {
      return BAD_VALUE;
    }
  });
  return calls && calls.length > 0 ? calls : null;
}

/** The DSML format of one generation, named by its section wrapper. */
function dsmlFormat(name: string, wrapper: (typeof DSML_WRAPPERS)[number]): ToolCallFormat {
  const open = `<${DSML}${wrapper}>`;
  const close = `</${DSML}${wrapper}>`;
  return {
    name,
    // A V4 template writes "tool_calls" around its calls and never "function_calls".
    detect: (t) =>
      t.includes("DSML") && t.includes("function_calls") === (wrapper === "function_calls"),
    opens: DSML_WRAPPERS.map((w) => `<${DSML}${w}>`),
    parse: parseDsml,
    argumentsAs: "object",
    section: { begin: `${open}\n`, sep: "\n", end: `\n${close}` },
    callGrammar: (tool) => {
      const props = (tool.parameters.properties ?? {}) as Record<string, { type?: unknown }>;
      return {
        type: "sequence",
        elements: [
          { type: "const_string", value: `<${DSML}invoke name="${tool.name}">\n` },
          ...requiredParams(tool).flatMap((key) => [
            {
              type: "const_string" as const,
              value: `<${DSML}parameter name="${key}" string="${props[key]?.type === "string"}">`,
            },
            valueGrammar(tool, key, "<"),
            { type: "const_string" as const, value: `</${DSML}parameter>\n` },
          ]),
          { type: "const_string", value: `</${DSML}invoke>` },
        ],
      };
    },
  };
}

/** DeepSeek-V3.2: DSML in `function_calls`. */
export const DEEPSEEK_V32: ToolCallFormat = dsmlFormat("deepseek-v3.2", "function_calls");

/** DeepSeek-V4: DSML in `tool_calls`. */
export const DEEPSEEK_V4: ToolCallFormat = dsmlFormat("deepseek-v4", "tool_calls");
