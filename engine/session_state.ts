/**
 * Saved sessions: the prompt cache of a {@link Session} (its tokens and the KV/latent cache rows
 * of those positions) plus whatever the caller keeps beside it (chat turns, sampler settings),
 * in one file that names the container it belongs to and ends with a CRC-32 of everything
 * before it. Loading refuses a damaged file or another container's session with a message that
 * says which.
 *
 * Layout: the magic `SLUICE-SESSION-1` (16 bytes), the header length (u32 LE), the header (UTF-8
 * JSON), the cache rows region after region (positions 0..n−1 of each), each recurrent state
 * whole, the CRC-32 (u32 LE).
 *
 * @module
 */
import { createHash } from "node:crypto";
import { closeSync, openSync, readFileSync, renameSync, rmSync, writeSync } from "node:fs";
import { basename } from "node:path";
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
  /** Bytes of each recurrent state (KDA), saved whole after the rows. */
  stateBytes: number[];
  /** The caller's own state (JSON), returned by {@link loadSession} as it was saved. */
  app: unknown;
}

/** SHA-256 (hex) of a container's manifest.json. */
export function manifestSha256(session: Session): string {
  const bytes = readFileSync(`${session.model.container.dir}/manifest.json`);
  return createHash("sha256").update(bytes).digest("hex");
}

/**
 * Writes the prompt cache of `session` and `app` to `path` (through a temporary file renamed
 * into place, so a failed save leaves any older file whole). Returns the bytes written.
 */
export function saveSession(session: Session, path: string, app: unknown = null): number {
  const regions = session.model.transformer.cacheRegions();
  const states = session.model.transformer.stateRegions();
  const tokens = [...session.cachedTokens];
  const header: SessionHeader = {
    container: basename(session.model.container.dir),
    manifestSha256: manifestSha256(session),
    tokens,
    rowBytes: regions.map((r) => r.rowBytes),
    stateBytes: states.map((s) => s.bytes),
    app,
  };
  const json = new TextEncoder().encode(JSON.stringify(header));
  const len = new Uint8Array(4);
  new DataView(len.buffer).setUint32(0, json.length, true);
  const tmp = `${path}.tmp-${Deno.pid}`;
  const fd = openSync(tmp, "w");
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
    for (const r of regions) put(session.model.arena.u8(r.offset, tokens.length * r.rowBytes));
    for (const s of states) put(session.model.arena.u8(s.offset, s.bytes));
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
    throw new Error(`cannot save the session to ${path}: ${(e as Error).message}`);
  }
  return written;
}

/** Reads and checks the header of a session file without touching any model. */
export function readSessionFile(path: string): { header: SessionHeader; rows: Uint8Array } {
  let bytes: Uint8Array;
  try {
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
    Array.isArray(header.stateBytes) && header.stateBytes.every(Number.isInteger);
  if (!ok) {
    throw new Error(
      `${path}: the session header lacks manifestSha256, tokens, rowBytes or stateBytes`,
    );
  }
  const rows = bytes.subarray(hEnd, bytes.length - 4);
  const expected = header.rowBytes.reduce((s, r) => s + r * header.tokens.length, 0) +
    header.stateBytes.reduce((s, b) => s + b, 0);
  if (rows.length !== expected) {
    throw new Error(`${path}: ${rows.length} bytes of cache rows, the header implies ${expected}`);
  }
  return { header, rows };
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
  const regions = session.model.transformer.cacheRegions();
  const states = session.model.transformer.stateRegions();
  const same = regions.length === header.rowBytes.length &&
    regions.every((r, i) => r.rowBytes === header.rowBytes[i]) &&
    states.length === header.stateBytes.length &&
    states.every((s, i) => s.bytes === header.stateBytes[i]);
  if (!same) throw new Error(`${path}: the cache layout differs from ${dir}'s`);
  const n = header.tokens.length;
  if (n > session.model.maxContext) {
    throw new Error(
      `${path}: the session holds ${n} tokens; this context holds ${session.model.maxContext} ` +
        `(open the model with a larger --ctx)`,
    );
  }
  let at = 0;
  for (const r of regions) {
    const len = n * r.rowBytes;
    session.model.arena.u8(r.offset, len).set(rows.subarray(at, at + len));
    at += len;
  }
  for (const s of states) {
    session.model.arena.u8(s.offset, s.bytes).set(rows.subarray(at, at + s.bytes));
    at += s.bytes;
  }
  session.model.transformer.resumeAt(n);
  session.adoptCache(header.tokens);
  return header;
}
