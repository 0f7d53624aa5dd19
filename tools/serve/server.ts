/**
 * The OpenAI-compatible HTTP server on Deno's own `Deno.serve`: chat and text completions (JSON
 * or SSE), models, tokenize/detokenize, health, Prometheus metrics and the live view. One model,
 * so requests queue (bounded) and run one at a time; the session's prompt cache carries over from
 * one request to the next, so a conversation only runs its new tokens. A client that goes away
 * cancels its generation at the next token.
 *
 * @module
 */
import { setImmediate } from "node:timers";
import type { Session } from "../../engine/session.ts";
import { LiveStats, modelId } from "./live.ts";
import { ApiError, type CompletionRequest, parseCompletion, StopMatcher } from "./openai.ts";
import type { EngineExtras, GenerationEnd } from "./chat_run.ts";
import { completionResponse } from "./completions.ts";
import { anthropicError, countTokens, messagesResponse, parseMessages } from "./anthropic.ts";
import { Abandoned, QueueFull, RequestQueue } from "./queue.ts";

/** Server settings. */
export interface ServeOptions {
  /** Interface to listen on (default 127.0.0.1). */
  host?: string;
  /** Port (default 8080; 0 picks a free one). */
  port?: number;
  /** When set, /v1/*, /tokenize, /detokenize and /metrics need `Authorization: Bearer <key>`. */
  apiKey?: string;
  /** Requests that may wait behind the running one (default 8). */
  queueSize?: number;
  /** Largest request body in bytes (default 4 MiB). */
  maxBodyBytes?: number;
  /** Idle time after which a stream gets an SSE comment to keep proxies from closing it. */
  keepAliveMs?: number;
  /** One line per request and at start-up (default: stderr). */
  log?: (line: string) => void;
}

/** A running server. */
export interface SluiceServer {
  /** `http://host:port`. */
  url: string;
  live: LiveStats;
  /** Stops listening, ends the streams and waits for the server to finish. */
  close(): Promise<void>;
}

const UI_HTML = new URL("./ui.html", import.meta.url);
const CHAT_HTML = new URL("./chat.html", import.meta.url);
const LIVE_JS = new URL("./live_view.js", import.meta.url);
const CORS = {
  "access-control-allow-origin": "*",
  "access-control-allow-headers": "authorization, content-type",
  "access-control-allow-methods": "GET, POST, OPTIONS",
};

function json(body: unknown, status = 200, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/json", ...CORS, ...headers },
  });
}

/**
 * Yields to the event loop so other requests, timers, disconnects and stream writes are seen.
 * setImmediate costs microseconds where a zero timeout costs a millisecond or more.
 */
function tick(): Promise<void> {
  return new Promise((r) => setImmediate(r));
}

/** The answer to an error: OpenAI's shape, never a stack trace. */
function errorResponse(e: unknown): ApiError {
  if (e instanceof ApiError) return e;
  if (e instanceof QueueFull) {
    return new ApiError(429, e.message, {
      type: "rate_limit_error",
      code: "queue_full",
      headers: { "retry-after": "1" },
    });
  }
  return new ApiError(500, e instanceof Error ? e.message : String(e));
}

async function readJson(req: Request, max: number): Promise<unknown> {
  const declared = Number(req.headers.get("content-length") ?? "0");
  const tooLarge = () =>
    new ApiError(413, `the request body is larger than ${max} bytes`, { code: "body_too_large" });
  if (declared > max) throw tooLarge();
  const parts: Uint8Array[] = [];
  let total = 0;
  if (req.body) {
    for await (const part of req.body) {
      total += part.length;
      if (total > max) throw tooLarge();
      parts.push(part);
    }
  }
  const bytes = new Uint8Array(total);
  let at = 0;
  for (const p of parts) {
    bytes.set(p, at);
    at += p.length;
  }
  try {
    return JSON.parse(new TextDecoder().decode(bytes));
  } catch (e) {
    throw new ApiError(400, `the request body is not valid JSON: ${(e as Error).message}`, {
      code: "invalid_json",
    });
  }
}

