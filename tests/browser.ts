/**
 * Test helpers: a headless Chromium driven over the DevTools protocol (navigate, evaluate,
 * screenshot), and a PNG decoder so a test can look at the pixels of a screenshot.
 *
 * @module
 */
import { inflateSync } from "node:zlib";

/** The Chromium executable on PATH, or null. */
export function findChromium(): string | null {
  for (const dir of (Deno.env.get("PATH") ?? "").split(":")) {
    for (const name of ["chromium", "chromium-browser"]) {
      try {
        if (Deno.statSync(`${dir}/${name}`).isFile) return `${dir}/${name}`;
      } catch {
        // Not in this directory.
      }
    }
  }
  return null;
}

/** A page in a headless Chromium. */
export class Browser {
  #proc: Deno.ChildProcess;
  #ws: WebSocket;
  #profile: string;
  #next = 1;
  #pending = new Map<number, { ok: (v: unknown) => void; fail: (e: Error) => void }>();

  private constructor(proc: Deno.ChildProcess, ws: WebSocket, profile: string) {
    this.#proc = proc;
    this.#ws = ws;
    this.#profile = profile;
    ws.onmessage = (ev) => {
      const msg = JSON.parse(ev.data);
      const p = this.#pending.get(msg.id);
      if (!p) return;
      this.#pending.delete(msg.id);
      if (msg.error) p.fail(new Error(`${msg.error.message} (${msg.error.code})`));
      else p.ok(msg.result);
    };
  }

  /** Starts Chromium with a fresh profile and connects to its first page. */
  static async launch(exe: string, width = 1280, height = 900): Promise<Browser> {
    const profile = Deno.makeTempDirSync({ prefix: "sluice-chromium-" });
    const proc = new Deno.Command(exe, {
      args: [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        `--user-data-dir=${profile}`,
        "--remote-debugging-address=127.0.0.1",
        "--remote-debugging-port=0",
        `--window-size=${width},${height}`,
        "about:blank",
      ],
      stdin: "null",
      stdout: "null",
      stderr: "piped",
    }).spawn();
    // Chromium prints the DevTools address on stderr; the rest of stderr is drained unread.
    const reader = proc.stderr.pipeThrough(new TextDecoderStream()).getReader();
    let text = "";
    const deadline = Date.now() + 30_000;
    let port: string | undefined;
    while (!port) {
      const { value, done } = await reader.read();
      if (done || Date.now() > deadline) {
        throw new Error(`chromium did not start its DevTools server:\n${text}`);
      }
      text += value;
      port = /DevTools listening on ws:\/\/127\.0\.0\.1:(\d+)\//.exec(text)?.[1];
    }
    (async () => {
      while (!(await reader.read()).done);
    })();
    const list = `http://127.0.0.1:${port}/json/list`;
    const targets = await (await fetch(list, { signal: AbortSignal.timeout(10_000) })).json();
    const page = targets.find((t: { type: string }) => t.type === "page");
    if (!page) throw new Error("chromium has no page target");
    const ws = new WebSocket(page.webSocketDebuggerUrl);
    await new Promise((ok, fail) => {
      ws.onopen = ok;
      ws.onerror = () => fail(new Error("cannot connect to chromium's DevTools socket"));
    });
    const b = new Browser(proc, ws, profile);
    await b.send("Emulation.setDeviceMetricsOverride", {
      width,
      height,
      deviceScaleFactor: 1,
      mobile: false,
    });
    return b;
  }

