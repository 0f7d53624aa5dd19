/**
 * gpt-oss's harmony format. The assistant's output is a run of messages, each a header
 * (`<|channel|>NAME`, maybe ` to=functions.F` and `<|constrain|>json`, also written before the
 * channel) then `<|message|>`, the body, and `<|end|>`, `<|call|>` or `<|return|>`; the next one
 * starts with `<|start|>assistant`. The `analysis` channel is the reasoning, `final` the answer, and
 * a message addressed `to=functions.F` a tool call whose body is the JSON arguments.
 *
 * @module
 */
import {
  argumentsGrammar,
  callId,
  jsonObjectText,
  type ToolCall,
  type ToolCallFormat,
  toolNamed,
  type ToolSpec,
} from "./call.ts";

const MESSAGE = "<|message|>";
/** Texts that end a message body or start the next message. */
export const HARMONY_ENDS = ["<|end|>", "<|call|>", "<|return|>", "<|start|>"] as const;

/** A message header's channel and recipient. */
export interface HarmonyHeader {
  channel: string;
  /** The function a tool call goes to (`F` of `to=functions.F`), or null. */
  recipient: string | null;
}

/** Reads a header (the text before `<|message|>`, `<|start|>assistant` removed). */
export function harmonyHeader(header: string): HarmonyHeader {
  const channel = /<\|channel\|>\s*([A-Za-z_]+)/.exec(header)?.[1] ?? "";
  const recipient = /to=functions\.([^\s<]+)/.exec(header)?.[1] ?? null;
  return { channel, recipient };
}

/** A tool call from a message addressed to `recipient`; null if the tool or JSON is wrong. */
export function harmonyCall(
  recipient: string,
  body: string,
  tools: readonly ToolSpec[],
): ToolCall | null {
  const text = jsonObjectText(body);
  if (text === null || !toolNamed(tools, recipient)) return null;
  return { id: callId(), name: recipient, arguments: text };
}

function parse(section: string, tools: readonly ToolSpec[]): ToolCall[] | null {
  const calls: ToolCall[] = [];
  let rest = section;
  while (rest.trim().length > 0) {
    rest = rest.replace(/^\s*(?:<\|start\|>assistant)?/, "");
    const m = rest.indexOf(MESSAGE);
    if (m < 0) return null;
    const { recipient } = harmonyHeader(rest.slice(0, m));
    if (recipient === null) return null;
    const body = rest.slice(m + MESSAGE.length);
    let end = body.length;
    let endLen = 0;
    for (const e of HARMONY_ENDS) {
      const i = body.indexOf(e);
      if (i >= 0 && i < end) [end, endLen] = [i, e === "<|start|>" ? 0 : e.length];
    }
    const call = harmonyCall(recipient, body.slice(0, end), tools);
    if (call === null) return null;
    calls.push(call);
    rest = body.slice(end + endLen);
  }
  return calls.length > 0 ? calls : null;
}

/** The harmony tool-call messages. */
export const HARMONY: ToolCallFormat = {
  name: "harmony",
  detect: (t) => t.includes("<|channel|>"),
  opens: ["<|channel|>commentary to=functions.", "<|start|>assistant to=functions."],
  parse,
  argumentsAs: "string",
  section: { begin: "", sep: "<|start|>assistant", end: "" },
  callGrammar: (tool) => ({
    type: "sequence",
    elements: [
      {
        type: "const_string",
        value: `<|channel|>commentary to=functions.${tool.name} <|constrain|>json${MESSAGE}`,
      },
      argumentsGrammar(tool),
      { type: "const_string", value: "<|call|>" },
    ],
  }),
};
