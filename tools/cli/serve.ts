/**
 * `mod.ts serve`: the OpenAI-compatible server (tools/serve/server.ts) on one model, until
 * Ctrl-C.
 *
 * @module
 */
import { parseArgs } from "node:util";
import { Session } from "../../engine/session.ts";
import { startServer } from "../serve/server.ts";
import { intFlag, modelPath, RUN_FLAGS, RUN_HELP, runOptions } from "./run_flags.ts";

const HELP = `sluice serve — an OpenAI-compatible server for one .sluice container

Usage:
  deno run -A mod.ts serve --model X.sluice [--host 127.0.0.1] [--port 8080] [--api-key KEY]

Endpoints:
  POST /v1/chat/completions   POST /v1/completions   GET /v1/models   GET /health
  GET /metrics (Prometheus)   POST /tokenize   POST /detokenize   GET /ui (live view)

Server:
  --model PATH          container made by 'deno task pack' (default: the synthetic demo model)
  --host ADDR           interface to listen on (default 127.0.0.1)
  --port N              port (default 8080; 0 picks a free one)
  --api-key KEY         require "Authorization: Bearer KEY" (env SLUICE_API_KEY); /health and
                        the live view (/ui, which shows counts, never text) stay open
  --queue N             requests that may wait behind the running one (default 8); more get 429
  --max-body SIZE       largest request body in bytes (default 4194304)
  --keep-alive S        seconds of silence before a stream gets an SSE comment (default 10)

Requests run one at a time. Each keeps the KV cache of its prompt: a request that extends the
previous one (the next turn of a chat) only runs its new tokens (usage.prompt_tokens_details).

Memory and I/O (none of these change the output):
${RUN_HELP}

  -h, --help            this text
`;

/** Runs the serve command; returns the exit code when the server stops. */
export async function serveCommand(args: string[]): Promise<number> {
  const { values: v } = parseArgs({
    args,
    options: {
      model: { type: "string" },
      host: { type: "string" },
      port: { type: "string" },
      "api-key": { type: "string" },
      queue: { type: "string" },
      "max-body": { type: "string" },
      "keep-alive": { type: "string" },
      ...RUN_FLAGS,
      quiet: { type: "boolean" },
      help: { type: "boolean", short: "h" },
    },
    strict: true,
  });
  if (v.help) {
    console.log(HELP);
    return 0;
  }
  const run = runOptions(v, Boolean(v.quiet));
  const session = await Session.open(await modelPath(v.model, Boolean(v.quiet)), run);
  const keepAlive = intFlag("keep-alive", v["keep-alive"]);
  const server = startServer(session, {
    host: v.host,
    port: intFlag("port", v.port),
    apiKey: v["api-key"] ?? Deno.env.get("SLUICE_API_KEY"),
    queueSize: intFlag("queue", v.queue),
    maxBodyBytes: intFlag("max-body", v["max-body"]),
    keepAliveMs: keepAlive === undefined ? undefined : keepAlive * 1000,
    log: v.quiet ? () => {} : undefined,
  });
  console.error(`sluice serve: listening on ${server.url} (live view ${server.url}/ui)`);
  const { promise, resolve } = Promise.withResolvers<void>();
  const stop = () => resolve();
  Deno.addSignalListener("SIGINT", stop);
  Deno.addSignalListener("SIGTERM", stop);
  await promise;
  Deno.removeSignalListener("SIGINT", stop);
  Deno.removeSignalListener("SIGTERM", stop);
  console.error("sluice serve: stopping");
  await server.close();
  session.close();
  return 0;
}
