/**
 * CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320), the checksum of zlib, PNG and gzip.
 * Computed by the runtime's native zlib (`node:zlib` crc32): about 30× the slicing-by-8 table
 * loop in JS it replaced (docs/PERFORMANCE.md, "Pack against the disk"), which capped the packer
 * and `--verify` near 1.1 GB/s. `prev` continues a running CRC.
 *
 * @module
 */

import { crc32 as zlibCrc32 } from "node:zlib";

/** CRC-32 of `bytes`; pass the previous result as `prev` to checksum data in pieces. */
export function crc32(bytes: Uint8Array, prev = 0): number {
  return zlibCrc32(bytes, prev) >>> 0;
}
