/**
 * Splits a chat model's streamed output into what OpenAI returns apart: the answer (`content`),
 * the reasoning (`reasoning_content`) and the tool calls. Text is passed on as soon as it cannot
 * be the start of a marker; a tool-call section is held until the end and parsed once whole, and
 * one that does not parse is returned as text, never an error.
 *
 * Two shapes of output: `<think>…</think>` reasoning followed by text and a tool-call section in
 * the family's format (tool_calls/), and gpt-oss's harmony messages (tool_calls/harmony.ts).
 *
 * @module
 */
import type { ToolCall, ToolCallFormat, ToolSpec } from "./tool_calls/mod.ts";
import { HARMONY_ENDS, harmonyCall, harmonyHeader } from "./tool_calls/harmony.ts";

/** New text of each kind. */
export interface OutputDelta {
  content: string;
  reasoning: string;
}

/** How to read one generation's output. */
export interface OutputOptions {
  /** The format of tool calls to look for; null when the request offers no tools. */
  format: ToolCallFormat | null;
  tools: readonly ToolSpec[];
  /** Split `<think>…</think>` off as reasoning. */
  thinkTags: boolean;
  /** The prompt already opened `<think>`: the output starts inside the reasoning. */
  startsInReasoning: boolean;
  /** Read gpt-oss harmony messages. */
  harmony: boolean;
}

/** A streaming splitter of one generation's text. */
export interface OutputSplitter {
  push(text: string): OutputDelta;
  /** The rest of the text and the tool calls, once the generation ended. */
  end(): { delta: OutputDelta; toolCalls: ToolCall[] };
}

/** Length of the longest suffix of `text` that is a proper prefix of one of `marks`. */
function partialMarkAtEnd(text: string, marks: readonly string[]): number {
  let keep = 0;
  for (const m of marks) {
    for (let k = Math.min(m.length - 1, text.length); k > keep; k--) {
      if (text.endsWith(m.slice(0, k))) {
        keep = k;
        break;
      }
    }
  }
  return keep;
}

/** The earliest of `marks` in `text`. */
function firstMark(text: string, marks: readonly string[]): { at: number; mark: string } | null {
  let best: { at: number; mark: string } | null = null;
  for (const mark of marks) {
    const at = text.indexOf(mark);
    if (at >= 0 && (best === null || at < best.at)) best = { at, mark };
  }
  return best;
}

const THINK_OPEN = "<think>";
const THINK_CLOSE = "</think>";

/** `<think>` reasoning, text, then a tool-call section. */
class TaggedSplitter implements OutputSplitter {
  #mode: "reasoning" | "content" | "tools";
  #held = "";
  #section = "";
  #contentSeen = false;
  /** Right after `</think>`: the whitespace before the answer is not part of it. */
  #trim = false;
  readonly #opts: OutputOptions;

  constructor(opts: OutputOptions) {
    this.#opts = opts;
    this.#mode = opts.startsInReasoning ? "reasoning" : "content";
  }

