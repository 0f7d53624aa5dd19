/**
 * `mod.ts chat` as a user drives it through stdin: a saved and reloaded conversation continues
 * with the same tokens (sampling included) as one that never stopped; /reset and /system act;
 * a session file of another container, or a damaged one, is refused and the chat goes on.
 */
import assert from "node:assert/strict";
import { readFileSync, writeFileSync } from "node:fs";
import { DEMO_DIMS, demoModelPath } from "../tools/demo_model.ts";
import { packCheckpoint } from "../tools/pack.ts";
import { synthCheckpoint } from "../tools/synth.ts";
import { packedFixture, runSluice, sharedMissing, tempDir } from "./fixtures.ts";

const SAMPLING = [
  ...["-n", "10", "--ignore-eos", "--temperature", "0.9", "--seed", "11", "--ctx", "512"],
];

function chat(model: string, input: string, ...args: string[]) {
  return runSluice(["chat", "--model", model, ...SAMPLING, ...args], input, 60_000);
}

Deno.test("chat: a saved session resumes with the same tokens as one that never stopped", async () => {
  const model = await demoModelPath(true);
  const file = `${tempDir()}/chat.session`;
  const whole = await chat(model, `hello there\n/save ${file}\nwhat next?\n/exit\n`);
  assert.equal(whole.code, 0, whole.stderr);
  assert.match(whole.stderr, /\(saved 1 turn\(s\), \d+ tokens/);
  // Each answer is followed by a newline: the whole run is the first turn's output, then the second's.
  const turn1 = await chat(model, "hello there\n/exit\n");
  const second = whole.stdout.slice(turn1.stdout.length);
  assert.ok(whole.stdout.startsWith(turn1.stdout) && second.length > 1, whole.stdout);
  const resumed = await chat(model, `/load ${file}\nwhat next?\n/exit\n`);
  assert.equal(resumed.code, 0, resumed.stderr);
  assert.match(resumed.stderr, /\(loaded 1 turn\(s\)/);
  assert.equal(resumed.stdout, second);
  // The loaded KV cache was used, not recomputed.
  assert.match(resumed.stderr, /prompt \d+ \([1-9]\d* cached\)/);
  // Without the saved state, the second answer differs (its seed and context are the first turn's).
  const fresh = await chat(model, "what next?\n/exit\n");
  assert.notEqual(fresh.stdout, second);
});

Deno.test("chat: --system and --prompt, /system and /reset", async () => {
  const model = await demoModelPath(true);
  const direct = await chat(model, "", "--system", "Be brief.", "--prompt", "hello");
  assert.equal(direct.code, 0, direct.stderr);
  const typed = await chat(model, "/system Be brief.\nhello\n/reset\n/system\nhello\n/exit\n");
  assert.equal(typed.code, 0, typed.stderr);
  const plain = await chat(model, "hello\n/exit\n");
  assert.equal(typed.stdout, direct.stdout + plain.stdout);
  assert.notEqual(direct.stdout, plain.stdout);
  assert.match(typed.stderr, /\(conversation cleared\)/);
});

/** A second small chat model (the demo recipe, another seed): a different container. */
async function otherChatModel(): Promise<string> {
  const dir = `${tempDir()}/other-chat`;
  const ckpt = await synthCheckpoint({
    arch: "mixtral",
    out: dir,
    size: 8 * 2 ** 20,
    overrides: { ...DEMO_DIMS, layers: 2 },
    seed: 7,
    progress: "off",
    log: () => {},
  });
  await packCheckpoint(ckpt.dir, `${dir}.sluice`, { progress: "off", log: () => {} });
  return `${dir}.sluice`;
}

Deno.test("chat: another container's session or a damaged file is refused, the chat goes on", async () => {
  const demo = await demoModelPath(true);
  const file = `${tempDir()}/demo-chat.session`;
  const saved = await chat(demo, `hi\n/save ${file}\n/exit\n`);
  assert.equal(saved.code, 0, saved.stderr);
  const wrong = await chat(await otherChatModel(), `/load ${file}\n/stats\n/exit\n`);
  assert.equal(wrong.code, 0, wrong.stderr);
  assert.match(
    wrong.stderr,
    /sluice chat: .*belongs to container "demo-.*\.sluice" \(.*\), not to .*other-chat/,
  );
  assert.match(wrong.stderr, /context +0\/512 tokens cached, 0 turn/);
  const bytes = readFileSync(file);
  bytes[bytes.length >> 1] ^= 1;
  const damaged = `${tempDir()}/damaged-chat.session`;
  writeFileSync(damaged, bytes);
  const bad = await chat(demo, `/load ${damaged}\nhi\n/exit\n`);
  assert.match(bad.stderr, /sluice chat: .*damaged \(its CRC-32 does not match\)/);
  assert.equal(bad.stdout, saved.stdout);
});

Deno.test({
  name: "chat: a model without a chat template chats through the built-in one, with a notice",
  ignore: sharedMissing() !== null,
  fn: async () => {
    const r = await chat(await packedFixture("stories260k-moe"), "hi\n");
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stderr, /sluice chat: the checkpoint has no chat template; using the built-in/);
    assert.ok(r.stdout.trim().length > 0);
  },
});
