/**
 * Feedback on long work: the prefill progress line (redrawn with tok/s on a terminal, one final
 * line otherwise), colour following --color, --no-color and NO_COLOR, the load line, and the
 * notice and stop reason when the context fills.
 */
import assert from "node:assert/strict";
import { Args } from "../tools/cli/args.ts";
import { colorOn, prefillProgress } from "../tools/cli/feedback.ts";
import { demoModelPath } from "../tools/demo_model.ts";
import { runSluice } from "./fixtures.ts";

/** The escape that starts an SGR or erase sequence. */
const ESC = "\x1b";

/** A prefill of `chunks` chunks of 100 tokens, 400 ms each, reported to a string. */
async function prefill(tty: boolean, chunks: number, cached = 0): Promise<string> {
  let clock = 0;
  let out = "";
  const report = prefillProgress({
    tty,
    cached: () => cached,
    write: (s) => (out += s),
    now: () => clock,
  });
  const total = cached + 100 * chunks;
  for (let done = cached + 100; done <= total; done += 100) {
    clock += 400;
    await report(done, total);
  }
  return out;
}

Deno.test("prefill progress: redrawn with tok/s on a terminal, one final line otherwise, none when short", async () => {
  const tty = await prefill(true, 5);
  // Drawn from the chunk that passes one second: chunks 3, 4 and 5, the last ending the line.
  assert.deepEqual(tty.split("\r").slice(1).map((l) => l.replace(`${ESC}[K`, "")), [
    "prompt 300/500 tokens, 250.0 tok/s, 1.2 s",
    "prompt 400/500 tokens, 250.0 tok/s, 1.6 s",
    "prompt 500/500 tokens, 250.0 tok/s, 2.0 s\n",
  ]);
  assert.equal(await prefill(false, 5), "prompt 500/500 tokens, 250.0 tok/s, 2.0 s\n");
  assert.equal(await prefill(false, 2), "");
  assert.equal(await prefill(true, 2), "");
  // Cached tokens are not counted in the rate.
  assert.equal(await prefill(false, 3, 1000), "prompt 1300/1300 tokens, 250.0 tok/s, 1.2 s\n");
});

Deno.test("colour: --color wins over NO_COLOR, --no-color and NO_COLOR turn it off, else a terminal", () => {
  const args = (values: Record<string, boolean>) => new Args("generate", values, []);
  const tty = { isTerminal: () => true };
  const pipe = { isTerminal: () => false };
  // NO_COLOR is passed rather than set: test files share one process, and a neighbour's output
  // must not lose its colour while this runs.
  const env = (value?: string) => ({
    get: (name: string) => name === "NO_COLOR" ? value : undefined,
  });
  assert.equal(colorOn(args({}), tty, env()), true);
  assert.equal(colorOn(args({}), tty, env("")), true);
  assert.equal(colorOn(args({}), pipe, env()), false);
  assert.equal(colorOn(args({ color: true }), pipe, env()), true);
  assert.equal(colorOn(args({ "no-color": true }), tty, env()), false);
  assert.equal(colorOn(args({}), tty, env("1")), false);
  assert.equal(colorOn(args({ color: true }), tty, env("1")), true);
  assert.throws(() => colorOn(args({ color: true, "no-color": true }), tty), /not both/);
});

Deno.test("generate: load line, colour on request, and the context-full notice and stop reason", async () => {
  const model = await demoModelPath(true);
  const base = ["generate", "-m", model, "-p", "Once", "--ctx", "40", "--ignore-eos"];
  const plain = await runSluice([...base, "-n", "-1"]);
  assert.equal(plain.code, 0, plain.stderr);
  assert.match(plain.stderr, /^loaded in \d+\.\d\d s: .* read \(\d+ MB\/s\)$/m);
  assert.match(plain.stderr, /\(the context is full: 40 tokens; start with a larger --ctx/);
  assert.match(plain.stderr, /generated +\d+ tokens, .* \(stopped: context full\)/);
  assert.ok(!(plain.stdout + plain.stderr).includes(ESC), "NO_COLOR: no escapes");
  const full = JSON.parse((await runSluice([...base, "-n", "-1", "--json"])).stdout);
  assert.equal(full.stats.stop_reason, "context");
  const short = JSON.parse((await runSluice([...base, "-n", "3", "--json"])).stdout);
  assert.equal(short.stats.stop_reason, "max_tokens");
  const colored = await runSluice([...base, "-n", "3", "--color"]);
  assert.ok(colored.stdout.startsWith(`${ESC}[1mOnce${ESC}[0m`), JSON.stringify(colored.stdout));
  assert.ok(colored.stderr.includes(`${ESC}[2mloaded in`), colored.stderr);
  const chat = await runSluice(
    ["chat", "-m", model, "--ctx", "40", "-n", "-1", "--ignore-eos"],
    "hi\n/exit\n",
  );
  assert.equal(chat.code, 0, chat.stderr);
  assert.match(chat.stderr, /\(the context is full: 40 tokens; .*, or \/reset\)/);
});
