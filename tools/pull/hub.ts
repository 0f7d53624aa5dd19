/**
 * The Hugging Face Hub over HTTP, as `pull` needs it: a revision's file list with sizes and LFS
 * sha256 (`/api/models/<repo>/revision/<rev>?blobs=true`), byte ranges of a file, and whole-file
 * downloads that resume with `Range` after a dropped connection, retry 429 (honouring
 * Retry-After) and 5xx with exponential backoff, check size and sha256, and turn 401/403/404 into
 * one clear line naming the repo and file. Every request has a connect timeout (no answer) and an
 * idle timeout (no bytes) and is retried after either; a redirect loop fails at once. `HF_ENDPOINT`
 * overrides the base URL; `HF_TOKEN` is sent as a bearer token and never appears in any message.
 *
 * @module
 */

import { createHash } from "node:crypto";
import { closeSync, existsSync, openSync, readSync, rmSync, statSync } from "node:fs";

/** One file of a revision. */
export interface HubFile {
  path: string;
  size: number;
  /** The LFS object's sha256 (hex), when the Hub gives one. */
  sha256: string | null;
}

/** A resolved revision: the commit and its files. */
export interface HubRevision {
  repo: string;
  /** The revision asked for (branch, tag or commit). */
  revision: string;
  /** The commit it resolved to; every file is fetched at this commit. */
  commit: string;
  files: Map<string, HubFile>;
}

/** How a {@link Hub} talks to the server. */
export interface HubOptions {
  /** Base URL (default `$HF_ENDPOINT` or https://huggingface.co). */
  endpoint?: string;
  /** Bearer token (default `$HF_TOKEN`). */
  token?: string;
  /** Attempts per request before giving up (default 8). */
  attempts?: number;
  /** First backoff wait in ms, doubled per retry up to 30 s (default 1000). */
  backoffMs?: number;
  /** Most ms to wait for the answer to a request before retrying (default 30 s). */
  connectTimeoutMs?: number;
  /** Most ms without a byte of the body before dropping the connection (default 60 s). */
  idleTimeoutMs?: number;
  /** Informational lines (retries); never given the token. */
  log?: (line: string) => void;
}

/** An HTTP status that retrying cannot fix. */
export class HubError extends Error {}

const DEFAULT_ENDPOINT = "https://huggingface.co";
/** Largest file list (JSON) accepted from the API; real ones are kilobytes. */
const MAX_LIST_BYTES = 64 << 20;

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** Hex sha256 of a file, read in 16 MiB chunks. */
export function sha256File(path: string): string {
  const h = createHash("sha256");
  const fd = openSync(path, "r");
  try {
    const buf = new Uint8Array(16 << 20);
    for (let pos = 0;;) {
      const n = readSync(fd, buf, 0, buf.length, pos);
      if (n === 0) break;
      h.update(buf.subarray(0, n));
      pos += n;
    }
  } finally {
    closeSync(fd);
  }
  return h.digest("hex");
}

/** A client for one Hub endpoint. */
export class Hub {
  readonly endpoint: string;
  readonly #token: string | undefined;
  readonly #attempts: number;
  readonly #backoffMs: number;
  readonly #connectMs: number;
  readonly #idleMs: number;
  readonly #log: (line: string) => void;

  constructor(opts: HubOptions = {}) {
    this.endpoint = (opts.endpoint ?? Deno.env.get("HF_ENDPOINT") ?? DEFAULT_ENDPOINT).replace(
      /\/+$/,
      "",
    );
    this.#token = opts.token ?? (Deno.env.get("HF_TOKEN") || undefined);
    this.#attempts = opts.attempts ?? 8;
    this.#backoffMs = opts.backoffMs ?? 1000;
    this.#connectMs = opts.connectTimeoutMs ?? 30_000;
    this.#idleMs = opts.idleTimeoutMs ?? 60_000;
    this.#log = opts.log ?? ((s) => console.error(s));
  }

  #headers(extra: Record<string, string> = {}): Headers {
    const h = new Headers(extra);
    if (this.#token) h.set("authorization", `Bearer ${this.#token}`);
    return h;
  }

