/**
 * The registry of tool-call formats: which one a chat template writes (the first whose marks it
 * holds, most specific first).
 *
 * @module
 */
import type { ToolCallFormat } from "./call.ts";
import { DEEPSEEK_V3, DEEPSEEK_V31, DEEPSEEK_V32, DEEPSEEK_V4 } from "./deepseek.ts";
import { GLM } from "./glm.ts";
import { HARMONY } from "./harmony.ts";
import { HERMES } from "./hermes.ts";
import { KIMI_K2 } from "./kimi_k2.ts";
import { MINIMAX } from "./minimax.ts";
import { QWEN_XML } from "./qwen_xml.ts";

export type { ToolCall, ToolCallFormat, ToolSpec } from "./call.ts";

/** Every format, in detection order (GLM and Qwen's XML before Hermes: all write `<tool_call>`). */
export const TOOL_CALL_FORMATS: readonly ToolCallFormat[] = [
  HARMONY,
  KIMI_K2,
  DEEPSEEK_V32,
  DEEPSEEK_V4,
  DEEPSEEK_V3,
  DEEPSEEK_V31,
  MINIMAX,
  GLM,
  QWEN_XML,
  HERMES,
];

/** The format a chat template writes tool calls in, or null when it shows none. */
export function detectToolFormat(template: string): ToolCallFormat | null {
  return TOOL_CALL_FORMATS.find((f) => f.detect(template)) ?? null;
}
