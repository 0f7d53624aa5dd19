/**
 * The chat page at / in a real headless Chromium: a message streams in and equals a greedy
 * generation of the same chat (system prompt and sampling settings from the page); reasoning and a
 * required tool call are shown folded; Stop ends a long generation; the live panels beside the
 * chat draw their charts.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { Session } from "../engine/session.ts";
import { demoModelPath } from "../tools/demo_model.ts";
import { startServer } from "../tools/serve/server.ts";
import { Browser, countColour, decodePng, findChromium } from "./browser.ts";
import { coldText, tempDir, THINK_TEMPLATE } from "./fixtures.ts";

const chromium = findChromium();

Deno.test({
  name: "the chat page streams, folds reasoning, stops, and shows the live view" +
    (chromium ? "" : " (skipped: no chromium on PATH; apt-get install chromium)"),
  ignore: chromium === null,
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const dir = tempDir();
    const template = join(dir, "think.jinja");
    Deno.writeTextFileSync(template, THINK_TEMPLATE);
    const demo = await demoModelPath(true);
    const opts = { quiet: true, ctx: 2048, threads: 1 };
    const session = await Session.open(demo, opts);
    session.useChatTemplate(template);
    const ref = await Session.open(demo, opts);
    ref.useChatTemplate(template);
    const server = startServer(session, { port: 0, log: () => {} });
    const browser = await Browser.launch(chromium!);
    const js = JSON.stringify;
    const set = (id: string, value: string) =>
      browser.eval(
        `(() => { const e = document.getElementById(${js(id)}); e.value = ${
          js(value)
        }; e.dispatchEvent(new Event("change")); })()`,
      );
    const send = (text: string) =>
      browser.eval(
        `(() => { document.getElementById("input").value = ${
          js(text)
        }; document.getElementById("form").requestSubmit(); })()`,
      );
    const stats = `document.querySelectorAll(".msg.assistant .stats")`;
    try {
      await browser.goto(`${server.url}/`);
      await browser.waitFor(`document.getElementById("model").textContent !== "…"`);
      await set("system", "You are terse.");
      await set("temperature", "0");
      await set("max_tokens", "24");
      await set("thinking", "off");
      await send("Tell me about foxes.");
      await browser.waitFor(`${stats}.length === 1`);
      const chat = [
        { role: "system", content: "You are terse." },
        { role: "user", content: "Tell me about foxes." },
      ];
      const want = await coldText(ref, ref.chatIds(chat, { enable_thinking: false }), 24, true);
      const got = await browser.eval<string>(
        `document.querySelector(".msg.assistant .body").textContent`,
      );
      assert.equal(got, want.replace(/^\s+/, ""));
      assert.match(await browser.eval<string>(`${stats}[0].textContent`), /24 tokens in/);

      // Thinking on: the whole greedy text is reasoning, shown folded.
      await set("thinking", "on");
      await send("And wolves?");
      await browser.waitFor(`${stats}.length === 2`);
      const fold = await browser.eval<{ open: boolean; summary: string; text: string }>(`(() => {
        const d = document.querySelectorAll(".msg.assistant")[1].querySelector("details.think");
        return { open: d.open, summary: d.querySelector("summary").textContent,
          text: d.querySelector("pre").textContent };
      })()`);
      assert.equal(fold.open, false);
      assert.match(fold.summary, /^Reasoning \(\d+ characters\)$/);
      assert.ok(fold.text.length > 0);

      // A required tool call is shown folded, with arguments that parse.
      await set("thinking", "off");
      await set(
        "tools",
        JSON.stringify([{
          type: "function",
          function: {
            name: "get_weather",
            parameters: {
              type: "object",
              properties: { city: { enum: ["Oslo", "Lima"] } },
              required: ["city"],
            },
          },
        }]),
      );
      await set("tool_choice", "required");
      await set("max_tokens", "200");
      await send("Weather in Oslo?");
      await browser.waitFor(`${stats}.length === 3`);
      const tool = await browser.eval<{ open: boolean; summary: string; args: string }>(`(() => {
        const d = document.querySelectorAll(".msg.assistant")[2].querySelector("details.tool");
        return { open: d.open, summary: d.querySelector("summary").textContent,
          args: d.querySelector("pre").textContent };
      })()`);
      assert.equal(tool.open, false);
      assert.equal(tool.summary, "Tool call: get_weather");
      assert.ok(["Oslo", "Lima"].includes(JSON.parse(tool.args).city), tool.args);
      assert.match(await browser.eval<string>(`${stats}[2].textContent`), /^tool_calls · /);
      await set("tools", "");

      // Stop: a long generation ends at the click, marked as stopped.
      await set("thinking", "on");
      await set("max_tokens", "1500");
      await send("Tell me a very long story.");
      await browser.waitFor(
        `(document.querySelectorAll(".msg.assistant")[3]?.textContent.length ?? 0) > 40`,
      );
      await browser.eval(`document.getElementById("stopBtn").click()`);
      await browser.waitFor(`${stats}.length === 4`);
      assert.equal(await browser.eval<string>(`${stats}[3].textContent`), "stopped");
      assert.ok(server.live.totals.cancelled >= 1);

      await browser.waitFor("globalThis.sluiceState?.history.length >= 3");
      await new Promise((r) => setTimeout(r, 1100));
      const shot = await browser.screenshot();
      const rect = await browser.eval<{ x: number; y: number; w: number; h: number }>(
        `(() => { const r = document.getElementById("rates").getBoundingClientRect();
          return { x: r.x, y: r.y, w: r.width, h: r.height }; })()`,
      );
      const img = decodePng(shot);
      assert.ok(countColour(img, [0x4f, 0xb3, 0xff], rect, 40) > 30, "the tok/s line is drawn");
      assert.ok(countColour(img, [0x25, 0x2b, 0x33], rect, 4) > 100, "the chart has grid lines");
      Deno.writeFileSync(Deno.env.get("SLUICE_CHAT_SCREENSHOT") ?? join(dir, "chat.png"), shot);
    } finally {
      await browser.close();
      await server.close();
      session.close();
      ref.close();
    }
  },
});
