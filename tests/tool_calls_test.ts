/**
 * The tool-call parsers against what each family's chat template writes. Every format has a
 * minimal template excerpt written here after the release's own template (the part that renders
 * an assistant turn's `tool_calls`): the parser must read back exactly the calls the template
 * wrote, detection must pick the format from the excerpt, and hand-written model outputs,
 * malformed ones included, must give calls or plain text, never an exception.
 */
import assert from "node:assert/strict";
import { Template } from "@huggingface/jinja";
import { outputSplitter } from "../tools/serve/chat_output.ts";
import {
  detectToolFormat,
  TOOL_CALL_FORMATS,
  type ToolCallFormat,
  type ToolSpec,
} from "../tools/serve/tool_calls/mod.ts";

const TOOLS: ToolSpec[] = [
  {
    name: "get_weather",
    parameters: {
      type: "object",
      properties: { city: { type: "string" }, days: { type: "integer" } },
      required: ["city"],
    },
  },
  {
    name: "search",
    parameters: {
      type: "object",
      properties: { query: { type: "string" }, filters: { type: "object" } },
      required: ["query"],
    },
  },
];

/** Two calls with a string, a number, a nested object and text that looks like markup. */
const CALLS = [
  { name: "get_weather", args: { city: "Zürich", days: 3 } },
  { name: "search", args: { query: 'a < b & "c"', filters: { year: 2026, tags: ["x"] } } },
];

/**
 * Excerpts of the assistant-turn part of each release's template (Qwen3, GLM-4.5, Kimi-K2,
 * DeepSeek-V3-0324, DeepSeek-V3.1, DeepSeek-V3.2 and V4 DSML, MiniMax-M2, gpt-oss, Qwen3.5), written for this test.
 */
const EXCERPTS: Record<string, string> = {
  hermes: `{%- for tc in message.tool_calls %}{% set f = tc.function %}
{%- if not loop.first %}{{ '\\n' }}{% endif %}<tool_call>
{"name": "{{ f.name }}", "arguments": {% if f.arguments is string %}{{ f.arguments }}{% else %}{{ f.arguments | tojson }}{% endif %}}
</tool_call>{% endfor %}`,
  glm: `{%- for tc in message.tool_calls %}{% set f = tc.function %}
<tool_call>{{ f.name }}
{% for k, v in f.arguments.items() %}<arg_key>{{ k }}</arg_key>
<arg_value>{{ v if v is string else v | tojson(ensure_ascii=False) }}</arg_value>
{% endfor %}</tool_call>{% endfor %}`,
  "qwen3-coder": `{%- for tc in message.tool_calls %}{% set f = tc.function %}
{%- if not loop.first %}{{ '\\n' }}{% endif %}<tool_call>
<function={{ f.name }}>
{% for k, v in f.arguments|items %}<parameter={{ k }}>
{{ v | tojson | safe if v is mapping or (v is sequence and v is not string) else v | string }}
</parameter>
{% endfor %}</function>
</tool_call>{% endfor %}`,
  "kimi-k2": `<|tool_calls_section_begin|>{%- for tc in message.tool_calls -%}
<|tool_call_begin|>{{ tc.id }}<|tool_call_argument_begin|>{{ tc.function.arguments }}<|tool_call_end|>
{%- endfor -%}<|tool_calls_section_end|>`,
  "deepseek-v3":
    `{%- for tc in message.tool_calls %}{% if loop.first %}<｜tool▁calls▁begin｜>{% else %}{{ '\\n' }}{% endif %}
{{- '<｜tool▁call▁begin｜>' + tc.type + '<｜tool▁sep｜>' + tc.function.name + '\\n' + '\`\`\`json' + '\\n' + tc.function.arguments + '\\n' + '\`\`\`' + '<｜tool▁call▁end｜>' }}
{%- endfor %}<｜tool▁calls▁end｜>`,
  "deepseek-v3.1": `<｜tool▁calls▁begin｜>{% for tc in message.tool_calls %}
{{- '<｜tool▁call▁begin｜>' + tc.function.name + '<｜tool▁sep｜>' + tc.function.arguments + '<｜tool▁call▁end｜>' }}
{%- endfor %}<｜tool▁calls▁end｜>`,
  "deepseek-v3.2": `<｜DSML｜function_calls>
{% for tc in message.tool_calls %}<｜DSML｜invoke name="{{ tc.function.name }}">
{% for k, v in tc.function.arguments.items() %}<｜DSML｜parameter name="{{ k }}" string="{{ 'true' if v is string else 'false' }}">{{ v if v is string else v | tojson }}</｜DSML｜parameter>
{% endfor %}</｜DSML｜invoke>
{% endfor %}</｜DSML｜function_calls>`,
  "deepseek-v4": `<｜DSML｜tool_calls>
{% for tc in message.tool_calls %}<｜DSML｜invoke name="{{ tc.function.name }}">
{% for k, v in tc.function.arguments.items() %}<｜DSML｜parameter name="{{ k }}" string="{{ 'true' if v is string else 'false' }}">{{ v if v is string else v | tojson }}</｜DSML｜parameter>
{% endfor %}</｜DSML｜invoke>
{% endfor %}</｜DSML｜tool_calls>`,
  minimax: `<minimax:tool_call>
{% for tc in message.tool_calls %}<invoke name="{{ tc.function.name }}">
{% for k, v in tc.function.arguments.items() %}<parameter name="{{ k }}">{{ v if v is string else v | tojson }}</parameter>
{% endfor %}</invoke>
{% endfor %}</minimax:tool_call>`,
  harmony: `{%- for tc in message.tool_calls %}{% if not loop.first %}<|start|>assistant{% endif %}
{{- ' to=functions.' + tc.function.name + '<|channel|>commentary json<|message|>' + tc.function.arguments + '<|call|>' }}{% endfor %}`,
};

