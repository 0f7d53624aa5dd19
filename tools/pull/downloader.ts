/**
 * The main thread's side of tools/pull/download_worker.ts: one worker for every shard download
 * of a pull, its jobs running side by side, each a promise of the bytes it fetched.
 *
 * @module
 */
import type { DownloadJob } from "./download_worker.ts";
import { HubError, type HubFile, type HubOptions, type HubRevision } from "./hub.ts";

interface Job {
  onBytes: (n: number) => void;
  done: (fetched: number) => void;
  fail: (e: Error) => void;
}

/** Downloads Hub files in a worker, so they proceed while the main thread is busy. */
export class Downloader {
  readonly #hub: Omit<HubOptions, "log">;
  readonly #log: (line: string) => void;
  readonly #jobs = new Map<number, Job>();
  #worker: Worker | null = null;
  #next = 0;

  /** `hub` configures the worker's Hub client; `log` hears its retry lines. */
  constructor(hub: HubOptions, log: (line: string) => void) {
    const { log: _, ...rest } = hub;
    this.#hub = rest;
    this.#log = log;
  }

  #start(): Worker {
    const w = new Worker(new URL("./download_worker.ts", import.meta.url), { type: "module" });
    w.onmessage = (ev) => {
      const m = ev.data as {
        id: number;
        bytes?: number;
        log?: string;
        done?: number;
        error?: string;
      };
      const job = this.#jobs.get(m.id)!;
      if (m.log) this.#log(m.log);
      if (m.bytes) job.onBytes(m.bytes);
      if (m.error !== undefined) job.fail(new HubError(m.error));
      if (m.done !== undefined) job.done(m.done);
      if (m.error !== undefined || m.done !== undefined) this.#jobs.delete(m.id);
    };
    w.onerror = (ev) => {
      ev.preventDefault();
      for (const job of this.#jobs.values()) job.fail(new Error(`download worker: ${ev.message}`));
      this.#jobs.clear();
    };
    return w;
  }

  /**
   * Downloads `file` to `dest` as {@link Hub.download} does (resuming what is there); `onBytes`
   * hears the bytes as they land, in batches. Resolves to the bytes fetched.
   */
  download(
    rev: HubRevision,
    file: HubFile,
    dest: string,
    onBytes: (n: number) => void,
  ): Promise<number> {
    this.#worker ??= this.#start();
    const id = this.#next++;
    return new Promise<number>((done, fail) => {
      this.#jobs.set(id, { onBytes, done, fail });
      const job: DownloadJob = { id, rev, file, dest, hub: this.#hub };
      this.#worker!.postMessage(job);
    });
  }

  /** Stops the worker; downloads still running stay half done on disk, to be resumed. */
  close(): void {
    this.#worker?.terminate();
    this.#worker = null;
  }
}
