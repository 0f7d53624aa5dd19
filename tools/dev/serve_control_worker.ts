/**
 * The engine worker of ./serve_control.ts: the worker server's own back (tools/serve/back.ts)
 * plus a control channel, a BroadcastChannel named by the worker's data, on which dev tools empty
 * the prompt cache or swap the chat template between requests. Each message `{ id, op, file? }`
 * is answered `{ id, error }` (null when it worked).
 *
 * @module
 */
import { runBack } from "../serve/back.ts";
import type { ControlReply, ControlRequest } from "./serve_control.ts";

runBack((session, data) => {
  const channel = new BroadcastChannel((data as { channel: string }).channel);
  channel.onmessage = (ev: MessageEvent<ControlRequest>) => {
    const m = ev.data;
    let error: string | null = null;
    try {
      if (m.op === "reset") session.resetCache();
      else session.useChatTemplate(m.file);
    } catch (e) {
      error = e instanceof Error ? e.message : String(e);
    }
    channel.postMessage({ id: m.id, error } satisfies ControlReply);
  };
});
