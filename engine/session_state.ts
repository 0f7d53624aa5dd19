/**
 * Saved sessions: the prompt cache of a {@link Session} (its tokens and the KV/latent cache rows
 * of those positions) plus whatever the caller keeps beside it (chat turns, sampler settings),
 * in one file that names the container it belongs to and ends with a CRC-32 of everything
 * before it. Loading refuses a damaged file or another container's session with a message that
 * says which.
 *
 * Layout: the magic `SLUICE-SESSION-1` (16 bytes), the header length (u32 LE), the header (UTF-8
 * JSON), the cache rows region after region (positions 0..n−1 of each), each recurrent state
 * whole, with `--spec mtp` (header `mtp`) the MTP layer's rows and the main hidden state at n − 1
 * (engine/transformer.ts mtpSnapshot), the CRC-32 (u32 LE).
 *
 * @module
 */
import { createHash } from "node:crypto";
import {
  closeSync,
  openSync,
  readFileSync,
  readSync,
  renameSync,
  rmSync,
  writeSync,
} from "node:fs";
import { basename } from "node:path";
import { concat } from "./arrays.ts";
import { heldRows, regionRows, writeRegionRows } from "./parts/mixer.ts";
import { crc32 } from "../io/crc32.ts";
import type { Session } from "./session.ts";

const MAGIC = new TextEncoder().encode("SLUICE-SESSION-1");

/** What a session file says about itself. */
export interface SessionHeader {
  /** Directory name of the container the state was computed with. */
  container: string;
  /** SHA-256 of that container's manifest.json: the identity a load checks. */
  manifestSha256: string;
  /** Token ids whose state the file holds. */
  tokens: number[];
  /** Bytes per position of each cache region, in the engine's order. */
  rowBytes: number[];
  /**
   * Rows saved of each region: the tokens, or a sliding window's ring rows once it has wrapped
   * (saved as the ring holds them). Absent in files that predate rings: the tokens.
   */
  rows?: number[];
  /** Bytes of each recurrent state (KDA), saved whole after the rows. */
  stateBytes: number[];
  /**
   * The MTP layer's cache rows (bytes per position of each region) and the hidden state its
   * next row reads, saved after the states; absent when the session kept none.
   */
  mtp?: { rowBytes: number[]; hiddenBytes: number };
  /** The caller's own state (JSON), returned by {@link loadSession} as it was saved. */
  app: unknown;
}

/** SHA-256 (hex) of a container's manifest.json. */
export function manifestSha256(session: Session): string {
  const bytes = readFileSync(`${session.model.container.dir}/manifest.json`);
  return createHash("sha256").update(bytes).digest("hex");
}

/**
 * The cache contents of positions 0..n−1 of sequence `seq`: each region's rows, then each
 * recurrent state whole (views into the arena, in the order a session file stores them).
 */
export function cacheParts(session: Session, n: number, seq = 0): Uint8Array[] {
  const { arena, transformer } = session.model;
  return [
    ...regionRows(arena, transformer.cacheRegions(seq), n),
    ...transformer.stateRegions(seq).map((s) => arena.u8(s.offset, s.bytes)),
  ];
}

/** An MTP layer's snapshot as kept: its regions' bytes per position and the bytes. */
export interface MtpSaved {
  rowBytes: number[];
  bytes: Uint8Array;
}

/**
 * A copy of what sequence `seq`'s MTP layer keeps for positions 0..n−1 (engine/transformer.ts
 * mtpSnapshot), or null when it keeps nothing (no `--spec mtp`, or its room given back).
 */
export function mtpSaved(session: Session, n: number, seq = 0): MtpSaved | null {
  const snap = session.model.transformer.mtpSnapshot(seq, n);
  return snap && { rowBytes: snap.rowBytes, bytes: concatBytes(snap.parts) };
}

/** The byte parts one after another, in one copy. */
export function concatBytes(parts: readonly Uint8Array[]): Uint8Array {
  return concat(parts, (n) => new Uint8Array(n));
}

/**
 * Writes `bytes` (laid out as {@link cacheParts} of `stored` positions) back into sequence `seq`,
 * keeping the first `n` ≤ `stored` positions of each region (see writeRegionRows; the caller checks
 * with Transformer.canResume that `n` is within a ring's reach), and declares the recurrent states
 * to be at position `n` (they are whole, so only n = stored is exact for a recurrent model); the
 * MTP layer's rows from `mtp` where kept (else they are left stale: drafts may be kept less often,
 * tokens never change).
 */
export function writeCacheParts(
  session: Session,
  bytes: Uint8Array,
  stored: number,
  n: number,
  seq = 0,
  mtp: MtpSaved | null = null,
): void {
  const { arena, transformer } = session.model;
  transformer.reserveRows?.(seq, n);
  let at = writeRegionRows(arena, transformer.cacheRegions(seq), bytes, stored, n);
  for (const s of transformer.stateRegions(seq)) {
    arena.u8(s.offset, s.bytes).set(bytes.subarray(at, at + s.bytes));
    at += s.bytes;
  }
  transformer.resumeAt(n, seq);
  transformer.mtpRestore(seq, mtp, stored, n);
}

