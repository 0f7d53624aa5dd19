/**
 * The fuzz target of the server's request bodies (OpenAI and Anthropic endpoints): the demo model served
 * on 127.0.0.1 as `mod.ts serve` serves it (the front, and the engine in its worker:
 * tools/serve/front.ts), and each input posted to one of its POST endpoints. An input is
 * `<path>\n<body>`; the structure-aware mutation keeps the path and rewrites the body as JSON
 * (wrong types, extreme numbers, missing or unknown fields, deep nesting) or as bytes (malformed
 * JSON). A 2xx answer is an accepted input and a 4xx one with an OpenAI error message a clean
 * rejection (its message goes through the fuzzer's "unhelpful" check); a 5xx, an error body
 * without a message, an error event inside a stream, or a hung request is a finding.
 *
 * Two more targets reach what a request renders and what a chat keeps: the chat template (the
 * input is the container's chat_template.jinja, rendered by a chat request; a template error must
 * name the template, and a loop must be stopped by the render budget) and saved session files
 * (loaded as `/load` does, the CRC fixed up after each mutation so the header and the bounds
 * behind it are reached).
 *
 * @module
 */
import { cpSync } from "node:fs";
import { join } from "node:path";
import { CHAT_LIMITS, checkChatMessages } from "../../../engine/chat.ts";
import { crc32 } from "../../../io/crc32.ts";
import { loadSession, saveSession } from "../../../engine/session_state.ts";
import { Session } from "../../../engine/session.ts";
import { demoModelPath } from "../../demo_model.ts";
import { startControlledServer } from "../serve_control.ts";
import { HOSTILE_NUMBERS, mutate, type Rng } from "./mutate.ts";
import type { FuzzTarget } from "./targets.ts";

/** A server answer that no request may get: a 5xx or a malformed error (a finding). */
export class ServerFault extends Error {}

const enc = new TextEncoder();
const dec = new TextDecoder();

/** Request bodies of every POST endpoint, with every field the server reads. */
const SEEDS: [string, unknown][] = [
  ["/v1/chat/completions", {
    messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Hi there" }],
    max_tokens: 3,
    temperature: 0.7,
    top_p: 0.9,
    top_k: 40,
    min_p: 0.05,
    seed: 7,
    stop: ["\n", "END"],
    frequency_penalty: 0.5,
    presence_penalty: 0.1,
    repetition_penalty: 1.1,
  }],
  ["/v1/chat/completions", {
    model: "MODEL", // the served model's id
    messages: [{ role: "user", content: [{ type: "text", text: "Tell me" }] }],
    max_completion_tokens: 2,
    stream: true,
    stream_options: { include_usage: true },
    n: 1,
    logprobs: false,
    response_format: { type: "text" },
    ignore_eos: true,
  }],
  ["/v1/chat/completions", {
    messages: [
      { role: "user", content: "Weather?" },
      {
        role: "assistant",
        content: null,
        tool_calls: [{ id: "c1", type: "function", function: { name: "w", arguments: "{}" } }],
      },
      { role: "tool", tool_call_id: "c1", content: "sunny" },
    ],
    tools: [{
      type: "function",
      function: {
        name: "w",
        parameters: { type: "object", properties: { c: { type: "string", maxLength: 4 } } },
      },
    }],
    tool_choice: "required",
    parallel_tool_calls: false,
    logprobs: true,
    top_logprobs: 2,
    max_tokens: 3,
    chat_template_kwargs: { enable_thinking: false },
    reasoning_effort: "low",
  }],
  ["/v1/chat/completions", {
    messages: [{ role: "user", content: "JSON please" }],
    response_format: {
      type: "json_schema",
      json_schema: {
        name: "r",
        strict: true,
        schema: { type: "object", properties: { a: { enum: [1, 2] } }, required: ["a"] },
      },
    },
    max_tokens: 8,
    stream: true,
  }],
  ["/v1/messages", {
    model: "any",
    max_tokens: 3,
    system: "Be brief.",
    stop_sequences: ["x"],
    thinking: { type: "enabled", budget_tokens: 10 },
    messages: [
      { role: "user", content: "Weather?" },
      { role: "assistant", content: [{ type: "tool_use", id: "t1", name: "w", input: {} }] },
      { role: "user", content: [{ type: "tool_result", tool_use_id: "t1", content: "sunny" }] },
    ],
    tools: [{ name: "w", input_schema: { type: "object", properties: {} } }],
    tool_choice: { type: "auto" },
    stream: true,
  }],
  ["/v1/messages/count_tokens", {
    model: "any",
    messages: [{ role: "user", content: [{ type: "text", text: "hi" }] }],
  }],
  ["/v1/completions", {
    prompt: "Once upon a time",
    max_tokens: 3,
    temperature: 0,
    echo: false,
    n: 2,
    logprobs: 1,
  }],
  ["/v1/completions", { prompt: [1, 2, 3], max_tokens: 2, stream: true, stop: "x", tools: [] }],
  // What a long-running chat session sends: many turns, tool turns, extra fields, an empty turn.
  ["/v1/chat/completions", {
    messages: [
      { role: "system", content: "You are terse." },
      ...Array.from({ length: 12 }, (_, i) => ({
        role: i % 2 ? "assistant" : "user",
        content: `turn ${i}`,
      })),
      { role: "assistant", content: "", tool_calls: [{ id: "c1", type: "function" }] },
      { role: "tool", content: "42", tool_call_id: "c1", name: "calc" },
      { role: "user", content: "" },
    ],
    max_tokens: 1,
  }],
  ["/tokenize", { content: "Hello world", add_special: false }],
  ["/detokenize", { tokens: [1, 2, 3] }],
];

