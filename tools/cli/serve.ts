/**
 * `mod.ts serve`: the OpenAI-compatible server (tools/serve/server.ts) on one model, until
 * Ctrl-C.
 *
 * @module
 */
import { parseBytes } from "../../engine/units.ts";
import { startWorkerServer } from "../serve/front.ts";
import {
  HELP_FLAG,
  helpShown,
  MODEL_FLAG,
  PARALLEL_FLAG,
  parallelFromArgs,
  parseCommandArgs,
} from "./args.ts";
import {
  CHAT_TEMPLATE_FLAG,
  CHAT_TEMPLATE_HELP,
  RUN_FLAGS,
  RUN_HELP,
  runOptionsFromArgs,
  sessionSpec,
} from "./run_flags.ts";
import { SPEC_FLAGS, SPEC_HELP, specFromArgs } from "./spec_flags.ts";

const HELP = `sluice serve — an OpenAI-compatible server for one .sluice container

Usage:
  deno run -A mod.ts serve --model X.sluice [--host 127.0.0.1] [--port 8080] [--api-key KEY]...

Endpoints:
  POST /v1/chat/completions   POST /v1/completions   GET /v1/models   GET /health
  POST /v1/messages (Anthropic)   POST /v1/messages/count_tokens
  GET /metrics (Prometheus)   POST /tokenize   POST /detokenize
  GET / (chat page)   GET /ui (live view)

Chat completions take tools (tool_choice auto/none/required/named), response_format json_object
and json_schema (sampling is constrained so the output matches), logprobs, n, and
chat_template_kwargs / enable_thinking / reasoning_effort; reasoning comes back as
reasoning_content. Tool calls are read in the template's own format: Qwen/Hermes, Qwen3-Coder
and Qwen3.5, GLM, Kimi-K2, DeepSeek V3/V3.1/V3.2/V4, MiniMax-M2, gpt-oss harmony.

Server:
  -m, --model PATH      container made by 'mod.ts pack' (default: the synthetic demo model)
  --host ADDR           interface to listen on (default 127.0.0.1)
  --port N              port (default 8080; 0 picks a free one)
  --api-key KEY         require "Authorization: Bearer KEY" (env SLUICE_API_KEY); /health and
                        the live view (/ui, which shows counts, never text) stay open. Give it
                        once per user: each key reuses only prompt prefixes cached for its own
                        requests, so no user learns from cached_tokens or timing what another
                        sent
  --cache-ram SIZE      saved prompt prefixes kept beside the live KV cache, split evenly
                        between the keys (default 256M; 0: only the live cache)
  --cors ORIGIN[,ORIGIN]  let pages from these origins (https://app.example) call the server
                        from a browser; none by default ("*": any, only with --api-key)
  --allow-host NAME[,NAME]  accept these names in the Host header besides the --host name, IP
                        addresses and localhost; others get 421, which stops DNS
                        rebinding ("*": any)
  -np, --parallel N     requests that generate at once, their passes batched so each expert
                        is read once per pass for all of them; each holds its own KV cache
                        (default auto: up to 4, as the budget has room, see plan --parallel;
                        1 with --draft, whose drafts run only for a lone sequence; --spec
                        drafts on every sequence)
  --queue N             requests that may wait behind the running ones (default 8); more get 429
  --max-body SIZE       largest request body, e.g. 512K, 16M (default 4M); a body must
                        arrive within 60 s
  --keep-alive S        seconds of silence before a stream gets an SSE comment (default 10)
${CHAT_TEMPLATE_HELP}

The model runs in a worker thread, so /health, /metrics, the pages, new connections and
cancellations are answered at once while it computes; if that worker fails, the requests in
flight get 500 and the server exits with status 1.

Up to --parallel requests run at once: each pass holds a token of every decoding request and
prompt chunks of new ones, and each request's output is what it would be alone. The KV cache of
a request is kept: a request that extends a cached prefix of the same user (the next turn of a
chat) only runs its new tokens (usage.prompt_tokens_details). Up to 4 prefixes per user (several conversations) are kept as
copies within --cache-ram and matched by longest common prefix; the least recently used goes first.

Speculative decoding (drafted, accepted and tokens per pass in /metrics):
${SPEC_HELP}

Memory and I/O (none of these change the output):
${RUN_HELP}

  -h, --help            this text
`;