/** What kind of thing `info` is, for messages about a path that is not a regular file. */
function kindOf(info: Deno.FileInfo): string {
  if (info.isSymlink) return "a symbolic link";
  if (info.isDirectory) return "a folder";
  if (info.isFifo) return "a FIFO";
  if (info.isCharDevice || info.isBlockDevice) return "a device";
  if (info.isSocket) return "a socket";
  return "not a regular file";
}

/** Whether the regular file at `path` starts with the session magic (a file this module wrote). */
function isSessionFile(path: string): boolean {
  const fd = openSync(path, "r");
  try {
    const head = new Uint8Array(MAGIC.length);
    return readSync(fd, head, 0, head.length, 0) === head.length &&
      MAGIC.every((b, i) => head[i] === b);
  } finally {
    closeSync(fd);
  }
}

/**
 * Throws unless `path` may receive a session: nothing there, or (with `replace`) a session file.
 * Links, devices, FIFOs and folders are never written through or replaced.
 */
function checkSaveTarget(path: string, replace: boolean): void {
  let info: Deno.FileInfo;
  try {
    info = Deno.lstatSync(path);
  } catch {
    return;
  }
  if (!info.isFile) {
    throw new Error(`cannot save the session to ${path}: it is ${kindOf(info)}; choose a new file`);
  }
  if (!isSessionFile(path)) {
    throw new Error(
      `cannot save the session to ${path}: the file exists and is not a sluice session file`,
    );
  }
  if (!replace) {
    throw new Error(
      `cannot save the session to ${path}: a session file is there; replace it explicitly (in chat: /save! FILE)`,
    );
  }
}

/**
 * Writes the prompt cache of `session` and `app` to `path` (through a temporary file renamed
 * into place, so a failed save leaves any older file whole). `path` must not exist, or (with
 * `replace`) be a session file: nothing else is ever written through or replaced. Returns the
 * bytes written.
 */
export function saveSession(
  session: Session,
  path: string,
  app: unknown = null,
  replace = false,
): number {
  checkSaveTarget(path, replace);
  const regions = session.model.transformer.cacheRegions();
  const states = session.model.transformer.stateRegions();
  const tokens = [...session.cachedTokens];
  const mtp = tokens.length > 0 ? mtpSaved(session, tokens.length) : null;
  const header: SessionHeader = {
    container: basename(session.model.container.dir),
    manifestSha256: manifestSha256(session),
    tokens,
    rowBytes: regions.map((r) => r.rowBytes),
    rows: regions.map((r) => heldRows(r, tokens.length)),
    stateBytes: states.map((s) => s.bytes),
    ...(mtp
      ? { mtp: { rowBytes: mtp.rowBytes, hiddenBytes: session.model.cfg.hiddenSize * 4 } }
      : {}),
    app,
  };
  const json = new TextEncoder().encode(JSON.stringify(header));
  const len = new Uint8Array(4);
  new DataView(len.buffer).setUint32(0, json.length, true);
  const tmp = `${path}.tmp-${Deno.pid}`;
  let fd: number;
  try {
    fd = openSync(tmp, "wx");
  } catch (e) {
    const why = (e as { code?: string }).code === "EEXIST"
      ? "a temporary file of this process is in the way"
      : (e as Error).message.replaceAll(tmp, path);
    throw new Error(`cannot save the session to ${path}: ${why}`);
  }
  let crc = 0, written = 0;
  const put = (bytes: Uint8Array) => {
    crc = crc32(bytes, crc);
    for (let o = 0; o < bytes.length;) o += writeSync(fd, bytes, o);
    written += bytes.length;
  };
  try {
    put(MAGIC);
    put(len);
    put(json);
    for (const part of cacheParts(session, tokens.length)) put(part);
    if (mtp) put(mtp.bytes);
    const tail = new Uint8Array(4);
    new DataView(tail.buffer).setUint32(0, crc, true);
    writeSync(fd, tail);
    written += 4;
    closeSync(fd);
    renameSync(tmp, path);
  } catch (e) {
    try {
      closeSync(fd);
    } catch {
      // Already closed before the rename failed.
    }
    rmSync(tmp, { force: true });
    // The temporary name is ours, not the user's: messages name the file asked for.
    const why = (e as Error).message.replaceAll(tmp, path);
    throw new Error(`cannot save the session to ${path}: ${why}`);
  }
  return written;
}

