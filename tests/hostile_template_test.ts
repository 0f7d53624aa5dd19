/**
 * A checkpoint's chat template as hostile input (issue 27): a template that loops is stopped by
 * the time budget (its worker terminated) or the step budget, one that builds huge strings or
 * lists by the size cap, and every error names the template. Rendering carries on normally after
 * a stopped template. `generate --chat` and `serve` on a container whose template loops answer
 * with that error instead of hanging.
 */
import assert from "node:assert/strict";
import { cpSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { renderChat } from "../engine/chat.ts";
import { Session } from "../engine/session.ts";
import { demoModelPath } from "../tools/demo_model.ts";
import { startServer } from "../tools/serve/server.ts";
import { runSluice, tempDir } from "./fixtures.ts";

const USER = [{ role: "user", content: "hi" }];
const NAME = "chat template test.jinja";
const GOOD = "{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}";
/** Ten billion iterations of an empty body: no output, only time. */
const SPIN = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}";

function render(template: string, limits = {}): string {
  return renderChat({ template, name: NAME }, USER, { limits });
}

Deno.test("a looping chat template is stopped by its time budget, then rendering goes on", () => {
  const t0 = performance.now();
  assert.throws(
    () => render(SPIN, { timeMs: 300, steps: 1e12 }),
    /^Error: chat template test\.jinja: rendering took longer than 300 ms/,
  );
  assert.ok(performance.now() - t0 < 20_000);
  assert.equal(render(GOOD), "[user] hi");
});

Deno.test("the step budget, the size cap and range() bound what a template may do", () => {
  assert.throws(
    () => render(SPIN, { steps: 50_000, timeMs: 60_000 }),
    /chat template test\.jinja: took more than 50000 steps/,
  );
  const doubling = "{% set ns = namespace(x='a') %}{% for i in range(64) %}" +
    "{% set ns.x = ns.x ~ ns.x %}{% endfor %}{{ ns.x }}";
  assert.throws(
    () => render(doubling, { outputBytes: 1 << 20 }),
    /chat template test\.jinja: made a string of 2097152 items, more than the cap of 1048576/,
  );
  assert.throws(
    () => render("{% for i in range(10**12) %}x{% endfor %}"),
    /range\(\) of 1000000000000 items, more than the cap of 100000/,
  );
  const wide = "{% for i in range(5000) %}{{ messages[0].content * 1 }}{% endfor %}";
  assert.throws(() => render(wide), /^Error: chat template test\.jinja: /);
  assert.throws(
    () => render("{% for m in messages %}{{ m.content }}{% endfor %}xyz", { outputBytes: 4 }),
    /its output is longer than the cap of 4 bytes|more than the cap of 4/,
  );
});

Deno.test("template errors name the template, whatever their cause", () => {
  assert.throws(
    () => render("{{ no_such_function() }}"),
    /^Error: chat template test\.jinja: Cannot call something that is not a function/,
  );
  assert.throws(() => render("{% for %}"), /^Error: chat template test\.jinja: does not parse/);
  assert.throws(
    () => render("{{ raise_exception('roles must alternate') }}"),
    /chat template test\.jinja: roles must alternate/,
  );
});

/** A copy of the demo container whose chat template spins. */
async function spinningModel(): Promise<string> {
  const out = join(tempDir(), "spinning.sluice");
  cpSync(await demoModelPath(true), out, { recursive: true });
  writeFileSync(join(out, "chat_template.jinja"), SPIN);
  return out;
}

Deno.test({
  name: "generate --chat and serve refuse a looping template instead of hanging",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const model = await spinningModel();
    const t0 = performance.now();
    const r = await runSluice(
      ["generate", "--model", model, "--chat", "--prompt", "hi"],
      "",
      60_000,
    );
    assert.equal(r.code, 1, r.stderr);
    assert.match(r.stderr, /spinning\.sluice\/chat_template\.jinja: (took more than|rendering)/);
    assert.ok(performance.now() - t0 < 50_000);
    const session = await Session.open(model, { quiet: true, ctx: 256 });
    const server = startServer(session, { port: 0, log: () => {} });
    try {
      const res = await fetch(`${server.url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ messages: USER, max_tokens: 2 }),
        signal: AbortSignal.timeout(30_000),
      });
      assert.equal(res.status, 400);
      assert.match((await res.json()).error.message, /chat_template\.jinja: /);
      const health = await fetch(`${server.url}/health`, { signal: AbortSignal.timeout(5_000) });
      assert.equal((await health.json()).status, "ok");
    } finally {
      await server.close();
      session.close();
    }
  },
});
