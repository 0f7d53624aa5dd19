/**
 * The back of the worker server: runs in a worker, opens the model and runs the server's own
 * request handling (./server.ts `serverHandler`: session, tokenizer, queue, prompt cache) on the
 * requests the front (./front.ts) passes it, sending each response back in chunks as it is
 * written. A forward pass holds this worker's event loop, never the front's. It posts what
 * /health, /metrics and /ui/state show every half second and after each response, and /health
 * and the running request also from between a forward pass's layers (when a request starts, and
 * every half second), so the front answers those at once.
 *
 * @module
 */
import { Session, type SessionOptions } from "../../engine/session.ts";
import { CancelFlags } from "./cancels.ts";
import { type ServeOptions, type ServerHandler, serverHandler } from "./server.ts";

/** How the back opens its model: plain data, as it crosses to the worker. */
export interface EngineSpec {
  /** The .sluice container. */
  path: string;
  /** Session options (memory, I/O, speculation). */
  options?: SessionOptions;
  /** `--chat-template`: a Jinja file or "chatml" instead of the checkpoint's template. */
  chatTemplate?: string;
}

/** What the front answers /health, /metrics and /ui/state from. */
export interface EngineStatus {
  health: Record<string, unknown>;
  metrics: string;
  state: Record<string, unknown>;
}

/** A request as the front passes it. */
export interface ForwardedRequest {
  type: "request";
  id: number;
  method: string;
  url: string;
  headers: [string, string][];
  body: Uint8Array<ArrayBuffer> | null;
}

/** Messages from the front to the back. */
export type ToBack =
  | {
    type: "open";
    spec: EngineSpec;
    serve: Omit<ServeOptions, "log">;
    data?: unknown;
    /** The front's CancelFlags (./cancels.ts), shared. */
    cancels: SharedArrayBuffer;
  }
  | ForwardedRequest
  /** The client of request `id` went away. */
  | { type: "abort"; id: number }
  /** The front answered a request with an error itself: counted in /metrics. */
  | { type: "refused" }
  /** Shutting down: stop every request. */
  | { type: "stop" }
  /** Close the model; answered by "closed". */
  | { type: "close" };

/** Messages from the back to the front. */
export type ToFront =
  | { type: "ready"; notice: string | null; status: EngineStatus; parallel: number }
  | { type: "failed"; message: string }
  | { type: "status"; status: EngineStatus }
  /** From inside a forward pass: /health and the running request (the rest waits for a yield). */
  | { type: "progress"; health: Record<string, unknown>; current: unknown }
  | { type: "head"; id: number; status: number; headers: [string, string][] }
  | { type: "chunk"; id: number; bytes: Uint8Array }
  | { type: "end"; id: number }
  /** The response body of `id` broke off. */
  | { type: "error"; id: number; message: string }
  | { type: "log"; line: string }
  | { type: "closed" };

/** Called once the model is open, before any request: embedders and tests install observers. */
export type OpenedHook = (session: Session, data: unknown) => void;

/** How often the status is posted while the worker's loop is free. */
const STATUS_MS = 500;

/** Runs the back on this worker's messages. */
export function runBack(opened?: OpenedHook): void {
  const scope = self as unknown as {
    postMessage(m: ToFront): void;
    onmessage: ((ev: MessageEvent<ToBack>) => void) | null;
  };
  const post = (m: ToFront) => scope.postMessage(m);
  let session: Session | null = null;
  let handler: ServerHandler | null = null;
  let timer: ReturnType<typeof setInterval> | undefined;
  /** Aborts of the requests in flight, by id. */
  const inflight = new Map<number, AbortController>();

  /** When the status was last posted, and the request running then. */
  let sentAt = 0;
  let sentFor: unknown = null;
  const status = (h: ServerHandler): EngineStatus => {
    sentAt = performance.now();
    sentFor = h.live.current;
    return { health: h.health(), metrics: h.live.prometheus(), state: h.live.snapshot() };
  };
  const update = (h: ServerHandler) => post({ type: "status", status: status(h) });

  const open = async (m: Extract<ToBack, { type: "open" }>) => {
    try {
      session = await Session.open(m.spec.path, m.spec.options);
      if (m.spec.chatTemplate !== undefined) session.useChatTemplate(m.spec.chatTemplate);
      const h = serverHandler(session, { ...m.serve, log: (line) => post({ type: "log", line }) });
      handler = h;
      // From inside a forward pass too (between layers), which may run for seconds, so /health
      // and the running request show at once. Only those: the full status reads
      // Session.cachedTokens, which inside a forward pass drops the prompt cache's token list.
      const cancels = new CancelFlags(m.cancels);
      session.model.transformer.moeObservers.push(() => {
        // A client that went away aborts its request here, so the pass can stop at the end of
        // this layer (engine/batch.ts) rather than of its prompt chunk.
        for (const [id, abort] of inflight) {
          if (!abort.signal.aborted && cancels.has(id)) abort.abort();
        }
        if (h.live.current === sentFor && performance.now() - sentAt < STATUS_MS) return;
        sentAt = performance.now();
        sentFor = h.live.current;
        post({ type: "progress", health: h.health(), current: h.live.current });
      });
      timer = setInterval(() => {
        if (performance.now() - sentAt >= STATUS_MS) update(h);
      }, STATUS_MS);
      opened?.(session, m.data);
      post({
        type: "ready",
        notice: session.chatTemplate.notice ?? null,
        status: status(h),
        parallel: session.model.transformer.sequences,
      });
    } catch (e) {
      session?.close();
      post({ type: "failed", message: e instanceof Error ? e.message : String(e) });
    }
  };

  const serve = async (h: ServerHandler, m: ForwardedRequest) => {
    const abort = new AbortController();
    inflight.set(m.id, abort);
    try {
      const req = new Request(m.url, {
        method: m.method,
        headers: m.headers,
        body: m.body,
        signal: abort.signal,
      });
      const res = await h.handle(req);
      post({ type: "head", id: m.id, status: res.status, headers: [...res.headers] });
      if (res.body) {
        const reader = res.body.getReader();
        // The client went away: cancelling the body stops a stream's generation.
        abort.signal.addEventListener("abort", () => reader.cancel().catch(() => {}), {
          once: true,
        });
        for (let r = await reader.read(); !r.done; r = await reader.read()) {
          post({ type: "chunk", id: m.id, bytes: r.value });
        }
      }
      // The counters of this request are in /metrics by the time its client has the answer.
      update(h);
      post({ type: "end", id: m.id });
    } catch (e) {
      post({ type: "error", id: m.id, message: e instanceof Error ? e.message : String(e) });
    } finally {
      inflight.delete(m.id);
    }
  };

  scope.onmessage = (ev) => {
    const m = ev.data;
    switch (m.type) {
      case "open":
        open(m);
        break;
      case "request":
        if (handler) serve(handler, m);
        break;
      case "abort":
        inflight.get(m.id)?.abort();
        break;
      case "refused":
        if (handler) handler.live.totals.errors++;
        break;
      case "stop":
        clearInterval(timer);
        handler?.stop();
        break;
      case "close":
        clearInterval(timer);
        session?.close();
        session = null;
        post({ type: "closed" });
        break;
    }
  };
}
