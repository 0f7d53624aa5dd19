/**
 * `serve` against a hostile web page and client (issue 27): no CORS unless `--cors` names the
 * origin, only JSON bodies (a page's `text/plain` POST needs no preflight), a Host header that is
 * not the server's own (DNS rebinding) refused unless `--allow-host`, and the API key compared in
 * constant time. Raw HTTP over TCP, so the test sets the Host header a browser would send.
 */
import assert from "node:assert/strict";
import { Session } from "../engine/session.ts";
import { demoModelPath } from "../tools/demo_model.ts";
import { type ServeOptions, startServer } from "../tools/serve/server.ts";
import { startWorkerServer } from "../tools/serve/front.ts";
import { hostAllowed, hostName } from "../tools/serve/gate.ts";

/** One HTTP/1.1 request over a fresh connection; the status, headers (lower case) and body. */
async function raw(
  url: string,
  lines: string[],
  body = "",
): Promise<{ status: number; headers: Map<string, string>; body: string }> {
  const { hostname, port } = new URL(url);
  const conn = await Deno.connect({ hostname, port: Number(port) });
  const enc = new TextEncoder();
  const head = [...lines, `content-length: ${enc.encode(body).length}`, "connection: close"];
  await conn.write(enc.encode(head.join("\r\n") + "\r\n\r\n" + body));
  let text = "";
  const dec = new TextDecoder();
  for await (const chunk of conn.readable) text += dec.decode(chunk, { stream: true });
  const [top, ...rest] = text.split("\r\n\r\n");
  const [status, ...fields] = top.split("\r\n");
  const headers = new Map(fields.map((f) => {
    const i = f.indexOf(":");
    return [f.slice(0, i).toLowerCase(), f.slice(i + 1).trim()] as [string, string];
  }));
  return { status: Number(status.split(" ")[1]), headers, body: rest.join("\r\n\r\n") };
}

const CHAT = JSON.stringify({ prompt: "a", max_tokens: 1 });

Deno.test("hostName and hostAllowed: IP literals, the bound name, localhost", () => {
  assert.equal(hostName("[::1]:8080"), "::1");
  assert.equal(hostName("Example.COM.:80"), "example.com");
  assert.ok(hostAllowed("127.0.0.1:8080", "127.0.0.1", []));
  assert.ok(hostAllowed("localhost:8080", "127.0.0.1", []));
  assert.ok(hostAllowed("[::1]:9", "127.0.0.1", []));
  assert.ok(hostAllowed("10.0.0.5:80", "0.0.0.0", []));
  assert.ok(!hostAllowed("evil.example:8080", "127.0.0.1", []));
  assert.ok(hostAllowed("localhost", "0.0.0.0", []), "localhost reaches any address");
  assert.ok(!hostAllowed("localhost.evil.example", "0.0.0.0", []));
  assert.ok(hostAllowed("box.lan:80", "box.lan", []));
  assert.ok(hostAllowed("api.example:80", "0.0.0.0", ["api.example"]));
  assert.ok(hostAllowed("anything:80", "0.0.0.0", ["*"]));
  assert.ok(!hostAllowed(null, "127.0.0.1", []));
});

/** A listening server of one kind, on its own session. */
type Start = (opts: ServeOptions) => Promise<{ url: string; close(): Promise<void> }>;

/** The in-process server and the worker server (`mod.ts serve`), which checks in its front. */
const KINDS: [string, Start][] = [
  ["in-process", async (opts) => {
    const session = await Session.open(await demoModelPath(true), RUN);
    const server = startServer(session, opts);
    return {
      url: server.url,
      close: async () => {
        await server.close();
        session.close();
      },
    };
  }],
  [
    "worker",
    async (opts) =>
      await startWorkerServer({ path: await demoModelPath(true), options: RUN }, opts),
  ],
];
const RUN = { quiet: true, ctx: 256 };

