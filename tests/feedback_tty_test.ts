/**
 * Feedback on long work as a user sees it: the load line redrawn with MB/s on a terminal and
 * erased when the load is done, the prefill line redrawn with tok/s on a terminal, and piped
 * stderr getting one final line of each instead. The terminal runs are in a real pty (util-linux
 * `script`, recording the raw bytes written to it); skipped, saying so, without it.
 */
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { loadProgress } from "../tools/cli/feedback.ts";
import { openContainer } from "../engine/container.ts";
import { Model, runFloor } from "../engine/model.ts";
import { demoModelPath } from "../tools/demo_model.ts";
import { runSluice } from "./fixtures.ts";
import { skipIf } from "./skips.ts";

const HAVE_SCRIPT = (() => {
  try {
    return new Deno.Command("script", { args: ["--version"], stdout: "null", stderr: "null" })
      .outputSync().success;
  } catch {
    return false;
  }
})();

const ESC = "\x1b";

/** A load of `steps` landings of 10 MB, 60 ms apart, reported to a string. */
function load(tty: boolean, steps: number, fail = false, color = false): string {
  let clock = 0;
  let out = "";
  const p = loadProgress({ tty, color, write: (s) => (out += s), now: () => clock });
  const total = 10e6 * steps;
  p.onLoad(0, total);
  for (let i = 1; i <= (fail ? steps - 1 : steps); i++) {
    clock += 60;
    p.onLoad(10e6 * i, total);
  }
  p.end();
  return out;
}

Deno.test("load progress: redrawn with MB/s on a terminal at most every 100 ms, erased when done or failed; nothing piped", () => {
  const tty = load(true, 4);
  assert.deepEqual(tty.split("\r").slice(1), [
    `loading 0 B / 38.1 MiB (0%), 0 MB/s, 0.0 s${ESC}[K`,
    // 60 ms: not yet; 120 ms: drawn; 180 ms: not yet; 240 ms: done, erased.
    `loading 19.1 MiB / 38.1 MiB (50%), 167 MB/s, 0.1 s${ESC}[K`,
    `${ESC}[K`,
  ]);
  // A load that fails leaves no half line before the error.
  assert.ok(load(true, 4, true).endsWith(`\r${ESC}[K`));
  // Dim when colour is on (--color, or a terminal without NO_COLOR).
  assert.ok(load(true, 4, false, true).startsWith(`\r${ESC}[2mloading 0 B / 38.1 MiB`));
  assert.equal(load(false, 4), "");
  assert.equal(load(false, 4, true), "");
});

Deno.test("the load's progress counts up to the bytes the load reads, whole or streamed", async () => {
  const path = await demoModelPath(true);
  const floor = runFloor(openContainer(path));
  for (const budget of [undefined, floor, Math.round(floor * 1.5)]) {
    const seen: [number, number][] = [];
    const m = await Model.open(path, {
      quiet: true,
      budget,
      onLoad: (done, total) => seen.push([done, total]),
    });
    try {
      const total = seen[0][1];
      assert.deepEqual(seen[0], [0, total]);
      assert.ok(seen.every(([d, t], i) => t === total && (i === 0 || d >= seen[i - 1][0])));
      assert.deepEqual(seen.at(-1), [m.loadBytes, total], `budget ${budget}`);
    } finally {
      m.close();
    }
  }
});

/** A prompt of about 1,800 tokens of the demo model: a prefill of seconds on this machine. */
const LONG_PROMPT = Array(120).fill("once upon a time there was a dog").join(" ");

/** Seconds the prefill took, from the stats block. */
function prefillSeconds(text: string): number {
  const m = /^prompt +(\d+) tokens, ([\d.]+) tok\/s/m.exec(text);
  assert.ok(m, text);
  return Number(m[1]) / Number(m[2]);
}

/**
 * `mod.ts args` in a pty with `input` typed: everything it wrote, raw but for line ends made
 * "\n" and escapes shown as ⎋.
 */
