/**
 * The HTTP listener of both servers (./server.ts in process, ./front.ts in front of the engine
 * worker): `Deno.serve` on the configured address, its printable URL, and a shutdown that waits
 * for open connections at most a bounded time.
 *
 * @module
 */
import { ApiError } from "./openai.ts";

/** A JSON answer. */
export function json(body: unknown, status = 200, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/json", ...headers },
  });
}

/** A listening server. */
export interface Listener {
  /** `http://host:port`. */
  url: string;
  /** Stops listening and waits for the connections to finish, at most `drainMs`. */
  shutdown(): Promise<void>;
}

/**
 * Serves `handle` on `opts.host` (default 127.0.0.1) and `opts.port` (default 8080; 0 picks a
 * free one). Errors Deno.serve itself catches are logged and answered in OpenAI's shape.
 */
export function listen(
  opts: { host?: string; port?: number; drainMs?: number },
  handle: (req: Request) => Promise<Response>,
  log: (line: string) => void,
): Listener {
  const drainMs = opts.drainMs ?? 10_000;
  const server = Deno.serve({
    hostname: opts.host ?? "127.0.0.1",
    port: opts.port ?? 8080,
    onListen: () => {},
    onError: (e) => {
      const err = e instanceof ApiError
        ? e
        : new ApiError(500, e instanceof Error ? e.message : String(e));
      log(`sluice serve: ${err.message}`);
      return json(err.body(), err.status, err.headers);
    },
  }, handle);
  const addr = server.addr as Deno.NetAddr;
  const host = addr.hostname.includes(":") ? `[${addr.hostname}]` : addr.hostname;
  return {
    url: `http://${host}:${addr.port}`,
    shutdown: async () => {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const drained = await Promise.race([
        server.shutdown().then(() => true),
        new Promise<false>((r) => timer = setTimeout(() => r(false), drainMs)),
      ]);
      clearTimeout(timer);
      if (!drained) log(`sluice serve: connections still open after ${drainMs} ms`);
    },
  };
}

/** Default largest request body (ServeOptions.maxBodyBytes). */
export const DEFAULT_MAX_BODY_BYTES = 4 * 2 ** 20;

/**
 * The body of `req`, refused with 413 once it passes `max` bytes (declared or sent) and, with
 * `timeoutMs`, with 408 when it has not all arrived by then (a client trickling a body would
 * otherwise hold its slot for ever).
 */
export async function readBody(
  req: Request,
  max: number,
  timeoutMs?: number,
): Promise<Uint8Array<ArrayBuffer>> {
  const declared = Number(req.headers.get("content-length") ?? "0");
  const tooLarge = () =>
    new ApiError(413, `the request body is larger than ${max} bytes`, { code: "body_too_large" });
  if (declared > max) throw tooLarge();
  const parts: Uint8Array[] = [];
  let total = 0;
  if (req.body) {
    const reader = req.body.getReader();
    let timer: ReturnType<typeof setTimeout> | undefined;
    const late = timeoutMs === undefined ? null : new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        reject(
          new ApiError(408, `the request body did not arrive within ${timeoutMs / 1000} s`, {
            code: "body_timeout",
          }),
        );
      }, timeoutMs);
    });
    try {
      for (;;) {
        const { value, done } = await (late ? Promise.race([reader.read(), late]) : reader.read());
        if (done) break;
        total += value.length;
        if (total > max) throw tooLarge();
        parts.push(value);
      }
    } catch (e) {
      reader.cancel().catch(() => {});
      throw e;
    } finally {
      clearTimeout(timer);
    }
  }
  const bytes = new Uint8Array(total);
  let at = 0;
  for (const p of parts) {
    bytes.set(p, at);
    at += p.length;
  }
  return bytes;
}
