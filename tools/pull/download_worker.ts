/**
 * A worker that downloads Hub files with {@link Hub.download}, so shards arrive while the main
 * thread packs (the packer is synchronous). Each job runs as soon as it arrives; messages out,
 * tagged with the job's `id`: `{bytes}` every 100 ms at most (bytes added since the last one,
 * negative when a bad download was dropped), `{log}` for retry lines, and finally `{done}` (bytes
 * fetched over the network) or `{error}`.
 *
 * @module
 */
import { Hub, type HubFile, type HubOptions, type HubRevision } from "./hub.ts";

/** One download job. */
export interface DownloadJob {
  id: number;
  rev: HubRevision;
  file: HubFile;
  dest: string;
  /** The Hub client's options, less `log` (functions do not cross to a worker). */
  hub: Omit<HubOptions, "log">;
}

const scope = self as unknown as {
  onmessage: (ev: MessageEvent<DownloadJob>) => void;
  postMessage(message: unknown): void;
};

scope.onmessage = async (ev: MessageEvent<DownloadJob>) => {
  const { id, rev, file, dest, hub } = ev.data;
  let bytes = 0;
  let last = performance.now();
  const client = new Hub({ ...hub, log: (line) => scope.postMessage({ id, log: line }) });
  try {
    const done = await client.download(rev, file, dest, (n) => {
      bytes += n;
      if (performance.now() - last >= 100) {
        scope.postMessage({ id, bytes });
        bytes = 0;
        last = performance.now();
      }
    });
    scope.postMessage({ id, bytes, done });
  } catch (e) {
    scope.postMessage({ id, bytes, error: (e as Error).message });
  }
};
