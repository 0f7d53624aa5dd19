/**
 * Expert-routing traces in the format of ../shared/traces: one JSON line per (token, layer),
 * `{"token": t, "layer": l, "experts": [ids in router rank order]}`, in request order. An optional
 * `meta.json` in the same folder describes the model (`n_layers`, `n_experts`, `top_k`, ...).
 * Pairs the recorder did not capture are simply absent (listed in `meta.json["missing"]`).
 *
 * @module
 */

/** The experts routed to for one token at one MoE layer. */
export interface TraceEvent {
  token: number;
  layer: number;
  /** Expert ids in router rank order. */
  experts: number[];
}

/** The fields of a trace's meta.json that sluice reads (others are kept as they are). */
export interface TraceMeta {
  model?: string;
  n_layers: number;
  n_experts: number;
  top_k: number;
  n_tokens: number;
  prefill_tokens?: number;
  /** (token, layer) pairs absent from the trace. */
  missing?: [number, number][];
  [field: string]: unknown;
}

/** Shape a simulator needs: layer and expert counts. */
export interface TraceShape {
  nLayers: number;
  nExperts: number;
}

function isIndex(v: unknown): v is number {
  return typeof v === "number" && Number.isInteger(v) && v >= 0;
}

/** Reads and validates a trace.jsonl file. Blank lines are skipped. */
export function readTrace(path: string): TraceEvent[] {
  const text = Deno.readTextFileSync(path);
  const events: TraceEvent[] = [];
  let lineNo = 0;
  for (const line of text.split("\n")) {
    lineNo++;
    if (line.trim() === "") continue;
    let v: unknown;
    try {
      v = JSON.parse(line);
    } catch (e) {
      throw new Error(`${path}:${lineNo}: not JSON (${(e as Error).message})`);
    }
    const o = v as Record<string, unknown>;
    if (
      typeof o !== "object" || o === null || !isIndex(o.token) || !isIndex(o.layer) ||
      !Array.isArray(o.experts) || !o.experts.every(isIndex)
    ) {
      throw new Error(
        `${path}:${lineNo}: expected {"token": int ≥ 0, "layer": int ≥ 0, "experts": [int ≥ 0...]}`,
      );
    }
    if (new Set(o.experts).size !== o.experts.length) {
      throw new Error(`${path}:${lineNo}: token ${o.token} layer ${o.layer} repeats an expert`);
    }
    events.push({ token: o.token, layer: o.layer, experts: o.experts as number[] });
  }
  return events;
}

/** Path of the meta.json that belongs to a trace file (same folder). */
export function metaPathFor(tracePath: string): string {
  const slash = tracePath.lastIndexOf("/");
  return slash < 0 ? "meta.json" : `${tracePath.slice(0, slash + 1)}meta.json`;
}

/** Reads the meta.json next to a trace, or returns null when there is none. */
export function readTraceMeta(tracePath: string): TraceMeta | null {
  const path = metaPathFor(tracePath);
  let text: string;
  try {
    text = Deno.readTextFileSync(path);
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return null;
    throw e;
  }
  const m = JSON.parse(text) as TraceMeta;
  for (const f of ["n_layers", "n_experts", "top_k", "n_tokens"] as const) {
    if (!isIndex(m[f])) throw new Error(`${path}: field "${f}" must be a non-negative integer`);
  }
  return m;
}

/**
 * Layer and expert counts of a trace: from its meta when given (checking every event fits),
 * else the largest ids seen plus one.
 */
export function traceShape(events: TraceEvent[], meta?: TraceMeta | null): TraceShape {
  let maxLayer = -1, maxExpert = -1;
  for (const e of events) {
    if (e.layer > maxLayer) maxLayer = e.layer;
    for (const x of e.experts) if (x > maxExpert) maxExpert = x;
  }
  if (!meta) return { nLayers: maxLayer + 1, nExperts: maxExpert + 1 };
  if (maxLayer >= meta.n_layers || maxExpert >= meta.n_experts) {
    throw new Error(
      `trace has layer ${maxLayer} / expert ${maxExpert} but meta.json says ` +
        `${meta.n_layers} layers × ${meta.n_experts} experts`,
    );
  }
  return { nLayers: meta.n_layers, nExperts: meta.n_experts };
}

