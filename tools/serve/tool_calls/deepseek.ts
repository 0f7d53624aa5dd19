/**
 * DeepSeek tool calls, three generations:
 * - V3 / R1 (0324, 0528): `<｜tool▁calls▁begin｜>`, then per call `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME`,
 *   the arguments in a ```json fence, `<｜tool▁call▁end｜>`; then `<｜tool▁calls▁end｜>`;
 * - V3.1: the same section with `NAME<｜tool▁sep｜>ARGUMENTS` and no fence;
 * - V3.2 / V4 ("DSML"): `<｜DSML｜function_calls>` holding `<｜DSML｜invoke name="F">` elements with
 *   `<｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>` children (raw text when
 *   string="true", else JSON).
 * The parser of the first two accepts either body, so a fine-tune mixing them still parses.
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
const DSML_OPEN = `<${DSML}function_calls>`;
const DSML_CLOSE = `</${DSML}function_calls>`;
const INVOKE = new RegExp(`^\\s*<${DSML}invoke name="([^"]*)">([\\s\\S]*?)(?:</${DSML}invoke>|$)`);
const PARAM = new RegExp(
  `^\\s*<${DSML}parameter name="([^"]*)"(?: string="(true|false)")?>([\\s\\S]*?)</${DSML}parameter>`,
);

function parseDsml(section: string, tools: readonly ToolSpec[]): ToolCall[] | null {
  const outer = blocks(section, DSML_OPEN, DSML_CLOSE);
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

/** DeepSeek-V3.2 / V4 DSML. */
export const DEEPSEEK_DSML: ToolCallFormat = {
  name: "deepseek-dsml",
  detect: (t) => t.includes(DSML),
  opens: [DSML_OPEN],
  parse: parseDsml,
  argumentsAs: "object",
  section: { begin: `${DSML_OPEN}\n`, sep: "\n", end: `\n${DSML_CLOSE}` },
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
