/**
 * The resume journal of a pack: `journal.json` in the temporary output directory records the
 * source fingerprint, the options, and the CRC of every trunk region and codebook set finished,
 * so a rerun keeps each layer still intact on disk and writes only the rest.
 *
 * @module
 */

import {
  closeSync,
  existsSync,
  fstatSync,
  mkdirSync,
  openSync,
  readFileSync,
  readSync,
  rmSync,
  statSync,
} from "node:fs";
import { basename, join } from "node:path";
import { EXPERT_MATRICES, type ExpertMatrix } from "../../io/model_config.ts";
import { CONTAINER_VERSION, expertBankFile, type Region } from "../../io/manifest_schema.ts";
import { crc32 } from "../../io/crc32.ts";
import { VQ3R_CODEBOOK_BYTES } from "../../io/format.ts";
import type { Checkpoint } from "../../io/safetensors.ts";
import { writeJson } from "../../io/json_file.ts";
import type { BankLayout, PackLayout } from "./layout.ts";
import { CONFIG_FILES } from "./side_files.ts";

/** The journal's file name inside the temporary output directory. */
export const JOURNAL = "journal.json";

/** The journal of a partial pack: what source, what options, which layers are done. */
export interface Journal {
  fingerprint: string;
  convert: string | null;
  /** Every option that changes the bytes written, as JSON. */
  options: string;
  globals: Region | null;
  layers: Record<string, Region>;
  /** CRC-32 of each VQ3R codebook set written, per layer and matrix kind. */
  codebooks: Record<string, Partial<Record<ExpertMatrix, number>>>;
}

/** What a journal must match to be resumed: the source and every byte-changing option. */
export type JournalKey = Pick<Journal, "fingerprint" | "convert" | "options">;

/** SHA-256 over the configs and every safetensors header: changes when the source changes. */
export async function fingerprint(src: string, ckpt: Checkpoint): Promise<string> {
  const parts: Uint8Array[] = [new TextEncoder().encode(`sluice-pack-v${CONTAINER_VERSION}\0`)];
  for (const f of CONFIG_FILES) {
    const p = join(src, f);
    parts.push(existsSync(p) ? readFileSync(p) : new Uint8Array(0), new Uint8Array(1));
  }
  const files = [...new Set([...ckpt.tensors.values()].map((t) => t.file))].sort();
  for (const f of files) {
    const fd = openSync(f, "r");
    try {
      const size = fstatSync(fd).size;
      const readAt = (n: number, pos: number): Uint8Array => {
        const buf = new Uint8Array(n);
        for (let got = 0; got < n;) {
          const k = readSync(fd, buf, got, n - got, pos + got);
          if (k === 0) throw new Error(`${f}: unexpected end of file in the header`);
          got += k;
        }
        return buf;
      };
      // The 8-byte length and the JSON header; openCheckpoint has already bounded the length.
      const len = new DataView(readAt(8, 0).buffer).getBigUint64(0, true);
      const header = readAt(8 + Number(len), 0);
      parts.push(new TextEncoder().encode(`${basename(f)}\0${size}\0`), header);
    } finally {
      closeSync(fd);
    }
  }
  const all = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    all.set(p, at);
    at += p.length;
  }
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", all));
  return "sha256:" + [...digest].map((b) => b.toString(16).padStart(2, "0")).join("");
}

function readJournal(tmp: string): Journal | null {
  try {
    const j = JSON.parse(readFileSync(join(tmp, JOURNAL), "utf-8"));
    if (typeof j?.fingerprint === "string" && j.layers && typeof j.layers === "object") return j;
  } catch {
    // A missing or torn journal means nothing can be trusted: start over.
  }
  return null;
}

/** Writes the journal of the pack in `tmp` (atomically). */
export function saveJournal(tmp: string, journal: Journal): void {
  writeJson(join(tmp, JOURNAL), journal);
}

/**
 * The journal of the pack in `tmp` when it was made for `key`; otherwise empties `tmp` and
 * starts a fresh journal there.
 */
export function openJournal(tmp: string, key: JournalKey, log: (line: string) => void): Journal {
  let journal = existsSync(tmp) ? readJournal(tmp) : null;
  if (
    journal &&
    (journal.fingerprint !== key.fingerprint || journal.convert !== key.convert ||
      journal.options !== key.options)
  ) {
    log(`pack: ${tmp} holds a pack of another source or options; starting over`);
    journal = null;
  }
  if (!journal) {
    rmSync(tmp, { recursive: true, force: true });
    mkdirSync(tmp, { recursive: true });
    journal = {
      fingerprint: key.fingerprint,
      convert: key.convert,
      options: key.options,
      globals: null,
      layers: {},
      codebooks: {},
    };
    saveJournal(tmp, journal);
  }
  return journal;
}

/**
 * Forgets journaled work that is no longer on disk intact: the globals region, and each layer
 * whose trunk run, expert bank file or codebooks do not match what was recorded.
 */
export function dropDamagedWork(
  journal: Journal,
  layout: PackLayout,
  tmp: string,
  trunkFd: number,
  booksFd: number,
  chunk: number,
): void {
  if (journal.globals && !regionIntact(trunkFd, journal.globals, chunk)) journal.globals = null;
  for (const [k, r] of Object.entries(journal.layers)) {
    const l = Number(k);
    const bank = layout.banks[l];
    const bankOk = !bank ||
      (existsSync(join(tmp, expertBankFile(l))) &&
        statSync(join(tmp, expertBankFile(l))).size === bank.stride * bank.experts.length);
    const booksOk = !bank || codebooksIntact(booksFd, bank, journal.codebooks[k]);
    if (!bankOk || !booksOk || !regionIntact(trunkFd, r, chunk)) delete journal.layers[k];
  }
}

/** Checks a journaled trunk region still holds what was written (size and CRC). */
function regionIntact(fd: number, r: Region, chunk: number): boolean {
  if (fstatSync(fd).size < r.offset + r.bytes) return false;
  const buf = new Uint8Array(Math.min(chunk, r.bytes));
  let crc = 0;
  for (let at = 0; at < r.bytes;) {
    const n = readSync(fd, buf, 0, Math.min(buf.length, r.bytes - at), r.offset + at);
    if (n === 0) return false;
    crc = crc32(buf.subarray(0, n), crc);
    at += n;
  }
  return crc === r.crc32;
}

/** Whether a journaled layer's codebooks are still in codebooks.bin with their CRCs. */
function codebooksIntact(
  fd: number,
  bank: BankLayout,
  crcs: Partial<Record<ExpertMatrix, number>> | undefined,
): boolean {
  for (const m of EXPERT_MATRICES) {
    const off = bank.codebookOffsets[m];
    if (off === undefined) continue;
    const want = crcs?.[m];
    if (want === undefined || fd < 0 || fstatSync(fd).size < off + VQ3R_CODEBOOK_BYTES) {
      return false;
    }
    const buf = new Uint8Array(VQ3R_CODEBOOK_BYTES);
    if (readSync(fd, buf, 0, buf.length, off) !== buf.length || crc32(buf) !== want) return false;
  }
  return true;
}