/** Reads and checks the header of a session file without touching any model. */
export function readSessionFile(path: string): { header: SessionHeader; rows: Uint8Array } {
  let bytes: Uint8Array;
  try {
    // A FIFO or device would block or never end: only a regular file is read.
    const info = Deno.statSync(path);
    if (!info.isFile) throw new Error(`it is ${kindOf(info)}, not a session file`);
    bytes = readFileSync(path);
  } catch (e) {
    throw new Error(`${path}: cannot read the session file (${(e as Error).message})`);
  }
  const magicOk = bytes.length >= MAGIC.length + 8 &&
    MAGIC.every((b, i) => bytes[i] === b);
  if (!magicOk) throw new Error(`${path}: not a sluice session file (no SLUICE-SESSION-1 magic)`);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const want = view.getUint32(bytes.length - 4, true);
  if (crc32(bytes.subarray(0, bytes.length - 4)) !== want) {
    throw new Error(`${path}: the session file is damaged (its CRC-32 does not match)`);
  }
  const hLen = view.getUint32(MAGIC.length, true);
  const hEnd = MAGIC.length + 4 + hLen;
  let header: SessionHeader;
  try {
    header = JSON.parse(new TextDecoder().decode(bytes.subarray(MAGIC.length + 4, hEnd)));
  } catch (e) {
    throw new Error(`${path}: the session header is not JSON (${(e as Error).message})`);
  }
  const ok = header && typeof header.manifestSha256 === "string" &&
    Array.isArray(header.tokens) && header.tokens.every(Number.isInteger) &&
    Array.isArray(header.rowBytes) && header.rowBytes.every(Number.isInteger) &&
    Array.isArray(header.stateBytes) && header.stateBytes.every(Number.isInteger) &&
    (header.rows === undefined ||
      (Array.isArray(header.rows) && header.rows.length === header.rowBytes.length &&
        header.rows.every((r) => Number.isInteger(r) && r >= 0 && r <= header.tokens.length)));
  if (!ok) {
    throw new Error(
      `${path}: the session header lacks manifestSha256, tokens, rowBytes or stateBytes, or ` +
        "its rows do not match them",
    );
  }
  const mtp = header.mtp;
  if (
    mtp !== undefined &&
    !(mtp && Array.isArray(mtp.rowBytes) && mtp.rowBytes.every(Number.isInteger) &&
      Number.isInteger(mtp.hiddenBytes))
  ) {
    throw new Error(`${path}: the session header's mtp lacks rowBytes or hiddenBytes`);
  }
  const rows = bytes.subarray(hEnd, bytes.length - 4);
  const saved = header.rows ?? header.rowBytes.map(() => header.tokens.length);
  const expected = header.rowBytes.reduce((s, r, i) => s + r * saved[i], 0) +
    header.stateBytes.reduce((s, b) => s + b, 0) + mtpBytes(header);
  if (rows.length !== expected) {
    throw new Error(`${path}: ${rows.length} bytes of cache rows, the header implies ${expected}`);
  }
  return { header, rows };
}

/** Bytes of the MTP layer's part of a session file with `header`. */
function mtpBytes(header: SessionHeader): number {
  const m = header.mtp;
  return m ? m.rowBytes.reduce((s, r) => s + r * header.tokens.length, 0) + m.hiddenBytes : 0;
}

/**
 * Writes a saved session back into `session`'s KV cache, after checking that it was saved from
 * the same container with the same cache layout. Returns the header (its `app` as saved).
 */
export function loadSession(session: Session, path: string): SessionHeader {
  const { header, rows } = readSessionFile(path);
  const own = manifestSha256(session);
  const dir = session.model.container.dir;
  if (header.manifestSha256 !== own) {
    throw new Error(
      `${path}: this session belongs to container "${header.container}" ` +
        `(manifest sha256 ${header.manifestSha256.slice(0, 12)}…), not to ${dir} ` +
        `(${own.slice(0, 12)}…)`,
    );
  }
  const n = header.tokens.length;
  const vocab = session.model.cfg.vocabSize;
  const bad = header.tokens.findIndex((id) => id < 0 || id >= vocab);
  if (bad >= 0) {
    throw new Error(
      `${path}: token ${bad} of the session is id ${header.tokens[bad]}, outside the ` +
        `vocabulary of ${vocab} (0..${vocab - 1})`,
    );
  }
  if (n > session.model.maxContext) {
    throw new Error(
      `${path}: the session holds ${n} tokens; this context holds ${session.model.maxContext} ` +
        `(open the model with a larger --ctx)`,
    );
  }
  const regions = session.model.transformer.cacheRegions();
  const states = session.model.transformer.stateRegions();
  const same = regions.length === header.rowBytes.length &&
    regions.every((r, i) => r.rowBytes === header.rowBytes[i]) &&
    states.length === header.stateBytes.length &&
    states.every((s, i) => s.bytes === header.stateBytes[i]);
  if (!same) throw new Error(`${path}: the cache layout differs from ${dir}'s`);
  // A ring that wrapped was saved as it held its rows: valid only in a ring of the same size.
  const saved = header.rows ?? header.rowBytes.map(() => n);
  if (!regions.every((r, i) => heldRows(r, n) === saved[i])) {
    throw new Error(
      `${path}: its sliding-window rings were saved with other sizes than ${dir} has now (they ` +
        "follow --ctx and --prefill-chunk: open the model with the ones it was saved with)",
    );
  }
  // The MTP layer's rows, where the file keeps them, come last (a model run without --spec mtp
  // skips them).
  const main = rows.length - mtpBytes(header);
  const mtp = header.mtp ? { rowBytes: header.mtp.rowBytes, bytes: rows.subarray(main) } : null;
  writeCacheParts(session, rows.subarray(0, main), n, n, 0, mtp);
  session.adoptCache(header.tokens);
  return header;
}