/** The assistant turn as the template writes it (what a model trained on it outputs). */
function written(format: ToolCallFormat, template: string): string {
  const tool_calls = CALLS.map((c, i) => ({
    id: `functions.${c.name}:${i}`,
    type: "function",
    function: {
      name: c.name,
      arguments: format.argumentsAs === "string" ? JSON.stringify(c.args) : c.args,
    },
  }));
  return new Template(template).render({ message: { role: "assistant", tool_calls } });
}

Deno.test("each format reads back the calls its template writes, and is detected from it", () => {
  assert.deepEqual(Object.keys(EXCERPTS).sort(), TOOL_CALL_FORMATS.map((f) => f.name).sort());
  for (const format of TOOL_CALL_FORMATS) {
    const template = EXCERPTS[format.name];
    assert.equal(detectToolFormat(template)?.name, format.name, `${format.name}: detection`);
    const text = written(format, template);
    const opened = format.opens.some((o) => text.trimStart().startsWith(o));
    // Harmony's first call starts with the recipient, before the channel.
    if (format.name !== "harmony") assert.ok(opened, `${format.name}: ${text.slice(0, 40)}`);
    const calls = format.parse(text.trim(), TOOLS);
    assert.ok(calls, `${format.name} did not parse:\n${text}`);
    assert.deepEqual(
      calls.map((c) => ({ name: c.name, args: JSON.parse(c.arguments) })),
      CALLS,
      format.name,
    );
    for (const c of calls) assert.ok(c.id.length > 0);
  }
});

Deno.test("the streamed splitter gives the same text and calls as the whole output", () => {
  for (const format of TOOL_CALL_FORMATS) {
    if (format.name === "harmony") continue;
    const out = `Let me check.\n${written(format, EXCERPTS[format.name])}`;
    for (const step of [1, 3, 7, 1000]) {
      const s = outputSplitter({
        format,
        tools: TOOLS,
        thinkTags: true,
        startsInReasoning: false,
        harmony: false,
      });
      let content = "";
      for (let i = 0; i < out.length; i += step) content += s.push(out.slice(i, i + step)).content;
      const end = s.end();
      content += end.delta.content;
      assert.equal(content, "Let me check.\n", `${format.name} step ${step}`);
      assert.deepEqual(end.toolCalls.map((c) => c.name), ["get_weather", "search"]);
    }
  }
});

/** Malformed outputs per format: each must come back as the text it was, with no calls. */
const MALFORMED: Record<string, string[]> = {
  hermes: [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"\n</tool_call>',
    '<tool_call>\n{"name": "no_such_tool", "arguments": {}}\n</tool_call>',
    '<tool_call>\n{"arguments": {}}\n</tool_call>',
    '<tool_call>\n{"name": "search", "arguments": [1]}\n</tool_call> trailing words',
  ],
  glm: [
    "<tool_call>get_weather<arg_key>city</arg_key>Paris</tool_call>",
    "<tool_call>nope<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>",
  ],
  "qwen3-coder": [
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</tool_call>",
    "<tool_call>\n<function=nope>\n</function>\n</tool_call>",
  ],
  "kimi-k2": [
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0{}<|tool_call_end|>",
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0" +
    '<|tool_call_argument_begin|>{"city": }<|tool_call_end|><|tool_calls_section_end|>',
  ],
  "deepseek-v3": [
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n{}<｜tool▁call▁end｜>",
  ],
  "deepseek-v3.1": ["<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather{}<｜tool▁calls▁end｜>"],
  "deepseek-v3.2": [
    '<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="days" ' +
    'string="false">three</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>',
  ],
  "deepseek-v4": [
    '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="days" ' +
    'string="false">three</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>',
  ],
  minimax: ['<minimax:tool_call>\n<invoke name="get_weather">\n<parameter city>x</parameter>'],
  harmony: ["<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{oops"],
};

