/**
 * What every tool-call format shares: the tools a request offers, the calls parsed back out of
 * model output, the format interface the registry (mod.ts) holds, and the value helpers of the
 * formats that write arguments as XML-ish key/value pairs instead of one JSON object.
 *
 * @module
 */
import type { StructuralTagFormat } from "@mlc-ai/web-xgrammar";

/** One function a request offers (OpenAI's `tools[i].function`). */
export interface ToolSpec {
  name: string;
  description?: string;
  /** JSON schema of the arguments object. */
  parameters: Record<string, unknown>;
  /** OpenAI's `strict`: arguments must match the schema exactly. */
  strict?: boolean;
}

/** One call the model made. */
export interface ToolCall {
  id: string;
  name: string;
  /** The arguments as JSON text (OpenAI's wire form). */
  arguments: string;
}

/** A family's way of writing tool calls in its output. */
export interface ToolCallFormat {
  /** Short name (logs, `--help`, tests). */
  readonly name: string;
  /** Whether a chat template writes assistant tool calls this way (looked for in its text). */
  detect(template: string): boolean;
  /** Texts that open a tool-call section in the model's output. */
  readonly opens: readonly string[];
  /**
   * Parses a section that starts with one of {@link opens} and runs to the end of the output.
   * Null when it is malformed (the caller then returns it as text).
   */
  parse(section: string, tools: readonly ToolSpec[]): ToolCall[] | null;
  /** How the template expects `tool_calls[i].function.arguments`: JSON text or an object. */
  readonly argumentsAs: "string" | "object";
  /** The text of a whole forced section: `begin`, calls separated by `sep`, `end`. */
  readonly section: { begin: string; sep: string; end: string };
  /** The grammar of one forced call of `tool` (the `index`-th of the section). */
  callGrammar(tool: ToolSpec, index: number): StructuralTagFormat;
}

/** A fresh call id in OpenAI's style. */
export function callId(): string {
  return `call_${crypto.randomUUID().replaceAll("-", "").slice(0, 24)}`;
}

/** JSON text of an arguments object, or null when `text` is not one. */
export function jsonObjectText(text: string): string | null {
  try {
    const v = JSON.parse(text);
    return typeof v === "object" && v !== null && !Array.isArray(v) ? JSON.stringify(v) : null;
  } catch {
    return null;
  }
}

/** The tool named `name`, or undefined. */
export function toolNamed(tools: readonly ToolSpec[], name: string): ToolSpec | undefined {
  return tools.find((t) => t.name === name);
}

/** Whether the schema of parameter `key` of `tool` says its value is a string. */
function isStringParam(tool: ToolSpec, key: string): boolean {
  const props = tool.parameters.properties as Record<string, { type?: unknown }> | undefined;
  const type = props?.[key]?.type;
  return type === "string" || (Array.isArray(type) && type.includes("string") && type.length === 1);
}

/**
 * The value of a key/value-style argument: raw text for a string parameter, else the JSON it
 * holds (a number, object, …), else the raw text (models write unquoted strings for untyped ones).
 */
export function argumentValue(tool: ToolSpec, key: string, raw: string): unknown {
  if (isStringParam(tool, key)) return raw;
  try {
    return JSON.parse(raw);
  } catch {
    return raw;
  }
}

/** The names of the parameters a forced call writes: the required ones, in schema order. */
export function requiredParams(tool: ToolSpec): string[] {
  const props = Object.keys((tool.parameters.properties ?? {}) as Record<string, unknown>);
  const req = tool.parameters.required;
  const required = Array.isArray(req) ? req.filter((k) => typeof k === "string") : [];
  return props.filter((k) => required.includes(k));
}

/**
 * Grammar of one key/value argument's value. A string is raw text without `stopChar`: one of its
 * enum values when the schema lists them, at most maxLength characters when it says so. Anything
 * else is JSON of the parameter's schema.
 */
