/**
 * What a llama.cpp user types from habit: the prompt echoed before its continuation (whose first
 * token keeps its leading space, in the CLI and in /v1/completions), `-ngl`/`-fa` accepted with a
 * note, `-cnv` starting a chat, `-n -1` running to the end of the context, and a typo answered
 * with "did you mean".
 */
import assert from "node:assert/strict";
import { loadTokenizer } from "../engine/tokenizer.ts";
import { Session } from "../engine/session.ts";
import { demoModelPath } from "../tools/demo_model.ts";
import { startServer } from "../tools/serve/server.ts";
import { packedFixture, runSluice } from "./fixtures.ts";
import "./shared_guard.ts";

Deno.test("generate echoes the prompt; prompt and answer read as the whole decode (demo model)", async () => {
  await assertEchoed(await demoModelPath(true), "The dog");
});

Deno.test('generate: after "The dog" the story goes on with " was" (stories260k-moe)', async () => {
  const { plain, run } = await assertEchoed(await packedFixture("stories260k-moe"), "The dog");
  assert.match(plain, /^The dog was /);
  assert.match(run.text, /^ was /);
});

Deno.test({
  name: "/v1/completions continues the prompt with its leading space (stories260k-moe)",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const model = await packedFixture("stories260k-moe");
    const session = await Session.open(model, { quiet: true, ctx: 256 });
    const server = startServer(session, { port: 0, log: () => {} });
    try {
      const r = await fetch(`${server.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ prompt: "The dog", max_tokens: 12, temperature: 0 }),
        signal: AbortSignal.timeout(30_000),
      });
      const text = (await r.json()).choices[0].text;
      const { run } = await bothWays(model, "-p", "The dog", "-n", "12", "--ctx", "256");
      assert.equal(text, run.text);
      assert.equal("The dog" + text, session.detokenize([...run.prompt_ids, ...run.generated_ids]));
      assert.match(text, /^ \S/);
    } finally {
      await server.close();
      session.close();
    }
  },
});

Deno.test("llama.cpp habits: -ngl and -fa are noted and change nothing; -n -1 runs to the context's end", async () => {
  const model = await demoModelPath(true);
  const args = ["-p", "Once", "--ctx", "48", "--ignore-eos"];
  const plain = await runSluice(["generate", "-m", model, "--json", ...args, "-n", "8"]);
  assert.equal(plain.code, 0, plain.stderr);
  for (const gpu of [["-ngl", "99", "-fa"], ["-fa", "on", "--n-gpu-layers=12"], ["-ngl=0"]]) {
    const r = await runSluice(["generate", "-m", model, "--json", ...args, ...gpu, "-n", "8"]);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(JSON.parse(r.stdout).generated_ids, JSON.parse(plain.stdout).generated_ids);
    const notes = r.stderr.split("\n").filter((l) => l.startsWith("note: "));
    assert.equal(notes.length, gpu.filter((g) => /^-(ngl|fa|-n-gpu)/.test(g)).length, r.stderr);
    if (gpu.includes("-fa")) assert.match(r.stderr, /note: -fa ignored: flash attention/);
    assert.match(r.stderr, /note: (-ngl|--n-gpu-layers) ignored: sluice runs on the CPU/);
  }
  const all = await runSluice(["generate", "-m", model, "--json", ...args, "-n", "-1"]);
  assert.equal(all.code, 0, all.stderr);
  const run = JSON.parse(all.stdout);
  assert.equal(run.prompt_ids.length + run.generated_ids.length, 48);
});

Deno.test('llama.cpp habits: -cnv starts a chat; typos get "did you mean"', async () => {
  const model = await demoModelPath(true);
  const chat = await runSluice(
    ["generate", "-m", model, "-cnv", "-n", "5", "-sys", "Be brief."],
    "hello\n/stats\n/exit\n",
  );
  assert.equal(chat.code, 0, chat.stderr);
  assert.match(chat.stderr, /\[\d+ tokens, .* tok\/s; prompt \d+/);
  assert.match(chat.stderr, /context +\d+\/\d+ tokens cached, 1 turn/);
  const cases: [string[], RegExp][] = [
    [
      ["generate", "--temprature", "0.5"],
      /unknown option "--temprature" \(did you mean --temperature\?\)/,
    ],
    [["generate", "-tmp", "0.5"], /unknown option "-tmp" .*did you mean --temp\?/],
    [["chat", "--max-token", "5"], /unknown option "--max-token" \(did you mean --max-tokens\?\)/],
    [["genrate", "-p", "x"], /unknown command "genrate" \(did you mean generate\?\)/],
    [["generate", "--no-display-promt"], /did you mean --no-display-prompt\?/],
  ];
  for (const [args, want] of cases) {
    const r = await runSluice(args);
    assert.notEqual(r.code, 0, args.join(" "));
    assert.match(r.stderr, want);
    assert.doesNotMatch(r.stderr, /\n\s+at /, "one line, no stack frames");
  }
});

/** `generate --json` and the plain run of the same arguments. */
async function bothWays(model: string, ...args: string[]) {
  const base = ["generate", "--model", model, "--quiet", ...args];
  const json = await runSluice([...base, "--json"]);
  assert.equal(json.code, 0, json.stderr);
  const plain = await runSluice(base);
  assert.equal(plain.code, 0, plain.stderr);
  return { run: JSON.parse(json.stdout), plain: plain.stdout };
}

/** The echoed prompt and the answer read as the decode of the whole sequence. */
async function assertEchoed(model: string, prompt: string) {
  const { run, plain } = await bothWays(model, "-p", prompt, "-n", "12");
  const tok = await loadTokenizer(model);
  const whole = tok.decode([...run.prompt_ids, ...run.generated_ids], { skipSpecial: true });
  assert.equal(plain, whole + "\n");
  assert.ok(plain.startsWith(prompt), plain);
  const bare = await runSluice([
    ...["generate", "--model", model, "--quiet", "-p", prompt, "-n", "12"],
    "--no-display-prompt",
  ]);
  assert.equal(bare.stdout, run.text + "\n");
  return { run, plain };
}

Deno.test("--chat-template FILE renders generate --chat and chat; a bad one is named", async () => {
  const model = await demoModelPath(true);
  const dir = Deno.makeTempDirSync({ prefix: "sluice-template-" });
  try {
    const file = `${dir}/turns.jinja`;
    Deno.writeTextFileSync(
      file,
      "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}",
    );
    const r = await runSluice([
      ...["generate", "-m", model, "--chat", "-p", "hi", "-n", "1", "--json"],
      ...["--chat-template", file],
    ]);
    assert.equal(r.code, 0, r.stderr);
    const tok = await loadTokenizer(model);
    assert.deepEqual(
      JSON.parse(r.stdout).prompt_ids,
      tok.encode("<user>hi", { addSpecial: false }),
    );
    const chat = await runSluice(["chat", "-m", model, "-n", "2", "--chat-template", file], "hi\n");
    assert.equal(chat.code, 0, chat.stderr);
    const bad = await runSluice(["chat", "-m", model, "--chat-template", `${dir}/none.jinja`], "");
    assert.equal(bad.code, 1);
    assert.match(bad.stderr, /--chat-template .*none\.jinja: not a file nor a built-in template/);
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});
