/**
 * The worker server, what `mod.ts serve` runs: a thin front on the main thread and the engine in
 * a worker (./back.ts), so a forward pass never holds the event loop that answers HTTP. The front
 * owns the listener; checks the Host header, CORS and the API key; serves the pages; answers
 * /health, /metrics and /ui/state from the status the back posts (/health and the running
 * request at most half a second old even inside a forward pass, the counters as of the back's
 * last yield); reads each body within a size and time bound; and
 * passes every other request (method, path, headers, body) to the back, which runs the server's
 * own handler (./server.ts). Responses come back in chunks as the back writes them, so SSE works
 * unchanged; a client that goes away aborts its request in the back. A back that dies gets its
 * requests in flight answered with 500 (an error event in a stream) and every later one with 503,
 * and the error logged; none hangs.
 *
 * @module
 */
import { type AnthropicError, anthropicError } from "./anthropic.ts";
import type { EngineSpec, EngineStatus, ToBack, ToFront } from "./back.ts";
import { CancelFlags } from "./cancels.ts";
import { Gate, methodNotAllowed } from "./gate.ts";
import { DEFAULT_MAX_BODY_BYTES, json, listen, readBody } from "./listen.ts";
import { ApiError } from "./openai.ts";
import type { ServeOptions } from "./server.ts";

/** Settings of the worker server: the server's, and the front's own bounds. */
export interface WorkerServeOptions extends ServeOptions {
  /** Most ms a request body may take to arrive (default 60 s); then 408. */
  bodyTimeoutMs?: number;
  /**
   * Most requests passed to the engine and not yet answered (default the engine's `parallel`
   * sequences + `queueSize` + 16: the running and queued generations and quick calls such as
   * /tokenize); more get 429 at once.
   */
  maxForwards?: number;
  /**
   * The module the engine worker runs (default ./back_worker.ts) and data for the hook it gives
   * `runBack` (./back.ts `OpenedHook`): for embedders and tests that observe the model.
   */
  worker?: { url: URL | string; data?: unknown };
}

/** A running worker server. */
export interface WorkerServer {
  /** `http://host:port`. */
  url: string;
  /** The chat template's notice (a checkpoint without one uses ChatML), or null. */
  notice: string | null;
  /** Resolves with the engine's error if its worker dies; the server then answers 503. */
  failed: Promise<Error>;
  /**
   * Stops listening and stops every request (a stream ends with an error event, a request not
   * yet answered gets 503), waits for the connections at most `drainMs`, and closes the model.
   */
  close(): Promise<void>;
}

/** Headers about the client's connection, not the request: not passed on. */
const HOP_HEADERS = new Set([
  "connection",
  "keep-alive",
  "transfer-encoding",
  "upgrade",
  "content-length",
]);

/** Most ms close() waits for the engine to close its model before stopping the worker. */
const CLOSE_MS = 10_000;

/** A request passed to the back and not yet finished. */
interface Forward {
  path: string;
  head: PromiseWithResolvers<{ status: number; headers: [string, string][] }>;
  /** Whether the head arrived (the client has a status). */
  answered: boolean;
  sse: boolean;
  controller: ReadableStreamDefaultController<Uint8Array>;
}

/** The request's error in the shape of its endpoint (Anthropic's for /v1/messages). */
function shaped(path: string, e: ApiError): ApiError | AnthropicError {
  return path.startsWith("/v1/messages") ? anthropicError(e) : e;
}

/**
 * Starts the engine worker on `spec` and, once the model is open, listens. Rejects with the
 * engine's error when the model cannot be opened.
 */
