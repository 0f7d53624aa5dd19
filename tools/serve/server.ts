/**
 * The OpenAI-compatible HTTP server on Deno's own `Deno.serve`: chat and text completions (JSON
 * or SSE), models, tokenize/detokenize, health, Prometheus metrics and the live view. One model:
 * up to its `parallel` requests generate at once, their forward passes batched
 * (tools/serve/batcher.ts), the rest queue (bounded). Each API key is one user with its own cached
 * prompt prefixes (engine/prefix_cache.ts), so a conversation only runs its new tokens and no
 * user's request reuses (or times, or counts) what another user sent. A client that goes away
 * cancels its generation at the next token.
 *
 * @module
 */
import { setImmediate } from "node:timers";
import { MAX_TOKEN_BYTES } from "../../engine/chat.ts";
import { PrefixCache } from "../../engine/prefix_cache.ts";
import type { Session } from "../../engine/session.ts";
import { LiveStats, modelId } from "./live.ts";
import { ApiError, type CompletionRequest, parseCompletion, StopMatcher } from "./openai.ts";
import type { EngineExtras, GenerationEnd } from "./chat_run.ts";
import { completionResponse } from "./completions.ts";
import { anthropicError, countTokens, messagesResponse, parseMessages } from "./anthropic.ts";
import { Abandoned, QueueFull } from "./queue.ts";
import { Batcher } from "./batcher.ts";
import { Gate, methodNotAllowed } from "./gate.ts";
import { DEFAULT_MAX_BODY_BYTES, json, listen, readBody } from "./listen.ts";

/** Server settings. */
export interface ServeOptions {
  /** Interface to listen on (default 127.0.0.1). */
  host?: string;
  /** Port (default 8080; 0 picks a free one). */
  port?: number;
  /**
   * When set, /v1/*, /tokenize, /detokenize and /metrics need `Authorization: Bearer <key>` (or
   * Anthropic's `x-api-key: <key>`). Several keys are several users: each reuses only the prompt
   * prefixes cached for its own requests (with no key, everyone is one user).
   */
  apiKey?: string | readonly string[];
  /**
   * Bytes of saved prompt prefixes (beside the live KV cache) kept for all users together, split
   * evenly between the keys (default 256 MiB; 0 keeps only the live cache).
   */
  cacheBytes?: number;
  /**
   * Origins (`https://app.example`) whose pages may call the server from a browser (CORS). None by
   * default: no CORS header is sent, so another site's page cannot read any answer.
   */
  cors?: string[];
  /**
   * Host names accepted in the Host header besides the bound address, `--host`'s name, IP
   * literals and `localhost`; `"*"` accepts any. Refusing other names
   * stops DNS rebinding, where a hostile name resolves to this server's address.
   */
  allowHosts?: string[];
  /**
   * Requests that may wait behind the running ones (default 8); up to the session's `parallel`
   * run at once, their passes batched (tools/serve/batcher.ts).
   */
  queueSize?: number;
  /** Largest request body in bytes (default 4 MiB). */
  maxBodyBytes?: number;
  /** Idle time after which a stream gets an SSE comment to keep proxies from closing it. */
  keepAliveMs?: number;
  /** One line per request and at start-up (default: stderr). */
  log?: (line: string) => void;
  /** Most ms {@link SluiceServer.close} waits for connections to finish (default 10 s). */
  drainMs?: number;
}

/** A running server. */
export interface SluiceServer {
  /** `http://host:port`. */
  url: string;
  live: LiveStats;
  /**
   * Stops listening and stops every request: a stream ends with an error event, a request not
   * yet answered gets 503. Waits for the connections to finish, at most `drainMs`.
   */
  close(): Promise<void>;
}

/** Default bytes of saved prompt prefixes (ServeOptions.cacheBytes). */
export const DEFAULT_CACHE_BYTES = 256 * 2 ** 20;

/** When {@link tick} last yielded through a timer. */
let timerYieldAt = 0;

/**
 * Yields to the event loop so other requests, timers, disconnects and stream writes are seen.
 * setImmediate costs microseconds where a zero timeout costs a millisecond or more, but one
 * immediate turn is not enough for Deno.serve to answer a request: with it alone, /health waited
 * for the whole prefill (3.5 s for 1968 tokens on the demo model at load 16). So at most every
 * {@link TIMER_YIELD_MS} the yield is a zero timeout, which lets waiting requests through.
 */
function tick(): Promise<void> {
  const now = performance.now();
  if (now - timerYieldAt < TIMER_YIELD_MS) return new Promise((r) => setImmediate(r));
  timerYieldAt = now;
  return new Promise((r) => setTimeout(r, 0));
}

/**
 * Most ms between yields that let other requests through (see {@link tick}): a timer yield costs
 * a millisecond or more (more on a loaded machine, where the process may lose its core), so the
 * server JSON ÷ direct decode ratio of `bench serve` fell to 0.84–0.90 at 50 ms between them.
 */
