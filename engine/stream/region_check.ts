/**
 * The `--verify` check of trunk regions as they land in the arena: the globals region and each
 * layer run against the CRC32 the manifest records, naming trunk.bin and the byte range.
 *
 * @module
 */
import type { Container } from "../../io/container.ts";
import { crc32 } from "../../io/crc32.ts";
import type { Arena } from "../arena.ts";

/**
 * `(layer, at)` CRC-checks the globals region or a layer
 * run just read into the arena at `at` against the manifest, naming the file and offset.
 */
export function regionChecker(
  arena: Arena,
  c: Container,
): (layer: number | "globals", at: number) => void {
  const t = c.manifest.trunk;
  return (layer, at) => {
    // MTP layers' runs follow the main layers' (manifest `mtp`).
    const r = layer === "globals"
      ? t.globals.region
      : t.layers[layer] ?? c.manifest.mtp!.layers[layer - t.layers.length];
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