  #marks(): string[] {
    if (this.#mode === "reasoning") return [THINK_CLOSE];
    const marks = [...(this.#opts.format?.opens ?? [])];
    if (this.#opts.thinkTags && !this.#contentSeen) marks.push(THINK_OPEN);
    return marks;
  }

  push(text: string): OutputDelta {
    const out = { content: "", reasoning: "" };
    if (this.#mode === "tools") {
      this.#section += text;
      return out;
    }
    let buf = this.#held + text;
    for (;;) {
      const marks = this.#marks();
      const hit = firstMark(buf, marks);
      if (hit === null) {
        const keep = partialMarkAtEnd(buf, marks);
        this.#emit(out, buf.slice(0, buf.length - keep));
        this.#held = buf.slice(buf.length - keep);
        return out;
      }
      this.#emit(out, buf.slice(0, hit.at));
      buf = buf.slice(hit.at + hit.mark.length);
      if (hit.mark === THINK_OPEN) this.#mode = "reasoning";
      else if (hit.mark === THINK_CLOSE) {
        this.#mode = "content";
        this.#trim = true;
      } else {
        this.#mode = "tools";
        this.#section = hit.mark + buf;
        this.#held = "";
        return out;
      }
    }
  }

  #emit(out: OutputDelta, text: string): void {
    if (!text) return;
    if (this.#mode === "reasoning") out.reasoning += text;
    else {
      if (this.#trim) text = text.replace(/^\s+/, "");
      if (!text) return;
      this.#trim = false;
      out.content += text;
      this.#contentSeen = true;
    }
  }

  end(): { delta: OutputDelta; toolCalls: ToolCall[] } {
    const delta = { content: "", reasoning: "" };
    this.#emit(delta, this.#held);
    this.#held = "";
    if (this.#mode !== "tools") return { delta, toolCalls: [] };
    const calls = this.#opts.format?.parse(this.#section, this.#opts.tools) ?? null;
    if (calls === null) {
      delta.content += this.#section;
      return { delta, toolCalls: [] };
    }
    return { delta, toolCalls: calls };
  }
}

const MESSAGE = "<|message|>";

/** gpt-oss harmony: analysis → reasoning, final and plain commentary → content, calls. */
class HarmonySplitter implements OutputSplitter {
  #header = true;
  #kind: "reasoning" | "content" | "call" = "content";
  #recipient = "";
  #raw = "";
  #body = "";
  #held = "";
  #calls: ToolCall[] = [];
  readonly #opts: OutputOptions;

  constructor(opts: OutputOptions) {
    this.#opts = opts;
  }

  push(text: string): OutputDelta {
    const out = { content: "", reasoning: "" };
    let buf = this.#held + text;
    this.#held = "";
    for (;;) {
      if (this.#header) {
        const m = buf.indexOf(MESSAGE);
        if (m < 0) {
          this.#held = buf;
          return out;
        }
        const head = harmonyHeader(buf.slice(0, m));
        this.#raw = buf.slice(0, m + MESSAGE.length);
        this.#recipient = head.recipient ?? "";
        this.#kind = head.recipient !== null && this.#opts.format
          ? "call"
          : head.channel === "analysis"
          ? "reasoning"
          : "content";
        this.#body = "";
        this.#header = false;
        buf = buf.slice(m + MESSAGE.length);
      }
      const hit = firstMark(buf, HARMONY_ENDS);
      const upTo = hit === null ? buf.length - partialMarkAtEnd(buf, HARMONY_ENDS) : hit.at;
      this.#bodyText(out, buf.slice(0, upTo));
      if (hit === null) {
        this.#held = buf.slice(upTo);
        return out;
      }
      this.#closeMessage(out);
      buf = buf.slice(hit.at + (hit.mark === "<|start|>" ? 0 : hit.mark.length));
      buf = buf.replace(/^<\|start\|>assistant/, "");
      this.#header = true;
    }
  }

  #bodyText(out: OutputDelta, text: string): void {
    this.#body += text;
    this.#raw += text;
    if (this.#kind === "reasoning") out.reasoning += text;
    else if (this.#kind === "content") out.content += text;
  }

  #closeMessage(out: OutputDelta): void {
    if (this.#kind !== "call") return;
    const call = harmonyCall(this.#recipient, this.#body, this.#opts.tools);
    if (call) this.#calls.push(call);
    else out.content += this.#raw;
  }

  end(): { delta: OutputDelta; toolCalls: ToolCall[] } {
    const delta = { content: "", reasoning: "" };
    if (this.#header) delta.content += this.#held;
    else {
      this.#bodyText(delta, this.#held);
      this.#closeMessage(delta);
    }
    this.#held = "";
    return { delta, toolCalls: this.#calls };
  }
}

/** A splitter for one generation. */
export function outputSplitter(opts: OutputOptions): OutputSplitter {
  return opts.harmony ? new HarmonySplitter(opts) : new TaggedSplitter(opts);
}
