/**
 * The live view at /ui in a real headless Chromium: while a request streams, the page shows the
 * model, the current request, the decode and read rates on their own charts with axes, the expert
 * heat map and the trunk layout, and a screenshot of it has those panels' colours where the page
 * says they are.
 */
import assert from "node:assert/strict";
import OpenAI from "openai";
import { Session } from "../engine/session.ts";
import { demoModelPath } from "../tools/demo_model.ts";
import { modelId } from "../tools/serve/live.ts";
import { startServer } from "../tools/serve/server.ts";
import { Browser, countBlend, countColour, decodePng, findChromium } from "./browser.ts";
import { budgetAboveFloor, tempDir } from "./fixtures.ts";
import { skipIf } from "./skips.ts";

const chromium = findChromium();
if (!chromium) console.error("ui_test: skipped, no chromium on PATH (apt-get install chromium)");

Deno.test({
  name: "the live view renders live state in headless Chromium" +
    (chromium ? "" : " (skipped: no chromium on PATH; apt-get install chromium)"),
  ignore: skipIf(chromium === null, "need chromium"),
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    // 1 MiB over the floor: some trunk layers and experts are resident, the rest stream.
    const demo = await demoModelPath(true);
    const opts = { quiet: true, ctx: 2048, threads: 1 };
    const budget = await budgetAboveFloor(demo, 2 ** 20, opts);
    const session = await Session.open(demo, { ...opts, budget });
    const server = startServer(session, { port: 0, log: () => {} });
    const client = new OpenAI({ apiKey: "none", baseURL: `${server.url}/v1`, maxRetries: 0 });
    const browser = await Browser.launch(chromium!);
    const abort = new AbortController();
    try {
      const model = modelId(session);
      await client.completions.create({ model, prompt: "warm up the cache", max_tokens: 40 });
      // Long streams, one after another, keep a request running whenever the page looks;
      // ignore_eos (a llama.cpp-style extension) keeps the random model talking.
      const body = { model, prompt: "a long story", max_tokens: 2000, stream: true as const };
      const reading = (async () => {
        while (!abort.signal.aborted) {
          try {
            const stream = await client.completions.create(
              { ...body, ignore_eos: true } as typeof body,
              { signal: abort.signal },
            );
            for await (const _ of stream);
          } catch {
            // Aborted below.
          }
        }
      })();
      await browser.goto(`${server.url}/ui`);
      const text = (id: string) => `document.getElementById(${JSON.stringify(id)}).textContent`;
      await browser.waitFor(`/now [1-9][0-9.]* tok\\/s/.test(${text("rateNow")})`);
      // A few seconds of history, so the chart has a shape; then a frame showing a request.
      await browser.waitFor("window.sluiceState?.history.length >= 4");
      await browser.waitFor(`${text("current")}.includes("decode")`);
      // The page's text and a screenshot of the same frame: it redraws once a second, so a pair
      // that straddles a redraw is taken again.
      const snapshot = () =>
        browser.eval<Record<string, string>>(`({
          model: ${text("model")}, status: ${text("status")}, current: ${text("current")},
          totals: ${text("totals")}, heat: ${text("heatInfo")}, trunk: ${text("trunkInfo")},
        })`);
      let page = await snapshot(), shot = await browser.screenshot();
      for (let i = 0; JSON.stringify(await snapshot()) !== JSON.stringify(page); i++) {
        assert.ok(i < 10, "the page never held still for a screenshot");
        page = await snapshot();
        shot = await browser.screenshot();
      }
      const rects = await browser.eval<
        Record<string, { x: number; y: number; w: number; h: number }>
      >(
        `Object.fromEntries(["rates", "reads", "heat", "trunk"].map((id) => {
          const r = document.getElementById(id).getBoundingClientRect();
          return [id, { x: r.x, y: r.y, w: r.width, h: r.height }];
        }))`,
      );
      abort.abort();
      await reading;
      assert.equal(page.model, model);
      assert.match(page.status, /^live · up \d+ s$/);
      assert.match(page.current, /req-\d+ \(completions\)phasedecodeprompt\d+ tokens/);
      assert.match(page.totals, /requests\d+ \(\d+ cancelled, 0 errors\)/);
      assert.match(page.totals, /batch\d of 1 running; \d+\.\d\d sequences per pass/);
      const plan = session.model.plan;
      assert.ok(plan.pinned > 0 && plan.pinned < 4 && plan.expertSlots < 64, "a mixed plan");
      assert.ok(
        page.trunk.startsWith(`${plan.pinned}/4 layers pinned, ${plan.ringSlots} ring slot(s)`),
        page.trunk,
      );
      const heat = /^(\d+)\/64 records resident \((\d+) slots\)/.exec(page.heat);
      const [resident, slots] = [Number(heat?.[1]), Number(heat?.[2])];
      // The cache's records now: the planned ones and those the KV cache still lends.
      assert.ok(slots >= plan.expertSlots && slots <= plan.expertSlots + plan.lentSlots, page.heat);
      assert.ok(resident > 0 && resident <= slots, page.heat);

      const img = decodePng(shot);
      assert.equal(img.width, 1280);
      // Pinned and streamed layers in their colours, in proportion; the tok/s line in its colour;
      // the heat map in more than the background's colour, with resident outlines.
      const pinned = countColour(img, [0x3f, 0xb2, 0x7f], rects.trunk);
      const streamed = countColour(img, [0x6b, 0x77, 0x85], rects.trunk);
      const ratio = pinned / streamed, want = plan.pinned / (4 - plan.pinned);
      assert.ok(pinned > 100 && Math.abs(ratio - want) < 0.1 * want, `${pinned} vs ${streamed}`);
      // The lines are anti-aliased over the chart's background: count their blends.
      const chart: [number, number, number] = [0x11, 0x15, 0x1a];
      const blue: [number, number, number] = [0x4f, 0xb3, 0xff];
      const orange: [number, number, number] = [0xff, 0xb3, 0x47];
      assert.ok(countBlend(img, blue, chart, rects.rates) > 50, "tok/s line");
      // Read rates have their own chart (they no longer overlap the tok/s line), both on grids.
      assert.ok(countBlend(img, orange, chart, rects.reads) > 50, "MiB/s line");
      assert.equal(countBlend(img, orange, chart, rects.rates), 0, "no read line on tok/s");
      for (const r of [rects.rates, rects.reads]) {
        assert.ok(countColour(img, [0x25, 0x2b, 0x33], r, 4) > 100, "grid lines");
      }
      const background = countColour(img, chart, rects.heat, 6);
      assert.ok(background < 0.9 * rects.heat.w * rects.heat.h, "heat map drawn");
      assert.ok(countColour(img, [0xe8, 0xf4, 0xff], rects.heat, 30) > 20, "resident outlines");
      const out = Deno.env.get("SLUICE_UI_SCREENSHOT") ?? `${tempDir()}/live-view.png`;
      Deno.writeFileSync(out, shot);
    } finally {
      abort.abort();
      await browser.close();
      await server.close();
      session.close();
    }
  },
});