const TIMER_YIELD_MS = 100;

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
  // Only JSON: a browser sends text/plain and form bodies cross-site without asking (no CORS
  // preflight), so accepting them would let any page drive the server.
  const type = (req.headers.get("content-type") ?? "").split(";")[0].trim().toLowerCase();
  if (type !== "application/json") {
    throw new ApiError(
      415,
      `the request body must be JSON sent as Content-Type: application/json, not ${
        type ? JSON.stringify(type) : "without a Content-Type"
      }`,
      { code: "unsupported_media_type" },
    );
  }
  const bytes = await readBody(req, max);
  try {
    return JSON.parse(new TextDecoder().decode(bytes));
  } catch (e) {
    throw new ApiError(400, `the request body is not valid JSON: ${(e as Error).message}`, {
      code: "invalid_json",
    });
  }
}

/**
 * The server's request handling without a listener: what {@link startServer} puts on a port, and
 * what the engine worker of the worker server (./back.ts) runs for the front (./front.ts).
 */
export interface ServerHandler {
  /** Answers one request; errors become OpenAI-shaped answers, never a stack trace. */
  handle(req: Request): Promise<Response>;
  live: LiveStats;
  /** The body of `GET /health`. */
  health(): Record<string, unknown>;
  /**
   * Stops every request and the live stats: a stream ends with an error event, a request not
   * yet answered gets 503.
   */
  stop(): void;
}