  /**
   * Sends a GET, retrying network errors, 429 and 5xx; returns a 2xx (or 416) response, throws a
   * {@link HubError} for other statuses. `what` names the repo and file for messages.
   */
  async #get(url: string, what: string, headers: Record<string, string> = {}): Promise<Response> {
    for (let attempt = 1;; attempt++) {
      let res: Response | null = null;
      let why: string;
      const answer = new AbortController();
      const timer = setTimeout(() => answer.abort(), this.#connectMs);
      try {
        res = await fetch(url, { headers: this.#headers(headers), signal: answer.signal });
        if (res.ok || res.status === 416) return res;
        why = `HTTP ${res.status}`;
      } catch (e) {
        const message = (e as Error).message;
        // fetch follows redirects itself and gives up on a loop: retrying cannot help.
        if (/redirect/i.test(message)) {
          throw new HubError(`${what}: redirect loop or too many redirects (${message})`);
        }
        why = answer.signal.aborted
          ? `no answer within ${this.#connectMs / 1000} s`
          : `network error (${message})`;
      } finally {
        clearTimeout(timer);
      }
      const status = res?.status ?? 0;
      await res?.body?.cancel();
      if (status !== 0 && status !== 429 && status < 500) throw this.#statusError(status, what);
      if (attempt >= this.#attempts) {
        throw new HubError(`${what}: ${why}, giving up after ${attempt} attempts`);
      }
      const after = Number(res?.headers.get("retry-after"));
      const wait = status === 429 && Number.isFinite(after) && after >= 0
        ? after * 1000
        : Math.min(30_000, this.#backoffMs * 2 ** (attempt - 1));
      this.#log(
        `pull: ${what}: ${why}, retrying in ${(wait / 1000).toFixed(1)} s ` +
          `(attempt ${attempt + 1} of ${this.#attempts})`,
      );
      await sleep(wait);
    }
  }

  #statusError(status: number, what: string): HubError {
    if (status === 401 || status === 403) {
      const hint = this.#token
        ? "HF_TOKEN was sent but does not grant access (accept the model's terms on the Hub?)"
        : "the repo is private or gated: set HF_TOKEN to a token with access";
      return new HubError(`${what}: HTTP ${status}, ${hint}`);
    }
    if (status === 404) {
      return new HubError(`${what}: HTTP 404, not found (check the repo name and revision)`);
    }
    return new HubError(`${what}: HTTP ${status}`);
  }

  /**
   * The chunks of a response body; throws when none arrives for the idle timeout (the connection
   * is dropped) or, with `max`, when the body grows beyond `max` bytes.
   */
  async *#chunks(res: Response, max = Infinity): AsyncGenerator<Uint8Array> {
    if (!res.body) return;
    const reader = res.body.getReader();
    let total = 0;
    try {
      for (;;) {
        let timer: ReturnType<typeof setTimeout> | undefined;
        const idle = new Promise<never>((_, fail) => {
          timer = setTimeout(
            () => fail(new Error(`no data for ${this.#idleMs / 1000} s`)),
            this.#idleMs,
          );
        });
        let r: ReadableStreamReadResult<Uint8Array>;
        try {
          r = await Promise.race([reader.read(), idle]);
        } finally {
          clearTimeout(timer);
        }
        if (r.done) return;
        total += r.value.length;
        if (total > max) throw new Error(`more than ${max} bytes`);
        yield r.value;
      }
    } finally {
      reader.cancel().catch(() => {});
    }
  }

  /** A whole response body (at most `max` bytes), under the idle timeout. */
  async #bytes(res: Response, max = Infinity): Promise<Uint8Array> {
    const parts: BlobPart[] = [];
    for await (const c of this.#chunks(res, max)) parts.push(c as Uint8Array<ArrayBuffer>);
    return new Uint8Array(await new Blob(parts).arrayBuffer());
  }