  /** One DevTools protocol call. */
  send(method: string, params: Record<string, unknown> = {}): Promise<unknown> {
    const id = this.#next++;
    this.#ws.send(JSON.stringify({ id, method, params }));
    return new Promise((ok, fail) => this.#pending.set(id, { ok, fail }));
  }

  /** Loads `url`. */
  async goto(url: string): Promise<void> {
    await this.send("Page.enable");
    await this.send("Page.navigate", { url });
  }

  /** The value of a JavaScript expression in the page. */
  async eval<T>(expression: string): Promise<T> {
    const r = await this.send("Runtime.evaluate", { expression, returnByValue: true }) as {
      result: { value: T };
      exceptionDetails?: { text: string; exception?: { description?: string } };
    };
    const ex = r.exceptionDetails;
    if (ex) throw new Error(`page: ${ex.exception?.description ?? ex.text}`);
    return r.result.value;
  }

  /** Waits until `expression` is truthy in the page (polling), or fails after `ms`. */
  async waitFor(expression: string, ms = 20_000): Promise<void> {
    const end = Date.now() + ms;
    // While the page loads, its elements may not exist yet: that counts as not true.
    const probe = `(() => { try { return Boolean(${expression}); } catch { return false; } })()`;
    while (!(await this.eval<boolean>(probe))) {
      if (Date.now() > end) throw new Error(`page: still not true after ${ms} ms: ${expression}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  /** A PNG screenshot of the viewport. */
  async screenshot(): Promise<Uint8Array> {
    const r = await this.send("Page.captureScreenshot", { format: "png" }) as { data: string };
    return Uint8Array.from(atob(r.data), (c) => c.charCodeAt(0));
  }

  /** Closes the browser (gracefully, then by force) and removes its profile. */
  async close(): Promise<void> {
    const wait = (ms: number) => new Promise((r) => setTimeout(r, ms));
    this.send("Browser.close").catch(() => {});
    const exited = await Promise.race([this.#proc.status.then(() => true), wait(5000)]);
    if (!exited) {
      this.#proc.kill("SIGKILL");
      await this.#proc.status;
    }
    this.#ws.close();
    // Its helper processes may still be writing to the profile for a moment.
    for (let i = 0;; i++) {
      try {
        Deno.removeSync(this.#profile, { recursive: true });
        return;
      } catch (e) {
        if (i === 20) throw e;
        await wait(100);
      }
    }
  }
}

/** A decoded PNG: 8-bit RGBA rows. */
export interface Image {
  width: number;
  height: number;
  rgba: Uint8Array;
}

/** Decodes an 8-bit, non-interlaced RGB or RGBA PNG (what Chromium writes). */
export function decodePng(png: Uint8Array): Image {
  const view = new DataView(png.buffer, png.byteOffset, png.byteLength);
  let at = 8, width = 0, height = 0, channels = 0;
  const idat: Uint8Array[] = [];
  while (at < png.length) {
    const len = view.getUint32(at);
    const type = String.fromCharCode(...png.subarray(at + 4, at + 8));
    const data = png.subarray(at + 8, at + 8 + len);
    if (type === "IHDR") {
      width = view.getUint32(at + 8);
      height = view.getUint32(at + 12);
      const depth = data[8], color = data[9], interlace = data[12];
      if (depth !== 8 || interlace !== 0 || (color !== 2 && color !== 6)) {
        throw new Error(
          `png: unsupported depth ${depth} / color ${color} / interlace ${interlace}`,
        );
      }
      channels = color === 6 ? 4 : 3;
    } else if (type === "IDAT") idat.push(data);
    at += 12 + len;
  }
  const joined = new Uint8Array(idat.reduce((s, d) => s + d.length, 0));
  idat.reduce((off, d) => (joined.set(d, off), off + d.length), 0);
  const raw = inflateSync(joined);
  const stride = width * channels;
  const px = new Uint8Array(height * stride);
  for (let y = 0; y < height; y++) {
    const filter = raw[y * (stride + 1)];
    const src = raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1));
    const row = px.subarray(y * stride, (y + 1) * stride);
    const up = y > 0 ? px.subarray((y - 1) * stride, y * stride) : new Uint8Array(stride);
    for (let i = 0; i < stride; i++) {
      const a = i >= channels ? row[i - channels] : 0;
      const b = up[i];
      const c = i >= channels ? up[i - channels] : 0;
      let pred = 0;
      if (filter === 1) pred = a;
      else if (filter === 2) pred = b;
      else if (filter === 3) pred = (a + b) >> 1;
      else if (filter === 4) {
        const p = a + b - c, pa = Math.abs(p - a), pb = Math.abs(p - b), pc = Math.abs(p - c);
        pred = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
      }
      row[i] = (src[i] + pred) & 0xff;
    }
  }
  const rgba = new Uint8Array(width * height * 4);
  for (let p = 0; p < width * height; p++) {
    for (let k = 0; k < 3; k++) rgba[p * 4 + k] = px[p * channels + k];
    rgba[p * 4 + 3] = channels === 4 ? px[p * channels + 3] : 255;
  }
  return { width, height, rgba };
}

/** A rectangle of the page, in CSS pixels (the screenshots are taken at scale 1). */
export interface Rect {
  x: number;
  y: number;
  w: number;
  h: number;
}

/** Pixels inside the rectangle (clipped to the image) whose red, green and blue pass `keep`. */
function countPixels(img: Image, rect: Rect, keep: (r: number, g: number, b: number) => boolean) {
  let n = 0;
  const x1 = Math.min(img.width, Math.ceil(rect.x + rect.w));
  const y1 = Math.min(img.height, Math.ceil(rect.y + rect.h));
  for (let y = Math.max(0, Math.floor(rect.y)); y < y1; y++) {
    for (let x = Math.max(0, Math.floor(rect.x)); x < x1; x++) {
      const i = (y * img.width + x) * 4;
      if (keep(img.rgba[i], img.rgba[i + 1], img.rgba[i + 2])) n++;
    }
  }
  return n;
}

/** Pixels within `tol` of colour `rgb` inside the rectangle (x, y, w, h). */
export function countColour(
  img: Image,
  rgb: [number, number, number],
  rect: Rect,
  tol = 12,
): number {
  return countPixels(
    img,
    rect,
    (r, g, b) => Math.abs(r - rgb[0]) + Math.abs(g - rgb[1]) + Math.abs(b - rgb[2]) <= tol,
  );
}

/**
 * Pixels inside the rectangle that are colour `rgb` blended over `bg` with at least `share` of
 * `rgb` (within `tol` of that blend): an anti-aliased line of width 1.5 covers few pixels in its
 * exact colour, and how many depends on its slope and where it falls on the pixel grid.
 */
export function countBlend(
  img: Image,
  rgb: [number, number, number],
  bg: [number, number, number],
  rect: Rect,
  share = 0.6,
  tol = 12,
): number {
  const d = rgb.map((c, k) => c - bg[k]);
  const dd = d[0] * d[0] + d[1] * d[1] + d[2] * d[2];
  return countPixels(img, rect, (r, g, b) => {
    const p = [r - bg[0], g - bg[1], b - bg[2]];
    const t = (p[0] * d[0] + p[1] * d[1] + p[2] * d[2]) / dd;
    const off = Math.abs(p[0] - t * d[0]) + Math.abs(p[1] - t * d[1]) + Math.abs(p[2] - t * d[2]);
    return t >= share && off <= tol;
  });
}
