/**
 * The check every expert record gets when it lands in the arena: its header must say what the
 * manifest says (magic, layer, expert, matrix offsets); with `verify`, its payload CRC32 too.
 *
 * @module
 */
import type { ExpertBank } from "./container.ts";
import { crc32 } from "./crc32.ts";
import { decodeRecordHeader } from "./format.ts";
import { EXPERT_MATRICES } from "./model_config.ts";

/** Throws when the record at `record` is not expert `expert` of `layer` as the manifest lays it out. */
export function checkRecord(
  record: Uint8Array,
  bank: ExpertBank,
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