/** What is at `path` when it is not a regular file: "a symlink", "a directory", "a device"... */
function specialKind(path: string): string | null {
  let st: Deno.FileInfo;
  try {
    st = Deno.lstatSync(path);
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return null;
    throw e;
  }
  if (st.isFile) return null;
  if (st.isSymlink) return "a symbolic link";
  if (st.isDirectory) return "a directory";
  if (st.isCharDevice || st.isBlockDevice) return "a device";
  if (st.isFifo) return "a named pipe";
  return "not a regular file";
}

/**
 * Throws unless a trace can be written to `path` by renaming a new file over it: the path and
 * the meta.json beside it must be absent or regular files (never a link, directory or device,
 * which the rename would replace), in an existing directory.
 */
export function checkTracePath(path: string): void {
  for (const p of [path, metaPathFor(path)]) {
    const kind = specialKind(p);
    if (kind) throw new Error(`--trace ${path}: ${p} is ${kind}; expected a regular file path`);
  }
  const slash = path.lastIndexOf("/");
  const dir = slash < 0 ? "." : path.slice(0, slash) || "/";
  let ok = false;
  try {
    ok = Deno.statSync(dir).isDirectory;
  } catch {
    // Reported below.
  }
  if (!ok) throw new Error(`--trace ${path}: folder ${dir} does not exist`);
}

/**
 * Appends trace lines to a new temporary file beside `path` and renames it to `path` on {@link close}, so a crashed run
 * never leaves a truncated trace under the final name. Used by `generate --trace`.
 */
export class TraceWriter {
  readonly path: string;
  readonly #tmp: string;
  readonly #file: Deno.FsFile;
  readonly #enc = new TextEncoder();
  #buf: string[] = [];
  #closed = false;

  /** Checks `path` ({@link checkTracePath}) and creates a new temporary file beside it. */
  constructor(path: string) {
    checkTracePath(path);
    this.path = path;
    this.#tmp = `${path}.${Deno.pid}.tmp`;
    this.#file = Deno.openSync(this.#tmp, { write: true, createNew: true });
  }

  /** Records the experts routed to for one (token, layer). */
  write(token: number, layer: number, experts: ArrayLike<number>): void {
    if (this.#closed) throw new Error(`TraceWriter: ${this.path} is already closed`);
    const ids = Array.from(experts);
    this.#buf.push(JSON.stringify({ token, layer, experts: ids }));
    if (this.#buf.length >= 4096) this.flush();
  }

  /**
   * Writes buffered lines to the temporary file. A failed write (a full disk) removes the
   * temporary file and closes the writer, so no partial trace is ever renamed into place.
   */
  flush(): void {
    if (this.#buf.length === 0) return;
    const bytes = this.#enc.encode(this.#buf.join("\n") + "\n");
    this.#buf = [];
    let off = 0;
    try {
      while (off < bytes.length) off += this.#file.writeSync(bytes.subarray(off));
    } catch (e) {
      this.#closed = true;
      this.#discard();
      throw new Error(`--trace ${this.path}: cannot write the trace (${(e as Error).message})`);
    }
  }

  /** Closes and removes the temporary file, ignoring errors: the caller reports the first one. */
  #discard(): void {
    for (const step of [() => this.#file.close(), () => Deno.removeSync(this.#tmp)]) {
      try {
        step();
      } catch {
        // Already closed or gone.
      }
    }
  }

  /**
   * Flushes, closes and renames into place; writes meta.json beside it when given. The path is
   * checked again first: what was a regular file at open may have been replaced since.
   */
  close(meta?: TraceMeta): void {
    if (this.#closed) return;
    this.flush();
    this.#closed = true;
    try {
      this.#file.close();
      checkTracePath(this.path);
    } catch (e) {
      this.#discard();
      throw e;
    }
    Deno.renameSync(this.#tmp, this.path);
    if (meta) {
      const metaPath = metaPathFor(this.path);
      const tmp = `${metaPath}.${Deno.pid}.tmp`;
      try {
        Deno.writeTextFileSync(tmp, JSON.stringify(meta, null, 1) + "\n", { createNew: true });
        Deno.renameSync(tmp, metaPath);
      } catch (e) {
        try {
          Deno.removeSync(tmp);
        } catch {
          // Never created.
        }
        throw new Error(`--trace ${metaPath}: cannot write (${(e as Error).message})`);
      }
    }
  }
}