for (const [kind, start] of KINDS) {
  Deno.test({
    name:
      `serve (${kind}): no CORS by default, JSON bodies only, foreign Host refused, --cors and --allow-host`,
    sanitizeResources: false,
    sanitizeOps: false,
    fn: async () => {
      const plain = await start({ port: 0, log: () => {}, apiKey: "k" });
      const open = await start({
        port: 0,
        log: () => {},
        cors: ["https://app.example"],
        allowHosts: ["sluice.example"],
      });
      try {
        const host = `host: ${new URL(plain.url).host}`;
        const auth = "authorization: Bearer k";
        const json = "content-type: application/json";
        // A page on another site: no CORS header, so the browser hides the answer.
        const cross = await raw(plain.url, [
          "GET /v1/models HTTP/1.1",
          host,
          auth,
          "origin: https://evil.example",
        ]);
        assert.equal(cross.status, 200);
        assert.ok(!cross.headers.has("access-control-allow-origin"), [...cross.headers].join());
        const pre = await raw(plain.url, [
          "OPTIONS /v1/completions HTTP/1.1",
          host,
          "origin: https://evil.example",
          "access-control-request-method: POST",
        ]);
        assert.equal(pre.status, 403);
        assert.ok(!pre.headers.has("access-control-allow-origin"));
        // The simple POST a page may send without a preflight.
        const text = await raw(plain.url, [
          "POST /v1/completions HTTP/1.1",
          host,
          auth,
          "content-type: text/plain",
        ], CHAT);
        assert.equal(text.status, 415);
        assert.match(JSON.parse(text.body).error.message, /must be JSON .*not "text\/plain"/);
        const form = await raw(plain.url, [
          "POST /tokenize HTTP/1.1",
          host,
          auth,
          "content-type: application/x-www-form-urlencoded",
        ], '{"content":"a"}');
        assert.equal(form.status, 415);
        // DNS rebinding: the page's own name resolves to this server.
        const rebound = await raw(plain.url, [
          "POST /v1/completions HTTP/1.1",
          "host: evil.example:8080",
          auth,
          json,
        ], CHAT);
        assert.equal(rebound.status, 421);
        assert.match(JSON.parse(rebound.body).error.message, /evil\.example.*--allow-host/);
        const local = await raw(plain.url, [
          "POST /v1/completions HTTP/1.1",
          "host: localhost",
          auth,
          json,
        ], CHAT);
        assert.equal(local.status, 200, local.body);
        // Text and conversations that cannot fit the context are refused naming the limit.
        const huge = await raw(plain.url, [
          "POST /v1/completions HTTP/1.1",
          host,
          auth,
          json,
        ], JSON.stringify({ prompt: "x".repeat(256 * 128 + 1) }));
        assert.equal(huge.status, 400);
        assert.match(
          JSON.parse(huge.body).error.message,
          /^prompt: 32769 characters cannot fit the context of 256 tokens/,
        );
        const many = await raw(plain.url, [
          "POST /v1/chat/completions HTTP/1.1",
          host,
          auth,
          json,
        ], JSON.stringify({ messages: Array(300).fill({ role: "user", content: "hi" }) }));
        assert.equal(many.status, 400);
        assert.match(
          JSON.parse(many.body).error.message,
          /^messages: the conversation has 300 messages; the context holds 256/,
        );
        // The key: a wrong one of the same length and a prefix both fail; the right one passes.
        for (const key of ["Bearer x", "Bearer ", "Bearer kk"]) {
          const r = await raw(plain.url, [
            "GET /v1/models HTTP/1.1",
            host,
            `authorization: ${key}`,
          ]);
          assert.equal(r.status, 401, key);
        }
        // --cors and --allow-host.
        const ohost = `host: ${new URL(open.url).host}`;
        const allowed = await raw(open.url, [
          "OPTIONS /v1/completions HTTP/1.1",
          ohost,
          "origin: https://app.example",
        ]);
        assert.equal(allowed.status, 204);
        assert.equal(allowed.headers.get("access-control-allow-origin"), "https://app.example");
        const answered = await raw(open.url, [
          "POST /v1/completions HTTP/1.1",
          ohost,
          json,
          "origin: https://app.example",
        ], CHAT);
        assert.equal(answered.status, 200);
        assert.equal(answered.headers.get("access-control-allow-origin"), "https://app.example");
        const other = await raw(open.url, [
          "GET /health HTTP/1.1",
          ohost,
          "origin: https://evil.example",
        ]);
        assert.ok(!other.headers.has("access-control-allow-origin"));
        const named = await raw(open.url, ["GET /health HTTP/1.1", "host: sluice.example:443"]);
        assert.equal(named.status, 200);
      } finally {
        await plain.close();
        await open.close();
      }
    },
  });
}

for (const [kind, start] of KINDS) {
  Deno.test({
    name:
      `serve (${kind}): closing mid-stream ends the stream with an error event and a waiting request with 503`,
    sanitizeResources: false,
    sanitizeOps: false,
    fn: async () => {
      // The drain's bound is only a backstop here (generous, so load cannot reach it): what is
      // checked is that the connections ended by themselves, i.e. the server never logged that the
      // bound cut them off.
      const logs: string[] = [];
      const server = await start({ port: 0, log: (l) => logs.push(l), drainMs: 60_000 });
      let closed = false;
      try {
        const body = (stream: boolean) =>
          JSON.stringify({ prompt: "a", max_tokens: 400, ignore_eos: true, stream });
        const headers = { "content-type": "application/json" };
        const url = `${server.url}/v1/completions`;
        const streamed = await fetch(url, { method: "POST", headers, body: body(true) });
        const reader = streamed.body!.pipeThrough(new TextDecoderStream()).getReader();
        let sse = "";
        while ((sse.match(/^data: \{/gm) ?? []).length < 3) sse += (await reader.read()).value;
        // A second request waits in the queue behind the stream.
        const waiting = fetch(url, { method: "POST", headers, body: body(false) });
        const depth = async () => (await (await fetch(`${server.url}/health`)).json()).queue_depth;
        while (await depth() === 0) await new Promise((r) => setTimeout(r, 5));
        closed = true;
        await server.close();
        assert.deepEqual(logs.filter((l) => /still open/.test(l)), [], "the connections ended");
        for (let r = await reader.read(); !r.done; r = await reader.read()) sse += r.value;
        const events = sse.split("\n").filter((l) => l.startsWith("data: "));
        const last = events.at(-1)!;
        assert.ok(!sse.includes("[DONE]"), "an interrupted stream never claims to be complete");
        assert.ok(!/"finish_reason":"(stop|length)"/.test(sse), sse.slice(-300));
        assert.equal(JSON.parse(last.slice(6)).error.code, "server_shutdown");
        const answer = await waiting;
        assert.equal(answer.status, 503);
        assert.equal((await answer.json()).error.code, "server_shutdown");
      } finally {
        if (!closed) await server.close();
      }
    },
  });
}
