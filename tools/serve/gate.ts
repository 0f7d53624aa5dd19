/**
 * What the server decides before a request reaches the model: whether its Host header names this
 * server (DNS rebinding), CORS preflights and headers, the API key and so the user, and the static
 * pages (chat page, live view). Shared by the in-process server (./server.ts) and the front of the
 * worker server (./front.ts), which answers these on the main thread while the engine computes.
 *
 * @module
 */
import { createHash, timingSafeEqual } from "node:crypto";
import { isIP } from "node:net";
import { ApiError } from "./openai.ts";

/** The settings the gate reads (a subset of the server's). */
export interface GateOptions {
  /** Bound interface (default 127.0.0.1). */
  host?: string;
  /** API keys: one user each; none lets everyone in as one user. */
  apiKey?: string | readonly string[];
  /** Origins allowed to call from a browser (`"*"`: any). */
  cors?: string[];
  /** Host names accepted besides the bound one, IP literals and localhost (`"*"`: any). */
  allowHosts?: string[];
}

/** A request let in: its path without trailing slashes and its user ("" without keys). */
export interface Admitted {
  path: string;
  user: string;
}

/** Paths anyone may GET, key or not: the pages, the live view's state and /health. */
const OPEN_PATHS = ["/", "/health", "/ui", "/ui/state", "/ui/live.js", "/favicon.ico"];

const UI_HTML = new URL("./ui.html", import.meta.url);
const CHAT_HTML = new URL("./chat.html", import.meta.url);
const LIVE_JS = new URL("./live_view.js", import.meta.url);

/** The name part of a Host header (`[::1]:8080` → `::1`, `Example.com.:80` → `example.com`). */
export function hostName(host: string): string {
  const h = host.trim().toLowerCase();
  const name = h.startsWith("[") ? h.slice(1, h.indexOf("]")) : h.replace(/:\d*$/, "");
  return name.replace(/\.$/, "");
}

/**
 * Whether a request's Host header names this server: an IP literal (a browser page reaching an
 * address by number has that number as its origin, so no other site's name is involved), the
 * bound host's name, `localhost`, or one of `allowed` (`"*"`: any).
 */
export function hostAllowed(host: string | null, bound: string, allowed: string[]): boolean {
  if (host === null) return false;
  if (allowed.includes("*")) return true;
  const name = hostName(host);
  if (name === "" || isIP(name) !== 0) return name !== "";
  // "localhost" always resolves to this machine, so no other site can stand behind it.
  return name === hostName(bound) || name === "localhost" ||
    allowed.some((a) => hostName(a) === name);
}

/** Compares a credential header with the expected one in time independent of the contents. */
function sameSecret(got: string | null, want: string): boolean {
  const digest = (s: string) => createHash("sha256").update(s).digest();
  return timingSafeEqual(digest(got ?? ""), digest(want)) && got !== null;
}

/** The 405 of `path` for a method it does not take. */
export function methodNotAllowed(path: string, method: string, allowed: string): ApiError {
  return new ApiError(405, `${path} accepts ${allowed}, not ${method}`, {
    code: "method_not_allowed",
  });
}

/** The server's checks of a request before any handler runs, and its static pages. */
export class Gate {
  readonly #keys: string[];
  readonly #bound: string;
  readonly #allowHosts: string[];
  readonly #origins: Set<string>;
  readonly #pages: Map<string, { body: string; type: string }>;

  constructor(opts: GateOptions) {
    const key = opts.apiKey;
    this.#keys = [...new Set(typeof key === "string" ? [key] : key ?? [])];
    this.#bound = opts.host ?? "127.0.0.1";
    this.#allowHosts = opts.allowHosts ?? [];
    this.#origins = new Set(opts.cors ?? []);
    const html = "text/html; charset=utf-8";
    this.#pages = new Map([
      ["/", { body: Deno.readTextFileSync(CHAT_HTML), type: html }],
      ["/ui", { body: Deno.readTextFileSync(UI_HTML), type: html }],
      ["/ui/live.js", {
        body: Deno.readTextFileSync(LIVE_JS),
        type: "text/javascript; charset=utf-8",
      }],
    ]);
  }

  /** Number of API keys (users); 0 when the server is open. */
  get users(): number {
    return this.#keys.length;
  }

  /**
   * The user a request is from (its key's number; "" without keys), or null without a valid key.
   * Every key is compared, in constant time, whichever matches. Anthropic's clients send the key
   * as x-api-key.
   */
  userOf(req: Request): string | null {
    if (this.#keys.length === 0) return "";
    const auth = req.headers.get("authorization");
    const x = req.headers.get("x-api-key");
    let user: string | null = null;
    this.#keys.forEach((key, i) => {
      const hit = Number(sameSecret(auth, `Bearer ${key}`)) | Number(sameSecret(x, key));
      if (hit && user === null) user = `key-${i}`;
    });
    return user;
  }

  /** CORS headers for a request from an allowed origin; none for any other. */
  cors(req: Request): Record<string, string> {
    const origin = req.headers.get("origin");
    const origins = this.#origins;
    if (origin === null || !(origins.has(origin) || origins.has("*"))) return {};
    return {
      "access-control-allow-origin": origins.has("*") ? "*" : origin,
      "access-control-allow-headers": "authorization, content-type, x-api-key",
      "access-control-allow-methods": "GET, POST, OPTIONS",
      vary: "Origin",
    };
  }

  /**
   * Checks the Host header, answers a CORS preflight (a Response) and checks the key of every
   * path but the open ones; throws the ApiError to answer otherwise.
   */
  admit(req: Request): Admitted | Response {
    const path = new URL(req.url).pathname.replace(/\/+$/, "") || "/";
    if (!hostAllowed(req.headers.get("host"), this.#bound, this.#allowHosts)) {
      throw new ApiError(
        421,
        `Host ${JSON.stringify(req.headers.get("host"))} is not this server's address; ` +
          `start it with --allow-host NAME to accept that name`,
        { code: "host_not_allowed" },
      );
    }
    if (req.method === "OPTIONS") {
      const headers = this.cors(req);
      if (!headers["access-control-allow-origin"]) {
        throw new ApiError(403, "cross-origin requests are not allowed (see --cors)", {
          code: "cors_not_allowed",
        });
      }
      return new Response(null, { status: 204, headers });
    }
    const user = OPEN_PATHS.includes(path) ? "" : this.userOf(req);
    if (user === null) {
      throw new ApiError(401, "missing or wrong API key (send Authorization: Bearer <key>)", {
        type: "authentication_error",
        code: "invalid_api_key",
      });
    }
    return { path, user };
  }

  /** The static page at `path` (chat page, live view, its script, favicon), or null. */
  page(path: string, method: string): Response | null {
    if (path === "/favicon.ico") return new Response(null, { status: 204 });
    const page = this.#pages.get(path);
    if (!page) return null;
    if (method !== "GET" && method !== "HEAD") throw methodNotAllowed(path, method, "GET");
    return new Response(page.body, { headers: { "content-type": page.type } });
  }
}