export function valueGrammar(tool: ToolSpec, key: string, stopChar: string): StructuralTagFormat {
  const props = tool.parameters.properties as Record<string, Record<string, unknown>> | undefined;
  const schema = props?.[key] ?? {};
  if (!isStringParam(tool, key)) return { type: "json_schema", json_schema: schema };
  const values = schema.enum;
  if (Array.isArray(values) && values.length > 0 && values.every((v) => typeof v === "string")) {
    const escape = (v: string) => v.replace(/[\\^$.*+?()[\]{}|/-]/g, "\\$&");
    return { type: "regex", pattern: `(${values.map(escape).join("|")})` };
  }
  const max = schema.maxLength;
  const count = Number.isInteger(max) && (max as number) >= 0 ? `{0,${max}}` : "*";
  return { type: "regex", pattern: `[^${stopChar}]${count}` };
}

/** Grammar of a JSON arguments object for `tool`. */
export function argumentsGrammar(tool: ToolSpec): StructuralTagFormat {
  return { type: "json_schema", json_schema: tool.parameters };
}

/** Text before `open` and the section from it, at the earliest of `opens`; null if none. */
export function splitAt(
  text: string,
  opens: readonly string[],
): { before: string; section: string } | null {
  let at = -1;
  for (const o of opens) {
    const i = text.indexOf(o);
    if (i >= 0 && (at < 0 || i < at)) at = i;
  }
  return at < 0 ? null : { before: text.slice(0, at), section: text.slice(at) };
}

/** Splits `section` into the bodies of consecutive `open … close` blocks; null if anything else. */
export function blocks(section: string, open: string, close: string): string[] | null {
  const out: string[] = [];
  let rest = section.trim();
  while (rest.length > 0) {
    if (!rest.startsWith(open)) return null;
    const end = rest.indexOf(close, open.length);
    if (end < 0) {
      out.push(rest.slice(open.length));
      break;
    }
    out.push(rest.slice(open.length, end));
    rest = rest.slice(end + close.length).trim();
  }
  return out;
}

/**
 * The call bodies of a section `begin … end` holding `callBegin … callEnd` blocks (Kimi-K2,
 * DeepSeek); null when the section or a block is malformed.
 */
export function sectionBodies(
  section: string,
  marks: { begin: string; end: string; callBegin: string; callEnd: string },
): string[] | null {
  const outer = blocks(section, marks.begin, marks.end);
  if (outer === null || outer.length !== 1) return null;
  const bodies = blocks(outer[0], marks.callBegin, marks.callEnd);
  return bodies === null || bodies.length === 0 ? null : bodies;
}

/** What {@link parseInvokes}'s `value` returns for a value that does not parse. */
export const BAD_VALUE: unique symbol = Symbol("bad value");

/**
 * Parses consecutive invoke elements (MiniMax-M2, DeepSeek DSML): `invoke` matches one at the
 * start of the text and captures the tool name and the body, `param` one parameter at the start
 * of a body and captures the key first; `value` reads that parameter's value or says
 * {@link BAD_VALUE}. Null when anything does not parse or names an unknown tool.
 */
export function parseInvokes(
  text: string,
  tools: readonly ToolSpec[],
  invoke: RegExp,
  param: RegExp,
  value: (tool: ToolSpec, p: RegExpExecArray) => unknown,
): ToolCall[] | null {
  const calls: ToolCall[] = [];
  let rest = text;
  while (rest.trim().length > 0) {
    const m = invoke.exec(rest);
    const tool = m && toolNamed(tools, m[1]);
    if (!m || !tool) return null;
    const args: Record<string, unknown> = {};
    let body = m[2];
    while (body.trim().length > 0) {
      const p = param.exec(body);
      if (!p) return null;
      const v = value(tool, p);
      if (v === BAD_VALUE) return null;
      args[p[1]] = v;
      body = body.slice(p[0].length);
    }
    calls.push({ id: callId(), name: tool.name, arguments: JSON.stringify(args) });
    rest = rest.slice(m[0].length);
  }
  return calls;
}