export async function startWorkerServer(
  spec: EngineSpec,
  opts: WorkerServeOptions = {},
): Promise<WorkerServer> {
  const log = opts.log ?? ((line: string) => console.error(line));
  const maxBody = opts.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES;
  const bodyTimeoutMs = opts.bodyTimeoutMs ?? 60_000;
  // Set when the engine is open and says how many sequences generate at once.
  let maxForwards = opts.maxForwards ?? Infinity;
  const gate = new Gate(opts);
  // Named, so Deno's own report of an uncaught error there says where it came from.
  const worker = new Worker(opts.worker?.url ?? new URL("./back_worker.ts", import.meta.url), {
    type: "module",
    name: "sluice engine",
  });
  const post = (m: ToBack, transfer: Transferable[] = []) => worker.postMessage(m, transfer);
  const forwards = new Map<number, Forward>();
  // Read by the engine between a pass's layers, where the abort message cannot reach it.
  const cancels = new CancelFlags();
  /** Requests whose client went away while the engine had them. */
  let cancelled = 0;
  let status: EngineStatus | null = null;
  let failure: Error | null = null;
  let closing = false;
  let seq = 0;
  const failed = Promise.withResolvers<Error>();
  const opened = Promise.withResolvers<string | null>();
  const closed = Promise.withResolvers<void>();

  /**
   * Ends request `f` with a 500: its answer if none was sent yet, an error event ending a stream
   * (never the end of a complete answer), or a broken body.
   */
  const breakOff = (f: Forward, message: string) => {
    const err = shaped(f.path, new ApiError(500, message, { code: "engine_failed" }));
    if (!f.answered) return f.head.reject(err);
    try {
      if (f.sse) {
        const event = f.path.startsWith("/v1/messages")
          ? `event: error\ndata: ${JSON.stringify(err.body())}\n\n`
          : `data: ${JSON.stringify(err.body())}\n\n`;
        f.controller.enqueue(new TextEncoder().encode(event));
        f.controller.close();
      } else f.controller.error(err);
    } catch {
      // The client already went away.
    }
  };

  /** The back is gone: every request in flight gets an error, and every later one 503. */
  const fail = (message: string) => {
    if (failure) return;
    failure = new Error(message);
    opened.reject(failure);
    worker.terminate();
    if (status) log(`sluice serve: the engine worker failed: ${message}`);
    for (const f of forwards.values()) {
      breakOff(f, `the engine failed while answering: ${message}`);
    }
    forwards.clear();
    closed.resolve();
    failed.resolve(failure);
  };

  const finish = (id: number) => forwards.delete(id);

  worker.onmessage = (ev: MessageEvent<ToFront>) => {
    const m = ev.data;
    switch (m.type) {
      case "ready":
        status = m.status;
        maxForwards = opts.maxForwards ?? m.parallel + (opts.queueSize ?? 8) + 16;
        opened.resolve(m.notice);
        break;
      case "failed":
        fail(m.message);
        break;
      case "status":
        status = m.status;
        break;
      case "progress":
        if (status) {
          status = { ...status, health: m.health, state: { ...status.state, current: m.current } };
        }
        break;
      case "log":
        log(m.line);
        break;
      case "closed":
        closed.resolve();
        break;
      case "head": {
        const f = forwards.get(m.id);
        if (!f) break;
        f.answered = true;
        f.sse = m.headers.some(([k, v]) =>
          k === "content-type" && v.startsWith("text/event-stream")
        );
        f.head.resolve(m);
        break;
      }
      case "chunk":
        try {
          forwards.get(m.id)?.controller.enqueue(m.bytes);
        } catch {
          // The client went away; the back has been told.
        }
        break;
      case "end":
      case "error": {
        const f = forwards.get(m.id);
        if (!f) break;
        finish(m.id);
        if (m.type === "error") {
          log(`sluice serve: ${f.path}: ${m.message}`);
          breakOff(f, m.message);
        } else {
          try {
            f.controller.close();
          } catch {
            // The client already cancelled the stream.
          }
        }
        break;
      }
    }
  };
  worker.onerror = (ev) => {
    ev.preventDefault();
    fail(ev.message || "the engine worker stopped with an error");
  };
  worker.onmessageerror = () => fail("a message from the engine worker could not be read");

  // A function and the worker's module stay here; the rest is plain data.
  const { log: _log, worker: _worker, ...serve } = opts;
  post({ type: "open", spec, serve, data: opts.worker?.data, cancels: cancels.flags.buffer });
  const notice = await opened.promise;

  const engineDown = () =>
    new ApiError(
      503,
      `the engine stopped after an error (${failure?.message}); restart the server`,
      {
        code: "engine_failed",
      },
    );
  const shutdownError = () =>
    new ApiError(503, "the server is shutting down; the request was stopped before it finished", {
      code: "server_shutdown",
    });

  /** Tells the back that the client of `id` went away (once, while it runs). */
  const abandon = (id: number) => {
    if (!forwards.has(id) || failure || cancels.has(id)) return;
    cancels.set(id);
    cancelled++;
    post({ type: "abort", id });
  };

  /** Passes `req` to the back and answers with what it sends. */
  const forward = async (req: Request, path: string): Promise<Response> => {
    if (failure) throw engineDown();
    if (closing) throw shutdownError();
    if (forwards.size >= maxForwards) {
      throw new ApiError(
        429,
        `the server is busy: ${forwards.size} requests already passed to the model`,
        { type: "rate_limit_error", code: "queue_full", headers: { "retry-after": "1" } },
      );
    }
    const id = ++seq;
    let controller!: ReadableStreamDefaultController<Uint8Array>;
    const body = new ReadableStream<Uint8Array>({
      start: (c) => {
        controller = c;
      },
      cancel: () => abandon(id),
    });
    const f: Forward = {
      path,
      head: Promise.withResolvers(),
      answered: false,
      sse: false,
      controller,
    };
    // Rejected when the back fails before the body is read; awaited below otherwise.
    f.head.promise.catch(() => {});
    // The slot is taken while the body arrives, so slow bodies count against the bound too.
    forwards.set(id, f);
    try {
      const bytes = req.method === "GET" || req.method === "HEAD"
        ? null
        : await readBody(req, maxBody, bodyTimeoutMs);
      if (failure) throw engineDown();
      post({
        type: "request",
        id,
        method: req.method,
        url: req.url,
        headers: [...req.headers].filter(([k]) => !HOP_HEADERS.has(k)),
        body: bytes,
      }, bytes ? [bytes.buffer] : []);
      req.signal.addEventListener("abort", () => abandon(id), { once: true });
      const head = await f.head.promise;
      const empty = [204, 205, 304].includes(head.status) || req.method === "HEAD";
      if (empty) body.cancel().catch(() => {});
      // A whole answer goes out with its length, as from the in-process server; only a stream
      // is passed on chunk by chunk.
      const answer = empty ? null : f.sse ? body : await new Response(body).arrayBuffer();
      return new Response(answer, { status: head.status, headers: head.headers });
    } catch (e) {
      if (!f.answered) finish(id);
      throw e instanceof ApiError ? shaped(path, e) : e;
    }
  };

  /** The status answers, or null for a path the back answers. */
  const fromStatus = (path: string, method: string): Response | null => {
    if (!["/health", "/metrics", "/ui/state"].includes(path)) return null;
    if (method !== "GET" && method !== "HEAD") throw methodNotAllowed(path, method, "GET");
    if (failure || !status) {
      if (path !== "/health") throw engineDown();
      return json({ status: "error", error: engineDown().message }, 503);
    }
    // With the requests passed to the engine and not yet answered, counted here and now.
    if (path === "/health") return json({ ...status.health, forwarded: forwards.size, cancelled });
    if (path === "/ui/state") return json(status.state);
    return new Response(status.metrics, {
      headers: { "content-type": "text/plain; version=0.0.4; charset=utf-8" },
    });
  };

  const route = async (req: Request): Promise<Response> => {
    const admitted = gate.admit(req);
    if (admitted instanceof Response) return admitted;
    const { path } = admitted;
    return gate.page(path, req.method) ?? fromStatus(path, req.method) ??
      await forward(req, path);
  };

  const listener = listen(opts, async (req) => {
    let res: Response;
    try {
      res = await route(req);
    } catch (e) {
      const err = e instanceof ApiError
        ? e
        : new ApiError(500, e instanceof Error ? e.message : String(e));
      if (err.status >= 500) log(`sluice serve: ${req.method} ${req.url}: ${err.message}`);
      if (!failure) post({ type: "refused" });
      res = json(err.body(), err.status, err.headers);
    }
    for (const [k, v] of Object.entries(gate.cors(req))) res.headers.set(k, v);
    return res;
  }, log);

  return {
    url: listener.url,
    notice,
    failed: failed.promise,
    close: async () => {
      if (closing) return;
      closing = true;
      if (!failure) post({ type: "stop" });
      await listener.shutdown();
      if (!failure) {
        post({ type: "close" });
        let timer: ReturnType<typeof setTimeout> | undefined;
        await Promise.race([closed.promise, new Promise((r) => timer = setTimeout(r, CLOSE_MS))]);
        clearTimeout(timer);
      }
      worker.terminate();
    },
  };
}