/** The request handling of a server on `session` (see {@link startServer}). */
export function serverHandler(session: Session, opts: ServeOptions = {}): ServerHandler {
  const log = opts.log ?? ((line: string) => console.error(line));
  const maxBody = opts.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES;
  const keepAliveMs = opts.keepAliveMs ?? 10_000;
  const gate = new Gate(opts);
  const prefixes = new PrefixCache(session, {
    ownerBytes: Math.floor((opts.cacheBytes ?? DEFAULT_CACHE_BYTES) / Math.max(1, gate.users)),
    // The next user's request must not spend the time of copying another user's cache.
    saveEagerly: gate.users > 1,
  });
  const batcher = new Batcher(session, prefixes, opts.queueSize ?? 8);
  const queue = batcher.queue;
  const live = new LiveStats(session, () => queue.waiting, prefixes, batcher.batch);
  const id = modelId(session);
  const created = Math.floor(Date.now() / 1000);
  const ctx = session.model.maxContext;
  /** Every request in flight (queued or running), stopped by close(). */
  const active = new Set<AbortController>();
  let closing = false;
  const shutdownError = () =>
    new ApiError(503, "the server is shutting down; the request was stopped before it finished", {
      code: "server_shutdown",
    });
  let seq = 0;

  /**
   * Prompt ids of a request (`planned` for a chat, rendered by chat_plan.ts), checked against the
   * vocabulary and the context.
   */
  const promptIds = (r: CompletionRequest, planned?: number[]): number[] => {
    let ids: number[];
    if (planned) ids = planned;
    else if (typeof r.prompt === "string") {
      // Text that cannot fit is refused before the tokenizer spends time on it.
      if (r.prompt.length > ctx * MAX_TOKEN_BYTES) {
        throw new ApiError(
          400,
          `prompt: ${r.prompt.length} characters cannot fit the context of ${ctx} tokens (at ` +
            `most ${ctx * MAX_TOKEN_BYTES}, ${MAX_TOKEN_BYTES} per token)`,
          { param: "prompt", code: "context_length_exceeded" },
        );
      }
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
    if (ids.length === 0) {
      throw planned
        ? new ApiError(400, "messages: the model's chat template rendered an empty prompt", {
          param: "messages",
        })
        : new ApiError(400, "the prompt has no tokens", { param: "prompt" });
    }
    if (ids.length >= ctx) {
      throw new ApiError(
        400,
        `the prompt has ${ids.length} tokens; the context holds ${ctx} (start the server with a larger --ctx)`,
        { param: r.messages ? "messages" : "prompt", code: "context_length_exceeded" },
      );
    }
    return ids;
  };

  /** Runs one generation of `user`, sending text as it becomes final. */
  const generate = async (
    user: string,
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
    live.running.add(cur);
    // A turn of the event loop before the first pass, so a stream's head goes out first: then a
    // client that goes away during the prefill is seen (and flagged to the engine, in the worker
    // server) while the pass runs.
    await tick();
    let n = 0;
    const generation = batcher.generate(user, ids, {
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
        cur.cachedTokens = generation.timings.cachedTokens;
        cur.prefilled = done - cur.cachedTokens;
        await tick();
      },
    });
    try {
      for await (const tok of generation.tokens) {
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
      live.running.delete(cur);
      const t = generation.timings;
      live.totals.requests++;
      live.totals.promptTokens += ids.length;
      live.totals.cachedTokens += t.cachedTokens;
      live.totals.generatedTokens += n;
      live.lastTokPerS = t.generateMs > 0 ? (t.generatedTokens * 1000) / t.generateMs : 0;
      if (signal.aborted) live.totals.cancelled++;
    }
    const t = generation.timings;
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

  /** The whole answer of a request that is not streamed; a shutdown answers 503 instead. */
  const whole = async <T>(abort: AbortController, run: () => Promise<T>): Promise<Response> => {
    active.add(abort);
    try {
      const answer = await batcher.run(run, abort.signal);
      // A stopped answer is never passed off as complete.
      if (closing && abort.signal.aborted) throw shutdownError();
      return json(answer);
    } catch (e) {
      throw closing ? shutdownError() : e;
    } finally {
      active.delete(abort);
    }
  };

  /** An SSE response fed by `produce` once the queue lets it run; errors become an event. */
  const sse = (
    abort: AbortController,
    produce: (write: (s: string) => void) => Promise<void>,
    errorEvent = (e: ApiError) => `data: ${JSON.stringify(e.body())}\n\n`,
  ): Response => {
    if (queue.busy && queue.waiting >= queue.capacity) throw new QueueFull(queue.waiting);
    const enc = new TextEncoder();
    active.add(abort);
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
        // Stopped by a shutdown: an error event, never the end of a complete answer.
        const stopped = () => closing && abort.signal.aborted;
        batcher.run(() => produce((s) => stopped() || write(s)), abort.signal)
          .then(() => {
            if (stopped()) write(errorEvent(shutdownError()));
          })
          .catch((e) => {
            if (closing) write(errorEvent(shutdownError()));
            else if (!(e instanceof Abandoned)) write(errorEvent(errorResponse(e)));
          })
          .finally(() => {
            clearInterval(keepAlive);
            active.delete(abort);
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
      },
    });
  };

  /** An abort controller that fires when the client of `req` goes away (or the server closes). */
  const abortOn = (req: Request): AbortController => {
    if (closing) throw shutdownError();
    const abort = new AbortController();
    // deno.json opts in to "no-legacy-abort", so the signal aborts on a disconnect only, not once
    // the response is delivered.
    req.signal.addEventListener("abort", () => abort.abort(), { once: true });
    return abort;
  };

  const complete = async (req: Request, user: string, chat: boolean): Promise<Response> => {
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
        generate(user, endpoint, ids, r, signal, send, extras, index),
      maskStats: live.maskStats,
      caches: prefixes.prefixes(user),
    });
    if (!r.stream) return await whole(abort, () => answer.whole(abort.signal));
    return sse(abort, (write) => answer.stream(abort.signal, write));
  };

  /** `POST /v1/messages` (Anthropic), answering errors in Anthropic's shape. */
  const messages = async (req: Request, user: string, counting: boolean): Promise<Response> => {
    try {
      const r = parseMessages(await readJson(req, maxBody), counting);
      if (counting) return json(countTokens(session, r, prefixes.prefixes(user)));
      const abort = abortOn(req);
      const answer = await messagesResponse({
        session,
        r,
        id,
        checkIds: promptIds,
        generate: (ids, signal, send, extras) =>
          generate(user, "messages", ids, r, signal, send, extras),
        maskStats: live.maskStats,
        caches: prefixes.prefixes(user),
      });
      if (!r.stream) return await whole(abort, () => answer.whole(abort.signal));
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
    const admitted = gate.admit(req);
    if (admitted instanceof Response) return admitted;
    const { path, user } = admitted;
    const method = req.method;
    const page = gate.page(path, method);
    if (page) return page;
    const get = method === "GET" || method === "HEAD";
    const post = method === "POST";
    const wrongMethod = (allowed: string) => methodNotAllowed(path, method, allowed);
    switch (path) {
      case "/ui/state":
        if (!get) throw wrongMethod("GET");
        return json(live.snapshot());
      case "/health":
        if (!get) throw wrongMethod("GET");
        return json(health());
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
        return await complete(req, user, path === "/v1/chat/completions");
      case "/v1/messages":
      case "/v1/messages/count_tokens":
        if (!post) throw wrongMethod("POST");
        return await messages(req, user, path.endsWith("/count_tokens"));
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

  const health = () => ({
    status: "ok",
    model: id,
    busy: queue.busy,
    queue_depth: queue.waiting,
  });

  return {
    live,
    health,
    handle: async (req) => {
      let res: Response;
      try {
        res = await route(req);
      } catch (e) {
        const err = errorResponse(e);
        if (err.status >= 500) log(`sluice serve: ${req.method} ${req.url}: ${err.message}`);
        live.totals.errors++;
        res = json(err.body(), err.status, err.headers);
      }
      for (const [k, v] of Object.entries(gate.cors(req))) res.headers.set(k, v);
      return res;
    },
    stop: () => {
      closing = true;
      for (const a of active) a.abort();
      live.close();
    },
  };
}

/**
 * Starts serving `session` on this thread: a forward pass holds the event loop, so other
 * requests are answered between prefill chunks and tokens. `mod.ts serve` runs the engine in a
 * worker instead (./front.ts), which answers them at once.
 */
export function startServer(session: Session, opts: ServeOptions = {}): SluiceServer {
  const handler = serverHandler(session, opts);
  const log = opts.log ?? ((line: string) => console.error(line));
  const listener = listen(opts, handler.handle, log);
  return {
    url: listener.url,
    live: handler.live,
    close: async () => {
      handler.stop();
      await listener.shutdown();
    },
  };
}
