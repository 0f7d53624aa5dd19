/**
 * The quick CI pass of `deno task fuzz` (the full run feeds 100k inputs per parser), and the
 * regression tests of what the fuzzer found: a tokenizer id of 2^31 that took minutes and
 * gigabytes inside the tokenizer library, a long short-option group that overflowed parseArgs'
 * stack, messages that said "undefined" for a missing field, and server request fields quoted as
 * "[object Object]" or, nested deep, overflowing the stack into a 500.
 */
import assert from "node:assert/strict";
import { normalizeConfig } from "../engine/config.ts";
import { loadTokenizer } from "../engine/tokenizer.ts";
import { readSafetensorsHeader } from "../io/safetensors.ts";
import { parseGenerateArgs } from "../tools/cli/generate.ts";
import { ApiError, parseCompletion } from "../tools/serve/openai.ts";
import { fuzzTarget, isCleanRejection } from "../tools/dev/fuzz.ts";
import { makeTargets } from "../tools/dev/fuzz/targets.ts";
import { fixtureDir, HAVE_FIXTURES } from "./fixtures.ts";

Deno.test("fuzz (quick pass): every parser rejects mutated input cleanly, fast, without leaks", async () => {
  const work = Deno.makeTempDirSync({ prefix: "sluice-fuzz-test-" });
  const { targets, skipped } = await makeTargets(work, HAVE_FIXTURES ? fixtureDir("") : null);
  try {
    if (skipped.length) console.warn(`fuzz: skipped without ../shared: ${skipped.join(", ")}`);
    for (const t of targets) {
      const count = t.name === "tokenizer files"
        ? 300
        : t.name === "serve request body"
        ? 400
        : t.name === "serve chat template"
        ? 150
        : t.name === "session file"
        ? 500
        : 1500;
      const r = await fuzzTarget(t, count, 12345);
      assert.equal(r.inputs, count);
      assert.ok(r.rejected > 0, `${t.name}: mutations must be rejected sometimes`);
      assert.deepEqual(
        r.findings.map((f) => `${f.kind}: ${f.message.slice(0, 200)}`),
        [],
        t.name,
      );
    }
  } finally {
    for (const t of targets) await t.close?.();
    Deno.removeSync(work, { recursive: true });
  }
});

Deno.test("fuzz classification: TypeErrors are crashes, plain Errors are rejections", () => {
  assert.ok(isCleanRejection(new Error("x")));
  assert.ok(isCleanRejection(new Deno.errors.NotFound("x")));
  assert.ok(!isCleanRejection(new TypeError("Cannot read properties of undefined")));
  assert.ok(!isCleanRejection(new RangeError("Maximum call stack size exceeded")));
  assert.ok(!isCleanRejection("a string"));
});

Deno.test({
  name: "regression: a tokenizer.json id of 2^31 or a 200 KB normalizer text is refused at once",
  ignore: !HAVE_FIXTURES,
  fn: async () => {
    const dir = Deno.makeTempDirSync();
    try {
      const json = JSON.parse(Deno.readTextFileSync(fixtureDir("stories260k/tokenizer.json")));
      json.model.vocab["<0x1E>"] = 2147483648;
      Deno.writeTextFileSync(`${dir}/tokenizer.json`, JSON.stringify(json));
      // The id is named, so it was refused before a table that long was built (that would
      // throw a RangeError or run out of memory instead).
      await assert.rejects(
        loadTokenizer(dir),
        /tokenizer\.json: vocabulary token "<0x1E>" has id 2147483648/,
      );
      json.model.vocab["<0x1E>"] = 33;
      json.added_tokens = [{ id: -4, content: "<x>" }];
      Deno.writeTextFileSync(`${dir}/tokenizer.json`, JSON.stringify(json));
      await assert.rejects(loadTokenizer(dir), /added token 0 has id -4/);
      json.added_tokens = [];
      const normalizer = json.normalizer;
      json.normalizer = {
        type: "Sequence",
        normalizers: [{ type: "Replace", pattern: { String: " " }, content: "[".repeat(200000) }],
      };
      Deno.writeTextFileSync(`${dir}/tokenizer.json`, JSON.stringify(json));
      await assert.rejects(
        loadTokenizer(dir),
        /normalizer\.normalizers\[0\]\.content inserts 200000/,
      );
      json.normalizer = normalizer;
      json.decoder = { type: "Nope" };
      Deno.writeTextFileSync(`${dir}/tokenizer.json`, JSON.stringify(json));
      await assert.rejects(loadTokenizer(dir), (e: Error) => {
        assert.match(e.message, /tokenizer\.json: not a tokenizer this engine can load/);
        return true;
      });
    } finally {
      Deno.removeSync(dir, { recursive: true });
    }
  },
});