/** Field names set (added or overwritten) anywhere in a body. */
const FIELDS = [
  "max_tokens",
  "stream",
  "seed",
  "prompt",
  "messages",
  "content",
  "role",
  "name",
  "tool_calls",
  "type",
  "text",
  "tokens",
  "tools",
  "tool_choice",
  "response_format",
  "json_schema",
  "schema",
  "parameters",
  "arguments",
  "input_schema",
  "input",
  "system",
  "thinking",
  "n",
  "logprobs",
];

/** Values of every JSON type, and the extremes, that a field may be swapped for. */
const HOSTILE_VALUES: readonly unknown[] = [
  null,
  "assistant",
  "tool",
  "system",
  "user",
  "text",
  [{ role: "assistant", content: null, tool_calls: [{ id: 1 }] }],
  [{ role: "user" }],
  [{ role: "system", content: "" }, { role: "system", content: "x" }],
  true,
  "",
  "x".repeat(300),
  "\u0000\ud800",
  [],
  [null],
  {},
  { role: 1 },
  [{ type: "image_url" }],
  ...HOSTILE_NUMBERS.flatMap((s) => {
    try {
      return [JSON.parse(s)];
    } catch {
      return [];
    }
  }),
  -1e308,
  Number.MAX_SAFE_INTEGER,
  2 ** 53 + 2,
  1e21,
  0.1,
  -0.5,
];

/** A fresh copy of one hostile value (mutations change values in place). */
function hostile(rng: Rng): unknown {
  return structuredClone(rng.pick(HOSTILE_VALUES));
}

function splitInput(input: Uint8Array): { path: string; body: Uint8Array } {
  const nl = input.indexOf(10);
  if (nl < 0) return { path: "/v1/completions", body: input };
  return { path: dec.decode(input.subarray(0, nl)), body: input.subarray(nl + 1) };
}

/** Spots in a JSON value (holder and key): anywhere in it, or only the top level. */
function anyPlace(rng: Rng, root: unknown): { holder: Record<string, unknown>; key: string }[] {
  const out: { holder: Record<string, unknown>; key: string }[] = [];
  const walk = (v: unknown, depth: number) => {
    if (depth > 8 || typeof v !== "object" || v === null) return;
    for (const k of Object.keys(v)) {
      out.push({ holder: v as Record<string, unknown>, key: k });
      walk((v as Record<string, unknown>)[k], depth + 1);
    }
  };
  walk(root, 0);
  return rng.below(2) ? out : out.filter((p) => p.holder === root);
}

/** One structure-aware change to a request body (a parsed JSON value, changed in place). */
function mutateBody(rng: Rng, body: unknown): unknown {
  if (typeof body !== "object" || body === null) return hostile(rng);
  const places = anyPlace(rng, body);
  if (places.length === 0) return body;
  const { holder, key } = rng.pick(places);
  switch (rng.below(6)) {
    case 0:
      delete holder[key];
      break;
    case 1:
      holder[rng.pick(FIELDS)] = hostile(rng);
      break;
    case 2: {
      // Deep nesting where a value was.
      let v: unknown = holder[key];
      for (let i = rng.below(3000); i > 0; i--) v = [v];
      holder[key] = v;
      break;
    }
    case 3:
      holder[key] = Array.from({ length: 1 + rng.below(40) }, () => holder[key]);
      break;
    default:
      holder[key] = hostile(rng);
  }
  return body;
}

