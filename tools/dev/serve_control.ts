/**
 * The worker server (tools/serve/front.ts `startWorkerServer`, what `mod.ts serve` runs) with a
 * control channel into its engine worker, for dev tools that need the model between requests:
 * `bench serve` empties the prompt cache, the serve fuzz targets swap the chat template. Requests
 * take the path they take under `mod.ts serve`; only the control messages are added
 * (./serve_control_worker.ts).
 *
 * @module
 */
import type { EngineSpec } from "../serve/back.ts";
import { startWorkerServer, type WorkerServeOptions, type WorkerServer } from "../serve/front.ts";

/** What a control message asks the engine worker to do. */
export type ControlOp = { op: "reset" } | { op: "template"; file: string };

/** A control message to the engine worker. */
export type ControlRequest = ControlOp & { id: number };

/** The engine worker's answer to a {@link ControlRequest}: its error, or null. */
export interface ControlReply {
  id: number;
  error: string | null;
}

/** A worker server and its control channel. */
export interface ControlledServer {
  server: WorkerServer;
  /** Empties the engine's prompt cache (`Session.resetCache`). */
  resetCache(): Promise<void>;
  /** Makes the engine render chats with the Jinja file `file`; rejects with its error. */
  useChatTemplate(file: string): Promise<void>;
  /** Closes the server and the channel. */
  close(): Promise<void>;
}

/** Starts the worker server of `spec` with the control channel (see the module doc). */
export async function startControlledServer(
  spec: EngineSpec,
  opts: Omit<WorkerServeOptions, "worker"> = {},
): Promise<ControlledServer> {
  const name = `sluice-dev-control-${crypto.randomUUID()}`;
  const channel = new BroadcastChannel(name);
  const waiting = new Map<number, PromiseWithResolvers<void>>();
  channel.onmessage = (ev: MessageEvent<ControlReply>) => {
    const w = waiting.get(ev.data.id);
    waiting.delete(ev.data.id);
    if (ev.data.error === null) w?.resolve();
    else w?.reject(new Error(ev.data.error));
  };
  let seq = 0;
  const call = (m: ControlOp) => {
    const id = ++seq;
    const w = Promise.withResolvers<void>();
    waiting.set(id, w);
    channel.postMessage({ ...m, id });
    return w.promise;
  };
  let server: WorkerServer;
  try {
    server = await startWorkerServer(spec, {
      ...opts,
      worker: {
        url: new URL("./serve_control_worker.ts", import.meta.url),
        data: { channel: name },
      },
    });
  } catch (e) {
    channel.close();
    throw e;
  }
  return {
    server,
    resetCache: () => call({ op: "reset" }),
    useChatTemplate: (file) => call({ op: "template", file }),
    async close() {
      try {
        await server.close();
      } finally {
        channel.close();
        for (const w of waiting.values()) w.reject(new Error("the server closed"));
      }
    },
  };
}