Deno.test("regression: a long short-option group is a clean error, not a stack overflow", () => {
  assert.throws(
    () => parseGenerateArgs(["--verify", "-" + "[".repeat(100000)]),
    (e: Error) => e.constructor === Error && /unknown option "-\[\[/.test(e.message),
  );
  assert.throws(
    () => parseGenerateArgs(["--crc-sample", "-1e" + '{"a":'.repeat(100000)]),
    (e: Error) => isCleanRejection(e),
  );
  assert.throws(() => parseGenerateArgs(["-n", "-3"]));
  assert.equal(parseGenerateArgs(["-n20"])?.sampling.maxTokens, 20);
  assert.equal(parseGenerateArgs(["-n", "5", "--temperature", "0.5"])?.sampling.maxTokens, 5);
});

Deno.test({
  name: "regression: num_hidden_layers of 2^32 is refused before any per-layer array is built",
  ignore: !HAVE_FIXTURES,
  fn: () => {
    const base = JSON.parse(Deno.readTextFileSync(fixtureDir("tiny-deepseek-v3/config.json")));
    // A plain Error naming the field: an array of 2^32 layers built first would have thrown a
    // RangeError instead.
    for (const n of [2 ** 32, 2 ** 31, 65537]) {
      assert.throws(
        () => normalizeConfig({ ...base, num_hidden_layers: n }),
        (e: Error) =>
          e.constructor === Error &&
          /num_hidden_layers must be an integer in 1\.\.65536/.test(e.message),
      );
    }
    assert.throws(() => normalizeConfig({ architectures: [] }), /model_type \(none\)/);
  },
});

Deno.test("regression: a missing safetensors field is named as missing, not as undefined", () => {
  const dir = Deno.makeTempDirSync();
  try {
    const header = new TextEncoder().encode(
      JSON.stringify({ a: { dtype: "F32", data_offsets: [0, 4] } }),
    );
    const bytes = new Uint8Array(8 + header.length + 4);
    new DataView(bytes.buffer).setBigUint64(0, BigInt(header.length), true);
    bytes.set(header, 8);
    Deno.writeFileSync(`${dir}/m.safetensors`, bytes);
    assert.throws(() => readSafetensorsHeader(`${dir}/m.safetensors`), (e: Error) => {
      assert.match(e.message, /tensor a: shape nothing \(the field is missing\)/);
      assert.doesNotMatch(e.message, /undefined/);
      return true;
    });
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test("regression: serve request fields are quoted by kind, never as [object Object] or a 500", () => {
  const chat = (extra: Record<string, unknown>) => () =>
    parseCompletion({ messages: [{ role: "user", content: "hi" }], ...extra }, true);
  const refuses = (f: () => unknown, status: number, message: string) =>
    assert.throws(f, (e: Error) => {
      assert.ok(e instanceof ApiError, `${e.constructor.name}: ${e.message}`);
      assert.equal(e.status, status);
      assert.equal(e.message, message);
      return true;
    });
  const types = 'response_format.type: expected "text", "json_object" or "json_schema"';
  refuses(chat({ response_format: { type: {} } }), 400, `${types}, got an object`);
  refuses(
    chat({ response_format: "json" }),
    400,
    'response_format: expected an object with a type, got "json"',
  );
  refuses(chat({ response_format: {} }), 400, `${types}, it is missing`);
  // A nesting deep enough to overflow the stack of any recursive quoting (it gave a 500).
  let deep: unknown = 1;
  for (let i = 0; i < 200_000; i++) deep = [deep];
  refuses(chat({ response_format: { type: deep } }), 400, `${types}, got an array`);
  refuses(
    chat({ max_tokens: deep }),
    400,
    `max_tokens: expected a number in [0, ${Number.MAX_SAFE_INTEGER}], got an array`,
  );
  refuses(chat({ stream: { a: 1 } }), 400, "stream: expected true or false, got an object");
  refuses(
    chat({ stream_options: { include_usage: "yes" } }),
    400,
    'stream_options.include_usage: expected true or false, got "yes"',
  );
  refuses(chat({ logprobs: "yes" }), 400, 'logprobs: expected true or false, got "yes"');
  refuses(chat({ n: deep }), 400, "n: expected a whole number in [1, 8], got an array");
  refuses(
    chat({ tools: [{ type: "function", function: { name: "f", parameters: deep } }] }),
    400,
    "tools[0].function.parameters: expected a JSON schema object, got an array",
  );
  refuses(chat({ tools: "all" }), 400, 'tools: expected an array, got "all"');
  refuses(chat({ echo: 1 }), 400, "echo: expected true or false, got 1");
  refuses(
    chat({ temperature: "x".repeat(100) }),
    400,
    `temperature: expected a number in [0, 2], got "${"x".repeat(40)}"…`,
  );
  assert.equal(
    chat({ response_format: { type: "text" }, logprobs: false, tools: [] })().stream,
    false,
  );
});