/** Reads a whole answer and classifies it (see the module doc). */
async function outcome(r: Response, path: string): Promise<void> {
  const text = await r.text();
  if (r.status >= 200 && r.status < 300) {
    if (!(r.headers.get("content-type") ?? "").startsWith("text/event-stream")) return;
    for (const line of text.split("\n")) {
      if (!line.startsWith("data: {")) continue;
      const event = JSON.parse(line.slice(6));
      if (event.error) throw new ServerFault(`${path}: error inside a stream: ${line}`);
    }
    // OpenAI streams end with [DONE], Anthropic's with message_stop.
    if (!text.includes("data: [DONE]") && !text.includes("event: message_stop")) {
      throw new ServerFault(`${path}: a stream without its end`);
    }
    return;
  }
  let message: unknown;
  try {
    message = JSON.parse(text)?.error?.message;
  } catch {
    message = undefined;
  }
  if (r.status >= 500 || typeof message !== "string" || message === "") {
    throw new ServerFault(`${path}: HTTP ${r.status}: ${text.slice(0, 300)}`);
  }
  throw new Error(`HTTP ${r.status}: ${message}`);
}

/** Posts `body` to `url` and reads the answer, failing on an HTTP error. */
async function warmUp(url: string, body: unknown): Promise<void> {
  const r = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  if (!r.ok) throw new Error(`fuzz serve: warming up ${url}: HTTP ${r.status} ${await r.text()}`);
  await r.body?.cancel();
}

/** The server target: starts the demo model's worker server (closed by `close`). */
export async function serveTarget(): Promise<FuzzTarget> {
  const controlled = await startControlledServer(
    { path: await demoModelPath(true), options: { quiet: true, ctx: 64, threads: 1 } },
    { port: 0, log: () => {}, maxBodyBytes: 1 << 20 },
  );
  const { server } = controlled;
  // The first render starts the template worker (type-checked first under `deno test`), and the
  // first structured-output request loads the grammar engine and indexes the vocabulary: one-off
  // costs of no one input, not hangs.
  await warmUp(`${server.url}/v1/chat/completions`, {
    messages: [{ role: "user", content: "warm up" }],
    max_tokens: 1,
    response_format: { type: "json_object" },
  });
  const id = (await (await fetch(`${server.url}/v1/models`)).json()).data[0].id as string;
  const seeds = SEEDS.map(([path, body]) =>
    enc.encode(`${path}\n${JSON.stringify(body).replace('"MODEL"', JSON.stringify(id))}`)
  );
  return {
    name: "serve request body",
    seeds,
    async run(input) {
      const { path, body } = splitInput(input);
      const r = await fetch(`${server.url}${path}`, {
        method: "POST",
        body: body.slice(),
        headers: { "content-type": "application/json" },
        signal: AbortSignal.timeout(10_000),
      });
      await outcome(r, path);
    },
    mutate(rng, s) {
      const { path, body } = splitInput(rng.pick(s));
      let out = mutate(rng, [body]);
      if (rng.below(4) !== 0) {
        let v: unknown = JSON.parse(dec.decode(body));
        for (let n = 1 + rng.below(3); n > 0; n--) v = mutateBody(rng, v);
        try {
          out = enc.encode(JSON.stringify(v));
        } catch {
          // Nested past JSON.stringify's stack: the byte mutation stands.
        }
      }
      const head = enc.encode(`${path}\n`);
      const joined = new Uint8Array(head.length + out.length);
      joined.set(head);
      joined.set(out, head.length);
      return joined;
    },
    close: () => controlled.close(),
  };
}

/** Chat templates: the demo model's own and the hostile shapes the render budget must stop. */
const TEMPLATE_SEEDS = [
  "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}" +
  "{% if add_generation_prompt %}<|assistant|>{% endif %}",
  "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }} [/INST]" +
  "{% else %}{{ m.content }}{{ eos_token }}{% endif %}{% endfor %}",
  "{% set ns = namespace(x='a') %}{% for i in range(40) %}{% set ns.x = ns.x ~ ns.x %}" +
  "{% endfor %}{{ ns.x }}",
  "{% for i in range(10**9) %}x{% endfor %}",
  "{% for a in range(100000) %}{% for b in range(100) %}{{ b }}{% endfor %}{% endfor %}",
  "{{ raise_exception('roles must alternate') }}",
  "{{ messages[0].nope.deeper() }}{% for %}",
];

/**
 * The chat template target: the demo container copied to `work` and served as `mod.ts serve`
 * serves it, each input written as a chat_template.jinja that the engine takes (as
 * `--chat-template FILE` does) before a chat request renders it.
 */
