/**
 * `mod.ts chat` in a real terminal (tmux, its own server socket): Ctrl-C stops the answer being
 * written at the next token and returns to the prompt with the conversation kept; a first Ctrl-C
 * at the empty prompt says how to leave, a second one leaves. Skipped (saying so) without tmux.
 */
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { demoModelPath } from "../tools/demo_model.ts";
import { skipIf } from "./skips.ts";

const HAVE_TMUX = (() => {
  try {
    return new Deno.Command("tmux", { args: ["-V"], stdout: "null", stderr: "null" }).outputSync()
      .success;
  } catch {
    return false;
  }
})();

/** A tmux server of this test only, driving one window. */
class Terminal {
  readonly socket = `sluice-test-${Deno.pid}-${crypto.randomUUID().slice(0, 8)}`;

  tmux(...args: string[]): string {
    const out = new Deno.Command("tmux", { args: ["-L", this.socket, ...args] }).outputSync();
    if (!out.success) {
      throw new Error(`tmux ${args[0]}: ${new TextDecoder().decode(out.stderr)}`);
    }
    return new TextDecoder().decode(out.stdout);
  }

  start(command: string): void {
    this.tmux("new-session", "-d", "-x", "160", "-y", "60", command);
  }

  keys(...keys: string[]): void {
    this.tmux("send-keys", "-t", "0", ...keys);
  }

  /** The window's text with its scrollback. */
  screen(): string {
    return this.tmux("capture-pane", "-p", "-J", "-S", "-2000", "-t", "0");
  }

  /** Waits until the screen matches `re`, or fails with the screen after `ms`. */
  async until(re: RegExp, ms = 60_000): Promise<string> {
    const end = Date.now() + ms;
    for (;;) {
      const s = this.screen();
      if (re.test(s)) return s;
      if (Date.now() > end) throw new Error(`timed out waiting for ${re}; screen:\n${s}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  close(): void {
    try {
      this.tmux("kill-server");
    } catch {
      // Already gone with its last window.
    }
  }
}

Deno.test({
  name:
    "chat in a terminal: Ctrl-C stops the answer, keeps the conversation; twice at the prompt exits",
  ignore: skipIf(!HAVE_TMUX, "need tmux"),
  fn: async () => {
    const model = await demoModelPath(true);
    const modTs = fileURLToPath(new URL("../mod.ts", import.meta.url));
    const term = new Terminal();
    try {
      const max = 1900;
      term.start(
        `NO_COLOR=1 '${Deno.execPath()}' run -A '${modTs}' chat --model '${model}' ` +
          `-n ${max} --ignore-eos --ctx 2048; echo "sluice exited $?"; sleep 60`,
      );
      await term.until(/^> /m);
      term.keys("hello there", "Enter");
      // Some of the answer is out: stop it.
      await term.until(/hello there\n.{20,}/);
      term.keys("C-c");
      const stopped = await term.until(/\[\d+ tokens.*\]\n> $/m);
      assert.match(stopped, /\(stopped; the answer so far is kept\)/);
      const n = Number(/\[(\d+) tokens/.exec(stopped)![1]);
      assert.ok(n > 0 && n < max, `stopped after ${n} of ${max} tokens`);
      // The chat goes on with the conversation: one turn, its tokens in the context.
      term.keys("/stats", "Enter");
      const stats = await term.until(/context +\d+\/2048 tokens cached, \d+ turn/);
      const [, cached, turns] = /context +(\d+)\/2048 tokens cached, (\d+) turn/.exec(stats)!;
      assert.equal(turns, "1");
      assert.ok(Number(cached) > n, `${cached} cached tokens after a ${n}-token answer`);
      // A first Ctrl-C at the prompt only says how to leave; the second leaves.
      term.keys("C-c");
      await term.until(/Ctrl-C again, \/exit or Ctrl-D to leave/);
      assert.doesNotMatch(term.screen(), /sluice exited/);
      term.keys("C-c");
      assert.match(await term.until(/sluice exited \d+/), /sluice exited 130/);
    } finally {
      term.close();
    }
  },
});