/** Runs the serve command; returns the exit code when the server stops. */
export async function serveCommand(args: string[]): Promise<number> {
  const a = parseCommandArgs("serve", args, {
    ...MODEL_FLAG,
    host: { type: "string" },
    port: { type: "string" },
    "api-key": { type: "string", multiple: true },
    "cache-ram": { type: "string" },
    cors: { type: "string" },
    "allow-host": { type: "string" },
    queue: { type: "string" },
    ...PARALLEL_FLAG,
    "max-body": { type: "string" },
    "keep-alive": { type: "string" },
    ...CHAT_TEMPLATE_FLAG,
    ...RUN_FLAGS,
    ...SPEC_FLAGS,
    quiet: { type: "boolean" },
    ...HELP_FLAG,
  });
  if (helpShown(a, HELP)) return 0;
  const list = (v: string | undefined) => v?.split(",").map((s) => s.trim()).filter(Boolean);
  const quiet = a.bool("quiet");
  const keepAlive = a.num("keep-alive");
  const maxBody = a.str("max-body");
  const cacheRam = a.str("cache-ram");
  const envKey = Deno.env.get("SLUICE_API_KEY");
  const keys = a.all("api-key").length > 0 ? a.all("api-key") : envKey ? [envKey] : [];
  const options = {
    host: a.str("host"),
    port: a.int("port"),
    apiKey: keys.length > 0 ? keys : undefined,
    cacheBytes: cacheRam === undefined ? undefined : parseBytes(cacheRam),
    cors: list(a.str("cors")),
    allowHosts: list(a.str("allow-host")),
    queueSize: a.int("queue"),
    maxBodyBytes: maxBody === undefined ? undefined : parseBytes(maxBody),
    keepAliveMs: keepAlive === undefined ? undefined : keepAlive * 1000,
    log: quiet ? () => {} : undefined,
  };
  if (options.cors?.includes("*") && !options.apiKey) {
    throw new Error(`--cors "*" lets every web page use the server: give --api-key too`);
  }
  const specOptions = specFromArgs(a);
  const run = {
    ...runOptionsFromArgs(a),
    parallel: parallelFromArgs(a) ?? (specOptions?.draft !== undefined ? 1 : "auto" as const),
    spec: specOptions,
  };
  const spec = { ...await sessionSpec(a, run, quiet), chatTemplate: a.str("chat-template") };
  const server = await startWorkerServer(spec, options);
  if (server.notice && !quiet) console.error(`sluice serve: ${server.notice}`);
  console.error(
    `sluice serve: listening on ${server.url} (chat ${server.url}/, live view ${server.url}/ui)`,
  );
  const host = options.host ?? "127.0.0.1";
  if (!options.apiKey && !["127.0.0.1", "localhost", "::1"].includes(host)) {
    console.error(
      `sluice serve: warning: listening on ${host} without --api-key: anyone who can reach it can use it`,
    );
  }
  const { promise, resolve } = Promise.withResolvers<void>();
  const stop = () => resolve();
  Deno.addSignalListener("SIGINT", stop);
  Deno.addSignalListener("SIGTERM", stop);
  // A dead engine is an error exit, so a supervisor restarts the server.
  const failed = await Promise.race([promise.then(() => null), server.failed]);
  Deno.removeSignalListener("SIGINT", stop);
  Deno.removeSignalListener("SIGTERM", stop);
  console.error(failed ? "sluice serve: stopping: the engine failed" : "sluice serve: stopping");
  await server.close();
  return failed ? 1 : 0;
}