async function inPty(args: string[], input = ""): Promise<string> {
  const log = await Deno.makeTempFile();
  try {
    const modTs = fileURLToPath(new URL("../mod.ts", import.meta.url));
    const quote = (s: string) => `'${s.replaceAll("'", `'\\''`)}'`;
    const command = [Deno.execPath(), "run", "-A", modTs, ...args].map(quote).join(" ");
    const child = new Deno.Command("script", {
      args: ["-q", "-e", "-c", command, log],
      stdin: "piped",
      stdout: "null",
      stderr: "piped",
      env: { NO_COLOR: "1" },
    }).spawn();
    const w = child.stdin.getWriter();
    await w.write(new TextEncoder().encode(input));
    await w.close();
    const watchdog = setTimeout(() => child.kill("SIGKILL"), 120_000);
    const out = await child.output();
    clearTimeout(watchdog);
    const raw = await Deno.readTextFile(log);
    assert.equal(out.code, 0, raw + new TextDecoder().decode(out.stderr));
    return raw.replaceAll("\r\n", "\n").replaceAll(ESC, "⎋");
  } finally {
    await Deno.remove(log);
  }
}

/** The load lines of a terminal run: drawn from 0 B, erased, then the one load line. */
function assertTtyLoad(raw: string): void {
  assert.match(raw, /\rloading 0 B \/ [\d.]+ MiB \(0%\), \d+ MB\/s, [\d.]+ s⎋\[K/);
  assert.match(raw, /\rloading [^\r]*⎋\[K\r⎋\[K(sluice: budget [^\n]*\n)?loaded in /);
  assert.equal(raw.match(/^loaded in /gm)?.length, 1, raw);
}

Deno.test({
  name: "generate in a terminal: the load and a long prefill redraw one progress line each",
  ignore: skipIf(!HAVE_SCRIPT, "need util-linux script"),
  fn: async () => {
    const model = await demoModelPath(true);
    const raw = await inPty(["generate", "-m", model, "-n", "3", "-p", LONG_PROMPT]);
    assertTtyLoad(raw);
    // NO_COLOR holds on a terminal too: redraws and erases, no colour.
    assert.doesNotMatch(raw, /⎋\[\d+m/);
    const secs = prefillSeconds(raw);
    const drawn = raw.match(/\rprompt \d+\/\d+ tokens, [\d.]+ tok\/s, [\d.]+ s⎋\[K/g) ?? [];
    // The line appears once the prefill has run a second; margins either side of that.
    if (secs >= 1.5) {
      assert.ok(drawn.length >= 2, `${drawn.length} redraws in a ${secs} s prefill`);
      assert.match(raw, /\rprompt (\d+)\/\1 tokens, [\d.]+ tok\/s, [\d.]+ s⎋\[K\n/);
    }
    if (secs < 0.8) assert.equal(drawn.length, 0, raw);
  },
});

Deno.test({
  name: "chat in a terminal: the load redraws a progress line, then the load line",
  ignore: skipIf(!HAVE_SCRIPT, "need util-linux script"),
  fn: async () => {
    const model = await demoModelPath(true);
    const raw = await inPty(["chat", "-m", model, "-n", "3"], "hello there\n/exit\n");
    assertTtyLoad(raw);
    assert.match(raw, /\[3 tokens, [\d.]+ tok\/s; prompt \d+/);
  },
});

Deno.test("piped, generate and chat write one final load line and one final prefill line, no redraws", async () => {
  const model = await demoModelPath(true);
  const gen = await runSluice(["generate", "-m", model, "-n", "3", "-p", LONG_PROMPT]);
  assert.equal(gen.code, 0, gen.stderr);
  const chat = await runSluice(["chat", "-m", model, "-n", "3"], "hello there\n/exit\n");
  assert.equal(chat.code, 0, chat.stderr);
  for (const run of [gen, chat]) {
    assert.ok(!run.stderr.includes("\r"), JSON.stringify(run.stderr));
    assert.doesNotMatch(run.stderr, /loading/);
    assert.equal(run.stderr.match(/^loaded in [\d.]+ s: .* read \(\d+ MB\/s\)$/gm)?.length, 1);
  }
  const lines = gen.stderr.match(/^prompt (\d+)\/\1 tokens, [\d.]+ tok\/s, [\d.]+ s$/gm) ?? [];
  const secs = prefillSeconds(gen.stderr);
  if (secs >= 1.5) assert.equal(lines.length, 1, gen.stderr);
  if (secs < 0.8) assert.equal(lines.length, 0, gen.stderr);
});