export async function serveTemplateTarget(work: string): Promise<FuzzTarget> {
  const dir = join(work, "template.sluice");
  cpSync(await demoModelPath(true), dir, { recursive: true });
  const file = join(dir, "chat_template.jinja");
  const controlled = await startControlledServer(
    { path: dir, options: { quiet: true, ctx: 256, threads: 1 } },
    { port: 0, log: () => {}, maxBodyBytes: 1 << 20 },
  );
  const { server } = controlled;
  const body = JSON.stringify({
    messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Hi" }],
    max_tokens: 1,
  });
  return {
    name: "serve chat template",
    seeds: TEMPLATE_SEEDS.map((t) => enc.encode(t)),
    // A template that loops runs until the render budget stops it.
    hangMs: CHAT_LIMITS.timeMs + 3000,
    async run(input) {
      Deno.writeFileSync(file, input);
      try {
        await controlled.useChatTemplate(file);
      } catch (e) {
        // A template the engine refuses to take must name it too.
        const m = (e as Error).message;
        if (!m.includes("chat_template.jinja")) {
          throw new ServerFault(`a template error that does not name the template: ${m}`);
        }
        throw e;
      }
      const r = await fetch(`${server.url}/v1/chat/completions`, {
        method: "POST",
        body,
        headers: { "content-type": "application/json" },
        signal: AbortSignal.timeout(CHAT_LIMITS.timeMs + 10_000),
      });
      try {
        await outcome(r, "/v1/chat/completions");
      } catch (e) {
        // Every template failure names the template; a prompt too long for the context is fine.
        const m = (e as Error).message;
        if (
          !(e instanceof ServerFault) && !m.includes("chat_template.jinja") &&
          !/context holds|cannot fit|chat template rendered an empty prompt/.test(m)
        ) {
          throw new ServerFault(`a template error that does not name the template: ${m}`);
        }
        throw e;
      }
    },
    close: () => controlled.close(),
  };
}

/** Rewrites the CRC-32 at the end of a session file's bytes to match the rest. */
function fixCrc(bytes: Uint8Array): Uint8Array {
  if (bytes.length < 4) return bytes;
  const out = bytes.slice();
  new DataView(out.buffer).setUint32(out.length - 4, crc32(out.subarray(0, out.length - 4)), true);
  return out;
}

/** The session file target: mutated saves of the demo model, loaded as chat's `/load` does. */
export async function sessionFileTarget(work: string): Promise<FuzzTarget> {
  const session = await Session.open(await demoModelPath(true), {
    quiet: true,
    ctx: 64,
    threads: 1,
  });
  const seeds: Uint8Array[] = [];
  for (const [i, prompt] of ["Hello", "Once upon a time there was"].entries()) {
    session.resetCache();
    for await (const _ of session.generate(prompt, { maxTokens: 2, ignoreEos: true })) {
      // Fills the prompt cache the save writes.
    }
    const path = join(work, `seed-${i}.session`);
    saveSession(session, path, {
      kind: "sluice-chat",
      system: null,
      messages: [{ role: "user", content: prompt }, { role: "assistant", content: "x" }],
      turn: 1,
      sampling: { seed: 3 },
    }, true);
    seeds.push(Deno.readFileSync(path));
  }
  const file = join(work, "input.session");
  return {
    name: "session file",
    seeds,
    run(input) {
      Deno.writeFileSync(file, input);
      const app = loadSession(session, file).app as { messages?: unknown } | null;
      if (app && typeof app === "object" && "messages" in app) {
        checkChatMessages(app.messages, session.model.maxContext, `${file}: the conversation`);
      }
    },
    mutate(rng, s) {
      const seed = rng.pick(s);
      if (rng.below(2)) return fixCrc(mutate(rng, [seed]));
      // Structure-aware: one header field swapped for a hostile value, the CRC fixed.
      const view = new DataView(seed.buffer, seed.byteOffset, seed.byteLength);
      const hLen = view.getUint32(16, true);
      const header = JSON.parse(dec.decode(seed.subarray(20, 20 + hLen)));
      const places = anyPlace(rng, header);
      if (places.length) {
        const { holder, key } = rng.pick(places);
        holder[key] = rng.below(3) ? hostile(rng) : rng.pick([[1e9], [-1], [0.5], 2 ** 40, []]);
      }
      const json = enc.encode(JSON.stringify(header));
      const out = new Uint8Array(20 + json.length + seed.length - 20 - hLen);
      out.set(seed.subarray(0, 16));
      new DataView(out.buffer).setUint32(16, json.length, true);
      out.set(json, 20);
      out.set(seed.subarray(20 + hLen), 20 + json.length);
      return fixCrc(out);
    },
    close() {
      session.close();
      return Promise.resolve();
    },
  };
}