  /** The files of `repo` at `revision`, with sizes and LFS sha256. */
  async revision(repo: string, revision: string): Promise<HubRevision> {
    const url = `${this.endpoint}/api/models/${repo}/revision/${encodeURIComponent(revision)}` +
      `?blobs=true`;
    const res = await this.#get(url, `${repo}@${revision}: file list`);
    let info: {
      sha?: unknown;
      siblings?: { rfilename?: unknown; size?: unknown; lfs?: { sha256?: unknown } }[];
    };
    try {
      info = JSON.parse(new TextDecoder().decode(await this.#bytes(res, MAX_LIST_BYTES)));
    } catch (e) {
      throw new HubError(`${repo}@${revision}: file list is not JSON (${(e as Error).message})`);
    }
    if (typeof info.sha !== "string" || !Array.isArray(info.siblings)) {
      throw new HubError(`${repo}@${revision}: file list lacks "sha" or "siblings"`);
    }
    const files = new Map<string, HubFile>();
    for (const s of info.siblings) {
      if (typeof s.rfilename !== "string" || typeof s.size !== "number") continue;
      const sha = s.lfs?.sha256;
      files.set(s.rfilename, {
        path: s.rfilename,
        size: s.size,
        sha256: typeof sha === "string" ? sha : null,
      });
    }
    return { repo, revision, commit: info.sha, files };
  }

  #url(rev: HubRevision, path: string): string {
    const file = path.split("/").map(encodeURIComponent).join("/");
    return `${this.endpoint}/${rev.repo}/resolve/${rev.commit}/${file}`;
  }

  /** Bytes `[start, end)` of a file. */
  async range(rev: HubRevision, path: string, start: number, end: number): Promise<Uint8Array> {
    const what = `${rev.repo}@${rev.revision}: ${path}`;
    for (let attempt = 1;; attempt++) {
      const res = await this.#get(this.#url(rev, path), what, {
        range: `bytes=${start}-${end - 1}`,
      });
      try {
        const body = await this.#bytes(res, res.status === 206 ? end - start : end);
        // A server that ignores Range sends the whole file: take the slice.
        const got = res.status === 206 ? body : body.subarray(start, end);
        if (got.length === end - start) return got;
        throw new Error(`got ${got.length} of ${end - start} bytes`);
      } catch (e) {
        if (attempt >= this.#attempts) throw new HubError(`${what}: ${(e as Error).message}`);
        await sleep(Math.min(30_000, this.#backoffMs * 2 ** (attempt - 1)));
      }
    }
  }

  /**
   * Downloads `file` to `dest`, appending to what a previous attempt left there (`Range`), and
   * checks its size and sha256 (the API's, else a sha256-shaped ETag). A mismatch deletes the
   * download and starts over (up to 3 times); `onBytes` hears every chunk written (negative when
   * a bad download is dropped). Returns the bytes fetched over the network.
   */
  async download(
    rev: HubRevision,
    file: HubFile,
    dest: string,
    onBytes: (n: number) => void,
  ): Promise<number> {
    const what = `${rev.repo}@${rev.revision}: ${file.path}`;
    let fetched = 0;
    let lost = "";
    for (let round = 1;; round++) {
      let etag: string | null = null;
      for (let attempt = 1;; attempt++) {
        const have = existsSync(dest) ? statSync(dest).size : 0;
        if (have > file.size) {
          rmSync(dest);
          onBytes(-have);
          continue;
        }
        if (have === file.size) break;
        if (attempt > this.#attempts) {
          throw new HubError(
            `${what}: still ${file.size - have} bytes short after ${attempt - 1} attempts` +
              (lost ? ` (last: ${lost})` : ""),
          );
        }
        const res = await this.#get(
          this.#url(rev, file.path),
          what,
          have > 0 ? { range: `bytes=${have}-` } : {},
        );
        etag = res.headers.get("x-linked-etag") ?? res.headers.get("etag") ?? etag;
        if (res.status === 416) {
          await res.body?.cancel();
          break;
        }
        const append = res.status === 206;
        if (!append && have > 0) onBytes(-have);
        const f = await Deno.open(dest, { write: true, create: true, append, truncate: !append });
        try {
          // Bytes beyond the declared size are never written: the download starts over.
          for await (const chunk of this.#chunks(res, append ? file.size - have : file.size)) {
            try {
              for (let w = 0; w < chunk.length;) w += await f.write(chunk.subarray(w));
            } catch (e) {
              // A full disk is no network fault: retrying cannot help, and the file is named.
              throw new HubError(`${what}: cannot write ${dest} (${(e as Error).message})`);
            }
            fetched += chunk.length;
            onBytes(chunk.length);
          }
        } catch (e) {
          if (e instanceof HubError) throw e;
          lost = (e as Error).message;
          this.#log(`pull: ${what}: connection lost (${lost}), resuming`);
          await sleep(Math.min(30_000, this.#backoffMs * 2 ** (attempt - 1)));
        } finally {
          f.close();
        }
      }
      const size = statSync(dest).size;
      const tag = etag?.replace(/^W\//, "").replaceAll('"', "") ?? "";
      const want = file.sha256 ?? (/^[0-9a-f]{64}$/.test(tag) ? tag : null);
      const got = want === null ? null : sha256File(dest);
      if (size === file.size && got === want) return fetched;
      const why = size !== file.size
        ? `size ${size}, expected ${file.size}`
        : `sha256 ${got}, expected ${want}`;
      rmSync(dest);
      onBytes(-size);
      if (round >= 3) throw new HubError(`${what}: ${why} after ${round} downloads; giving up`);
      this.#log(`pull: ${what}: ${why}; fetching it again`);
    }
  }
}
