/**
 * The check every expert record gets when it lands in the arena: its header must say what the
 * manifest says (magic, layer, expert, matrix offsets); with `verify`, its payload CRC32 too.
 * With `verify`, trunk regions get their CRC32 checked as they land as well.
 *
 * @module
 */
import type { Arena } from "../engine/arena.ts";
import type { Container, ExpertBank } from "./container.ts";
import { crc32 } from "./crc32.ts";
import { decodeRecordHeader } from "./format.ts";
import { EXPERT_MATRICES } from "../engine/model_config.ts";

/** Throws when the record at `record` is not expert `expert` of `layer` as the manifest lays it out. */
export function checkRecord(
  record: Uint8Array,
  bank: Pick<ExpertBank, "stride" | "matrices">,
  layer: number,
  expert: number,
  file: string,
  fileOffset: number,
  verify: boolean,
): void {
  const place = { file, layer, expert, offset: fileOffset };
  const h = decodeRecordHeader(record, place, bank.stride);
  for (const m of EXPERT_MATRICES) {
    if (h.matrices[m].offset !== bank.matrices[m].offset) {
      throw new Error(
        `expert ${expert} of layer ${layer}: ${m} at ${
          h.matrices[m].offset
        } in the record header, ` +
          `${bank.matrices[m].offset} in the manifest (${file} offset ${fileOffset})`,
      );
    }
  }
  if (!verify) return;
  const crc = crc32(record.subarray(h.payloadOffset, h.payloadOffset + h.payloadBytes));
  if (crc !== h.payloadCrc) {
    throw new Error(
      `expert ${expert} of layer ${layer}: checksum mismatch (${file} offset ${fileOffset})`,
    );
  }
}

/**
 * The `--verify` check of trunk regions: `(layer, at)` CRC-checks the globals region or a layer
 * run just read into the arena at `at` against the manifest, naming the file and offset.
 */
export function regionChecker(
  arena: Arena,
  c: Container,
): (layer: number | "globals", at: number) => void {
  const t = c.manifest.trunk;
  return (layer, at) => {
    const r = layer === "globals" ? t.globals.region : t.layers[layer];
    const crc = crc32(arena.u8(at, r.bytes));
    if (crc !== r.crc32) {
      const what = layer === "globals" ? "globals region" : `layer ${layer} run`;
      throw new Error(
        `${c.trunkPath}: ${what} [${r.offset}, ${r.offset + r.bytes}) CRC mismatch ` +
          `(0x${crc.toString(16)}, manifest 0x${r.crc32.toString(16)}): the file is damaged`,
      );
    }
  };
}