/** Starts serving `session`. */
export function startServer(session: Session, opts: ServeOptions = {}): SluiceServer {
  const log = opts.log ?? ((line: string) => console.error(line));
  const maxBody = opts.maxBodyBytes ?? 4 * 2 ** 20;
  const keepAliveMs = opts.keepAliveMs ?? 10_000;
  const queue = new RequestQueue(opts.queueSize ?? 8);
  const live = new LiveStats(session, () => queue.waiting);
  const id = modelId(session);
  const created = Math.floor(Date.now() / 1000);
  const ctx = session.model.maxContext;
  const uiHtml = Deno.readTextFileSync(UI_HTML);
  const chatHtml = Deno.readTextFileSync(CHAT_HTML);
  const liveJs = Deno.readTextFileSync(LIVE_JS);
  const streams = new Set<AbortController>();
  let seq = 0;

  // Anthropic's clients send the key as x-api-key.
  const authorised = (req: Request) =>
    !opts.apiKey || req.headers.get("authorization") === `Bearer ${opts.apiKey}` ||
    req.headers.get("x-api-key") === opts.apiKey;

  /**
   * Prompt ids of a request (`planned` for a chat, rendered by chat_plan.ts), checked against the
   * vocabulary and the context.
   */
  const promptIds = (r: CompletionRequest, planned?: number[]): number[] => {
    let ids: number[];
    if (planned) ids = planned;
    else if (typeof r.prompt === "string") {
      ids = session.tokenize(r.prompt);
    } else {
      ids = r.prompt ?? [];
      const vocab = session.model.cfg.vocabSize;
      const badId = ids.find((x) => x >= vocab);
      if (badId !== undefined) {
        throw new ApiError(
          400,
          `prompt: token id ${badId} is outside the vocabulary [0, ${vocab})`,
          {
            param: "prompt",
          },
        );
      }
    }
    if (ids.length === 0) throw new ApiError(400, "the prompt has no tokens", { param: "prompt" });
    if (ids.length >= ctx) {
      throw new ApiError(
        400,
        `the prompt has ${ids.length} tokens; the context holds ${ctx} (start the server with a larger --ctx)`,
        { param: r.messages ? "messages" : "prompt", code: "context_length_exceeded" },
      );
    }
    return ids;
  };

  /** Runs one generation, sending text as it becomes final. */
  const generate = async (
    endpoint: string,
    ids: number[],
    r: CompletionRequest,
    signal: AbortSignal,
    send: (text: string) => void,
    extras: EngineExtras = {},
    seedOffset = 0,
  ): Promise<GenerationEnd> => {
    const maxTokens = Math.min(r.maxTokens ?? ctx, ctx - ids.length);
    const stop = new StopMatcher([...r.stop, ...(extras.stops ?? [])]);
    const cur = {
      id: `req-${++seq}`,
      endpoint,
      phase: "prefill" as "prefill" | "decode",
      promptTokens: ids.length,
      cachedTokens: 0,
      prefilled: 0,
      generated: 0,
      maxTokens,
      startedMs: Date.now(),
    };
    live.current = cur;
    let n = 0;
    try {
      const tokens = session.generate(ids, {
        maxTokens,
        temperature: r.temperature,
        topP: r.topP,
        topK: r.topK,
        minP: r.minP,
        // The choices of n > 1 differ; each is still reproducible from the request's seed.
        seed: r.seed === undefined ? undefined : (r.seed + seedOffset) >>> 0,
        frequencyPenalty: r.frequencyPenalty,
        presencePenalty: r.presencePenalty,
        repetitionPenalty: r.repetitionPenalty,
        ignoreEos: r.ignoreEos,
        keepSpecial: extras.keepSpecial,
        constraint: extras.constraint,
        logprobs: extras.logprobs,
        signal,
        onPrefill: async (done) => {
          cur.cachedTokens = session.timings.cachedTokens;
          cur.prefilled = done - cur.cachedTokens;
          await tick();
        },
      });
      for await (const tok of tokens) {
        n++;
        cur.phase = "decode";
        cur.generated = n;
        extras.onToken?.(tok);
        const text = stop.push(tok.text);
        if (text) send(text);
        if (stop.stopped) break;
        await tick();
      }
      if (!stop.stopped) {
        const rest = stop.flush();
        if (rest) send(rest);
      }
    } finally {
      live.current = null;
      const t = session.timings;
      live.totals.requests++;
      live.totals.promptTokens += ids.length;
      live.totals.cachedTokens += t.cachedTokens;
      live.totals.generatedTokens += n;
      live.lastTokPerS = t.generateMs > 0 ? (t.generatedTokens * 1000) / t.generateMs : 0;
      if (signal.aborted) live.totals.cancelled++;
    }
    const t = session.timings;
    const finish: GenerationEnd["finish"] = !stop.stopped && n >= maxTokens ? "length" : "stop";
    log(
      `sluice serve: ${cur.id} ${endpoint} ${signal.aborted ? "cancelled" : finish}: prompt ` +
        `${ids.length} tokens (${t.cachedTokens} cached), ${n} generated, ` +
        `${live.lastTokPerS.toFixed(1)} tok/s`,
    );
    return {
      finish,
      stopString: stop.matched,
      usage: {
        prompt_tokens: ids.length,
        completion_tokens: n,
        total_tokens: ids.length + n,
        prompt_tokens_details: { cached_tokens: t.cachedTokens },
      },
    };
  };

  /** An SSE response fed by `produce` once the queue lets it run; errors become an event. */
  const sse = (
    abort: AbortController,
    produce: (write: (s: string) => void) => Promise<void>,
    errorEvent = (e: ApiError) => `data: ${JSON.stringify(e.body())}\n\n`,
  ): Response => {
    if (queue.busy && queue.waiting >= queue.capacity) throw new QueueFull(queue.waiting);
    const enc = new TextEncoder();
    streams.add(abort);
    const body = new ReadableStream<Uint8Array>({
      start: (controller) => {
        let last = Date.now();
        let open = true;
        const write = (s: string) => {
          if (!open) return;
          try {
            controller.enqueue(enc.encode(s));
            last = Date.now();
          } catch {
            open = false;
            abort.abort();
          }
        };
        // SSE comments while queued or in a long prefill keep proxies and clients from timing out.
        const keepAlive = setInterval(() => {
          if (Date.now() - last >= keepAliveMs) write(": keep-alive\n\n");
        }, Math.max(1, Math.min(keepAliveMs, 1000)));
        write(": queued\n\n");
        queue.run(() => produce(write), abort.signal)
          .catch((e) => {
            if (!(e instanceof Abandoned)) write(errorEvent(errorResponse(e)));
          })
          .finally(() => {
            clearInterval(keepAlive);
            streams.delete(abort);
            if (open) {
              open = false;
              try {
                controller.close();
              } catch {
                // The client already cancelled the stream.
              }
            }
          });
      },
      cancel: () => abort.abort(),
    });
    return new Response(body, {
      headers: {
        "content-type": "text/event-stream",
        "cache-control": "no-cache",
        connection: "keep-alive",
        ...CORS,
      },
    });
  };

  /** An abort controller that fires when the client of `req` goes away. */
  const abortOn = (req: Request): AbortController => {
    const abort = new AbortController();
    // deno.json opts in to "no-legacy-abort", so the signal aborts on a disconnect only, not once
    // the response is delivered.
    req.signal.addEventListener("abort", () => abort.abort(), { once: true });
    return abort;
  };

  const complete = async (req: Request, chat: boolean): Promise<Response> => {
    const r = parseCompletion(await readJson(req, maxBody), chat);
    checkModel(r.model);
    const abort = abortOn(req);
    const endpoint = chat ? "chat.completions" : "completions";
    const answer = await completionResponse({
      session,
      r,
      id,
      promptIds,
      generate: (ids, signal, send, extras, index) =>
        generate(endpoint, ids, r, signal, send, extras, index),
      maskStats: live.maskStats,
    });
    if (!r.stream) {
      return json(await queue.run(() => answer.whole(abort.signal), abort.signal));
    }
    return sse(abort, (write) => answer.stream(abort.signal, write));
  };

  /** `POST /v1/messages` (Anthropic), answering errors in Anthropic's shape. */
  const messages = async (req: Request, counting: boolean): Promise<Response> => {
    try {
      const r = parseMessages(await readJson(req, maxBody), counting);
      if (counting) return json(countTokens(session, r));
      const abort = abortOn(req);
      const answer = await messagesResponse({
        session,
        r,
        id,
        checkIds: promptIds,
        generate: (ids, signal, send, extras) => generate("messages", ids, r, signal, send, extras),
        maskStats: live.maskStats,
      });
      if (!r.stream) {
        return json(await queue.run(() => answer.whole(abort.signal), abort.signal));
      }
      return sse(
        abort,
        (write) => answer.stream(abort.signal, write),
        (e) => `event: error\ndata: ${JSON.stringify(anthropicError(e).body())}\n\n`,
      );
    } catch (e) {
      throw anthropicError(errorResponse(e));
    }
  };

  const checkModel = (model: string | null) => {
    if (model !== null && model !== id) {
      throw new ApiError(404, `the model "${model}" does not exist; this server serves "${id}"`, {
        param: "model",
        code: "model_not_found",
      });
    }
  };

  const route = async (req: Request): Promise<Response> => {
    const url = new URL(req.url);
    const path = url.pathname.replace(/\/+$/, "") || "/";
    const method = req.method;
    if (method === "OPTIONS") return new Response(null, { status: 204, headers: CORS });
    const open = ["/", "/health", "/ui", "/ui/state", "/ui/live.js", "/favicon.ico"].includes(path);
    if (!open && !authorised(req)) {
      throw new ApiError(401, "missing or wrong API key (send Authorization: Bearer <key>)", {
        type: "authentication_error",
        code: "invalid_api_key",
      });
    }
    const get = method === "GET" || method === "HEAD";
    const post = method === "POST";
    const wrongMethod = (allowed: string) =>
      new ApiError(405, `${path} accepts ${allowed}, not ${method}`, {
        code: "method_not_allowed",
      });
    switch (path) {
      case "/":
      case "/ui":
        if (!get) throw wrongMethod("GET");
        return new Response(path === "/" ? chatHtml : uiHtml, {
          headers: { "content-type": "text/html; charset=utf-8" },
        });
      case "/ui/live.js":
        if (!get) throw wrongMethod("GET");
        return new Response(liveJs, {
          headers: { "content-type": "text/javascript; charset=utf-8" },
        });
      case "/favicon.ico":
        return new Response(null, { status: 204 });
      case "/ui/state":
        if (!get) throw wrongMethod("GET");
        return json(live.snapshot());
      case "/health":
        if (!get) throw wrongMethod("GET");
        return json({ status: "ok", model: id, busy: queue.busy, queue_depth: queue.waiting });
      case "/metrics":
        if (!get) throw wrongMethod("GET");
        return new Response(live.prometheus(), {
          headers: { "content-type": "text/plain; version=0.0.4; charset=utf-8" },
        });
      case "/v1/models":
        if (!get) throw wrongMethod("GET");
        return json({ object: "list", data: [modelEntry()] });
      case "/v1/chat/completions":
      case "/v1/completions":
        if (!post) throw wrongMethod("POST");
        return await complete(req, path === "/v1/chat/completions");
      case "/v1/messages":
      case "/v1/messages/count_tokens":
        if (!post) throw wrongMethod("POST");
        return await messages(req, path.endsWith("/count_tokens"));
      case "/tokenize": {
        if (!post) throw wrongMethod("POST");
        const b = await readJson(req, maxBody) as { content?: unknown; add_special?: unknown };
        if (typeof b?.content !== "string") {
          throw new ApiError(400, "content: expected a string", { param: "content" });
        }
        const addSpecial = b.add_special === undefined ? true : b.add_special === true;
        return json({ tokens: session.tokenizer.encode(b.content, { addSpecial }) });
      }
      case "/detokenize": {
        if (!post) throw wrongMethod("POST");
        const b = await readJson(req, maxBody) as { tokens?: unknown };
        const vocab = session.model.cfg.vocabSize;
        const ok = Array.isArray(b?.tokens) &&
          b.tokens.every((t) => Number.isInteger(t) && t >= 0 && t < vocab);
        if (!ok) {
          throw new ApiError(400, `tokens: expected an array of ids in [0, ${vocab})`, {
            param: "tokens",
          });
        }
        return json({ content: session.detokenize(b.tokens as number[]) });
      }
    }
    if (path.startsWith("/v1/models/")) {
      const name = decodeURIComponent(path.slice("/v1/models/".length));
      if (name === id) return json(modelEntry());
      throw new ApiError(404, `the model "${name}" does not exist; this server serves "${id}"`, {
        param: "model",
        code: "model_not_found",
      });
    }
    throw new ApiError(404, `no such endpoint: ${method} ${path}`, { code: "not_found" });
  };

  const modelEntry = () => ({
    id,
    object: "model",
    created,
    owned_by: "sluice",
    context_length: ctx,
  });

  const server = Deno.serve({
    hostname: opts.host ?? "127.0.0.1",
    port: opts.port ?? 8080,
    onListen: () => {},
    onError: (e) => {
      const err = errorResponse(e);
      log(`sluice serve: ${err.message}`);
      return json(err.body(), err.status, err.headers);
    },
  }, async (req) => {
    try {
      return await route(req);
    } catch (e) {
      const err = errorResponse(e);
      if (err.status >= 500) log(`sluice serve: ${req.method} ${req.url}: ${err.message}`);
      live.totals.errors++;
      return json(err.body(), err.status, err.headers);
    }
  });
  const addr = server.addr as Deno.NetAddr;
  const host = addr.hostname.includes(":") ? `[${addr.hostname}]` : addr.hostname;
  return {
    url: `http://${host}:${addr.port}`,
    live,
    close: async () => {
      for (const s of streams) s.abort();
      live.close();
      await server.shutdown();
    },
  };
}