Deno.test("malformed calls come back as text, with no calls and no exception", () => {
  for (const format of TOOL_CALL_FORMATS) {
    for (const bad of MALFORMED[format.name]) {
      assert.equal(format.parse(bad, TOOLS), null, `${format.name}: ${bad}`);
      const s = outputSplitter({
        format,
        tools: TOOLS,
        thinkTags: false,
        startsInReasoning: false,
        harmony: format.name === "harmony",
      });
      const content = s.push(`ok ${bad}`).content;
      const end = s.end();
      assert.equal(end.toolCalls.length, 0, `${format.name}: ${bad}`);
      assert.equal(content + end.delta.content, `ok ${bad}`, format.name);
    }
  }
});

Deno.test("hand-written outputs: GLM spacing, Kimi ids, V3.1 without fences, string coercion", () => {
  const glm = TOOL_CALL_FORMATS.find((f) => f.name === "glm")!;
  const g = glm.parse(
    "<tool_call>get_weather <arg_key>city</arg_key> <arg_value>Oslo</arg_value> " +
      "<arg_key>days</arg_key><arg_value>2</arg_value> </tool_call>",
    TOOLS,
  );
  assert.deepEqual(g?.map((c) => JSON.parse(c.arguments)), [{ city: "Oslo", days: 2 }]);
  const kimi = TOOL_CALL_FORMATS.find((f) => f.name === "kimi-k2")!;
  const k = kimi.parse(
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.search:7<|tool_call_argument_begin|>" +
      '{"query": "q"}<|tool_call_end|><|tool_calls_section_end|>',
    TOOLS,
  );
  assert.equal(k?.[0].id, "functions.search:7");
  const minimax = TOOL_CALL_FORMATS.find((f) => f.name === "minimax")!;
  // A string-typed parameter keeps digits as text; an untyped unparsable one stays text too.
  const m = minimax.parse(
    '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">1984</parameter>\n' +
      '<parameter name="days">5</parameter>\n</invoke>\n</minimax:tool_call>',
    TOOLS,
  );
  assert.deepEqual(JSON.parse(m![0].arguments), { city: "1984", days: 5 });
  // The model stopped at its end-of-turn token before the closing tag.
  const hermes = TOOL_CALL_FORMATS.find((f) => f.name === "hermes")!;
  const h = hermes.parse('<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n', TOOLS);
  assert.equal(h?.[0].name, "search");
});

Deno.test("reasoning: <think> split off, whether the prompt opened it or the model did", () => {
  for (const startsInReasoning of [true, false]) {
    const out = `${startsInReasoning ? "" : "<think>"}Weighing it.</think>\n\nAnswer.`;
    for (const step of [1, 2, 5, 100]) {
      const s = outputSplitter({
        format: null,
        tools: [],
        thinkTags: true,
        startsInReasoning,
        harmony: false,
      });
      let content = "", reasoning = "";
      for (let i = 0; i < out.length; i += step) {
        const d = s.push(out.slice(i, i + step));
        content += d.content;
        reasoning += d.reasoning;
      }
      const end = s.end();
      assert.equal(content + end.delta.content, "Answer.");
      assert.equal(reasoning + end.delta.reasoning, "Weighing it.");
    }
  }
});

Deno.test("harmony: analysis is reasoning, final is content, a commentary call is a call", () => {
  const harmony = TOOL_CALL_FORMATS.find((f) => f.name === "harmony")!;
  const outputs = [
    "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hi!",
    "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary " +
    'to=functions.get_weather <|constrain|>json<|message|>{"city": "Rome"}<|call|>',
  ];
  const expected = [
    { reasoning: "Think.", content: "Hi!", calls: [] as string[] },
    { reasoning: "Need weather.", content: "", calls: ['{"city":"Rome"}'] },
  ];
  for (let k = 0; k < outputs.length; k++) {
    for (const step of [1, 4, 1000]) {
      const s = outputSplitter({
        format: harmony,
        tools: TOOLS,
        thinkTags: false,
        startsInReasoning: false,
        harmony: true,
      });
      let content = "", reasoning = "";
      for (let i = 0; i < outputs[k].length; i += step) {
        const d = s.push(outputs[k].slice(i, i + step));
        content += d.content;
        reasoning += d.reasoning;
      }
      const end = s.end();
      assert.deepEqual({
        reasoning: reasoning + end.delta.reasoning,
        content: content + end.delta.content,
        calls: end.toolCalls.map((c) => c.arguments),
      }, expected[k]);
    }
  }
});
