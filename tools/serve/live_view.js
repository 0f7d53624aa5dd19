// The live view's drawing, shared by the live page (/ui) and the chat page (/): polls /ui/state
// once a second and fills whichever of its elements the page has (charts with axes and units,
// the expert heat map, the trunk ring, the current request and totals). No build step, no CDN.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const DIM = "#7d8794", GRID = "#252b33", BG = "#11151a";

  function kv(el, rows) {
    if (!el) return;
    el.replaceChildren(...rows.flatMap(([k, v]) => {
      const a = document.createElement("span");
      a.className = "dim";
      a.textContent = k;
      const b = document.createElement("span");
      b.textContent = v;
      return [a, b];
    }));
  }

  function canvas(el) {
    const dpr = globalThis.devicePixelRatio || 1;
    const w = el.clientWidth, h = Number(el.getAttribute("height"));
    el.width = w * dpr;
    el.height = h * dpr;
    el.style.height = h + "px";
    const g = el.getContext("2d");
    g.scale(dpr, dpr);
    g.font = "11px ui-monospace, Menlo, Consolas, monospace";
    return { g, w, h };
  }

  /** A round tick step giving about `n` ticks up to `max`. */
  function step(max, n) {
    const raw = max / n, p = 10 ** Math.floor(Math.log10(raw));
    for (const m of [1, 2, 5, 10]) if (m * p >= raw) return m * p;
    return 10 * p;
  }

  /** A tick label: whole numbers as they are, others with two significant digits. */
  function fmt(v) {
    const r = Math.round(v * 1e6) / 1e6;
    return Number.isInteger(r) ? String(r) : String(Number(r.toPrecision(2)));
  }

  /**
   * A line chart of `points` ({t: seconds since start, v}) with a y axis in `unit` (ticks from 0)
   * and an x axis in seconds before the newest sample.
   */
  function chart(el, points, color, unit) {
    if (!el) return;
    const { g, w, h } = canvas(el);
    g.fillStyle = BG;
    g.fillRect(0, 0, w, h);
    const left = 52, right = 8, top = 16, bottom = 20;
    const pw = w - left - right, ph = h - top - bottom;
    const max0 = Math.max(0, ...points.map((p) => p.v));
    const dy = step(max0 > 0 ? max0 : 1, 4), ymax = Math.max(dy, Math.ceil(max0 / dy) * dy);
    const t1 = points.length ? points[points.length - 1].t : 0;
    const span = Math.max(10, points.length ? t1 - points[0].t : 60);
    const x = (t) => left + pw - ((t1 - t) / span) * pw, y = (v) => top + ph - (v / ymax) * ph;
    g.lineWidth = 1;
    g.textBaseline = "middle";
    for (let v = 0; v <= ymax + dy / 2; v += dy) {
      g.strokeStyle = GRID;
      g.beginPath();
      g.moveTo(left, Math.round(y(v)) + 0.5);
      g.lineTo(left + pw, Math.round(y(v)) + 0.5);
      g.stroke();
      g.fillStyle = DIM;
      g.textAlign = "right";
      g.fillText(fmt(v), left - 6, y(v));
    }
    const dx = step(span, 5);
    g.textAlign = "center";
    g.textBaseline = "top";
    for (let s = 0; s <= span + 1e-9; s += dx) {
      const px = left + pw - (s / span) * pw;
      g.strokeStyle = GRID;
      g.beginPath();
      g.moveTo(Math.round(px) + 0.5, top);
      g.lineTo(Math.round(px) + 0.5, top + ph);
      g.stroke();
      g.fillStyle = DIM;
      g.fillText(
        s === 0 ? "now" : `-${fmt(s)} s`,
        Math.min(w - 18, Math.max(left + 14, px)),
        top + ph + 4,
      );
    }
    g.save();
    g.translate(10, top + ph / 2);
    g.rotate(-Math.PI / 2);
    g.textAlign = "center";
    g.textBaseline = "middle";
    g.fillText(unit, 0, 0);
    g.restore();
    if (points.length < 2) return;
    g.strokeStyle = color;
    g.lineWidth = 1.5;
    g.beginPath();
    points.forEach((p, i) => (i ? g.lineTo(x(p.t), y(p.v)) : g.moveTo(x(p.t), y(p.v))));
    g.stroke();
  }

  function drawHeat(ex) {
    const el = $("heat");
    if (!el) return;
    el.setAttribute("height", String(Math.max(40, ex.layers.length * 20 + 4)));
    const { g, w, h } = canvas(el);
    g.fillStyle = BG;
    g.fillRect(0, 0, w, h);
    const rows = ex.layers, n = ex.perLayer;
    if (!rows.length || !n) {
      g.fillStyle = DIM;
      g.fillText("dense model: no experts", 8, 16);
      return;
    }
    const left = 34, cw = (w - left - 4) / n, ch = Math.min(24, (h - 4) / rows.length);
    const max = Math.max(1, ...rows.flatMap((r) => r.use));
    rows.forEach((r, j) => {
      g.fillStyle = DIM;
      g.fillText(`L${r.layer}`, 4, j * ch + ch / 2 + 4);
      r.use.forEach((u, e) => {
        const t = Math.sqrt(u / max);
        g.fillStyle = `rgb(${Math.round(30 + 225 * t)},${Math.round(40 + 120 * t)},${
          Math.round(60 + 20 * (1 - t))
        })`;
        g.fillRect(left + e * cw, j * ch + 1, Math.max(1, cw - 1), ch - 2);
        if (r.resident[e]) {
          g.strokeStyle = "#e8f4ff";
          g.lineWidth = 1;
          g.strokeRect(left + e * cw + 0.5, j * ch + 1.5, Math.max(1, cw - 2), ch - 3);
        }
      });
    });
    const resident = rows.reduce((s, r) => s + r.resident.reduce((a, b) => a + b, 0), 0);
    const rate = ex.hits + ex.misses ? (100 * ex.hits / (ex.hits + ex.misses)).toFixed(1) : "—";
    $("heatInfo").textContent = `${resident}/${
      rows.length * n
    } records resident (${ex.slots} slots), hits ${ex.hits}, misses ${ex.misses}, hit rate ${rate}%`;
  }

  function drawTrunk(t) {
    const el = $("trunk");
    if (!el) return;
    const { g, w, h } = canvas(el);
    g.fillStyle = BG;
    g.fillRect(0, 0, w, h);
    const cw = (w - 8) / t.layers;
    for (let l = 0; l < t.layers; l++) {
      g.fillStyle = l < t.pinned ? "#3fb27f" : "#6b7785";
      g.fillRect(4 + l * cw, 8, Math.max(1, cw - 2), h - 24);
    }
    g.fillStyle = DIM;
    g.fillText("layer 0", 4, h - 4);
    g.fillText(`${t.layers - 1}`, w - 24, h - 4);
    $("trunkInfo").textContent =
      `${t.pinned}/${t.layers} layers pinned, ${t.ringSlots} ring slot(s); ring reads ${t.reads}, hits ${t.hits}`;
  }

  function render(s) {
    // The last state drawn, for debugging from the console (and for tests).
    globalThis.sluiceState = s;
    if ($("model")) $("model").textContent = s.model;
    if ($("status")) {
      $("status").textContent = `live · up ${s.uptimeS.toFixed(0)} s`;
      $("status").className = "dim";
    }
    chart($("rates"), s.history.map((p) => ({ t: p.t, v: p.tokPerS })), "#4fb3ff", "tok/s");
    chart(
      $("reads"),
      s.history.map((p) => ({ t: p.t, v: p.readBytesPerS / 2 ** 20 })),
      "#ffb347",
      "MiB/s",
    );
    const last = s.history[s.history.length - 1];
    if ($("rateNow")) {
      $("rateNow").textContent = last ? `now ${last.tokPerS.toFixed(1)} tok/s` : "";
    }
    if ($("readNow")) {
      $("readNow").textContent = last
        ? `now ${(last.readBytesPerS / 2 ** 20).toFixed(2)} MiB/s, io wait ${
          (100 * last.ioWait).toFixed(0)
        }%`
        : "";
    }
    const c = s.current;
    kv(
      $("current"),
      c
        ? [
          ["request", `${c.id} (${c.endpoint})`],
          ["phase", c.phase],
          [
            "prompt",
            `${c.promptTokens} tokens, ${c.cachedTokens} from the prompt cache, ${c.prefilled} prefilled`,
          ],
          ["generated", `${c.generated} / ${c.maxTokens}`],
          ["elapsed", `${((Date.now() - c.startedMs) / 1000).toFixed(1)} s`],
        ]
        : [["request", "idle"], ["queue", `${s.queueDepth} waiting`]],
    );
    kv($("totals"), [
      [
        "requests",
        `${s.totals.requests} (${s.totals.cancelled} cancelled, ${s.totals.errors} errors)`,
      ],
      [
        "tokens",
        `${s.totals.promptTokens} prompt (${s.totals.cachedTokens} cached), ${s.totals.generatedTokens} generated`,
      ],
      ["last tok/s", s.lastTokPerS.toFixed(2)],
      ...(s.batch
        ? [[
          "batch",
          `${s.running.length} of ${s.batch.parallel} running; ${
            s.batch.passes > 0 ? (s.batch.sequences / s.batch.passes).toFixed(2) : "0"
          } sequences per pass`,
        ]]
        : []),
      ["read", `${s.text.bytesRead}, io wait ${(s.ioWaitMs / 1000).toFixed(2)} s`],
      ["context", `${s.contextTokens} / ${s.maxContext} tokens cached`],
      ["memory", `budget ${s.text.budget}, arena ${s.text.arena}, RSS ${s.text.rss}`],
      ["queue", `${s.queueDepth} waiting`],
    ]);
    drawHeat(s.experts);
    drawTrunk(s.trunk);
  }

  async function poll() {
    try {
      const r = await fetch("/ui/state", { cache: "no-store" });
      render(await r.json());
    } catch (e) {
      if ($("status")) {
        $("status").textContent = `disconnected (${e.message})`;
        $("status").className = "down";
      }
    }
    setTimeout(poll, 1000);
  }
  poll();
})();
